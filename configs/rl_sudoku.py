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

import pathlib

from aogpt_jax import recipes


def get_config(arg=None):
  c = recipes.config_file(pathlib.Path(__file__).with_name("sudoku.py"), arg)
  small = "tiny" in [t.strip() for t in (arg or "").split(",")]
  recipes.post_training(c, small, mode="rl", steps=1000, tiny_steps=200)
  return recipes.apply(c, {**recipes.rl_group(small), "rl.steps": c.seq_len})
