"""The task interface, the registry and the train / held-out split.

A task is a data source of fixed-length token rows with a question part (``prompt``: True on the
given cells) and a rule-based checker. Every task has:

- ``name``, ``length`` (tokens per row), ``vocab_size`` (ids used are ``0 .. vocab_size - 1``);
- ``options()``: every option with its default, JSON-able; ``tasks.make(t.name, **t.options())``
  builds the same task;
- ``train_batch(seed, index, batch)`` -> ``{"tokens": int32 [B, n], "prompt": bool [B, n]}``,
  deterministic in its arguments alone;
- ``heldout(seed, count)`` -> the same dict; deterministic, and ``heldout(seed, k)`` is the first
  ``k`` rows of ``heldout(seed, m)`` for ``k <= m``;
- ``verify(tokens, puzzle)`` -> ``{"solved", "cell_accuracy", "givens_kept", ...}`` ([B] each);
- ``render(tokens_row, prompt_row=None)`` -> str.

The split: each instance has canonical bytes (a sudoku's solution grid; a star graph's edge set
and center), bucketed by ``zlib.crc32(bytes) % 2**20``; it is held out iff the bucket is below
``heldout_frac * 2**20``. ``train_batch`` draws only train-bucket instances and ``heldout`` only
held-out ones, so no instance (and no puzzle made from one) is in both.
"""

import inspect
import io
import zlib

import numpy as np

BUCKETS = 2**20
REGISTRY: dict[str, type] = {}


def register(name: str):
  """Class decorator: ``@register("sudoku") class Sudoku(Task)``; ``tasks.make(name, **options)``
  calls the class with the options as keyword arguments."""
  def wrap(cls):
    if name in REGISTRY:
      raise ValueError(f"task {name!r} is registered twice ({REGISTRY[name].__name__}, "
                       f"{cls.__name__})")
    cls.name = name
    REGISTRY[name] = cls
    return cls
  return wrap


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
