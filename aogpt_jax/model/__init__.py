"""The model, and nothing that trains, samples, evaluates or stores it (those import this).

    from flax import nnx
    from aogpt_jax import model
    m = model.AOGPT(model.preset("tiny", vocab_size=320, valid_vocab_size=257), rngs=nnx.Rngs(0))
    order = model.orders.sample("uniform", key, batch, n)       # int32 [B, n]: a permutation
    loss, per_token = model.loss(m, tokens, order)   # mean NLL (nats) and per-token NLLs

  aogpt.py          AOGPT, ModelConfig, presets, the any-order loss, the KV-cached slot passes
  blocks.py         the transformer block with adaLN target conditioning (and its variants)
  layers.py         Dense / Embed / Norm with the published init and logical axis names; row ops
  attention.py      the attention kernel choice, the XLA path and the blockwise / splash kernels
  cross_entropy.py  the chunked head + cross-entropy without [B, n, V] logits
  orders.py         order distributions (a registry: `orders.register`)
  objectives.py     training objectives (a registry): ao (AO-GPT / sigma-GPT / GPT), mdm
  encoder.py        the encoder-only masked diffusion baseline on the same backbone
  jit.py            split the graph definition, then jit: the one way a model function is jitted

Names are imported on first use.
"""

from aogpt_jax import lazy_exports

_EXPORTS = {"AOGPT": "aogpt", "ModelConfig": "aogpt", "preset": "aogpt", "loss": "aogpt"}
_MODULES = ("aogpt", "blocks", "layers", "attention", "cross_entropy", "orders", "objectives",
            "encoder", "jit")

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, _MODULES)
