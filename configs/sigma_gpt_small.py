"""sigma-GPT Small as reproduced in the paper (Tables 4/5; the published model_sigmaGPT.py): the
target position added once at the input, LayerNorm, no QK-norm, a head tied to the token
embedding without bias, uniformly random orders, no EMA; the AO-GPT optimizer recipe otherwise
(`recipes.sigma_gpt`). ``:tiny`` gives the same run at CPU size."""

from aogpt_jax import recipes


def get_config(arg=None):
  return recipes.from_arg(arg, lambda: recipes.sigma_gpt("small"))
