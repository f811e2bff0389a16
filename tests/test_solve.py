"""Solving a task's puzzles (evaluation/solve.py, ``--mode=solve``): every given kept, the
reported rate is the verifier's on the written rows, the interval, early-error bookkeeping, the
files (never overwritten) and the command line on a short task run."""

import json
import pathlib
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import tasks
from aogpt_jax.evaluation import solve as solve_lib
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.sampling import SampleSettings
from helpers import trainer as trainer_helpers

TASK = tasks.make("sudoku", size=4, min_givens=5, max_givens=8)


@pytest.fixture(scope="module")
def model():
  cfg = model_lib.ModelConfig(vocab_size=64, valid_vocab_size=4, block_size=16, n_layer=1,
                              n_head=2, n_embd=32, target_dim=8, position_init="grid:4,4,2,2")
  return model_lib.AOGPT(cfg, rngs=nnx.Rngs(0))


def _check_rows(res, puzzles):
  ref, given = puzzles["tokens"], puzzles["prompt"]
  out = np.array([r["output"] for r in res.rows])
  assert out.shape == ref.shape
  np.testing.assert_array_equal(out[given], ref[given])               # every given kept
  for r, row in enumerate(res.rows):
    assert sorted(row["order"]) == list(range(TASK.length))           # every cell written once
    assert set(row["order"][:given[r].sum()]) == set(np.flatnonzero(given[r]))
  again = TASK.verify(out, puzzles)                                   # the rate, recomputed
  assert res.summary["solved"]["count"] == int(again["solved"].sum())
  assert [row["solved"] for row in res.rows] == again["solved"].tolist()
  np.testing.assert_allclose(res.summary["cell_accuracy"], again["cell_accuracy"].mean())


@pytest.mark.parametrize("settings", [
    dict(method="diffusion", order="random", steps=16),
    dict(method="diffusion", order="l2r", steps=16),
    dict(method="diffusion", order="random", steps=4),
    dict(method="adaptive", policy="max_prob", steps=16),
    dict(method="adaptive", policy="threshold", threshold=0.5),
], ids=lambda s: "-".join(str(v) for v in s.values()))
def test_solve_keeps_givens_and_reports_the_verifiers_rate(model, settings):
  puzzles = TASK.heldout(0, 12)
  s = SampleSettings(length=16, greedy=True, **settings)
  res = solve_lib.solve(model, TASK, puzzles, s, key=jax.random.key(0), batch_size=5,
                        warm=False)
  _check_rows(res, puzzles)
  assert res.summary["rows"] == 12 and 0 <= res.summary["solved"]["low"]
  assert 1 <= res.summary["steps_mean"] <= 16
  # The result does not depend on the batch size.
  res2 = solve_lib.solve(model, TASK, puzzles, s, key=jax.random.key(0), batch_size=12,
                         warm=False)
  assert [r["output"] for r in res.rows] == [r["output"] for r in res2.rows]


@pytest.mark.parametrize("method", ["encoder", "adaptive"])
def test_solve_with_the_encoder_mdm(method):
  from aogpt_jax.model import encoder as encoder_lib
  enc = encoder_lib.make_encoder(model_lib.ModelConfig(
      vocab_size=64, valid_vocab_size=4, block_size=16, n_layer=1, n_head=2, n_embd=32,
      target_dim=8), rngs=nnx.Rngs(0))
  puzzles = TASK.heldout(0, 6)
  res = solve_lib.solve(enc, TASK, puzzles, SampleSettings(length=16, greedy=True, method=method),
                        key=jax.random.key(0), warm=False)
  _check_rows(res, puzzles)
  answer = 16 - puzzles["prompt"].sum(1)
  assert [r["steps"] for r in res.rows] == answer.tolist()     # one cell per step


def test_early_errors_and_interval_against_hand_made_rows():
  ref = np.array([[0, 1, 2, 3], [0, 1, 2, 3]])
  given = np.array([[True, False, False, False], [False, False, True, True]])
  out = np.array([[0, 1, 0, 3], [1, 1, 2, 3]])
  order = np.array([[0, 3, 1, 2], [2, 3, 1, 0]])
  correct, first = solve_lib.early_errors(out, ref, given, order)
  # row 0 writes 3 (right), 1 (right), 2 (wrong); row 1 writes 1 (right), 0 (wrong)
  assert correct.tolist() == [[True, True, False], [True, False, False]]
  assert first.tolist() == [2, 1]
  lo, hi = solve_lib.wilson(0, 50)
  assert lo == 0.0 and 0.05 < hi < 0.09
  lo, hi = solve_lib.wilson(25, 50)
  assert lo < 0.5 < hi and abs((lo + hi) / 2 - 0.5) < 1e-9


def test_bad_puzzles_are_one_line(model):
  s = SampleSettings(length=16, greedy=True, method="adaptive")
  bad = {"tokens": np.zeros((2, 9), np.int32), "prompt": np.zeros((2, 9), bool)}
  with pytest.raises(ValueError, match=r"^solve.puzzles: expected tokens and prompt of shape"):
    solve_lib.solve(model, TASK, bad, s)
  with pytest.raises(ValueError, match=r"^sample.length: task 'sudoku' rows are 16"):
    solve_lib.solve(model, TASK, TASK.heldout(0, 2), SampleSettings(length=12))


def test_a_verifier_that_raises_on_the_outputs_is_one_line(model, monkeypatch):
  task = tasks.make("sudoku", size=4, min_givens=5, max_givens=8)

  def verify(tokens, puzzle):
    raise IndexError("index 16 is out of bounds")

  monkeypatch.setattr(task, "verify", verify)
  s = SampleSettings(length=16, greedy=True, method="diffusion", order="random", steps=16)
  with pytest.raises(ValueError) as e:
    solve_lib.solve(model, task, TASK.heldout(0, 12), s, batch_size=5, warm=False)
  assert str(e.value) == ("task 'sudoku': its verifier raised IndexError: index 16 is out of "
                          "bounds on the model's outputs")


@pytest.mark.slow
@pytest.mark.subprocess
def test_solve_mode_on_a_short_task_run(tmp_path):
  wd = tmp_path / "run"
  base = ["python", "-m", "aogpt_jax.main", "--config=configs/sudoku.py:tiny", f"--workdir={wd}",
          "--config.model.n_layer=1", "--config.model.n_embd=32", "--config.model.n_head=2",
          "--config.model.target_dim=8", "--config.batch_size=8", "--config.eval_every=0",
          "--config.log_every=2", "--config.task.heldout_count=8"]
  base[0] = sys.executable
  trainer_helpers.run(base + ["--config.total_steps=4", "--config.checkpoint_every=4"],
                      tmp_path / "train.log")
  solve = base + ["--mode=solve", "--config.solve.count=6", "--config.solve.batch_size=4"]
  for _ in range(2):
    trainer_helpers.run(solve, tmp_path / "solve.log")
  out = (tmp_path / "solve.log").read_text()
  assert "solved " in out and "cell accuracy" in out
  files = sorted(p.name for p in (wd / "solve").iterdir())
  assert files == ["solve-2.json", "solve-2.jsonl", "solve-2.md", "solve.json", "solve.jsonl",
                   "solve.md"]
  rows = [json.loads(line) for line in (wd / "solve" / "solve.jsonl").read_text().splitlines()]
  summary = json.loads((wd / "solve" / "solve.json").read_text())
  assert len(rows) == 6 and summary["summary"]["rows"] == 6
  assert summary["provenance"]["model"]["step"] == 4
  task = tasks.make("sudoku", size=6, min_givens=14, max_givens=22)   # configs/sudoku.py:tiny
  puzzles = task.heldout(0, 6)
  out = np.array([r["output"] for r in rows])
  np.testing.assert_array_equal(out[puzzles["prompt"]], puzzles["tokens"][puzzles["prompt"]])
  assert summary["summary"]["solved"]["count"] == int(task.verify(out, puzzles)["solved"].sum())
  # A puzzle file in the common format (one puzzle,solution per row), saved by Excel (a UTF-8
  # byte-order mark), with a repeated row and a row with no blank; solved into a workdir with
  # no run, with --checkpoint=WORKDIR as the error of such a workdir says.
  f = tmp_path / "p.csv"
  lines = [f"{tasks.sudoku.to_string(t, p)},{tasks.sudoku.to_string(t)}\n"
           for t, p in zip(puzzles["tokens"], puzzles["prompt"])]
  solution = tasks.sudoku.to_string(puzzles["tokens"][0])
  f.write_text("puzzle,solution\n" + "".join(lines + [lines[0], f"{solution},{solution}\n"]),
               encoding="utf-8-sig")
  other = tmp_path / "other"
  trainer_helpers.run(solve + [f"--config.solve.puzzles={f}", "--config.solve.count=0",
                               "--config.solve.name=file", f"--workdir={other}",
                               f"--checkpoint={wd}"], tmp_path / "file.log")
  assert "1 of the 8 rows of" in (tmp_path / "file.log").read_text()
  file_rows = [json.loads(r) for r in (other / "solve" / "file.jsonl").read_text().splitlines()]
  assert [r["given"] for r in file_rows[:6]] == [r["given"] for r in rows]
  assert [r["output"] for r in file_rows[:6]] == [r["output"] for r in rows]  # the same weights
  assert file_rows[6]["given"] == rows[0]["given"]
  assert file_rows[7]["solved"] and file_rows[7]["first_error_rank"] == -1   # nothing to fill
  summary = json.loads((other / "solve" / "file.json").read_text())
  assert summary["provenance"]["duplicates"] == 1 and summary["provenance"]["model"]["step"] == 4
  # Another task than the run's: one line.
  bad = pathlib.Path(tmp_path / "bad.log")
  p = trainer_helpers.start(solve + ["--config.task.options.max_givens=20"], bad)
  assert p.wait(timeout=300) == 1
  assert "task.options: the run in" in bad.read_text().strip().splitlines()[-1]


def test_numpy_options_are_written_whole(tmp_path):
  """A task whose options() hold numpy scalars: --mode=solve died in json.dumps after writing
  solve.jsonl and solve.json (half a result); every body is now made first, numbers plain."""
  import json as json_lib
  import numpy as np_
  from aogpt_jax.evaluation import solve as solve_lib
  from aogpt_jax.tasks import base
  summary = {"task": "toy", "task_options": {"k": np_.int64(3), "f": np_.float32(0.5)},
             "rows": 1, "solved": {"count": 1, "rate": 1.0, "low": 0.2, "high": 1.0},
             "cell_accuracy": 1.0, "first_cell_accuracy": 1.0, "first_error_rank_median": None,
             "steps_mean": 1.0, "ms_per_puzzle": 1.0, "settings": {}}
  res = solve_lib.SolveResult([{"index": 0, "solved": np_.bool_(True), "x": np_.int32(2)}],
                              summary)
  path = solve_lib.write(res, str(tmp_path), "solve", {"seed": np_.int64(0)})
  assert json_lib.loads(open(path).read())["x"] == 2
  got = json_lib.loads(open(path[:-1]).read())
  assert got["summary"]["task_options"] == {"k": 3, "f": 0.5}
  assert sorted(p.name for p in (tmp_path / "solve").iterdir()) == [
      "solve.json", "solve.jsonl", "solve.md"]
  assert base.plain({"a": (np_.int8(1), [np_.float64(2.0)])}) == {"a": (1, [2.0])}


def test_puzzles_without_a_blank_are_named():
  """A puzzle file with no blank anywhere reported "solved 6/6 (100.0%) ... 0.0 steps" without
  a word."""
  import numpy as np_
  from aogpt_jax import tasks
  from aogpt_jax.evaluation import solve as solve_lib
  from aogpt_jax.sampling import sampler
  t = tasks.make("sudoku", size=4)
  rows = t.heldout(0, 3)
  s = sampler.SampleSettings(length=16, steps=16, method="adaptive")
  with pytest.raises(ValueError, match=r"^solve.puzzles: every cell of the 3 puzzles is given"):
    solve_lib.check_puzzles(t, {**rows, "prompt": np_.ones_like(rows["prompt"])}, s)
  solve_lib.check_puzzles(t, rows, s)


def test_a_full_disk_names_the_file_and_leaves_no_tmp(tmp_path, monkeypatch):
  """--mode=solve onto a full disk said "OSError: [Errno 28]" without the file and left
  solve.jsonl.tmp."""
  import errno
  import pathlib as pathlib_
  from aogpt_jax.train import workdir as workdir_lib
  real = pathlib_.Path.write_text

  def full(self, text, *a, **k):
    real(self, text[:10], *a, **k)                  # half written, then the disk is full
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(pathlib_.Path, "write_text", full)
  target = tmp_path / "solve.jsonl"
  with pytest.raises(OSError, match=rf"writing {target} failed: No space left on device"):
    workdir_lib.write_json_atomic(target, "x" * 100)
  assert list(tmp_path.iterdir()) == []
