"""The task interface, the registry and the train / held-out split.

A task is a data source of fixed-length token rows with a question part (``prompt``: True on the
given cells) and a rule-based checker. Every task has:

- ``name``, ``length`` (tokens per row), ``vocab_size`` (ids used are ``0 .. vocab_size - 1``);
- ``options()``: every option with its default, JSON-able; ``tasks.make(t.name, **t.options())``
  builds the same task;
- ``train_batch(seed, index, batch)`` -> ``{"tokens": int32 [B, n], "prompt": bool [B, n]}``,
  deterministic in its arguments alone;
- ``heldout(seed, count)`` -> the same dict; deterministic, and ``heldout(seed, k)`` is the first
  ``k`` rows of ``heldout(seed, m)`` for ``k <= m``; a finite split may return fewer than
  ``count`` rows (all it has: the runs cap their counts to it, with a line);
- ``verify(tokens, puzzle)`` -> ``{"solved", "cell_accuracy", "givens_kept", ...}`` ([B] each);
- ``render(tokens_row, prompt_row=None)`` -> str;
- optionally ``grid``: ``(rows, columns, box_rows, box_columns)`` of a grid task (Sudoku; a star
  graph's edge list, one row per edge), which ``model.position_init="grid:..."`` must match and
  ``model.position_init="grid"`` takes.

A task of one's own lives in any module that registers it (``@register("name")``); a run names the
module in ``task.module`` (`import_module`: a dotted name or a .py file), so every mode and
``aogpt_jax.load`` import it before the task is looked up. `check_task` is what the runs check on
the first training batch and the held-out rows before the first step.

The split: each instance has canonical bytes (a sudoku's solution grid; a star graph's edge set
and center), bucketed by ``zlib.crc32(bytes) % 2**20``; it is held out iff the bucket is below
``heldout_frac * 2**20``. ``train_batch`` draws only train-bucket instances and ``heldout`` only
held-out ones, so no instance (and no puzzle made from one) is in both.
"""

import hashlib
import importlib
import importlib.util
import inspect
import io
import os
import sys
import zlib

import numpy as np

BUCKETS = 2**20
REGISTRY: dict[str, type] = {}


def _origin(cls) -> tuple[str, str]:
  """Where a class was defined: (its qualified name, the file of its methods' code, else its
  module): the same for a class whose module (or config file) was imported again."""
  for v in vars(cls).values():
    code = getattr(getattr(v, "__func__", v), "__code__", None)
    if code is not None:
      return cls.__qualname__, os.path.realpath(code.co_filename)
  return cls.__qualname__, cls.__module__


def register(name: str):
  """Class decorator: ``@register("sudoku") class Sudoku(Task)``; ``tasks.make(name, **options)``
  calls the class with the options as keyword arguments. The same class imported again (a module
  or config file loaded twice) replaces its entry; another class under a taken name is an
  error."""
  def wrap(cls):
    old = REGISTRY.get(name)
    if old is not None and old is not cls and _origin(old) != _origin(cls):
      raise ValueError(f"task {name!r} is registered twice: {old.__module__}.{old.__qualname__} "
                       f"and {cls.__module__}.{cls.__qualname__}; give one of them another name")
    cls.name = name
    REGISTRY[name] = cls
    return cls
  return wrap


def import_module(spec: str):
  """Imports the module of a task of one's own (``task.module``): a dotted name importable from
  ``sys.path`` (the current folder included) or a path to a .py file; importing it again is a
  no-op. Returns the module; a missing module or an error inside it is a one-line ValueError
  naming ``task.module`` (its cause keeps the traceback)."""
  spec = str(spec).strip()
  if _is_path(spec):
    path = os.path.realpath(os.path.expanduser(spec))
    if not os.path.isfile(path):
      raise ValueError(f"task.module: no such file {spec!r}; expected a .py file or a dotted "
                       f"module name importable from the current folder")
    name = (f"_aogpt_task_{os.path.splitext(os.path.basename(path))[0]}_"
            f"{hashlib.sha1(path.encode()).hexdigest()[:8]}")
    if name in sys.modules:
      return sys.modules[name]
    loader = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader)
    sys.modules[name] = module
    try:
      loader.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module may raise anything
      del sys.modules[name]
      raise ValueError(f"task.module: importing {spec} failed: {type(e).__name__}: "
                       f"{_first_line(e)}") from e
    return module
  try:
    return importlib.import_module(spec)
  except ModuleNotFoundError as e:
    if e.name and spec.split(".")[0] == e.name.split(".")[0] and spec.startswith(e.name):
      raise ValueError(f"task.module: no module named {e.name!r} (searched the current folder "
                       f"and sys.path); expected a dotted module name or a path to a .py file"
                       ) from e
    raise ValueError(f"task.module: importing {spec} failed: ModuleNotFoundError: "
                     f"{_first_line(e)}") from e
  except Exception as e:  # noqa: BLE001 - the user's module may raise anything
    raise ValueError(f"task.module: importing {spec} failed: {type(e).__name__}: "
                     f"{_first_line(e)}") from e


def import_modules(specs: str) -> list:
  """`import_module` of each comma-separated entry of ``specs`` ("" = none)."""
  return [import_module(s) for s in str(specs or "").split(",") if s.strip()]


def _is_path(spec: str) -> bool:
  return spec.endswith(".py") or os.sep in spec


def canonical(specs: str) -> str:
  """``specs`` (comma-separated) with each .py file as its absolute path (what a run records,
  so that a resume from another folder imports the same file)."""
  parts = [s.strip() for s in str(specs or "").split(",") if s.strip()]
  return ",".join(os.path.abspath(os.path.expanduser(s)) if _is_path(s) else s for s in parts)


def _first_line(e: BaseException) -> str:
  return (str(e).strip().splitlines() or [repr(e)])[0]


def names() -> list[str]:
  return sorted(REGISTRY)


def make(name: str, **options) -> "Task":
  if name not in REGISTRY:
    raise ValueError(f"task {name!r} is not registered; expected one of {', '.join(names())}")
  cls = REGISTRY[name]
  known = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
  for key in options:
    if key not in known:
      raise ValueError(f"task {name!r}: unknown option {key}={options[key]!r}; expected one of "
                       f"{', '.join(known)}")
  return cls(**options)


def defaults(name: str) -> dict:
  """Every option of task ``name`` with its default (the keys a config's ``task.options`` can
  set; ``make(name, **defaults(name) | options)`` is ``make(name, **options)``)."""
  if name not in REGISTRY:
    return {}
  return {k: p.default for k, p in inspect.signature(REGISTRY[name].__init__).parameters.items()
          if k != "self" and p.default is not inspect.Parameter.empty}


def plain(value):
  """``value`` with numpy scalars and arrays as Python numbers and lists (recursively through
  dicts, lists and tuples): a task's ``options()`` as JSON can hold them."""
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, dict):
    return {k: plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(plain(v) for v in value)
  return value


def options(task: "Task") -> dict:
  """``task.options()`` made JSON-safe (`plain`): what configs, summaries and provenance
  record."""
  return plain(task.options())


def heldout_mask(keys: np.ndarray, frac: float) -> np.ndarray:
  """bool [B]: which rows of ``keys`` ([B, ...], each row the canonical bytes of one instance)
  fall in the held-out bucket."""
  keys = np.ascontiguousarray(keys)
  cut = int(round(frac * BUCKETS))
  return np.array([zlib.crc32(k.tobytes()) % BUCKETS < cut for k in keys], bool)


def check_frac(name: str, frac) -> float:
  if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac < 1:
    raise ValueError(f"task {name!r}: heldout_frac={frac!r}; expected a number in (0, 1)")
  return float(frac)


def check_int(name: str, key: str, value, lo: int, hi: int | None = None) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or (
      hi is not None and value > hi):
    bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    raise ValueError(f"task {name!r}: {key}={value!r}; expected an integer {bound}")
  return int(value)


def as_rows(name: str, what: str, x, length: int, dtype=np.int64) -> np.ndarray:
  """``x`` as [B, length] (a single row becomes [1, length])."""
  a = np.asarray(x)
  if a.ndim == 1:
    a = a[None]
  if a.ndim != 2 or a.shape[1] != length:
    raise ValueError(f"task {name!r}: {what} has shape {np.shape(x)}; expected [B, {length}]")
  return a.astype(dtype)


class Task:
  """The base of every task (see the module docstring)."""

  name: str = ""
  length: int = 0
  vocab_size: int = 0
  heldout_frac: float = 0.1
  grid: tuple[int, int, int, int] | None = None   # a grid task's (rows, cols, box rows, box cols)

  def options(self) -> dict:
    raise NotImplementedError

  def train_batch(self, seed: int, index: int, batch: int) -> dict[str, np.ndarray]:
    raise NotImplementedError

  def heldout(self, seed: int, count: int) -> dict[str, np.ndarray]:
    raise NotImplementedError

  def verify(self, tokens, puzzle: dict) -> dict[str, np.ndarray]:
    raise NotImplementedError

  def render(self, tokens_row, prompt_row=None) -> str:
    raise NotImplementedError

  def split_keys(self, tokens) -> np.ndarray:
    """[B, k]: the canonical bytes (as an array) of each row's instance, what the split hashes."""
    raise NotImplementedError

  def in_heldout(self, tokens) -> np.ndarray:
    """bool [B]: which rows' instances are on the held-out side of the split."""
    return heldout_mask(self.split_keys(tokens), self.heldout_frac)

  def __repr__(self):
    opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
    return f"tasks.make({self.name!r}, {opts})"

  def _cell_accuracy(self, tokens: np.ndarray, puzzle: dict) -> tuple[np.ndarray, np.ndarray]:
    """(cell_accuracy, givens_kept), each [B]: accuracy over the non-prompt cells (1.0 where a
    row has none); every prompt cell equal to the puzzle's."""
    ref = as_rows(self.name, "puzzle['tokens']", puzzle["tokens"], self.length)
    prompt = as_rows(self.name, "puzzle['prompt']", puzzle["prompt"], self.length, bool)
    if ref.shape[0] != tokens.shape[0]:
      raise ValueError(f"task {self.name!r}: tokens has {tokens.shape[0]} rows, the puzzle "
                       f"{ref.shape[0]}; expected the same")
    same = tokens == ref
    free = (~prompt).sum(1)
    acc = np.where(free > 0, (same & ~prompt).sum(1) / np.maximum(free, 1), 1.0)
    return acc.astype(np.float64), (same | ~prompt).all(1)


def open_text(path: str, newline: str | None = None) -> io.StringIO:
  """A UTF-8 text file as a stream of lines (a byte-order mark, as Excel's "CSV UTF-8" writes,
  dropped); bytes that are not UTF-8 are a one-line ValueError naming the file, the line and
  the column."""
  with open(path, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
    start = bom + e.start
    line = raw.count(b"\n", 0, start) + 1
    column = start - (raw.rfind(b"\n", 0, start) + 1) + 1
    raise ValueError(f"{path}: line {line}: byte 0x{raw[start]:02x} at column {column} is not "
                     f"UTF-8; expected a UTF-8 text file (re-save it as UTF-8)") from None
  return io.StringIO(text, newline=newline)


def seeds(*parts: int) -> np.random.Generator:
  """A generator seeded by a stream tag and the caller's seed / index (integers >= 0)."""
  for p in parts[1:]:
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 0:
      raise ValueError(f"task seed / index {p!r}; expected an integer >= 0")
  return np.random.default_rng([int(p) for p in parts])


# ----------------------------------------------------------------------------- checks of a task


def check_rows(task: "Task", rows, what: str) -> int:
  """One-line ValueErrors naming the task when ``rows`` (what ``train_batch`` / ``heldout``
  returned, described by ``what``) do not fit it: a dict of ``tokens`` (integers [B, length]
  in ``[0, vocab_size)``) and ``prompt`` (bool, the same shape). Returns B."""
  where = f"task {task.name!r}: {what}"
  if not isinstance(rows, dict) or "tokens" not in rows or "prompt" not in rows:
    got = sorted(rows) if isinstance(rows, dict) else type(rows).__name__
    raise ValueError(f"{where} returned {got}; expected a dict with 'tokens' and 'prompt'")
  tokens, prompt = np.asarray(rows["tokens"]), np.asarray(rows["prompt"])
  if tokens.ndim != 2 or tokens.shape[1:] != (task.length,):
    raise ValueError(f"{where}: tokens of shape {tokens.shape}; expected [rows, {task.length}] "
                     f"(the task's length)")
  if prompt.shape != tokens.shape:
    raise ValueError(f"{where}: prompt of shape {prompt.shape}; expected the tokens' "
                     f"{tokens.shape}")
  if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f"{where}: tokens of dtype {tokens.dtype}; expected integers")
  if prompt.size and prompt.dtype != bool:   # ~prompt of an int 0/1 mask is -1 / -2, not a mask
    raise ValueError(f"{where}: prompt of dtype {prompt.dtype}; expected a bool mask (True on "
                     f"the given cells: np.asarray(mask, bool))")
  bad = (tokens < 0) | (tokens >= task.vocab_size)
  if bad.any():
    r, c = (int(i[0]) for i in np.nonzero(bad))
    raise ValueError(f"{where}: row {r} holds token id {int(tokens[r, c])} at position {c}; "
                     f"expected ids in [0, {task.vocab_size}) (vocab_size={task.vocab_size})")
  return int(tokens.shape[0])


def verify(task: "Task", tokens, puzzle: dict, what: str) -> dict:
  """``task.verify(tokens, puzzle)``; a verifier that raises is one ValueError line naming the
  task, the exception and ``what`` was verified (its cause: the traceback)."""
  try:
    out = task.verify(tokens, puzzle)
  except Exception as e:  # noqa: BLE001 - a task's verifier may raise anything
    raise ValueError(f"task {task.name!r}: its verifier raised {type(e).__name__}: "
                     f"{_first_line(e)} on {what}") from e
  check_verdict(task, out, len(np.asarray(tokens)), what)
  return out


def check_verdict(task: "Task", out, n: int, what: str) -> None:
  """A verifier's answer must be a dict with 'solved' (bool [n]: a float 0.3 is not a verdict)
  and 'cell_accuracy' (finite numbers in [0, 1], [n]): else one line naming the task."""
  expected = (f"expected a dict with 'solved' (bool) and 'cell_accuracy' (numbers in [0, 1]) "
              f"of shape [{n}]")
  if not isinstance(out, dict) or "solved" not in out or "cell_accuracy" not in out:
    got = sorted(out) if isinstance(out, dict) else type(out).__name__
    raise ValueError(f"task {task.name!r}: its verifier returned {got} for {what}; {expected}")
  solved, acc = np.asarray(out["solved"]), np.asarray(out["cell_accuracy"])
  if solved.shape != (n,) or acc.shape != (n,):
    raise ValueError(f"task {task.name!r}: its verifier returned 'solved' of shape "
                     f"{solved.shape} and 'cell_accuracy' of shape {acc.shape} for {what}; "
                     f"{expected}")
  if solved.dtype != np.bool_:
    raise ValueError(f"task {task.name!r}: its verifier's 'solved' is {solved.dtype} for {what} "
                     f"(e.g. {solved.ravel()[:3].tolist()}); {expected}")
  if not np.issubdtype(acc.dtype, np.number) or not (
      np.isfinite(acc) & (acc >= 0) & (acc <= 1)).all():
    raise ValueError(f"task {task.name!r}: its verifier's 'cell_accuracy' holds "
                     f"{acc.ravel()[:3].tolist()}... for {what}; {expected}")


def check_verifier(task: "Task", rows: dict, what: str) -> None:
  """The verifier must run on ``rows``' reference answers and call every one ``solved``; a
  verifier that raises is one line naming the task and the exception (its cause: the
  traceback)."""
  n = len(np.asarray(rows["tokens"]))
  out = verify(task, np.asarray(rows["tokens"]), rows, f"the reference answers of {what}")
  solved = np.asarray(out["solved"])
  if not solved.astype(bool).all():
    first = int(np.flatnonzero(~solved.astype(bool))[0])
    raise ValueError(f"task {task.name!r}: its verifier says {int((~solved.astype(bool)).sum())}"
                     f" of {n} reference answers of {what} are not solved (row {first} first); "
                     f"expected every reference answer solved")


def check_task(task: "Task", *, seed: int, batch: int, heldout_seed: int,
               heldout_count: int) -> int:
  """What a run checks before its first step, on the first training batch and the held-out rows:
  shapes, ids in range, the prompt mask, scored cells, the verifier on the reference answers.
  Returns how many held-out rows the split has up to ``heldout_count`` (fewer: the caller caps
  its count); an empty split is an error."""
  def call(fn, what, key=""):
    try:
      return fn()
    except Exception as e:  # noqa: BLE001 - a task's generator may raise anything
      raise ValueError(f"{key}task {task.name!r}: {what} raised {type(e).__name__}: "
                       f"{_first_line(e)}") from e

  what = f"train_batch(seed={seed}, index=0, batch={batch})"
  rows = call(lambda: task.train_batch(seed, 0, batch), what)
  if check_rows(task, rows, what) != batch:
    raise ValueError(f"task {task.name!r}: {what} returned {len(rows['tokens'])} rows; expected "
                     f"{batch}")
  _check_scored(task, rows, what, "training")
  check_verifier(task, rows, what)
  again = call(lambda: task.train_batch(seed, 0, batch), what)
  if not all(np.array_equal(np.asarray(rows[k]), np.asarray(again[k])) for k in
             ("tokens", "prompt")):
    raise ValueError(f"task {task.name!r}: {what} returned other rows when called again with the "
                     f"same arguments; expected a pure function of (seed, index, batch), e.g. "
                     f"rows drawn from tasks.base.seeds(TAG, seed, index) (a resumed run reads "
                     f"its batches again)")
  train_rows = rows
  what = f"heldout(seed={heldout_seed}, count={heldout_count})"
  held = call(lambda: task.heldout(heldout_seed, heldout_count), what,
              f"task.heldout_count={heldout_count} (the count asked for): ")
  n = check_rows(task, held, what)
  if n == 0:
    raise ValueError(f"task.heldout_count: task {task.name!r} has an empty held-out split ({what}"
                     f" returned no rows); expected held-out rows to evaluate on")
  if n > heldout_count:
    raise ValueError(f"task {task.name!r}: {what} returned {n} rows; expected at most "
                     f"{heldout_count}")
  _check_scored(task, held, what, "held-out")
  check_verifier(task, held, what)
  seen = {t.tobytes() + p.tobytes() for t, p in zip(
      np.asarray(train_rows["tokens"], np.int64), np.asarray(train_rows["prompt"], bool))}
  leaked = sum(t.tobytes() + p.tobytes() in seen for t, p in zip(
      np.asarray(held["tokens"], np.int64), np.asarray(held["prompt"], bool)))
  if n >= 4 and 2 * leaked > n:
    raise ValueError(f"task {task.name!r}: {leaked} of the {n} rows of {what} are rows of the "
                     f"first training batch; expected a held-out split apart from training (e.g. "
                     f"tasks.base.heldout_mask on a key of each instance, as the built-in tasks "
                     f"do)")
  return n


def _check_scored(task: "Task", rows: dict, what: str, side: str) -> None:
  if np.asarray(rows["prompt"], bool).all():
    raise ValueError(f"task {task.name!r}: no scored cells: every cell of the {side} rows of "
                     f"{what} is a given (prompt), so there is nothing to train or score; "
                     f"expected rows with cells to fill (fewer givens)")
