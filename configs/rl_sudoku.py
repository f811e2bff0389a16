"""GRPO on the 6x6 / 9x9 Sudoku task, from a configs/sudoku.py run (docs/post_training.md).

  python -m aogpt_jax.main --config=configs/sudoku.py:tiny --workdir=/tmp/sudoku      # SFT
  python -m aogpt_jax.main --config=configs/rl_sudoku.py:tiny --workdir=/tmp/sudoku_rl \
      --config.train.init_from=/tmp/sudoku --mode=rl

The task, the model and ``:ARG`` are configs/sudoku.py's (``tiny``: the CPU size); the run starts
from the weights of ``train.init_from`` (the sudoku run's WORKDIR: its EMA weights) and takes
``total_steps`` GRPO updates of ``rl.prompts`` training puzzles x ``rl.group_size`` rollouts, the
reward ``solved`` (the verifier), rollouts in random order one cell per step; the held-out eval
solves ``task.heldout_count`` held-out puzzles greedily with the same sampler.
"""

import importlib.util
import pathlib

from aogpt_jax import recipes


def _sudoku(arg):
  path = pathlib.Path(__file__).with_name("sudoku.py")
  spec = importlib.util.spec_from_file_location("_aogpt_sudoku_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def get_config(arg=None):
  c = _sudoku(arg)
  small = "tiny" in [t.strip() for t in (arg or "").split(",")]
  return recipes.apply(c, {
      "train.init_from": "/tmp/sudoku" if small else "",
      "total_steps": 200 if small else 1000,
      "log_every": 10, "eval_every": 50 if small else 200,
      "checkpoint_every": 50 if small else 200,
      "task.heldout_count": 128 if small else 256,
      "rl.reward": "solved", "rl.group_size": 8, "rl.prompts": 8 if small else 32,
      "rl.lr": 1e-4 if small else 3e-5, "rl.steps": c.seq_len, "rl.order": "random",
      "rl.method": "diffusion", "rl.ema_decay": 0.9,
  })
