"""The KV-cached sampler's logits equal uncached forwards; prompts, keys, AR decoding, plans."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.sampling import sampler
from aogpt_jax.sampling import diffusion, prompts
from aogpt_jax.sampling import tokens as tokens_lib
from helpers.sampler import tiny_model

N = 10


@pytest.fixture(scope="module")
def model():
  return tiny_model()


def _valid(plan):
  return plan.k[:, :, None] > np.arange(plan.queries)[None, None, :]     # [T, B, Q]


def _prompt():
  return prompts.pairs_prompt([{1: 3, 7: 5}, {}, {0: 1, 1: 2, 2: 3, 9: 4}], N, 13)


@pytest.mark.parametrize("count_mode,steps,with_prompt,block", [
    ("deterministic", 4, False, None), ("deterministic", 3, True, 2), ("stochastic", 4, True, None),
    ("stochastic", N, False, 3)])
def test_step_logits_equal_uncached_forward(model, count_mode, steps, with_prompt, block):
  s = sampler.SampleSettings(length=N, steps=steps, count_mode=count_mode, schedule="cosine")
  kw = dict(prompt=_prompt()) if with_prompt else dict(batch=3)
  out = sampler.generate(model, jax.random.key(3), s, debug=True, block=block, **kw)
  plan = out.plan
  assert out.logits.shape == (plan.steps, 3, plan.queries, 16)
  if block:
    assert plan.block == block                                  # some steps were split:
    assert (plan.q0 > 0).any() or ((plan.k == 0) & (plan.ccount > 0)).any()
  ref_fn = jax.jit(lambda t, o, m, q0, k: diffusion.full_step_logits(
      model, o, t, m, q0, k, queries=plan.queries)[0])
  valid = _valid(plan)
  checked = 0
  for i in range(plan.steps):
    # Tokens known before step i are the final tokens at ranks < m: committed tokens never change.
    ref = np.asarray(ref_fn(jnp.asarray(out.tokens), jnp.asarray(out.order),
                            *(jnp.asarray(a[i]) for a in (plan.m, plan.q0, plan.k))))
    got = out.logits[i]
    v = valid[i]
    np.testing.assert_array_equal(np.isinf(got[v]), np.isinf(ref[v]))
    fin = v[..., None] & np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], atol=1e-5, rtol=1e-5)
    checked += int(v.sum())
  # every generated position was predicted by exactly one query
  plen = np.asarray(kw["prompt"][1]).sum(1) if with_prompt else np.zeros(3)
  assert checked == int(np.sum(N - plen))


def test_ancestral_logits_equal_gather_forward(model):
  """T = n: each step's single query is the ordinary causal forward at that rank."""
  s = sampler.SampleSettings(length=N, steps=N)
  out = sampler.generate(model, jax.random.key(0), s, batch=4, debug=True)
  assert out.plan.queries == 1 and out.plan.block == 1
  ref = np.asarray(jax.jit(lambda t, o: model(t, o))(jnp.asarray(out.tokens),
                                                     jnp.asarray(out.order)))   # [B, n, V]
  got = out.logits[:, :, 0].transpose(1, 0, 2)
  fin = np.isfinite(ref)
  np.testing.assert_allclose(got[fin], ref[fin], atol=1e-5, rtol=1e-5)


def test_parallel_queries_equal_swapped_order_forward(model):
  """Query j at frontier m = the causal forward of the order with ranks m and m+j swapped:
  it sees the committed context and itself only, never the other queries."""
  s = sampler.SampleSettings(length=N, steps=3)
  out = sampler.generate(model, jax.random.key(1), s, batch=2, debug=True, block=3)
  plan = out.plan
  rows, swapped, want = [], [], []
  for i in range(plan.steps):
    for b in range(2):
      m, q0, k = int(plan.m[i, b]), int(plan.q0[i, b]), int(plan.k[i, b])
      for j in range(k):
        o = out.order[b].copy()
        o[m], o[m + q0 + j] = o[m + q0 + j], o[m]
        rows.append(b), swapped.append(o), want.append((m, out.logits[i, b, j]))
  assert len(rows) == 2 * N
  ref = np.asarray(jax.jit(lambda t, o: model(t, o))(jnp.asarray(out.tokens[rows]),
                                                     jnp.asarray(np.stack(swapped))))
  for r, (m, got) in enumerate(want):
    fin = np.isfinite(ref[r, m])
    np.testing.assert_allclose(got[fin], ref[r, m][fin], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("count_mode", ["deterministic", "stochastic"])
@pytest.mark.slow
def test_cached_and_uncached_samplers_draw_identical_tokens(model, count_mode):
  """... and the block size (how steps are split into passes) does not change the samples."""
  s = sampler.SampleSettings(length=N, steps=5, count_mode=count_mode, top_p=0.9,
                             temperature=0.8)
  a = sampler.generate(model, jax.random.key(7), s, prompt=_prompt())
  b = sampler.generate(model, jax.random.key(7), dataclasses.replace(s, method="uncached"),
                       prompt=_prompt())
  c = sampler.generate(model, jax.random.key(7), s, prompt=_prompt(), block=1)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.tokens, c.tokens)


@pytest.mark.slow
def test_ar_equals_l2r_diffusion_with_one_token_per_step(model):
  s = sampler.SampleSettings(length=N, steps=N, order="l2r", top_p=0.9)
  ptok, pmask = prompts.prefix_prompt([[1, 2, 3], [4], []], N, 13)
  a = sampler.generate(model, jax.random.key(5), s, prompt=(ptok, pmask))
  b = sampler.generate(model, jax.random.key(5), dataclasses.replace(s, method="ar"),
                       prompt=(ptok, pmask))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(b.tokens[pmask], ptok[pmask])


def test_ar_greedy_equals_uncached_argmax(model):
  s = sampler.SampleSettings(length=N, method="ar", greedy=True)
  out = sampler.generate(model, jax.random.key(0), s,
                         prompt=prompts.prefix_prompt([[5, 6], [7, 8]], N, 13), debug=True)
  l2r = jnp.broadcast_to(jnp.arange(N), (2, N))
  logits = np.asarray(jax.jit(lambda t, o: model(t, o))(jnp.asarray(out.tokens), l2r))
  np.testing.assert_array_equal(out.tokens[:, 2:], logits.argmax(-1)[:, 2:])
  fin = np.isfinite(logits[:, 2:])
  np.testing.assert_allclose(out.logits.transpose(1, 0, 2)[fin], logits[:, 2:][fin], atol=1e-5)


@pytest.mark.parametrize("method", ["diffusion", "ar"])
def test_scan_step_moves_no_cache_sized_array(model, method):
  """The compiled sampler's scan step writes its slots into the KV cache in place and attends
  over it as stored: no transpose, copy or broadcast of a whole layer's keys or values per step
  (a [B, K, N, H] cache made XLA:CPU transpose every layer's keys and values in every step; a
  broadcast would be grouped-query attention's repeat, which a model without kv heads of its
  own must not run). Without ``return_logp`` no log-probability record [B, n, 2] is built."""
  kw = dict(method="ar", order="l2r") if method == "ar" else dict(steps=N)
  s = sampler.SampleSettings(length=N, **kw)
  p = sampler.prepare(model.cfg, jax.random.key(0), s, batch=3)
  pl = None if method == "ar" else sampler.plan([p])[0]
  args, jkw = sampler.program_args(p, pl, s, False)
  with tokens_lib.exact_sampling():
    hlo = sampler.model_jit.call(sampler.sampler_program.lower, model, *args, **jkw).compile().as_text()
  cfg = model.cfg
  cache_len = N + (0 if method == "ar" else pl.shape().block)
  cache_dims = sorted((3, cache_len, cfg.n_head, cfg.head_dim))
  moved = [line.strip()[:120] for line in hlo.splitlines()   # in the scan's body (metadata)
           if (mt := re.search(r"= f32\[([\d,]+)\]\S* (transpose|copy|broadcast)\(", line))
           and sorted(int(d) for d in mt.group(1).split(",")) == cache_dims
           and "/while/body/" in line]
  assert not moved, moved
  assert f"f32[3,{N},2]" not in hlo


@pytest.fixture(scope="module")
def rope_model():
  return tiny_model(rope=True, seed=1)


@pytest.mark.slow
def test_rope_cached_logits_equal_uncached_forwards(rope_model):
  """``model.rope``: a cached key is turned by its own position once, when it is written, and
  each query by its target: the sampler's logits equal the uncached forwards, for several
  queries per step (Figure 10), a prompt and split steps, and for one query per step."""
  test_step_logits_equal_uncached_forward(rope_model, "stochastic", 4, True, 2)
  test_parallel_queries_equal_swapped_order_forward(rope_model)
  test_ancestral_logits_equal_gather_forward(rope_model)
