"""What the post-training run tests (test_posttrain_run.py, test_dpo_run.py) share: a config file's
``:tiny`` at the size of the other trainer tests, the tiny Sudoku run they start from, and a
compilation counter (`model.jit.Compiles`, re-exported)."""

import pathlib

from aogpt_jax import recipes
from aogpt_jax.model.jit import Compiles  # noqa: F401 - the tests' counter
from aogpt_jax.train import loop as train_loop
from helpers import shared

REPO = pathlib.Path(__file__).resolve().parents[2]
# configs/sudoku.py:tiny (6x6 puzzles) at the size of the other trainer tests.
SIZE = {"model.n_layer": 1, "model.n_embd": 32, "model.n_head": 2, "model.target_dim": 8,
        "batch_size": 8, "task.heldout_count": 8, "eval.batch_size": 8,
        "eval.train_max_blocks": 8}


def config(name: str, **overrides):
  """configs/NAME:tiny with SIZE and ``overrides`` applied."""
  return recipes.apply(recipes.config_file(REPO / "configs" / name, "tiny"),
                       {**SIZE, **overrides})


def train_start(tmp_path_factory) -> pathlib.Path:
  """A 10-step configs/sudoku.py:tiny run: the starting weights of a post-training run, trained
  once per test session (helpers/shared.py) for every file that starts from it. Read only."""
  return shared.session_dir(tmp_path_factory, "sudoku_start", lambda wd: train_loop.train(
      config("sudoku.py", total_steps=10, log_every=10, eval_every=0, checkpoint_every=0),
      str(wd)))


def other_shape(tmp_path_factory) -> pathlib.Path:
  """A 1-step configs/sudoku.py:tiny run of another width (model.n_embd=16): a reference or
  starting run of the wrong shape, trained once per test session. Read only."""
  return shared.session_dir(tmp_path_factory, "sudoku_n_embd_16", lambda wd: train_loop.train(
      config("sudoku.py", total_steps=1, log_every=1, eval_every=0, checkpoint_every=0,
             **{"model.n_embd": 16}), str(wd)))
