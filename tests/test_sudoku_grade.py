"""The Sudoku grader (`tasks.sudoku_grade`): its guess count against an independent brute-force
count, its buckets, minimal puzzles, bucket selection of held-out puzzles, hard training mixtures
and the per-bucket solve summary."""

import numpy as np
import pytest

from aogpt_jax.evaluation import solve as solve_lib
from aogpt_jax.tasks import sudoku, sudoku_grade

# Arto Inkala's 2012 puzzle: singles stall at once; a published 17-given puzzle that singles
# solve alone.
INKALA = "800000000003600000070090200050007000000045700000100030001000068008500010090000400"
SEVENTEEN = "000000010400000000020000000000050407008000300001090000300400200050100000000806000"


def _grid(s):
  return np.array([int(c) for c in s])


def _reference_guesses(cells, size):
  """An independent count: singles by the package's `sudoku.singles` (no contradiction check:
  a dead end shows as a cell with no candidate), then the fewest-candidates cell (lowest index
  on ties), digits ascending, one guess per digit tried."""
  count = 0
  units = sudoku.units(size)

  def cands(c):
    out = []
    for i in range(size * size):
      if c[i]:
        out.append(set())
        continue
      seen = {c[j] for u in units if i in u for j in u}
      out.append(set(range(1, size + 1)) - seen)
    return out

  def consistent(c):
    for u in units:
      vals = [c[j] for j in u if c[j]]
      if len(vals) != len(set(vals)):
        return False
    return True

  def rec(c):
    nonlocal count
    prev = None
    while prev != c:     # singles to a fixpoint, checking for contradictions each round
      prev = c
      if not consistent(c):
        return False
      cs = cands(c)
      if any(not c[i] and not cs[i] for i in range(len(c))):
        return False
      for u in units:
        for d in range(1, size + 1):
          if d not in [c[j] for j in u] and not any(d in cs[j] for j in u):
            return False
      c = sudoku.singles(c, size)
    if not consistent(c):
      return False
    cs = cands(c)
    empty = [i for i in range(len(c)) if not c[i]]
    if not empty:
      return True
    i = min(empty, key=lambda j: (len(cs[j]), j))
    for d in sorted(cs[i]):
      count += 1
      child = list(c)
      child[i] = d
      if rec(child):
        return True
    return False

  assert rec(list(cells))
  return count


def test_guesses_match_an_independent_count():
  rng = np.random.default_rng(3)
  counts = []
  for size in (4, 6):
    for g in sudoku.random_grids(size, rng, 12) + 1:
      keep = rng.random(size * size) < (0.25 if size == 4 else 0.3)
      puzzle = np.where(keep, g, 0)
      mine = sudoku_grade.guesses(puzzle)
      assert mine == _reference_guesses([int(v) for v in puzzle], size), puzzle
      counts.append(mine)
  assert max(counts) > 1          # the sample branches (else the comparison proves little)
  assert sudoku_grade.guesses(_grid(INKALA)) == _reference_guesses([int(v) for v in _grid(INKALA)], 9)


def test_known_puzzles_buckets_and_singles():
  assert sudoku_grade.guesses(_grid(INKALA)) >= 5
  assert sudoku_grade.guesses(_grid(SEVENTEEN)) == 0
  assert sudoku.difficulty(_grid(SEVENTEEN)) == "propagation"
  assert [sudoku_grade.bucket(g) for g in (0, 1, 4, 5, 99, 100, 10**6)] == [
      "0", "1-4", "1-4", "5-99", "5-99", "100+", "100+"]
  assert sudoku_grade.guesses(_grid(INKALA), limit=3) == 3
  bad = _grid(INKALA).copy()
  bad[1] = 8                      # a second 8 in the first row
  with pytest.raises(ValueError, match="no solution"):
    sudoku_grade.guesses(bad)
  with pytest.raises(ValueError, match="difficulty bucket 'hard'"):
    sudoku_grade.bounds("hard")


def test_grade_agrees_with_difficulty_on_heldout_rows():
  t = sudoku.Sudoku(size=6, min_givens=8, max_givens=12)
  rows = t.heldout(0, 200)     # about 1 in 40 needs a guess
  g = t.grade(rows)
  d = np.array([sudoku.difficulty({"tokens": a, "prompt": b})
                for a, b in zip(rows["tokens"], rows["prompt"])])
  assert ((g > 0) == (d == "search")).all() and (g > 0).any() and (g == 0).any()


def _minimal(puzzle) -> bool:
  """Minimal by the package's other solver (`sudoku.solve`): one solution, and several once any
  given is removed."""
  if sudoku.solve(puzzle)[0] != 1:
    return False
  for i in np.flatnonzero(puzzle):
    p = puzzle.copy()
    p[i] = 0
    if sudoku.solve(p)[0] == 1:
      return False
  return True


def test_minimal_prompts_are_minimal_and_unique():
  rng = np.random.default_rng(0)
  for size in (6, 9):
    grid = sudoku.random_grids(size, rng, 1)[0] + 1
    prompt = sudoku_grade.minimal_prompt(grid, rng)
    assert _minimal(np.where(prompt, grid, 0))
    assert sudoku_grade.is_minimal(np.where(prompt, grid, 0))
  assert not sudoku_grade.is_minimal(grid) and not _minimal(grid)   # a full grid is not


def test_heldout_by_bucket_and_hard_training_rows():
  t = sudoku.Sudoku(size=6, min_givens=8, max_givens=12, difficulty="1-4")
  rows = t.heldout(0, 6)
  assert all(1 <= g <= 4 for g in t.grade(rows))
  with pytest.raises(ValueError, match="difficulty='hard'"):
    sudoku.Sudoku(size=6, difficulty="hard")
  with pytest.raises(ValueError, match="hard_frac=1.5"):
    sudoku.Sudoku(size=6, hard_frac=1.5)
  h = sudoku.Sudoku(size=6, hard_frac=0.5)
  b = h.train_batch(0, 3, 8)
  again = h.train_batch(0, 3, 8)
  assert (b["prompt"] == again["prompt"]).all()          # a pure function of its arguments
  for i in range(4):                                     # the hard half: minimal, unique
    assert _minimal(np.where(b["prompt"][i], b["tokens"][i] + 1, 0))
  plain = sudoku.Sudoku(size=6).train_batch(0, 3, 8)
  assert (plain["tokens"] == b["tokens"]).all()          # the same grids, other givens


def test_solve_summary_by_bucket():
  t = sudoku.Sudoku(size=6, min_givens=8, max_givens=12)
  rows = t.heldout(1, 12)
  g = t.grade(rows)
  solved = np.arange(12) % 3 == 0
  out = [dict() for _ in range(12)]
  b = solve_lib.by_bucket(t, rows["tokens"], rows["prompt"], solved, out)
  assert sum(v["rows"] for v in b.values()) == 12
  for name, v in b.items():
    sel = np.array([sudoku_grade.bucket(x) == name for x in g])
    assert v["rows"] == sel.sum() and v["count"] == solved[sel].sum()
  assert [r["guesses"] for r in out] == g.tolist()
  line = solve_lib.bucket_text({"buckets": b})
  assert line.startswith("; solved by guesses: ")
