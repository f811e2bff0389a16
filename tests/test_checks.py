"""One checks stage per command (`aogpt_jax.checks`): every mode has one; bad input that the
modes used to find late (after the workdir was created, after the weights loaded) is one line
from it, before anything is created or loaded; ``python -m aogpt_jax.main`` runs it before the
mode."""

import json
import subprocess
import sys

import pytest

from aogpt_jax import checks
from aogpt_jax import main
from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax.config import ConfigError
from aogpt_jax.train import loop as train_loop
from helpers import posttrain
from helpers.trainer import cpu_env

pytestmark = pytest.mark.slow   # trains the shared 10-step start run (helpers.posttrain)


@pytest.fixture(scope="module")
def start(tmp_path_factory):
  return posttrain.train_start(tmp_path_factory)


@pytest.fixture(autouse=True)
def no_weights(monkeypatch):
  """The checks read what runs record (JSON); loading weights here is a failure."""
  def refuse(*a, **k):
    raise AssertionError("the checks stage loaded weights")
  monkeypatch.setattr(checkpoint_lib, "load_model", refuse)
  monkeypatch.setattr(train_loop, "load_spec", refuse)


@pytest.mark.smoke
def test_every_mode_has_its_checks():
  assert set(checks.COMMANDS) == set(main.MODES)


def _raises(mode, cfg, workdir, match, checkpoint=""):
  with pytest.raises((ConfigError, OSError), match=match):
    checks.check(mode, cfg, str(workdir), checkpoint)


def test_train(tmp_path, start):
  wd = tmp_path / "new"
  _raises("train", posttrain.config("sudoku.py", **{"train.init_from": str(tmp_path / "nope")}),
          wd, r"^train.init_from: .*nope: no such folder or file")
  # a start of another shape: named from its recorded model, no weights read
  _raises("train", posttrain.config("sudoku.py", **{"train.init_from": str(start),
                                                    "model.n_embd": 16}),
          wd, r"^train.init_from: .* model.n_embd=32 \(the run has 16\)")
  assert not wd.exists()          # nothing created
  (tmp_path / "file").write_text("x")
  _raises("train", posttrain.config("sudoku.py"), tmp_path / "file", r"is a file, not a folder")
  # a folder another mode wrote: its newest checkpoint's meta says so
  meta = tmp_path / "rl_run" / "checkpoints" / "7" / "meta"
  meta.mkdir(parents=True)
  (meta / "metadata").write_text(json.dumps({"mode": "rl", "model": {}}))
  _raises("train", posttrain.config("sudoku.py"), tmp_path / "rl_run",
          r"written by --mode=rl; this is --mode=train")
  checks.check("train", posttrain.config("sudoku.py"), str(wd))   # a good config passes
  assert not wd.exists()


def test_post_training(tmp_path, start):
  wd = tmp_path / "new"
  rl = {"train.init_from": str(start), "total_steps": 2}
  _raises("rl", posttrain.config("rl_sudoku.py", **{**rl, "model.blank_block": False}), wd,
          r"^train.init_from: .* model.blank_block=True \(the run has False\); --mode=rl trains "
          r"the starting model as it is")
  _raises("rl", posttrain.config("rl_sudoku.py", **{**rl, "rl.max_grad_norm": -1.0}), wd,
          r"max_grad_norm")
  _raises("rl", posttrain.config("rl_sudoku.py", **{**rl, "train.init_from": ""}), wd,
          r"^train.init_from: --mode=rl starts from a trained model")
  _raises("rl", posttrain.config("rl_sudoku.py", **rl), start,   # a training run's folder
          r"written by --mode=train; this is --mode=rl")
  checks.check("rl", posttrain.config("rl_sudoku.py", **rl), str(wd))
  _raises("dpo", posttrain.config("dpo_sudoku.py", **{**rl, "dpo.pairs": 0}), wd, r"^dpo.pairs")
  assert not wd.exists()


def test_solve(tmp_path, start):
  cfg = posttrain.config("sudoku.py", **{"solve.count": 4})
  checks.check("solve", cfg, str(start))
  _raises("solve", posttrain.config("sudoku.py", **{"solve.search_width": -1}), start,
          r"^solve.search_width: must be an integer >= 0")
  # the sampler's settings against the model the run records, before its weights load
  _raises("solve", posttrain.config("sudoku.py", **{"solve.search_width": 0,
                                                    "sample.policy": "bogus"}),
          start, r"sample.policy")
  _raises("solve", cfg, tmp_path / "none", r"^--workdir: no run in")
  _raises("eval", cfg, start, r"^task.name: --mode=eval is for text models")
  _raises("sample", cfg, start, r"^task.name: --mode=sample is for text models")


def test_main_runs_the_checks_before_the_mode(tmp_path):
  """The command line: a bad init_from is one line and the mode function never runs (it would
  have created the workdir, its lock and its log before loading the start)."""
  script = ("import sys\nfrom absl import app\nfrom aogpt_jax import main\n"
            "main.MODES['train'] = lambda *a, **k: sys.exit('the mode ran')\n"
            "app.run(main.main, flags_parser=main.parse_flags)\n")
  wd = tmp_path / "run"
  p = subprocess.run([sys.executable, "-c", script, f"--config={posttrain.REPO}/configs/"
                      "sudoku.py:tiny", f"--workdir={wd}",
                      f"--config.train.init_from={tmp_path / 'nope'}"],
                     capture_output=True, text=True, env=cpu_env(), cwd=posttrain.REPO,
                     timeout=300, check=False)
  assert p.returncode == 1, p.stderr[-2000:]
  assert p.stderr.strip().splitlines()[-1].startswith(
      "aogpt_jax: config error: train.init_from:"), p.stderr[-2000:]
  assert "the mode ran" not in p.stderr and not wd.exists()
