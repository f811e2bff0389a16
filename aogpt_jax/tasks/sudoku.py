"""Sudoku as a task: sizes 4 (2x2 boxes), 6 (2x3 boxes: 2 rows x 3 columns each) and 9 (3x3).

Layout: one token per cell, row-major, ``length = size * size``; token id = digit - 1
(``vocab_size = size``). ``tokens`` is the full solution, ``prompt`` True on the given cells.

Grids. Size 4 draws uniformly from all 288 grids (enumerated once). Sizes 6 and 9 draw a grid
from a pool of 32 grids made by randomized backtracking from a fixed seed (the same pool for
every task seed), then apply random validity-preserving transformations, vectorized in numpy:
row permutations within bands, band permutations, column permutations within stacks, stack
permutations, a transpose when the boxes are square, and a digit relabelling.

Split (`base`): a grid is held out iff ``crc32(grid bytes) % 2**20 < heldout_frac * 2**20``.
``train_batch`` resamples held-out grids away and ``heldout`` draws only held-out grids, so no
solution grid is in both. With ``unique=True`` (the default) no training puzzle is a held-out
puzzle either: a held-out puzzle's givens fit one grid only, which training never draws. For
size 4 (288 grids) the split is checked non-empty on both sides when the task is made; with the
default ``heldout_frac=0.1`` about 29 of the 288 grids are held out.

Training rows: a givens count uniform in ``[min_givens, max_givens]`` and that many random cells.
Training puzzles need not have a unique solution (the loss is on the reference grid).

Held-out puzzles: with ``unique=True`` cells are removed in random order while the solver still
finds one solution, down to a target count drawn in ``[min_givens, max_givens]``; a grid whose
removal pass ends above ``max_givens`` is replaced by the next held-out grid. So ``min_givens``
may be below what is reachable (the count lands between the reachable minimum and
``max_givens``), but ``max_givens`` must be reachable: for 9x9 a random removal pass rarely goes
below ~22 givens (a pass that removes every cell it can ends at a minimal puzzle: ask for one with
``min_givens=17``). ``difficulty``: "propagation" keeps puzzles naked and hidden singles alone
solve, "search" the others, "any" both (`difficulty`); a bucket of the guess count
(`sudoku_grade`: "0", "1-4", "5-99", "100+") keeps the puzzles of that bucket.

Hard training mixtures: ``hard_frac`` of each training batch are unique puzzles of training grids
made by one removal pass to a minimal puzzle (`sudoku_grade.minimal_prompt`: 6x6 about 10
givens, 9x9 about 20-27; ~1 ms / ~30 ms each on a CPU core), the rest random givens as above.

Outside puzzles: `load_puzzles` (CSV, text, a Hugging Face ``datasets`` name or directory),
`from_strings`, `to_string`. Solver: `solve(grid, limit=2) -> (count, solution)`.
"""

import csv
import functools
import os
import re

import numpy as np

from aogpt_jax.tasks import base, sudoku_grade
from aogpt_jax.tasks.sudoku_grade import BOXES, units
from aogpt_jax.tasks.sudoku_grade import cell_units as _cell_units
from aogpt_jax.tasks.sudoku_grade import parse_digits as _digits

DEFAULT_GIVENS = {4: (5, 10), 6: (14, 24), 9: (28, 40)}
# The fewest givens of a puzzle with one solution (4x4: 4; 6x6: 8; 9x9: 17, McGuire et al. 2012).
MIN_UNIQUE_GIVENS = {4: 4, 6: 8, 9: 17}
DIFFICULTIES = ("any", "propagation", "search", *sudoku_grade.BUCKETS)
POOL = 32


# ---------------------------------------------------------------------------------------------
# geometry and the bitmask solver (digits 1..size, 0 = blank, flat lists)

def _search(cells: list[int], size: int, limit: int | None, found: list | None = None,
            forbid: tuple[int, int] = (-1, 0), rng: np.random.Generator | None = None) -> int:
  """Counts solutions of ``cells`` (modified in place while searching, restored after) up to
  ``limit`` (None: all), appending each to ``found`` when given. Most constrained cell first
  (a cell with one candidate is a naked single). ``forbid=(cell, digit)`` bars that digit there.
  ``rng`` shuffles the digit order (random grids)."""
  cu = _cell_units(size)
  full = (1 << size) - 1
  used = sudoku_grade.used_digits(cells, size)
  if used is None:
    return 0
  empties = [i for i, v in enumerate(cells) if not v]
  fcell, fbit = forbid[0], (1 << (forbid[1] - 1)) if forbid[1] else 0
  count = 0

  def rec(k):  # empties[:k] are filled
    nonlocal count
    if k == len(empties):
      count += 1
      if found is not None:
        found.append(list(cells))
      return
    best, best_opts, best_n = -1, 0, size + 1
    for j in range(k, len(empties)):
      i = empties[j]
      r, c, b = cu[i]
      opts = full & ~(used[r] | used[c] | used[b])
      if i == fcell:
        opts &= ~fbit
      n = opts.bit_count()
      if n < best_n:
        best, best_opts, best_n = j, opts, n
        if n <= 1:
          break
    if best_n == 0:
      return
    empties[k], empties[best] = empties[best], empties[k]
    i = empties[k]
    r, c, b = cu[i]
    digits = [d for d in range(1, size + 1) if best_opts >> (d - 1) & 1]
    if rng is not None:
      rng.shuffle(digits)
    for d in digits:
      bit = 1 << (d - 1)
      cells[i] = d
      used[r] |= bit
      used[c] |= bit
      used[b] |= bit
      rec(k + 1)
      used[r] &= ~bit
      used[c] &= ~bit
      used[b] &= ~bit
      cells[i] = 0
      if limit is not None and count >= limit:
        break
    empties[k], empties[best] = empties[best], empties[k]

  rec(0)
  return count


def solve(grid, limit: int | None = 2) -> tuple[int, np.ndarray | None]:
  """(number of solutions counted up to ``limit``, the first solution or None) of ``grid``
  ([size, size] or [size * size] digits 1..size, 0 = blank; size 4, 6 or 9). ``limit=None``
  counts all. The solution has ``grid``'s shape."""
  cells, size, shape = _digits(grid)
  found = []
  count = _search(cells, size, limit, found)
  return count, (np.array(found[0], np.int64).reshape(shape) if found else None)


def _candidates(cells: list[int], size: int) -> list[int] | None:
  cu = _cell_units(size)
  used = [0] * (3 * size)
  for i, v in enumerate(cells):
    if v:
      for u in cu[i]:
        used[u] |= 1 << (v - 1)
  full = (1 << size) - 1
  return [0 if v else full & ~(used[cu[i][0]] | used[cu[i][1]] | used[cu[i][2]])
          for i, v in enumerate(cells)]


def singles(cells: list[int], size: int) -> list[int]:
  """Fills what naked and hidden singles alone determine; returns the (partly) filled cells."""
  cells = list(cells)
  unit_cells = units(size).tolist()
  while True:
    cand = _candidates(cells, size)
    placed = False
    for i, m in enumerate(cand):
      if not cells[i] and m and not m & (m - 1):
        cells[i] = m.bit_length()
        placed = True
    if not placed:
      for u in unit_cells:
        for d in range(size):
          bit = 1 << d
          where = [i for i in u if not cells[i] and cand[i] & bit]
          if len(where) == 1 and not any(cells[i] == d + 1 for i in u):
            cells[where[0]] = d + 1
            placed = True
    if not placed:
      return cells


def difficulty(puzzle) -> str:
  """"propagation" if naked and hidden singles alone solve ``puzzle``, else "search".
  ``puzzle``: a digit grid (0 = blank, as `solve` takes) or one row ``{"tokens", "prompt"}``."""
  if isinstance(puzzle, dict):
    tok, prm = np.asarray(puzzle["tokens"]).ravel(), np.asarray(puzzle["prompt"]).ravel()
    puzzle = np.where(prm, tok + 1, 0)
  cells, size, _ = _digits(puzzle, "puzzle")
  return "propagation" if all(singles(cells, size)) else "search"


@functools.lru_cache(maxsize=None)
def all_grids(size: int) -> np.ndarray:
  """uint8 [count, size * size] tokens (digit - 1) of every grid; size 4 only (288)."""
  if size != 4:
    raise ValueError(f"sudoku size={size}: all_grids enumerates size 4 only")
  found = []
  _search([0] * 16, 4, None, found)
  return np.array(found, np.uint8) - 1


@functools.lru_cache(maxsize=None)
def pool(size: int) -> np.ndarray:
  """uint8 [POOL, size * size] tokens of grids made by randomized backtracking, seed fixed."""
  rng = np.random.default_rng([0x5D0, size])
  out = []
  for _ in range(POOL):
    found = []
    _search([0] * (size * size), size, 1, found, rng=rng)
    out.append(found[0])
  return np.array(out, np.uint8) - 1


def random_grids(size: int, rng: np.random.Generator, count: int) -> np.ndarray:
  """uint8 [count, size * size] valid grids (tokens), vectorized."""
  if size == 4:
    grids = all_grids(4)
    return grids[rng.integers(0, len(grids), count)]
  br, bc = BOXES[size]
  g = pool(size)[rng.integers(0, POOL, count)].reshape(count, size, size)

  def perm(group):  # a permutation of 0..size-1 keeping groups of `group` together
    outer = rng.random((count, size // group)).argsort(1)
    inner = rng.random((count, size // group, group)).argsort(2)
    return (outer[:, :, None] * group + inner).reshape(count, size)

  rows, cols = perm(br), perm(bc)
  g = g[np.arange(count)[:, None, None], rows[:, :, None], cols[:, None, :]]
  if br == bc:
    g = np.where((rng.random(count) < 0.5)[:, None, None], g.transpose(0, 2, 1), g)
  relabel = rng.random((count, size)).argsort(1).astype(np.uint8)
  return np.take_along_axis(relabel, g.reshape(count, -1).astype(np.intp), 1)


def cells_ok(tokens: np.ndarray, size: int) -> np.ndarray:
  """bool [B, n]: each cell's digit is in range and appears once in its row, its column and its
  box (whichever solution the grid is)."""
  vals = tokens[:, units(size)]                                   # [B, 3 size, size]
  clash = (vals[..., :, None] == vals[..., None, :]).sum(-1) > 1  # a digit twice in the unit
  bad = np.zeros(tokens.shape, bool)
  for u, cells in enumerate(units(size)):
    bad[:, cells] |= clash[:, u]
  return ~bad & (tokens >= 0) & (tokens < size)


def rule_cells(tokens: np.ndarray, prompt: np.ndarray, size: int) -> np.ndarray:
  """float [B]: the fraction of each row's non-given cells whose digit is in range and appears
  once in its row, its column and its box (1.0 for every valid grid, whichever solution it is;
  1.0 where a row has no free cell)."""
  ok = cells_ok(tokens, size) & ~prompt
  free = (~prompt).sum(1)
  return np.where(free > 0, ok.sum(1) / np.maximum(free, 1), 1.0).astype(np.float64)


def legal_tokens(tokens, written, size: int) -> np.ndarray:
  """bool [R, n, size]: token d may go in cell i (no written cell of i's row, column or box holds
  d). ``tokens`` int [R, n] (0-based), ``written`` bool [R, n]."""
  tokens, written = np.asarray(tokens), np.asarray(written, bool)
  u = units(size)                                                # [3s, s]
  onehot = (tokens[..., None] == np.arange(size)) & written[..., None]       # [R, n, s]
  used = onehot[:, u].any(2)                                     # [R, 3s, s]
  cell_units = np.zeros((size * size, 3), np.int64)
  for j, members in enumerate(u):
    cell_units[members, j // size] = j
  return ~used[:, cell_units].any(2)


def valid_rows(tokens: np.ndarray, size: int) -> np.ndarray:
  """bool [B]: every row, column and box of each token row is a permutation of 0..size-1."""
  cells = np.sort(tokens[:, units(size)], axis=-1)
  return (cells == np.arange(size)).all((1, 2))


# ---------------------------------------------------------------------------------------------
# the task

@base.register("sudoku")
class Sudoku(base.Task):
  """Sudoku (module docstring): ``tasks.make("sudoku", size=6, min_givens=18, max_givens=24)``.

  verify: "solved" (rules hold and every given kept), "valid" (rows, columns and boxes are
  permutations of the digits), "givens_kept", "cell_accuracy" (over the non-given cells, against
  the reference solution), "rule_cells" (`rule_cells`: the non-given cells that break no rule,
  whichever solution the grid is; 0 where a given was changed)."""

  def __init__(self, size: int = 9, min_givens: int | None = None, max_givens: int | None = None,
               heldout_frac: float = 0.1, unique: bool = True, difficulty: str = "any",
               hard_frac: float = 0.0):
    if size not in BOXES:
      raise ValueError(f"task 'sudoku': size={size!r}; expected one of 4, 6, 9")
    n = size * size
    lo, hi = DEFAULT_GIVENS[size]
    self.size = size
    self.min_givens = base.check_int("sudoku", "min_givens", lo if min_givens is None
                                     else min_givens, 0, n)
    self.max_givens = base.check_int("sudoku", "max_givens", hi if max_givens is None
                                     else max_givens, self.min_givens, n)
    self.heldout_frac = base.check_frac("sudoku", heldout_frac)
    if not isinstance(unique, bool):
      raise ValueError(f"task 'sudoku': unique={unique!r}; expected True or False")
    if unique and self.max_givens < MIN_UNIQUE_GIVENS[size]:
      raise ValueError(f"task 'sudoku': max_givens={self.max_givens} with unique=True: no "
                       f"{size}x{size} puzzle with fewer than {MIN_UNIQUE_GIVENS[size]} givens "
                       f"has one solution, so no held-out puzzle can be made; expected "
                       f"max_givens >= {MIN_UNIQUE_GIVENS[size]}, or unique=False")
    self.unique = unique
    if difficulty not in DIFFICULTIES:
      raise ValueError(f"task 'sudoku': difficulty={difficulty!r}; expected one of "
                       f"{', '.join(DIFFICULTIES)}")
    if difficulty != "any" and not unique:
      raise ValueError(f"task 'sudoku': difficulty={difficulty!r} with unique=False; a grade "
                       f"needs one solution: expected unique=True or difficulty='any'")
    self.difficulty = difficulty
    if isinstance(hard_frac, bool) or not isinstance(hard_frac, (int, float)) or not (
        0.0 <= hard_frac <= 1.0):
      raise ValueError(f"task 'sudoku': hard_frac={hard_frac!r}; expected a number in [0, 1] "
                       f"(the share of each training batch that are minimal unique puzzles)")
    self.hard_frac = float(hard_frac)
    self.length, self.vocab_size = n, size
    if size == 4:
      held = base.heldout_mask(all_grids(4), self.heldout_frac).sum()
      if held in (0, len(all_grids(4))):
        raise ValueError(f"task 'sudoku': heldout_frac={heldout_frac!r} leaves {held} of the "
                         f"288 4x4 grids held out; expected both sides non-empty")

  def options(self) -> dict:
    return {"size": self.size, "min_givens": self.min_givens, "max_givens": self.max_givens,
            "heldout_frac": self.heldout_frac, "unique": self.unique,
            "difficulty": self.difficulty, "hard_frac": self.hard_frac}

  def _grids(self, rng: np.random.Generator, count: int, held: bool) -> np.ndarray:
    """[count, n] grids from one side of the split."""
    out, have = [], 0
    for _ in range(10_000):
      g = random_grids(self.size, rng, max(count + count // 2, 16) if not held else 64)
      g = g[self.in_heldout(g) == held]
      out.append(g)
      have += len(g)
      if have >= count:
        return np.concatenate(out)[:count]
    raise AssertionError("unreachable: both sides of the split are non-empty")

  @property
  def grid(self) -> tuple[int, int, int, int]:
    """(rows, columns, box rows, box columns): what ``model.position_init="grid:..."`` codes."""
    return (self.size, self.size, *BOXES[self.size])

  def load(self, path: str, limit: int | None = None) -> dict[str, np.ndarray]:
    """Puzzles of this size from a file or dataset (`load_puzzles`): ``--mode=solve`` with
    ``solve.puzzles=FILE``."""
    return load_puzzles(path, size=self.size, limit=limit)

  def split_keys(self, tokens) -> np.ndarray:
    """The solution grids, uint8 [B, n]."""
    return base.as_rows(self.name, "tokens", tokens, self.length, np.uint8)

  def train_batch(self, seed: int, index: int, batch: int) -> dict[str, np.ndarray]:
    """``batch`` training rows: train-bucket grids, random givens (not necessarily unique); the
    first ``round(hard_frac * batch)`` rows minimal unique puzzles (module docstring)."""
    rng = base.seeds(0x7A1, seed, index)
    grids = self._grids(rng, batch, held=False)
    k = rng.integers(self.min_givens, self.max_givens + 1, batch)
    rank = rng.random((batch, self.length)).argsort(1).argsort(1)
    prompt = rank < k[:, None]
    hard = int(round(self.hard_frac * batch))
    if hard:
      hrng = base.seeds(0x4A2D, seed, index)
      for i in range(hard):
        prompt[i] = sudoku_grade.minimal_prompt(grids[i] + 1, hrng)
    return {"tokens": grids.astype(np.int32), "prompt": prompt}

  def legal(self, tokens, written) -> np.ndarray:
    """bool [R, n, size]: which tokens each cell may take without breaking a row, column or
    box rule given the ``written`` cells of ``tokens`` ([R, n]; the search decoding's checker,
    `sampling.search`)."""
    return legal_tokens(tokens, written, self.size)

  def cell_rules(self, tokens, puzzle: dict) -> np.ndarray:
    """bool [R, n]: the cells whose digit breaks no rule of the finished grid (any valid digit,
    not only the stored solution's; the per-cell reward ``cell_valid``); False everywhere in a
    row whose givens were changed."""
    tokens = base.as_rows(self.name, "tokens", tokens, self.length)
    _, kept = self._cell_accuracy(tokens, puzzle)
    return cells_ok(tokens, self.size) & np.asarray(kept, bool)[:, None]

  def valid(self, tokens) -> np.ndarray:
    """bool [R]: the rows are finished grids that keep every rule (no reference needed: the
    search decoding's checker, `sampling.search`)."""
    tokens = base.as_rows(self.name, "tokens", tokens, self.length)
    return ((tokens >= 0) & (tokens < self.size)).all(1) & valid_rows(
        np.clip(tokens, 0, self.size - 1), self.size)

  def grade(self, puzzles: dict) -> np.ndarray:
    """int64 [R]: each puzzle's guess count (`sudoku_grade.guesses`; bucket with
    `sudoku_grade.bucket`): what ``--mode=solve`` and the benchmarks report solved rates by."""
    return sudoku_grade.grade_rows(puzzles)

  def heldout(self, seed: int, count: int) -> dict[str, np.ndarray]:
    """``count`` distinct held-out puzzles (unique solutions when ``unique``), deterministic;
    ``heldout(seed, k)`` is the first ``k`` rows of ``heldout(seed, m)``, ``k <= m``."""
    rng = base.seeds(0x4E1D, seed)
    tokens, prompts, seen = [], [], set()
    attempts, limit = 0, 200 * count + 2000
    while len(tokens) < count:
      for grid in self._grids(rng, 64, held=True):
        if len(tokens) == count:
          break
        attempts += 1
        # bounded: past 1000 tries, a rate at which the limit would find under a quarter of
        # them ends the search too (not minutes of tries first)
        if attempts > limit or (attempts >= 1000 and 4 * len(tokens) * limit < count * attempts):
          raise ValueError(
              f"task 'sudoku': found {len(tokens)} of {count} held-out puzzles in {attempts} "
              f"tries with {self.options()}; expected reachable options (raise max_givens or "
              f"heldout_frac, or difficulty='any')")
        prompt = self._puzzle(grid, rng)
        if prompt is None:
          continue
        key = grid.tobytes() + prompt.tobytes()
        if key in seen:
          continue
        if not self._wanted(np.where(prompt, grid + 1, 0)):
          continue
        seen.add(key)
        tokens.append(grid.astype(np.int32))
        prompts.append(prompt)
    n = self.length
    return {"tokens": np.array(tokens, np.int32).reshape(-1, n),
            "prompt": np.array(prompts, bool).reshape(-1, n)}

  def _wanted(self, digits: np.ndarray) -> bool:
    """Whether a held-out puzzle (digits, 0 = blank) has the ``difficulty`` asked for."""
    if self.difficulty == "any":
      return True
    if self.difficulty in ("propagation", "search"):
      return difficulty(digits) == self.difficulty
    lo, hi = sudoku_grade.bounds(self.difficulty)
    g = sudoku_grade.guesses(digits, None if hi is None else hi + 1)
    return g >= lo and (hi is None or g <= hi)

  def _puzzle(self, grid: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """The given-cells mask of one held-out puzzle of ``grid``, or None when the removal pass
    ends above max_givens."""
    n = self.length
    target = int(rng.integers(self.min_givens, self.max_givens + 1))
    order = rng.permutation(n)
    if not self.unique:
      prompt = np.zeros(n, bool)
      prompt[order[:target]] = True
      return prompt
    cells = [int(v) + 1 for v in grid]
    givens = n
    for c in order:
      if givens == target:
        break
      d = cells[c]
      cells[c] = 0
      if _search(cells, self.size, 1, forbid=(int(c), d)):
        cells[c] = d      # another digit fits there: the cell stays given
      else:
        givens -= 1
    if givens > self.max_givens:
      return None
    return np.array(cells) > 0

  def verify(self, tokens, puzzle: dict) -> dict[str, np.ndarray]:
    tokens = base.as_rows(self.name, "tokens", tokens, self.length)
    acc, kept = self._cell_accuracy(tokens, puzzle)
    valid = self.valid(tokens)
    prompt = np.asarray(puzzle["prompt"], bool)
    rules = np.where(kept, rule_cells(tokens, prompt, self.size), 0.0)
    return {"solved": valid & kept, "valid": valid, "givens_kept": kept, "cell_accuracy": acc,
            "rule_cells": rules}

  def render(self, tokens_row, prompt_row=None) -> str:
    """The grid, given cells in [brackets], boxes separated by | and -."""
    return render(tokens_row, prompt_row, self.size)


def render(tokens_row, prompt_row=None, size: int | None = None) -> str:
  tok = np.asarray(tokens_row).ravel()
  size = size or int(round(tok.size ** 0.5))
  prm = np.zeros(tok.size, bool) if prompt_row is None else np.asarray(prompt_row, bool).ravel()
  br, bc = BOXES[size]
  lines = []
  for r in range(size):
    if r and r % br == 0:
      lines.append("+".join(["-" * (3 * bc)] * (size // bc)))
    cells = [f"[{t + 1}]" if p else f" {t + 1} "
             for t, p in zip(tok[r * size:(r + 1) * size], prm[r * size:(r + 1) * size])]
    lines.append("|".join("".join(cells[c:c + bc]) for c in range(0, size, bc)))
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# puzzles from outside: strings, files, datasets

def to_string(tokens_row, prompt_row=None) -> str:
  """Digits 1..size, one per cell; with ``prompt_row`` the non-given cells are ``0`` (the
  puzzle), without it every cell (the solution)."""
  tok = np.asarray(tokens_row).ravel() + 1
  if prompt_row is not None:
    tok = np.where(np.asarray(prompt_row, bool).ravel(), tok, 0)
  return "".join(str(int(t)) for t in tok)


def _strings(puzzle, solution, size: int, where: str) -> tuple[str, str]:
  """The row's strings, stripped, with lengths and characters checked."""
  n = size * size
  puzzle, solution = str(puzzle).strip(), str(solution).strip()
  for what, s in (("puzzle", puzzle), ("solution", solution)):
    if len(s) != n:
      raise ValueError(f"{where}: {what} {s[:100]!r} has {len(s)} characters; expected {n}")
  digits = "".join(str(d) for d in range(1, size + 1))
  bad = sorted(set(puzzle) - set(digits + "0."))
  if bad:
    raise ValueError(f"{where}: puzzle {puzzle!r} holds {''.join(bad)!r}; expected digits "
                     f"1-{size} and 0 or . for blanks")
  bad = sorted(set(solution) - set(digits))
  if bad:
    raise ValueError(f"{where}: solution {solution!r} holds {''.join(bad)!r}; expected digits "
                     f"1-{size} only")
  return puzzle, solution


def _arrays(rows: list[tuple[str, str, str]], size: int) -> dict[str, np.ndarray]:
  """``{"tokens", "prompt"}`` of checked (where, puzzle, solution) rows; the solutions must keep
  the givens and be valid (vectorized: a million rows take seconds)."""
  n = size * size
  pz = np.frombuffer("".join(r[1] for r in rows).encode(), np.uint8).reshape(-1, n)
  sol = np.frombuffer("".join(r[2] for r in rows).encode(), np.uint8).reshape(-1, n)
  sol = (sol - ord("1")).astype(np.int32)
  given = (pz != ord("0")) & (pz != ord("."))
  wrong = (given & (pz.astype(np.int32) - ord("1") != sol)).any(1)
  if wrong.any():
    i = int(np.argmax(wrong))
    where, puzzle, solution = rows[i]
    c = int(np.argmax(given[i] & (pz[i].astype(np.int32) - ord("1") != sol[i])))
    raise ValueError(f"{where}: solution {solution!r} has {solution[c]} at cell {c} (row "
                     f"{c // size + 1}, column {c % size + 1}) where the puzzle gives "
                     f"{puzzle[c]}; expected the givens kept")
  valid = valid_rows(sol, size)
  if not valid.all():
    where, _, solution = rows[int(np.argmin(valid))]
    raise ValueError(f"{where}: solution {solution!r} breaks a row, column or box; expected a "
                     f"valid {size}x{size} sudoku")
  return {"tokens": sol, "prompt": given}


def from_strings(puzzles, solutions, size: int = 9, where: str = "from_strings") -> dict:
  """``{"tokens", "prompt"}`` from puzzle strings (``0`` or ``.`` blank) and their solutions;
  every row checked (errors name ``where`` and the row, counted from 1)."""
  puzzles, solutions = list(puzzles), list(solutions)
  if size not in BOXES:
    raise ValueError(f"{where}: size={size!r}; expected one of 4, 6, 9")
  if len(puzzles) != len(solutions):
    raise ValueError(f"{where}: {len(puzzles)} puzzles, {len(solutions)} solutions; expected "
                     f"as many of each")
  rows = [(f"{where}: row {i + 1}", *_strings(p, s, size, f"{where}: row {i + 1}"))
          for i, (p, s) in enumerate(zip(puzzles, solutions))]
  return _arrays(rows, size)


PUZZLE_COLUMNS = ("puzzle", "puzzles", "quizzes", "quiz", "question")
SOLUTION_COLUMNS = ("solution", "solutions", "answer")


def _columns(names: list[str], where: str) -> tuple[str, str]:
  low = {str(c).strip().lower(): c for c in names}
  pick = [next((low[c] for c in cands if c in low), None)
          for cands in (PUZZLE_COLUMNS, SOLUTION_COLUMNS)]
  if None in pick:
    raise ValueError(f"{where}: columns {list(names)}; expected a puzzle column "
                     f"({'/'.join(PUZZLE_COLUMNS)}) and a solution column "
                     f"({'/'.join(SOLUTION_COLUMNS)})")
  return pick[0], pick[1]


def load_puzzles(path_or_name: str, size: int = 9, limit: int | None = None,
                 split: str = "train") -> dict:
  """Puzzles with solutions as ``{"tokens", "prompt"}``, one puzzle per row:

  - a ``.csv`` file: a header naming a puzzle column (puzzle / quizzes / question) and a solution
    column (solution / solutions / answer), or no header and the puzzle and solution as the
    first two columns;
  - any other file: two strings per line separated by a comma or spaces (blank lines and lines
    starting with # skipped);
  - otherwise a Hugging Face ``datasets`` directory (``save_to_disk``) or hub name, its
    ``split``, when ``datasets`` is installed.

  Strings hold ``size * size`` characters, ``0`` or ``.`` blank. Every row is checked (length,
  characters, the solution valid and keeping the givens); errors name the file and its line."""
  if size not in BOXES:
    raise ValueError(f"{path_or_name}: size={size!r}; expected one of 4, 6, 9")
  if limit is not None:
    limit = base.check_int("sudoku", "limit", limit, 0)
  path = os.fspath(path_or_name)
  if os.path.isfile(path):
    rows = _read_file(path)
  else:
    rows = _read_dataset(path, split, limit)
  out = []
  for where, p, s in rows:
    if limit is not None and len(out) >= limit:
      break
    out.append((where, *_strings(p, s, size, where)))
  if not out:
    raise ValueError(f"{path}: no puzzles found; expected one puzzle and its solution per row")
  return _arrays(out, size)


def _looks_like_grid(s: str) -> bool:
  return bool(re.fullmatch(r"[0-9.]{16,}", s.strip()))


def _read_file(path: str):
  """Yields (where, puzzle, solution) with ``where`` = "path: line k"."""
  with base.open_text(path, newline="") as f:
    if path.lower().endswith(".csv"):
      reader = csv.reader(f)
      header = None
      for row in reader:
        k = reader.line_num
        if not row or not "".join(row).strip():
          continue
        if header is None and not _looks_like_grid(row[0]):
          header = row
          pc, sc = _columns(header, path)
          cols = (header.index(pc), header.index(sc))
          continue
        if header is None:
          header, cols = [], (0, 1)
        if len(row) <= max(cols):
          raise ValueError(f"{path}: line {k}: {len(row)} columns; expected at least "
                           f"{max(cols) + 1} (puzzle and solution)")
        yield f"{path}: line {k}", row[cols[0]], row[cols[1]]
    else:
      for k, line in enumerate(f, 1):
        if not line.strip() or line.lstrip().startswith("#"):
          continue
        parts = [p for p in re.split(r"[,\s]+", line.strip()) if p]
        if len(parts) != 2:
          raise ValueError(f"{path}: line {k}: {len(parts)} fields; expected two strings (puzzle "
                           f"and solution) separated by a comma or spaces")
        yield f"{path}: line {k}", parts[0], parts[1]


def _read_dataset(name: str, split: str, limit: int | None):
  try:
    import datasets  # pylint: disable=g-import-not-at-top  (optional, heavy)
  except ImportError:
    raise ValueError(f"{name}: no such file, and the `datasets` package is not installed to load "
                     f"it as a dataset (pip install datasets); expected a CSV or text "
                     f"file") from None
  if os.path.isdir(name):
    ds = datasets.load_from_disk(name)
    if isinstance(ds, datasets.DatasetDict):
      ds = ds[split]
  else:
    ds = datasets.load_dataset(name, split=split)
  pc, sc = _columns(list(ds.column_names), name)
  for i, ex in enumerate(ds):
    if limit is not None and i >= limit:
      return
    yield f"{name}: row {i + 1}", ex[pc], ex[sc]
