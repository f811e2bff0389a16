"""GPT-2 Small -> AO-GPT Small: starts from GPT-2's weights converted so that the AO-GPT computes
GPT-2's logits under the left-to-right order (`train.init_from=gpt2:openai-community/gpt2`, the
Hugging Face cache; or `gpt2:/path/to/folder`), then teaches it every order: an order curriculum
from all L2R to the paper's 10% mixture, peak lr 1e-4 with 500 warm-up steps, 20k steps of 0.5M
tokens (docs/training.md, "Starting from a GPT").

``:tiny`` is the CPU analogue: it adapts the tiny left-to-right model that
``configs/gpt2_small.py:tiny`` trains into /tmp/aogpt_l2r_tiny first:

  python -m aogpt_jax.main --config=configs/gpt2_small.py:tiny --workdir=/tmp/aogpt_l2r_tiny
  python -m aogpt_jax.main --config=configs/a2o_gpt2_small.py:tiny --workdir=/tmp/aogpt_a2o_tiny
"""

from aogpt_jax import recipes


def get_config(arg=None):
  tokens = [t.strip() for t in (arg or "").split(",") if t.strip()]
  if tokens not in ([], ["tiny"]):
    raise ValueError(f"config argument {arg!r}: expected nothing or 'tiny'")
  return recipes.a2o_tiny() if tokens else recipes.a2o_gpt2_small()
