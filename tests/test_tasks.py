"""aogpt_jax.tasks (numpy only): the registry and options, deterministic generators, the train /
held-out split, the verifiers on hand-made rows, the sudoku solver and difficulty labels, and the
outside puzzle formats (files the tests write; no network)."""

import importlib.util
import json
import sys

import numpy as np
import pytest

from aogpt_jax import tasks
from aogpt_jax.tasks import sudoku

# Wikipedia's example puzzle (unique; naked and hidden singles solve it) and its solution.
EASY = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
EASY_SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"
# Inkala's "hardest sudoku": unique, singles alone get stuck.
HARD = "800000000003600000070090200050007000000045700000100030001000068008500010090000400"
HARD_SOLUTION = "812753649943682175675491283154237896369845721287169534521974368438526917796318452"
GRID4 = "1234341221434321"


def digits(s):
  return np.array([0 if ch in "0." else int(ch) for ch in s])


def tokens_of(s):
  return digits(s) - 1


TASKS = [("sudoku", {"size": 4}), ("sudoku", {"size": 6, "min_givens": 18, "max_givens": 24}),
         ("sudoku", {"size": 9}), ("star_graph", {"degree": 3, "path_len": 5, "num_nodes": 24}),
         ("star_graph", {"degree": 3, "path_len": 5, "num_nodes": 24, "encoding": "parents"})]


# ----------------------------------------------------------------------------------------------
# registry, options, generators

def test_registry_and_options():
  assert {"sudoku", "star_graph"} <= set(tasks.names())
  with pytest.raises(ValueError, match="'chess' is not registered; expected one of"):
    tasks.make("chess")
  with pytest.raises(ValueError, match=r"unknown option sizee=6; expected one of size"):
    tasks.make("sudoku", sizee=6)
  for kw, msg in [({"size": 5}, "size=5"), ({"size": 4, "min_givens": 9, "max_givens": 8},
                                             "max_givens=8"),
                  ({"difficulty": "hard"}, "difficulty='hard'"), ({"heldout_frac": 1.0},
                                                                   "heldout_frac=1.0"),
                  ({"unique": 1}, "unique=1")]:
    with pytest.raises(ValueError, match=msg):
      tasks.make("sudoku", **kw)
  with pytest.raises(ValueError, match=r"num_nodes=15; expected an integer >= 16"):
    tasks.make("star_graph", degree=3, path_len=5, num_nodes=15)
  for name, kw in TASKS:
    t = tasks.make(name, **kw)
    opts = t.options()
    assert json.loads(json.dumps(opts)) == opts and kw.items() <= opts.items()
    assert tasks.make(t.name, **opts).options() == opts


@pytest.mark.subprocess
def test_tasks_import_no_jax():
  import subprocess  # pylint: disable=g-import-not-at-top
  code = ("import sys; from aogpt_jax import tasks; tasks.make('sudoku').train_batch(0, 0, 2)\n"
          "assert not [m for m in sys.modules if m == 'jax' or m.startswith('flax')]")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("name,kw", TASKS)
def test_train_batch_deterministic_in_range_and_prompted(name, kw):
  t = tasks.make(name, **kw)
  a, b = t.train_batch(3, 7, 32), t.train_batch(3, 7, 32)
  assert a["tokens"].dtype == np.int32 and a["prompt"].dtype == bool
  assert a["tokens"].shape == a["prompt"].shape == (32, t.length)
  np.testing.assert_array_equal(a["tokens"], b["tokens"])
  np.testing.assert_array_equal(a["prompt"], b["prompt"])
  assert not np.array_equal(a["tokens"], t.train_batch(3, 8, 32)["tokens"])
  assert not np.array_equal(a["tokens"], t.train_batch(4, 7, 32)["tokens"])
  with pytest.raises(ValueError, match=r"seed / index -1; expected an integer >= 0"):
    t.train_batch(0, -1, 4)
  assert t.heldout(0, 0)["tokens"].shape == (0, t.length)
  assert a["tokens"].min() >= 0 and a["tokens"].max() < t.vocab_size
  assert t.verify(a["tokens"], a)["solved"].all()        # references are valid solutions
  if name == "sudoku":
    k = a["prompt"].sum(1)
    assert k.min() >= t.min_givens and k.max() <= t.max_givens and len(set(k)) > 1
  else:
    q = t.prompt_length
    assert a["prompt"][:, :q].all() and not a["prompt"][:, q:].any()
    np.testing.assert_array_equal(a["tokens"][:, q], a["tokens"][:, q - 2])    # path from start
    np.testing.assert_array_equal(a["tokens"][:, -1], a["tokens"][:, q - 1])   # ... to goal
    for row in a["tokens"]:                                  # distinct node labels, a star
      edges = t.edge_pairs(row)[0]
      assert len(set(edges.ravel())) == t.degree * t.path_len + 1
      assert np.sum(edges[:, 0] == row[q - 2]) == t.degree


def test_train_batch_is_fast():
  import time  # pylint: disable=g-import-not-at-top
  t = tasks.make("sudoku", size=9)
  t.train_batch(0, 0, 64)                                   # builds the grid pool once
  start = time.perf_counter()
  for i in range(20):
    t.train_batch(0, i, 64)
  assert (time.perf_counter() - start) / 20 < 0.02


@pytest.mark.parametrize("name,kw", TASKS)
def test_heldout_deterministic_prefix_and_disjoint_from_training(name, kw):
  t = tasks.make(name, **kw)
  h = t.heldout(0, 24 if name == "sudoku" and kw["size"] == 9 else 64)
  np.testing.assert_array_equal(h["tokens"][:10], t.heldout(0, 10)["tokens"])
  np.testing.assert_array_equal(h["prompt"][:10], t.heldout(0, 10)["prompt"])
  assert not np.array_equal(h["tokens"][:10], t.heldout(1, 10)["tokens"])
  assert t.verify(h["tokens"], h)["solved"].all()
  if name == "sudoku":
    held = {g.tobytes() for g in h["tokens"]}
    puzzles = {np.where(p, g, -1).tobytes() for g, p in zip(h["tokens"], h["prompt"])}
    assert len(puzzles) == len(h["tokens"])                 # distinct puzzles
  else:                                                     # the graph, whatever the edge order
    q = 2 * t.degree * t.path_len
    held = {np.sort(g[:q].reshape(-1, 2) @ [t.num_nodes, 1]).tobytes() for g in h["tokens"]}
  assert t.in_heldout(h["tokens"]).all()
  for i in range(100 if name != "sudoku" or kw["size"] == 4 else 30):
    tr = t.train_batch(i % 3, i, 64)
    assert not t.in_heldout(tr["tokens"]).any()
    for g, p in zip(tr["tokens"], tr["prompt"]):
      key = g.tobytes() if name == "sudoku" else np.sort(
          g[:q].reshape(-1, 2) @ [t.num_nodes, 1]).tobytes()
      assert key not in held
      if name == "sudoku":
        assert np.where(p, g, -1).tobytes() not in puzzles


def test_split_4x4_covers_all_grids_on_both_sides():
  grids = sudoku.all_grids(4)
  assert len(grids) == 288 and len({g.tobytes() for g in grids}) == 288
  t = tasks.make("sudoku", size=4)
  seen_train = {g.tobytes() for i in range(40) for g in t.train_batch(0, i, 64)["tokens"]}
  seen_held = {g.tobytes() for g in t.heldout(0, 300)["tokens"]}
  assert seen_train and seen_held and not seen_train & seen_held
  assert len(seen_train) + len(seen_held) == 288            # every grid on one side
  with pytest.raises(ValueError, match="heldout_frac=1e-07 leaves 0 of the 288"):
    tasks.make("sudoku", size=4, heldout_frac=1e-7)


def test_random_grids_are_valid_and_varied():
  for size in (6, 9):
    g = sudoku.random_grids(size, np.random.default_rng(0), 200)
    assert sudoku.valid_rows(g, size).all()
    assert len({r.tobytes() for r in g}) == 200


# ----------------------------------------------------------------------------------------------
# sudoku: verifier, solver, difficulty, held-out puzzles

def test_sudoku_verify_hand_made():
  for s, size in [(GRID4, 4), (EASY_SOLUTION, 9)]:
    t = tasks.make("sudoku", size=size)
    ref = tokens_of(s)[None]
    prompt = np.zeros_like(ref, bool)
    prompt[0, :size] = True                                 # the first row given
    puzzle = {"tokens": ref, "prompt": prompt}
    ok = t.verify(ref, puzzle)
    assert ok["solved"][0] and ok["valid"][0] and ok["givens_kept"][0]
    assert ok["cell_accuracy"][0] == 1.0
    swapped = ref.copy()                                    # swap two cells of the last row
    swapped[0, [-1, -2]] = swapped[0, [-2, -1]]
    v = t.verify(swapped, puzzle)
    assert not v["solved"][0] and not v["valid"][0] and v["givens_kept"][0]
    assert v["cell_accuracy"][0] == pytest.approx(1 - 2 / (size * size - size))
    relabel = (ref + 1) % size                              # still valid, every given changed
    v = t.verify(relabel, puzzle)
    assert v["valid"][0] and not v["givens_kept"][0] and not v["solved"][0]
    assert v["cell_accuracy"][0] == 0.0
    bad = ref.copy()
    bad[0, -1] = size                                       # out of range: not valid
    assert not t.verify(bad, puzzle)["valid"][0]
  with pytest.raises(ValueError, match=r"tokens has shape \(3, 15\); expected \[B, 16\]"):
    tasks.make("sudoku", size=4).verify(np.zeros((3, 15)), puzzle)


def _rule_cells_by_loops(grid, prompt, size):
  """The free cells whose digit is in range and once in its row, column and box, by loops."""
  br, bc = sudoku.BOXES[size]
  g = np.asarray(grid).reshape(size, size)
  ok = 0
  for i in np.flatnonzero(~np.asarray(prompt)):
    r, c = divmod(int(i), size)
    d = g[r, c]
    box = g[r - r % br:r - r % br + br, c - c % bc:c - c % bc + bc]
    ok += (0 <= d < size and (g[r] == d).sum() == 1 and (g[:, c] == d).sum() == 1
           and (box == d).sum() == 1)
  return ok / max(int((~np.asarray(prompt)).sum()), 1)


def test_sudoku_rule_cells_counts_any_solution():
  four = tokens_of(GRID4)[None]
  other = four.copy().reshape(4, 4)                         # the unavoidable rectangle swapped:
  other[[0, 0, 1, 1], [0, 2, 0, 2]] = other[[1, 1, 0, 0], [0, 2, 0, 2]]  # another solution
  other = other.reshape(1, 16)
  assert sudoku.valid_rows(other, 4).all() and (other != four).sum() == 4
  prompt = np.ones_like(four, bool)
  prompt[0, [0, 2, 4, 6]] = False
  t = tasks.make("sudoku", size=4)
  v = t.verify(other, {"tokens": four, "prompt": prompt})
  assert v["solved"][0] and v["cell_accuracy"][0] == 0.0 and v["rule_cells"][0] == 1.0
  t6 = tasks.make("sudoku", size=6)
  pz = t6.heldout(0, 24)
  rng = np.random.default_rng(0)
  noisy = np.where(rng.random(pz["tokens"].shape) < 0.2, rng.integers(0, 7, pz["tokens"].shape),
                   pz["tokens"])
  noisy = np.where(pz["prompt"], pz["tokens"], noisy)      # givens kept, some free cells wrong
  got = t6.verify(noisy, pz)["rule_cells"]
  want = [_rule_cells_by_loops(g, p, 6) for g, p in zip(noisy, pz["prompt"])]
  np.testing.assert_allclose(got, want)
  assert 0 < got.min() < 1 and got.max() <= 1
  noisy[0, np.argmax(pz["prompt"][0])] += 1                # a given changed: 0
  assert t6.verify(noisy, pz)["rule_cells"][0] == 0.0


def test_cell_valid_reward_accepts_any_solutions_digit():
  """``cell_valid`` (a per-cell reward, `Task.cell_rules`): every cell of another valid solution
  scores 1 where ``cell_correct`` scores the swapped cells 0; on noisy grids it is the loops'
  per-cell check; a changed given zeroes the row; a task without cell rules is one line."""
  from aogpt_jax.posttrain import rewards
  four = tokens_of(GRID4)[None]
  other = four.copy().reshape(4, 4)
  other[[0, 0, 1, 1], [0, 2, 0, 2]] = other[[1, 1, 0, 0], [0, 2, 0, 2]]
  other = other.reshape(1, 16)
  prompt = np.ones_like(four, bool)
  prompt[0, [0, 2, 4, 6]] = False
  pz = {"tokens": four, "prompt": prompt}
  t = tasks.make("sudoku", size=4)
  assert (rewards.get_reward("cell_valid")(other, pz, t) == 1).all()
  assert rewards.get_reward("cell_correct")(other, pz, t)[0, [0, 2, 4, 6]].sum() == 0
  t6 = tasks.make("sudoku", size=6)
  pz = t6.heldout(0, 12)
  rng = np.random.default_rng(1)
  noisy = np.where(rng.random(pz["tokens"].shape) < 0.2, rng.integers(0, 7, pz["tokens"].shape),
                   pz["tokens"])
  noisy = np.where(pz["prompt"], pz["tokens"], noisy)
  got = rewards.get_reward("cell_valid")(noisy, pz, t6)
  for g, row in zip(noisy, got):
    for i in range(36):
      one = np.zeros(36, bool)
      one[i] = True
      assert row[i] == _rule_cells_by_loops(g, ~one, 6), i
  assert 0 < got.mean() < 1
  noisy[0, np.argmax(pz["prompt"][0])] += 1
  assert (rewards.get_reward("cell_valid")(noisy, pz, t6)[0] == 0).all()
  star = tasks.make("star_graph", degree=2, path_len=2, num_nodes=8)
  rows = star.heldout(0, 2)
  with pytest.raises(ValueError, match=r"^rl.reward: 'cell_valid' needs a task with rules per "
                                       r"cell .* 'star_graph' has none"):
    rewards.get_reward("cell_valid")(rows["tokens"], rows, star)


def test_solver_counts_and_solves():
  count, sol = sudoku.solve(digits(EASY))
  assert count == 1 and "".join(map(str, sol)) == EASY_SOLUTION
  count, sol = sudoku.solve(digits(HARD).reshape(9, 9))
  assert count == 1 and sol.shape == (9, 9) and "".join(map(str, sol.ravel())) == HARD_SOLUTION
  two = digits(EASY_SOLUTION).reshape(9, 9)
  two[[3, 3, 4, 4], [5, 8, 5, 8]] = 0                       # an unavoidable rectangle (1s and 3s)
  assert sudoku.solve(two)[0] == 2 and sudoku.solve(two, limit=None)[0] == 2
  four = digits(GRID4).reshape(4, 4)
  four[[0, 0, 1, 1], [0, 2, 0, 2]] = 0
  assert sudoku.solve(four, limit=None)[0] == 2
  assert sudoku.solve(np.zeros(16, int), limit=None)[0] == 288
  broken = digits(EASY)
  broken[1] = 5                                             # two 5s in the first row
  assert sudoku.solve(broken) == (0, None)
  with pytest.raises(ValueError, match="has 80 cells"):
    sudoku.solve(np.zeros(80, int))


def test_difficulty_labels():
  assert sudoku.difficulty(digits(EASY)) == "propagation"
  assert sudoku.difficulty(digits(HARD)) == "search"
  row = {"tokens": tokens_of(EASY_SOLUTION), "prompt": digits(EASY) > 0}
  assert sudoku.difficulty(row) == "propagation"


@pytest.mark.parametrize("size,lo,hi", [(4, 4, 6), (6, 10, 16), (9, 24, 30)])
def test_heldout_puzzles_have_a_unique_solution_in_range(size, lo, hi):
  t = tasks.make("sudoku", size=size, min_givens=lo, max_givens=hi)
  h = t.heldout(5, 12)
  k = h["prompt"].sum(1)
  assert k.min() >= lo and k.max() <= hi
  for g, p in zip(h["tokens"], h["prompt"]):
    count, sol = sudoku.solve(np.where(p, g + 1, 0))
    assert count == 1 and np.array_equal(sol, g + 1)


def test_heldout_difficulty_filter_and_unreachable_options():
  t = tasks.make("sudoku", size=9, min_givens=22, max_givens=30, difficulty="search")
  h = t.heldout(0, 3)
  assert all(sudoku.difficulty({"tokens": g, "prompt": p}) == "search"
             for g, p in zip(h["tokens"], h["prompt"]))
  with pytest.raises(ValueError, match=r"found 0 of 256 held-out puzzles in 1000 tries"):
    tasks.make("sudoku", size=4, difficulty="search").heldout(0, 256)  # singles solve all 4x4
  # below the fewest givens of a one-solution puzzle: refused when the task is made (before
  # training, not minutes of tries at the first held-out eval)
  for size, least in sudoku.MIN_UNIQUE_GIVENS.items():
    with pytest.raises(ValueError, match=rf"max_givens={least - 1} with unique=True: no "
                       rf"{size}x{size} puzzle with fewer than {least} givens"):
      tasks.make("sudoku", size=size, min_givens=0, max_givens=least - 1)
    tasks.make("sudoku", size=size, min_givens=0, max_givens=least - 1, unique=False)
  h = tasks.make("sudoku", size=9, unique=False, min_givens=10, max_givens=12).heldout(0, 5)
  assert h["prompt"].sum(1).max() <= 12                      # no uniqueness asked: any count


def test_render():
  t = tasks.make("sudoku", size=4)
  prompt = np.zeros(16, bool)
  prompt[0] = True
  assert t.render(tokens_of(GRID4), prompt).splitlines() == [
      "[1] 2 | 3  4 ", " 3  4 | 1  2 ", "------+------", " 2  1 | 4  3 ", " 4  3 | 2  1 "]
  assert "[" not in tasks.make("sudoku", size=6).render(np.arange(36) % 6)


# ----------------------------------------------------------------------------------------------
# star graph: verifier

def test_star_graph_verify_hand_made():
  t = tasks.make("star_graph", degree=2, path_len=2, num_nodes=6)
  # center 0; arms 0>1>2 and 0>3>4; goal 4; edges in a shuffled order
  row = np.array([3, 4, 0, 1, 1, 2, 0, 3, 0, 4, 0, 3, 4])
  assert t.length == 13
  puzzle = {"tokens": row[None], "prompt": (np.arange(13) < 10)[None]}
  ok = t.verify(row[None], puzzle)
  assert ok["solved"][0] and ok["first_step_correct"][0] and ok["cell_accuracy"][0] == 1.0
  assert t.render(row).splitlines()[-1] == "path: 0 -> 3 -> 4"
  wrong_arm = row.copy()
  wrong_arm[10:] = [0, 1, 4]             # 1 > 4 is no edge; the first step is the other arm
  v = t.verify(wrong_arm[None], puzzle)
  assert not v["solved"][0] and not v["path_valid"][0] and not v["first_step_correct"][0]
  assert v["givens_kept"][0] and v["cell_accuracy"][0] == pytest.approx(2 / 3)
  skip = row.copy()
  skip[10:] = [0, 5, 4]                  # 5 is no node of the graph
  assert not t.verify(skip[None], puzzle)["path_valid"][0]
  backwards = row.copy()
  backwards[10:] = [0, 4, 4]             # (0, 4) is no edge, nor is (4, 4)
  assert not t.verify(backwards[None], puzzle)["solved"][0]
  reverse_edge = row.copy()
  reverse_edge[:2] = [4, 3]              # the prompt changed: edge 3 > 4 reversed
  v = t.verify(reverse_edge[None], puzzle)
  assert v["path_valid"][0] and not v["givens_kept"][0] and not v["solved"][0]
  wrong_goal = row.copy()
  wrong_goal[10:] = [0, 1, 2]            # a valid walk, to the other leaf
  v = t.verify(wrong_goal[None], puzzle)
  assert not v["path_valid"][0] and not v["first_step_correct"][0]


def test_star_graph_parents_table_is_the_same_graph():
  """``encoding="parents"``: the graph of the hand-made row above as a table (cell v: v's
  parent, 6 = none), verified alike; generated rows are the edge list's graphs, goals, paths and
  held-out split, tabled."""
  t = tasks.make("star_graph", degree=2, path_len=2, num_nodes=6, encoding="parents")
  assert (t.length, t.vocab_size, t.prompt_length) == (11, 7, 8)
  row = np.array([6, 0, 1, 0, 3, 6, 0, 4, 0, 3, 4])
  puzzle = {"tokens": row[None], "prompt": (np.arange(11) < 8)[None]}
  ok = t.verify(row[None], puzzle)
  assert ok["solved"][0] and ok["first_step_correct"][0]
  assert t.render(row).splitlines()[0] == "edges: 0>1 1>2 0>3 3>4"
  wrong = row.copy()
  wrong[8:] = [0, 1, 4]                  # 1 > 4 is no edge
  assert not t.verify(wrong[None], puzzle)["path_valid"][0]
  changed = row.copy()
  changed[2] = 3                         # the table changed: 2's parent is now 3
  assert not t.verify(changed[None], puzzle)["givens_kept"][0]
  with pytest.raises(ValueError, match=r"encoding='matrix'; expected one of 'edges', 'parents'"):
    tasks.make("star_graph", encoding="matrix")
  opts = {"degree": 3, "path_len": 4, "num_nodes": 16}
  a, b = tasks.make("star_graph", **opts), tasks.make("star_graph", encoding="parents", **opts)
  for rows in (lambda x: x.train_batch(1, 2, 64), lambda x: x.heldout(0, 64)):
    ea, eb = rows(a)["tokens"], rows(b)["tokens"]
    np.testing.assert_array_equal(ea[:, a.prompt_length - 2:], eb[:, b.prompt_length - 2:])
    np.testing.assert_array_equal(a.split_keys(ea), b.split_keys(eb))
    table = eb[:, :16]
    for r in range(64):
      for u, v in a.edge_pairs(ea[r]).reshape(-1, 2):
        assert table[r, v] == u
      assert (table[r] == 16).sum() == 16 - 12


def test_star_graph_first_step_needs_the_goal():
  """Following any edge from the start (the Clever Hans shortcut) gets the first step right
  about 1/degree of the time."""
  t = tasks.make("star_graph", degree=4, path_len=3, num_nodes=20)
  h = t.heldout(0, 400)
  rng = np.random.default_rng(0)
  guess = h["tokens"].copy()
  q = 2 * t.degree * t.path_len + 2
  for row in guess:
    edges = row[:q - 2].reshape(-1, 2)
    row[q + 1] = rng.choice(edges[edges[:, 0] == row[q - 2], 1])
  rate = t.verify(guess, h)["first_step_correct"].mean()
  assert 0.18 < rate < 0.32


# ----------------------------------------------------------------------------------------------
# outside puzzles

def test_strings_round_trip():
  data = sudoku.from_strings([EASY.replace("0", ".")], [EASY_SOLUTION])
  assert data["prompt"].sum() == sum(ch != "0" for ch in EASY)
  assert sudoku.to_string(data["tokens"][0], data["prompt"][0]) == EASY
  assert sudoku.to_string(data["tokens"][0]) == EASY_SOLUTION
  with pytest.raises(ValueError, match="as many of each"):
    sudoku.from_strings([EASY], [])


def test_load_csv_with_header_text_and_blanks(tmp_path):
  csv_path = tmp_path / "p.csv"
  csv_path.write_text(f"id,quizzes,solutions\n1,{EASY},{EASY_SOLUTION}\n"
                      f"2,{HARD.replace('0', '.')},{HARD_SOLUTION}\n")
  a = sudoku.load_puzzles(str(csv_path))
  assert a["tokens"].shape == (2, 81) and a["tokens"].dtype == np.int32
  assert sudoku.to_string(a["tokens"][1], a["prompt"][1]) == HARD
  assert sudoku.load_puzzles(csv_path, limit=1)["tokens"].shape == (1, 81)
  bare = tmp_path / "bare.csv"
  bare.write_text(f"{EASY},{EASY_SOLUTION}\n")
  np.testing.assert_array_equal(sudoku.load_puzzles(str(bare))["tokens"], a["tokens"][:1])
  txt = tmp_path / "p.txt"
  txt.write_text(f"# puzzle solution\n{EASY}  {EASY_SOLUTION}\n\n{HARD},{HARD_SOLUTION}\n")
  b = sudoku.load_puzzles(str(txt))
  np.testing.assert_array_equal(a["tokens"], b["tokens"])
  np.testing.assert_array_equal(a["prompt"], b["prompt"])
  small = tmp_path / "small.txt"
  small.write_text("1.3.3.1.2.4..3.1 1234341221434321\n")
  assert sudoku.load_puzzles(str(small), size=4)["prompt"].sum() == 8
  t = tasks.make("sudoku", size=9)
  assert t.verify(a["tokens"], a)["solved"].all()


@pytest.mark.parametrize("line,msg", [
    (f"{EASY[:-1]},{EASY_SOLUTION}", "line 3: puzzle .* has 80 characters; expected 81"),
    (f"{EASY[:-1]}x,{EASY_SOLUTION}", r"line 3: puzzle .* holds 'x'; expected digits 1-9"),
    (f"{EASY},{EASY_SOLUTION[:-1]}0", r"line 3: solution .* holds '0'; expected digits 1-9 only"),
    (f"{EASY},{EASY_SOLUTION[1:2]}{EASY_SOLUTION[0]}{EASY_SOLUTION[2:]}",
     r"line 3: solution .* has 3 at cell 0 \(row 1, column 1\) where the puzzle gives 5"),
    (f"{EASY.replace('5', '0')},{EASY_SOLUTION.replace('5', '6', 1)}",
     "line 3: solution .* breaks a row, column or box"),
    (EASY, r"line 3: 1 columns; expected at least 2"),
])
def test_load_bad_rows_name_the_line(tmp_path, line, msg):
  path = tmp_path / "bad.csv"
  path.write_text(f"quizzes,solutions,x\n{EASY},{EASY_SOLUTION},1\n{line}\n")
  with pytest.raises(ValueError, match=f"bad.csv: {msg}"):
    sudoku.load_puzzles(str(path))


def test_load_errors(tmp_path):
  path = tmp_path / "cols.csv"
  path.write_text(f"a,b\n{EASY},{EASY_SOLUTION}\n")
  with pytest.raises(ValueError, match=r"columns \['a', 'b'\]; expected a puzzle column"):
    sudoku.load_puzzles(str(path))
  path = tmp_path / "three.txt"
  path.write_text(f"{EASY} {EASY_SOLUTION} 7\n")
  with pytest.raises(ValueError, match="line 1: 3 fields; expected two strings"):
    sudoku.load_puzzles(str(path))
  if importlib.util.find_spec("datasets") is None:
    with pytest.raises(ValueError, match="no such file, and the `datasets` package is not"):
      sudoku.load_puzzles(str(tmp_path / "missing"))


def test_load_without_datasets_is_one_clear_error(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "datasets", None)        # import datasets -> ImportError
  with pytest.raises(ValueError, match=r"missing: no such file, and the `datasets` package is "
                     r"not installed to load it as a dataset \(pip install datasets\)"):
    sudoku.load_puzzles(str(tmp_path / "missing"))


def test_load_dataset_directory(tmp_path):
  datasets = pytest.importorskip("datasets")
  datasets.Dataset.from_dict({"puzzle": [EASY], "solution": [EASY_SOLUTION]}).save_to_disk(
      str(tmp_path / "ds"))
  a = sudoku.load_puzzles(str(tmp_path / "ds"))
  assert sudoku.to_string(a["tokens"][0], a["prompt"][0]) == EASY
