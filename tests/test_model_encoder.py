"""Encoder-only masked diffusion baseline: masking, ELBO weighting and estimators against direct
computations, and the exact identity between the ELBO and the order-averaged any-order NLL."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.model import encoder as mdm
from aogpt_jax.model import aogpt as model
from aogpt_jax.model import orders
from helpers.sampler import exact_elbo

exact_order_nll = nnx.jit(mdm.exact_order_nll)


def tiny_encoder(n=4, vocab=5, valid=4, seed=0):
  cfg = model.preset("tiny", block_size=n, n_layer=2, n_head=2, n_embd=16, vocab_size=vocab,
                     valid_vocab_size=valid, init_std=0.5, target="adaln")
  return mdm.make_encoder(cfg, rngs=nnx.Rngs(seed))


def test_encoder_is_the_aogpt_backbone_without_target_and_mask_is_never_predicted():
  m = tiny_encoder()
  assert m.cfg.target == "none" and mdm.mask_id(m.cfg) == 4
  tokens = jnp.array([[0, 4, 2, 4]], jnp.int32)        # two [MASK]s
  probs = jax.nn.softmax(mdm.encoder_logits(m, tokens), -1)
  assert float(probs[..., 4:].max()) == 0.0
  with pytest.raises(ValueError, match="must exceed model.valid_vocab_size"):
    mdm.make_encoder(model.preset("tiny", vocab_size=257), rngs=nnx.Rngs(0))


def test_prediction_depends_on_revealed_values_not_on_reveal_order():
  m = tiny_encoder(n=4)
  tokens = jnp.array([[1, 2, 3, 0]], jnp.int32)
  # Reveal positions {0, 2} in two different orders: the encoder sees the same input.
  o1, o2 = jnp.array([[0, 2, 1, 3]]), jnp.array([[2, 0, 1, 3]])
  nll1 = mdm.exact_order_nll(m, tokens, o1)
  nll2 = mdm.exact_order_nll(m, tokens, o2)
  np.testing.assert_allclose(nll1[0, 2], nll2[0, 2], rtol=0, atol=0)   # p(x_1 | x_0, x_2)
  changed = tokens.at[0, 2].set(0)
  nll3 = mdm.exact_order_nll(m, changed, o1)
  assert abs(float(nll3[0, 2]) - float(nll1[0, 2])) > 1e-4             # values matter


def test_exact_order_nll_is_the_sum_of_single_position_predictions():
  m = tiny_encoder(n=4)
  tokens = jnp.array([[1, 3, 0, 2], [2, 2, 1, 0]], jnp.int32)
  order = orders.sample("uniform", jax.random.key(1), 2, 4)
  got = np.asarray(mdm.exact_order_nll(m, tokens, order))
  for b in range(2):
    for r in range(4):
      inp = np.array(tokens[b])
      inp[np.asarray(order[b, r:])] = mdm.mask_id(m.cfg)
      logp = jax.nn.log_softmax(mdm.encoder_logits(m, jnp.asarray(inp)[None])[0, order[b, r]])
      np.testing.assert_allclose(got[b, r], -float(logp[tokens[b, order[b, r]]]), rtol=1e-5)


def test_weighted_nll_is_masked_sum_over_t():
  m = tiny_encoder(n=4)
  tokens = jnp.array([[1, 3, 0, 2], [2, 2, 1, 0]], jnp.int32)
  masked = jnp.array([[True, False, True, False], [False, False, False, True]])
  t = jnp.array([0.5, 0.25])
  got = np.asarray(mdm.weighted_nll(m, tokens, masked, t))
  for b in range(2):
    inp = jnp.where(masked[b], mdm.mask_id(m.cfg), tokens[b])[None]
    logp = np.asarray(jax.nn.log_softmax(mdm.encoder_logits(m, inp)[0], -1))
    direct = -sum(logp[i, tokens[b, i]] for i in range(4) if masked[b, i]) / float(t[b])
    np.testing.assert_allclose(got[b], direct, rtol=1e-5)


def test_draw_masks_rates_and_antithetic_spread():
  t, masked = mdm.draw_masks(jax.random.key(0), 512, 64, antithetic=True)
  ts = np.sort(np.asarray(t))
  assert ts.min() > 0 and ts.max() <= 1
  np.testing.assert_allclose(np.diff(ts), 1 / 512, atol=1e-5)             # evenly spread
  rate = np.asarray(masked).mean(1)
  assert np.abs(rate - np.asarray(t)).mean() < 0.06                        # mask rate ~ t
  t2, _ = mdm.draw_masks(jax.random.key(0), 512, 64, antithetic=False)
  assert np.diff(np.sort(np.asarray(t2))).std() > 1e-4


def test_draw_masks_is_the_stratified_rule_with_its_keys():
  """The draw pinned value by value: t_b = 1 - ((u + b/B) mod 1) (float64 here), u and the mask
  uniforms from the two halves of the key."""
  key, b, n = jax.random.key(3), 6, 5
  k_t, k_m = jax.random.split(key)
  for antithetic in (True, False):
    t, masked = map(np.asarray, mdm.draw_masks(key, b, n, antithetic=antithetic))
    if antithetic:
      want = 1.0 - np.mod(float(jax.random.uniform(k_t, ())) + np.arange(b) / b, 1.0)
    else:
      want = 1.0 - np.asarray(jax.random.uniform(k_t, (b,)), np.float64)
    np.testing.assert_allclose(t, want, atol=1e-6)
    np.testing.assert_array_equal(masked, np.asarray(jax.random.uniform(k_m, (b, n))) < t[:, None])


def test_elbo_equals_order_averaged_any_order_nll_and_mc_estimate_converges():
  m = tiny_encoder(n=4, seed=3)
  tokens = jnp.array([[1, 3, 0, 2], [2, 2, 1, 0]], jnp.int32)
  perms = list(itertools.permutations(range(4)))
  avg = np.mean([np.asarray(exact_order_nll(m, tokens, jnp.array([p, p]))).sum(1)
                 for p in perms], axis=0)
  exact = exact_elbo(m, tokens)
  np.testing.assert_allclose(exact, avg, rtol=1e-5)   # the AO-AR / MDM identity, exactly
  est = np.asarray(nnx.jit(mdm.elbo_samples, static_argnums=3)(m, tokens, jax.random.key(0),
                                                               4000))
  mean, se = est.mean(0), est.std(0) / np.sqrt(len(est))
  assert np.all(np.abs(mean - exact) < 5 * se + 1e-3), (mean, exact, se)


@pytest.mark.slow
def test_mdm_loss_is_mean_term_per_token_and_differentiable():
  m = tiny_encoder(n=4)
  tokens = jnp.array([[1, 3, 0, 2], [2, 2, 1, 0]], jnp.int32)
  loss, terms = mdm.mdm_loss(m, tokens, jax.random.key(5))
  np.testing.assert_allclose(loss, terms.mean() / 4, rtol=1e-6)
  gd, p = nnx.split(m)
  g = jax.jit(jax.grad(lambda p: mdm.mdm_loss(nnx.merge(gd, p), tokens,
                                               jax.random.key(5))[0]))(p)
  assert float(jnp.abs(g["h"][0]["attn"]["c_attn"]["kernel"][...]).max()) > 0
