"""What the post-training run tests (test_posttrain_run.py, test_dpo_run.py) share: a config file's
``:tiny`` at the size of the other trainer tests, the tiny Sudoku run they start from, and a
compilation counter."""

import pathlib

import jax

from aogpt_jax import recipes
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


class Compiles:
  """Counts compilations while open: ``with Compiles() as c:`` then ``c.count``. It counts
  jax's lowering events (jaxpr to an MLIR module), which every compilation starts with, whether
  XLA then compiles or the persistent compilation cache the tests share answers: a program
  compiled again for new argument placements (committed or not) is a cache hit there, so
  counting XLA's own compile events would miss it."""

  EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"

  def __init__(self):
    self.count = 0
    self._listener = self._listen

  def _listen(self, event, duration, **kw):
    del duration, kw
    self.count += event == self.EVENT

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self._listener)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listener)
