"""Path-finding in a star graph (Bachmann & Nagarajan 2024), where left to right fails
(docs/tasks.md).

  python -m aogpt_jax.main --config=configs/star_graph.py:tiny --workdir=/tmp/star     # CPU
  python -m aogpt_jax.main --config=configs/star_graph.py:tiny --workdir=/tmp/star --mode=solve

Arguments as configs/sudoku.py: ``tiny`` (CPU size), ``l2r``, ``mdm``. The prompt is the shuffled
edge list, the start and the goal; the answer is the path. A left-to-right model must pick the
goal's arm at its first step; an any-order model can walk back from the goal.
"""

from aogpt_jax import recipes


def get_config(arg=None):
  return recipes.task(
      "star_graph", {"degree": 5, "path_len": 8, "num_nodes": 64},
      tiny_options={"degree": 3, "path_len": 5, "num_nodes": 24},
      model={"n_layer": 8, "n_head": 8, "n_embd": 256, "target_dim": 64},
      tiny_model={},
      steps=20_000, tiny_steps=600, arg=arg)
