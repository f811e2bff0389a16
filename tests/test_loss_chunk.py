"""model.loss with ``loss_chunk > 0`` (head + cross-entropy a chunk of tokens at a time, no
[B, n, V] logits tensor) against the plain full-logits loss: same per-token NLL, same gradients
on every parameter, padding ids still get no gradient, on both attention paths and with a
chunk that does not divide B * n."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import model, orders


def _cfg(**kw):
  base = dict(block_size=16, n_layer=2, n_head=2, n_embd=32, target_dim=8, vocab_size=64,
              valid_vocab_size=50, init_std=0.1)
  base.update(kw)
  return model.preset("tiny", **base)


@pytest.mark.parametrize("attention,target,chunk", [("gather", "adaln", 7), ("mask", "adaln", 16),
                                                    ("gather", "sigma_gpt", 100)])
def test_chunked_loss_equals_full_loss_and_grads(attention, target, chunk):
  cfg = _cfg(attention=attention, target=target)
  m = model.AOGPT(cfg, rngs=nnx.Rngs(0))
  k1, k2 = jax.random.split(jax.random.key(3))
  tokens = jax.random.randint(k1, (3, 12), 0, 50, dtype=jnp.int32)
  order = orders.sample("uniform", k2, 3, 12)
  graphdef, params = nnx.split(m)
  chunked_def = nnx.graphdef(model.AOGPT(cfg.replace(loss_chunk=chunk), rngs=nnx.Rngs(0)))

  def f(gd):
    return jax.value_and_grad(lambda p: model.loss(nnx.merge(gd, p), tokens, order)[0])
  (l0, g0), (l1, g1) = f(graphdef)(params), f(chunked_def)(params)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  _, pt0 = model.loss(nnx.merge(graphdef, params), tokens, order)
  _, pt1 = model.loss(nnx.merge(chunked_def, params), tokens, order)
  assert pt1.shape == pt0.shape
  np.testing.assert_allclose(pt1, pt0, rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7)
  head = g1["lm_head"]
  assert float(jnp.abs(head["kernel"][...][:, cfg.valid_vocab_size:]).max()) == 0.0
  assert float(jnp.abs(head["bias"][...][cfg.valid_vocab_size:]).max()) == 0.0
  assert float(jnp.abs(head["bias"][...][:cfg.valid_vocab_size]).max()) > 0.0


def test_chunked_loss_has_no_full_logits_tensor():
  cfg = _cfg(loss_chunk=8, vocab_size=112, valid_vocab_size=100)  # no other dim is 112
  m = model.AOGPT(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(m)
  tokens = jnp.zeros((4, 16), jnp.int32)
  order = orders.sample("uniform", jax.random.key(0), 4, 16)
  jaxpr = str(jax.make_jaxpr(jax.grad(
      lambda p: model.loss(nnx.merge(graphdef, p), tokens, order)[0]))(params))
  assert "f32[4,16,112]" not in jaxpr and "f32[64,112]" not in jaxpr
  assert "f32[8,112]" in jaxpr


def test_loss_chunk_must_be_non_negative():
  with pytest.raises(ValueError, match="model.loss_chunk"):
    _cfg(loss_chunk=-1)
