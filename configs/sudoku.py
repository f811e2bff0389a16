"""Sudoku with AO-GPT: training on the given cells, solved with adaptive order (docs/tasks.md).

  python -m aogpt_jax.main --config=configs/sudoku.py:tiny --workdir=/tmp/sudoku     # CPU
  python -m aogpt_jax.main --config=configs/sudoku.py:tiny --workdir=/tmp/sudoku --mode=solve

Arguments (``:ARG``, comma-separated): ``tiny`` (the CPU size: 6x6 grids of 14-22 givens, the
tiny model, 1,200 steps),
``l2r`` (the left-to-right baseline of the same size), ``mdm`` (the encoder-only masked
diffusion baseline). Without ``tiny``: 9x9 puzzles of 24-40 givens and an 8 x 256 model (about
Kim et al.'s 6M parameters), for one accelerator. The position tables start as row + column +
box codes (``model.position_init``).

``--mode=solve`` decodes with the search (`sampling.search`: 8 beams, 2 tokens a branch, the
finished beams ranked by the model's pseudo-likelihood; model-only) for AO-GPT and the MDM;
``--config.solve.search_width=0`` is greedy max_prob (faster, fewer puzzles solved),
``--config.solve.search_checker=True`` puts Sudoku's rules in the loop (docs/tasks.md).
"""

from aogpt_jax import recipes


def get_config(arg=None):
  c = recipes.task(
      "sudoku", {"size": 9, "min_givens": 24, "max_givens": 40},
      tiny_options={"size": 6, "min_givens": 14, "max_givens": 22},
      model={"n_layer": 8, "n_head": 8, "n_embd": 256, "target_dim": 64,
             "position_init": "grid:9,9,3,3"},
      tiny_model={"position_init": "grid:6,6,2,3"},
      steps=20_000, tiny_steps=1_200, arg=arg)
  if recipes.task_arg(arg)[1] in (None, "mdm"):      # models the search decodes (blanks, MDM)
    c.solve.search_width = 8
  return c
