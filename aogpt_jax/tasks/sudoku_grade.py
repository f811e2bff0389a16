"""Sudoku difficulty, measured: the guess count of a propagate-then-backtrack solver, the field's
buckets, and minimal puzzles.

The grade (`guesses`): propagate naked and hidden singles to a fixpoint (a cell with no
candidate, or a digit with no place in a row, column or box, is a contradiction); if cells are
left, branch on the empty cell with the fewest candidates (ties: the lowest cell index), trying
its digits in ascending order, each recursively propagated. Every digit tried at a branching
cell counts as one guess, until the first solution: a puzzle that singles solve has 0 guesses,
one whose first branch guesses right has 1. This is the count the public reproductions of
"diffusion vs autoregression on hard Sudoku" grade Sudoku-Extreme by (a backtracking solver's
guesses), with their buckets `BUCKETS`: 0, 1-4, 5-99, 100+. The grade is deterministic (a
function of the puzzle only); it is the solver's cost, not a human technique rating.

Minimal puzzles (`minimal_prompt`): remove the given cells of a solution grid one at a time in a
random order, keeping a cell given when another digit would fit there (the puzzle would have two
solutions); one pass leaves a *minimal* puzzle: every given is necessary (removing any one
leaves several solutions), since removing cells only adds solutions. 9x9 passes end at about
20-27 givens; `Sudoku(..., min_givens=17)` asks for minimal held-out puzzles.
"""

from __future__ import annotations

import functools

import numpy as np

BOXES = {4: (2, 2), 6: (2, 3), 9: (3, 3)}

BUCKETS = ("0", "1-4", "5-99", "100+")
_BOUNDS = {"0": (0, 0), "1-4": (1, 4), "5-99": (5, 99), "100+": (100, None)}


def bucket(guess_count: int) -> str:
  """The field's bucket of a guess count: "0", "1-4", "5-99" or "100+"."""
  g = int(guess_count)
  if g < 0:
    raise ValueError(f"guess count {g}; expected >= 0")
  return next(b for b, (lo, hi) in _BOUNDS.items() if g >= lo and (hi is None or g <= hi))


def bounds(name: str) -> tuple[int, int | None]:
  """(fewest, most or None) guesses of bucket ``name``."""
  if name not in _BOUNDS:
    raise ValueError(f"difficulty bucket {name!r}; expected one of {', '.join(BUCKETS)}")
  return _BOUNDS[name]


@functools.lru_cache(maxsize=None)
def units(size: int) -> np.ndarray:
  """int [3 * size, size]: the cell indices of each row, column and box."""
  br, bc = BOXES[size]
  idx = np.arange(size * size).reshape(size, size)
  boxes = [idx[r:r + br, c:c + bc].ravel() for r in range(0, size, br) for c in range(0, size, bc)]
  return np.concatenate([idx, idx.T, np.stack(boxes)])


@functools.lru_cache(maxsize=None)
def cell_units(size: int) -> tuple[tuple[int, int, int], ...]:
  """Per cell, the indices of its row, column and box among `units`."""
  br, bc = BOXES[size]
  return tuple((r, size + c, 2 * size + (r // br) * (size // bc) + c // bc)
               for r in range(size) for c in range(size))


def parse_digits(grid, what: str = "grid") -> tuple[list[int], int, tuple]:
  """(cells as a flat list of digits, size, the grid's shape) of a digit grid (0 = blank)."""
  a = np.asarray(grid)
  n = a.size
  size = int(round(n ** 0.5))
  if size not in BOXES or size * size != n:
    raise ValueError(f"sudoku {what} has {n} cells; expected 16, 36 or 81")
  if a.min() < 0 or a.max() > size:
    raise ValueError(f"sudoku {what} holds values outside 0..{size} (0 = blank)")
  return [int(v) for v in a.ravel()], size, a.shape


@functools.lru_cache(maxsize=None)
def _geometry(size: int):
  return units(size).tolist(), cell_units(size)


def used_digits(cells: list[int], size: int) -> list[int] | None:
  """Per unit (`units`), the bit mask of the digits its written cells hold; None when a digit
  stands twice in a unit."""
  used, cu = [0] * (3 * size), cell_units(size)
  for i, v in enumerate(cells):
    if v:
      bit = 1 << (v - 1)
      r, c, b = cu[i]
      if (used[r] | used[c] | used[b]) & bit:
        return None
      used[r] |= bit
      used[c] |= bit
      used[b] |= bit
  return used


def _propagate(cells: list[int], size: int, unit_cells, cu) -> list[int] | None:
  """Naked and hidden singles to a fixpoint; ``cells`` is modified in place and returned, or
  None on a contradiction."""
  full = (1 << size) - 1
  used = used_digits(cells, size)
  if used is None:
    return None

  def place(i, d):
    bit = 1 << (d - 1)
    r, c, b = cu[i]
    if (used[r] | used[c] | used[b]) & bit:
      return False
    cells[i] = d
    used[r] |= bit
    used[c] |= bit
    used[b] |= bit
    return True

  while True:
    placed = False
    cand = [0] * len(cells)
    for i, v in enumerate(cells):
      if not v:
        r, c, b = cu[i]
        m = full & ~(used[r] | used[c] | used[b])
        if not m:
          return None
        cand[i] = m
        if not m & (m - 1):
          if not place(i, m.bit_length()):
            return None
          placed = True
    if placed:
      continue
    for u, members in enumerate(unit_cells):
      missing = full & ~used[u]
      while missing:
        bit = missing & -missing
        missing ^= bit
        where = [i for i in members if not cells[i] and cand[i] & bit]
        if not where:
          return None
        if len(where) == 1 and not used[u] & bit:
          if not place(where[0], bit.bit_length()):
            return None
          placed = True
    if not placed:
      return cells


def _digits(puzzle) -> tuple[list[int], int]:
  if isinstance(puzzle, str):       # "8000...0400": digits, 0 or . for a blank
    puzzle = np.array([0 if c in "0." else int(c) for c in puzzle.strip()])
  if isinstance(puzzle, dict):
    tok, prm = np.asarray(puzzle["tokens"]).ravel(), np.asarray(puzzle["prompt"]).ravel()
    puzzle = np.where(prm, tok + 1, 0)
  cells, size, _ = parse_digits(puzzle, "puzzle")
  return cells, size


def _dfs(cells: list[int], size: int, *, solutions: int | None, guess_limit: int | None = None,
         forbid: tuple[int, int] = (-1, 0)) -> tuple[int, int]:
  """(solutions found, guesses made) by singles propagation plus fewest-candidates backtracking
  (module docstring), stopping after ``solutions`` solutions (None: all) or ``guess_limit``
  guesses; ``forbid=(cell, digit)`` bars that digit there."""
  unit_cells, cu = _geometry(size)
  full = (1 << size) - 1
  found = count = 0

  class _Stop(Exception):
    pass

  def rec(cells):
    nonlocal found, count
    if _propagate(cells, size, unit_cells, cu) is None or (
        forbid[0] >= 0 and cells[forbid[0]] == forbid[1]):
      return
    used = used_digits(cells, size)     # consistent: propagation checked it
    best, best_m, best_n = -1, 0, size + 1
    for i, v in enumerate(cells):
      if not v:
        r, c, b = cu[i]
        m = full & ~(used[r] | used[c] | used[b])
        if i == forbid[0]:
          m &= ~(1 << (forbid[1] - 1))
        if m.bit_count() < best_n:
          best, best_m, best_n = i, m, m.bit_count()
    if best < 0:
      found += 1
      if solutions is not None and found >= solutions:
        raise _Stop
      return
    for d in range(1, size + 1):
      if best_m >> (d - 1) & 1:
        count += 1
        if guess_limit is not None and count >= guess_limit:
          raise _Stop
        child = list(cells)
        child[best] = d
        rec(child)

  try:
    rec(list(cells))
  except _Stop:
    pass
  return found, count


def guesses(puzzle, limit: int | None = None) -> int:
  """The guess count of ``puzzle`` (module docstring): a digit grid (0 = blank, as
  `sudoku.solve` takes), a string of digits (0 or . blank) or one row ``{"tokens", "prompt"}``
  (0-based tokens, the given mask). ``limit``: stop counting there (returns ``limit``). Raises
  ValueError when the puzzle has no solution (contradictory givens included)."""
  cells, size = _digits(puzzle)
  found, count = _dfs(cells, size, solutions=1, guess_limit=limit)
  if not found and (limit is None or count < limit):
    raise ValueError("sudoku puzzle has no solution (its givens contradict each other or "
                     "leave no way to fill the grid); expected a solvable puzzle")
  return count


def count_solutions(cells: list[int], size: int, limit: int = 2,
                    forbid: tuple[int, int] = (-1, 0)) -> int:
  """Solutions of ``cells`` (digits, 0 = blank) counted up to ``limit``, singles propagated at
  every node; ``forbid=(cell, digit)`` bars that digit there."""
  return _dfs(cells, size, solutions=limit, forbid=forbid)[0]


def grade_rows(puzzles: dict, limit: int | None = 10_000) -> np.ndarray:
  """int64 [R]: the guess count of each row of ``{"tokens", "prompt"}`` ([R, n], 0-based)."""
  tok, prm = np.asarray(puzzles["tokens"]), np.asarray(puzzles["prompt"], bool)
  return np.array([guesses(np.where(p, t + 1, 0), limit) for t, p in zip(tok, prm)], np.int64)


def buckets(guess_counts) -> list[str]:
  return [bucket(g) for g in np.asarray(guess_counts).ravel()]


def minimal_prompt(grid_digits: np.ndarray, rng: np.random.Generator,
                   target: int = 0) -> np.ndarray:
  """bool [n]: the givens of a puzzle of ``grid_digits`` (a solved grid, digits 1..size, [n])
  with one solution, made by one random removal pass (module docstring); stops at ``target``
  givens if it gets there first (0: minimal)."""
  cells = [int(v) for v in np.asarray(grid_digits).ravel()]
  n = len(cells)
  size = int(round(n ** 0.5))
  givens = n
  for c in rng.permutation(n):
    if givens <= target:
      break
    d = cells[c]
    cells[c] = 0
    if count_solutions(cells, size, 1, forbid=(int(c), d)):
      cells[c] = d      # another digit fits there: the cell stays given
    else:
      givens -= 1
  return np.array(cells) > 0


def is_minimal(puzzle) -> bool:
  """True when ``puzzle`` (digits, 0 = blank) has one solution and removing any given leaves
  several (brute force over the givens: the test's independent check of `minimal_prompt`)."""
  cells, size = _digits(puzzle)
  if count_solutions(cells, size) != 1:
    return False
  for i, v in enumerate(cells):
    if v:
      cells[i] = 0
      several = count_solutions(cells, size) > 1
      cells[i] = v
      if not several:
        return False
  return True
