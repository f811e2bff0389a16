"""CPU quickstart: AO-GPT (~1M parameters, byte tokens) on the Python standard library's source.

No downloads; 1,800 steps, about four minutes on an idle 2-core CPU (benchmarks/quickstart.py). Run:
  python -m aogpt_jax.main --config=configs/quickstart.py --workdir=/tmp/aogpt_quickstart
"""

from aogpt_jax import recipes


def get_config(arg=None):
  return recipes.from_arg(arg, recipes.quickstart)
