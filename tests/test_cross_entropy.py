"""The chunked cross-entropy (``model.loss_chunk > 0``: head + cross-entropy a chunk of tokens at
a time, no [B, n, V] logits tensor) against the plain full-logits loss: same loss, per-token NLL
and gradients on every parameter, padding ids still get no gradient, on both attention paths,
with a tied head and with a chunk that does not divide B * n; and `fused_mean_nll` against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.model import cross_entropy
from aogpt_jax.model import aogpt as model
from aogpt_jax.model import orders


def _cfg(**kw):
  base = dict(block_size=16, n_layer=2, n_head=2, n_embd=32, target_dim=8, vocab_size=64,
              valid_vocab_size=50, init_std=0.1)
  base.update(kw)
  return model.preset("tiny", **base)


@pytest.mark.parametrize("attention,target,chunk", [("gather", "adaln", 7), ("mask", "adaln", 16),
                                                    ("gather", "sigma_gpt", 100)])
@pytest.mark.slow
def test_chunked_loss_equals_full_loss_and_grads(attention, target, chunk):
  tied = dict(tie_embeddings=True, head_bias=False) if target == "sigma_gpt" else {}
  cfg = _cfg(attention=attention, target=target, **tied)
  m = model.AOGPT(cfg, rngs=nnx.Rngs(0))
  k1, k2 = jax.random.split(jax.random.key(3))
  tokens = jax.random.randint(k1, (3, 12), 0, 50, dtype=jnp.int32)
  order = orders.sample("uniform", k2, 3, 12)
  graphdef, params = nnx.split(m)
  chunked_def = nnx.graphdef(model.AOGPT(cfg.replace(loss_chunk=chunk), rngs=nnx.Rngs(0)))

  def f(gd):
    return jax.jit(jax.value_and_grad(lambda p: model.loss(nnx.merge(gd, p), tokens, order)[0]))
  (l0, g0), (l1, g1) = f(graphdef)(params), f(chunked_def)(params)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  _, pt0 = model.loss(nnx.merge(graphdef, params), tokens, order)
  _, pt1 = model.loss(nnx.merge(chunked_def, params), tokens, order)
  assert pt1.shape == pt0.shape
  np.testing.assert_allclose(pt1, pt0, rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7)
  if tied:    # the padding rows of the tied embedding get no gradient from the head
    assert float(jnp.abs(g1["wte"]["embedding"][...][cfg.valid_vocab_size:]).max()) == 0.0
    return
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
  assert "f32[2,4,112]" in jaxpr      # a chunk of 8 tokens: 2 positions of the 4 rows


def test_loss_chunk_must_be_non_negative():
  with pytest.raises(ValueError, match="model.loss_chunk"):
    _cfg(loss_chunk=-1)


def test_fused_mean_nll_against_numpy_and_only_the_mean_is_differentiated():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(7, 5)).astype(np.float32)
  w = rng.normal(size=(5, 11)).astype(np.float32)
  b = rng.normal(size=(11,)).astype(np.float32)
  t = rng.integers(0, 9, size=(7,))
  logits = x.astype(np.float64) @ w + b
  logits[:, 9:] = -np.inf
  lse = np.log(np.exp(logits[:, :9]).sum(-1))
  nll = lse - logits[np.arange(7), t]
  mean, per_token = cross_entropy.fused_mean_nll(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b),
                                                 jnp.asarray(t), valid_vocab=9, chunk=3)
  np.testing.assert_allclose(per_token, nll, rtol=1e-5)
  np.testing.assert_allclose(mean, nll.mean(), rtol=1e-5)
  gx = jax.grad(lambda x: cross_entropy.fused_mean_nll(x, w, b, t, valid_vocab=9, chunk=3)[0])(x)
  p = np.exp(logits - lse[:, None])
  p[np.arange(7), t] -= 1
  np.testing.assert_allclose(gx, (p / 7) @ w.T, rtol=1e-4, atol=1e-6)
  g_tok = jax.grad(lambda x: jnp.sum(cross_entropy.fused_mean_nll(
      x, w, b, t, valid_vocab=9, chunk=3)[1]))(x)
  assert not np.asarray(g_tok).any()      # per-token NLLs are metrics, not differentiable
