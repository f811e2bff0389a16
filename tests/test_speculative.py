"""Exactness of the speculative sampler (`sampling.speculative`): sample frequencies match the
ancestral (T = n) distribution computed by enumeration (`sampler_testlib`), and the parallel
T < n distribution (the drafts' own) is rejected, so the test has the power to fail."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.sampling import speculative, tokens as tokens_lib
from sampler_testlib import (all_sequences, chisquare_p, histogram, mixture_over_orders,
                             parallel_logprob, tiny_model)

N_SAMPLES = 20000
V, LEN = 3, 4


@pytest.fixture(scope="module")
def model():
  return tiny_model(vocab=4, valid=V, block=LEN, std=0.5)


@pytest.fixture(scope="module")
def seqs():
  return all_sequences(V, LEN)


def _run(model, key, order, *, prompt=None, draft=2, **kw):
  batch = order.shape[0]
  tokens0 = jnp.zeros((batch, LEN), jnp.int32) if prompt is None else prompt[0]
  plen = jnp.zeros((batch,), jnp.int32) if prompt is None else prompt[1]
  fn = jax.jit(functools.partial(speculative.sample_speculative, model, draft=draft, **kw))
  with tokens_lib.exact_sampling():
    keys = tokens_lib.stream(tokens_lib.sample_keys(jax.random.key(key), batch),
                             tokens_lib.TOKEN_STREAM)
    toks, passes = fn(order, tokens0, plen, keys)
  toks = np.asarray(toks)
  assert (toks < V).all() and (toks >= 0).all()
  return toks, np.asarray(passes)


def _random_orders(key, batch, positions, prefix=()):
  perms = jax.vmap(lambda k: jax.random.permutation(k, jnp.asarray(positions, jnp.int32)))(
      jax.random.split(jax.random.key(key), batch))
  pre = jnp.broadcast_to(jnp.asarray(prefix, jnp.int32), (batch, len(prefix)))
  return jnp.concatenate([pre, perms], axis=1).astype(jnp.int32)


@pytest.mark.parametrize("draft", [2, 3])
def test_random_order_is_ancestral(model, seqs, draft):
  toks, passes = _run(model, 10 + draft, _random_orders(1, N_SAMPLES, range(LEN)), draft=draft)
  hist = histogram(toks, V)
  exact = mixture_over_orders(model, seqs, range(LEN), [1] * LEN)
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  wrong = mixture_over_orders(model, seqs, range(LEN), [2, 2])
  assert chisquare_p(hist, wrong, N_SAMPLES) < 1e-6
  assert passes.max() <= 2 * LEN and passes.mean() < 2 * LEN


@pytest.mark.parametrize("rule", ["nucleus", "published"])
def test_l2r_temperature_top_p(model, seqs, rule):
  kw = dict(temperature=0.7, top_p=0.8, top_p_rule=rule)
  order = jnp.broadcast_to(jnp.arange(LEN, dtype=jnp.int32), (N_SAMPLES, LEN))
  toks, _ = _run(model, 3, order, draft=4, **kw)
  hist = histogram(toks, V)
  exact = np.exp(parallel_logprob(model, seqs, np.arange(LEN), [1] * LEN, **kw))
  if exact.max() > 1 - 1e-9:       # the published rule at 0.8 keeps one token per step here
    assert hist[np.argmax(exact)] == N_SAMPLES
  else:
    assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  plain = np.exp(parallel_logprob(model, seqs, np.arange(LEN), [1] * LEN, temperature=0.7))
  assert chisquare_p(hist, plain, N_SAMPLES) < 1e-6
  parallel = np.exp(parallel_logprob(model, seqs, np.arange(LEN), [LEN], **kw))
  if rule == "nucleus":            # under "published" both are the same single sequence here
    assert chisquare_p(hist, parallel, N_SAMPLES) < 1e-6


def test_infill_prompt(model, seqs):
  order = _random_orders(5, N_SAMPLES, [0, 2, 3], prefix=(1,))
  tokens0 = jnp.zeros((N_SAMPLES, LEN), jnp.int32).at[:, 1].set(2)
  toks, _ = _run(model, 4, order, prompt=(tokens0, jnp.ones((N_SAMPLES,), jnp.int32)), draft=3)
  assert (toks[:, 1] == 2).all()
  keep = seqs[:, 1] == 2
  hist = histogram(toks, V)[keep]
  exact = mixture_over_orders(model, seqs, [0, 2, 3], [1, 1, 1], prefix=(1,))[keep]
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  wrong = mixture_over_orders(model, seqs, [0, 2, 3], [3], prefix=(1,))[keep]
  assert chisquare_p(hist, wrong, N_SAMPLES) < 1e-6
