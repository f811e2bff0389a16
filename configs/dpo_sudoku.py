"""DPO on the 6x6 / 9x9 Sudoku task, from a configs/sudoku.py run (docs/post_training.md).

  python -m aogpt_jax.main --config=configs/sudoku.py:tiny --workdir=/tmp/sudoku      # SFT
  python -m aogpt_jax.main --config=configs/dpo_sudoku.py:tiny --workdir=/tmp/sudoku_dpo \
      --config.train.init_from=/tmp/sudoku --mode=dpo

The task, the model and ``:ARG`` are configs/sudoku.py's (``tiny``: the CPU size); the run starts
from the weights of ``train.init_from`` (the sudoku run's WORKDIR: its EMA weights), which are
also the frozen reference, and takes ``total_steps`` DPO updates of ``dpo.pairs`` pairs: chosen =
a training puzzle's solution, rejected = the same grid with one or two answer cells changed (it
breaks a rule). ``dpo.order``: ``l2r`` (the exact log-likelihood of the answer left to right) or
``random`` (the mean over ``dpo.orders`` random orders: an estimate). The held-out eval reports
the preference accuracy and margin on ``task.heldout_count`` held-out pairs; ``--mode=solve``
solves the held-out puzzles with the run's weights.
"""

import pathlib

from aogpt_jax import recipes


def get_config(arg=None):
  c = recipes.config_file(pathlib.Path(__file__).with_name("sudoku.py"), arg)
  small = "tiny" in [t.strip() for t in (arg or "").split(",")]
  recipes.post_training(c, small, mode="dpo", steps=1000, tiny_steps=100)
  return recipes.apply(c, recipes.dpo_group(small))
