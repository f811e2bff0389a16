"""The chunked cross-entropy (model.loss_chunk > 0) against the plain logits path: the same loss,
per-token NLLs and gradients, with padding ids, a tied head and a partial last chunk."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import cross_entropy, model, orders


def _value_and_grad(cfg, tokens, order):
  m = model.AOGPT(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(m)

  def f(p):
    mean, per_token = model.loss(nnx.merge(graphdef, p), tokens, order)
    return mean, per_token

  (mean, per_token), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
  return mean, per_token, grads


@pytest.mark.parametrize("extra", [{}, {"tie_embeddings": True, "head_bias": False},
                                   {"target": "sigma_gpt", "tie_embeddings": True}])
def test_chunked_loss_equals_the_plain_logits_path(extra):
  base = dict(block_size=16, n_layer=2, n_head=2, n_embd=32, target_dim=8, vocab_size=64,
              valid_vocab_size=50, init_std=0.1, **extra)
  tokens = jax.random.randint(jax.random.key(1), (3, 12), 0, 50)
  order = orders.sample("uniform", jax.random.key(2), 3, 12)
  want = _value_and_grad(model.preset("tiny", **base), tokens, order)
  for chunk in (5, 36, 1000):          # 36 tokens: a partial last chunk, one chunk, bigger
    got = _value_and_grad(model.preset("tiny", loss_chunk=chunk, **base), tokens, order)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got[2])[0],
                            jax.tree.leaves(want[2])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7, err_msg=jax.tree_util.keystr(path))
  # padding ids get no gradient through the head
  head = got[2]["wte"]["embedding"] if extra else got[2]["lm_head"]["kernel"]
  pad = np.asarray(head)[50:] if extra else np.asarray(head)[:, 50:]
  assert not pad.any()


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
