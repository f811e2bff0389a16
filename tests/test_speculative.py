"""Exactness of the speculative sampler (`sampling.speculative`): sample frequencies match the
ancestral (T = n) distribution computed by enumeration (`helpers.sampler`), and the parallel
T < n distribution (the drafts' own) is rejected, so the test has the power to fail."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.sampling import sampler
from aogpt_jax.sampling import config as sample_config_lib
from aogpt_jax.sampling import diffusion, prompts, speculative, tokens as tokens_lib
from helpers import exact_tiny
from helpers.sampler import (chisquare_p, histogram, mixture_over_orders, parallel_logprob,
                             tiny_model)

N_SAMPLES, V, LEN = exact_tiny.N_SAMPLES, exact_tiny.V, exact_tiny.LEN
model, seqs = exact_tiny.model, exact_tiny.seqs     # the shared fixtures


def _run(model, key, order, *, prompt=None, draft=2, **kw):
  batch = order.shape[0]
  tokens0 = jnp.zeros((batch, LEN), jnp.int32) if prompt is None else prompt[0]
  plen = jnp.zeros((batch,), jnp.int32) if prompt is None else prompt[1]
  fn = jax.jit(functools.partial(speculative.sample_speculative, model, draft=draft, **kw))
  with tokens_lib.exact_sampling():
    keys = tokens_lib.stream(tokens_lib.sample_keys(jax.random.key(key), batch),
                             tokens_lib.TOKEN_STREAM)
    toks, passes, _ = fn(order, tokens0, plen, keys)
  toks = np.asarray(toks)
  assert (toks < V).all() and (toks >= 0).all()
  return toks, np.asarray(passes)


def _random_orders(key, batch, positions, prefix=()):
  perms = jax.vmap(lambda k: jax.random.permutation(k, jnp.asarray(positions, jnp.int32)))(
      jax.random.split(jax.random.key(key), batch))
  pre = jnp.broadcast_to(jnp.asarray(prefix, jnp.int32), (batch, len(prefix)))
  return jnp.concatenate([pre, perms], axis=1).astype(jnp.int32)


@pytest.mark.parametrize("draft,queries", [(2, "taper"), (3, "taper"), (3, "all")])
def test_random_order_is_ancestral(model, seqs, draft, queries):
  toks, passes = _run(model, 10 + draft, _random_orders(1, N_SAMPLES, range(LEN)), draft=draft,
                      queries=queries)
  hist = histogram(toks, V)
  exact = mixture_over_orders(model, seqs, range(LEN), [1] * LEN)
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  wrong = mixture_over_orders(model, seqs, range(LEN), [2, 2])
  assert chisquare_p(hist, wrong, N_SAMPLES) < 1e-6
  assert passes.max() <= 2 * LEN and passes.mean() < 2 * LEN


@pytest.mark.parametrize("rule", ["nucleus", "published"])
@pytest.mark.slow
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


@pytest.mark.slow
def test_auto_draft_is_ancestral(model, seqs):
  """draft="auto" picks K from past outcomes only: still the T = n distribution."""
  toks, passes = _run(model, 21, _random_orders(2, N_SAMPLES, range(LEN)), draft="auto",
                      temperature=0.8)
  hist = histogram(toks, V)
  exact = mixture_over_orders(model, seqs, range(LEN), [1] * LEN, temperature=0.8)
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  wrong = mixture_over_orders(model, seqs, range(LEN), [2, 2], temperature=0.8)
  assert chisquare_p(hist, wrong, N_SAMPLES) < 1e-6
  assert passes.mean() < 2 * LEN


def _explicit_mask_logits(m, tokens, order, prompt_len=None):
  """Uncached forward with the explicit rank mask: logits [B, n + 1, V] in slot space
  (slot 0 = START, slot p + 1 = the token at position p)."""
  tok, pos, tgt, mask = model_lib.mask_slots(tokens, order,
                                             model_lib.prompt_block(m.cfg, prompt_len))
  h, _ = m.hidden_slots(tok, pos, tgt, mask=mask)
  return m.head(h, tgt)


@pytest.mark.parametrize("draft,queries,rope,prompt_attention", [
    (4, "taper", False, "causal"),
    pytest.param("auto", "taper", False, "causal", marks=pytest.mark.slow),
    pytest.param(3, "all", False, "causal", marks=pytest.mark.slow),
    pytest.param(4, "taper", True, "causal", marks=pytest.mark.slow),
    (4, "taper", False, "bidirectional")])
def test_verify_and_draft_logits_equal_uncached_forward(draft, queries, rope, prompt_attention):
  """Every round's causal-slot logits equal the explicit-mask causal forward over the known
  tokens plus the pending drafts, and the draft queries of causal slot c+i equal the
  explicit-mask parallel forward with context ranks < c+i; a prompt at positions 2 and 5
  (infilling). All rounds of all rows are checked in one batched uncached call each; also with
  ``model.rope``, and with a bidirectional prompt (`model.prompt_attention`)."""
  m = tiny_model(rope=rope, prompt_attention=prompt_attention)
  n, batch = 10, 3
  s = sampler.SampleSettings(length=n, method="speculative", draft=draft, temperature=0.9,
                             draft_queries=queries)
  prompt = prompts.pairs_prompt([[(2, 4), (5, 7)]] * batch, n, m.cfg.valid_vocab_size)
  out = sampler.generate(m, jax.random.key(3), s, prompt=prompt, debug=True)
  tr, order, final = out.logits, out.order, out.tokens
  assert (final[:, 2] == 4).all() and (final[:, 5] == 7).all()
  rounds = [(i, b) for i in range(n) for b in range(batch) if tr["c"][i, b] >= 0]
  assert len(rounds) >= batch and max(tr["m"][i, b] for i, b in rounds) >= 2
  orders, toks, known, ks, where = [], [], [], [], []
  for i, b in rounds:
    c, pend, k = int(tr["c"][i, b]), int(tr["m"][i, b]), int(tr["k"][i, b])
    t = final[b].copy()          # the tokens the pass saw: known ranks < c, drafts after
    t[order[b, c:c + pend]] = tr["d"][i, b, :pend]
    for src in range(min(pend, n - 1 - c) + 1):  # causal slot c+src (rank < n), its queries
      orders.append(order[b]), toks.append(t), known.append(c + src), ks.append(min(k, n - c - src))
      where.append((i, b, src))
  orders, toks = jnp.asarray(np.stack(orders)), jnp.asarray(np.stack(toks))
  known, ks = jnp.asarray(known, jnp.int32), jnp.asarray(ks, jnp.int32)
  kmax = tr["p"].shape[2]
  plen = jnp.full(known.shape, 2, jnp.int32)
  q, _, _ = jax.jit(lambda o, t, c, k: diffusion.full_step_logits(
      m, o, t, c, jnp.zeros_like(c), k, queries=kmax, prompt_len=plen))(orders, toks, known, ks)
  full = np.asarray(jax.jit(lambda t, o: _explicit_mask_logits(m, t, o, plen))(toks, orders))
  q, checked = np.asarray(q), 0
  for r, (i, b, src) in enumerate(where):
    kv, c = int(ks[r]), int(known[r])
    slot = 0 if c == 0 else order[b, c - 1] + 1        # the slot holding rank c-1's token
    np.testing.assert_allclose(tr["p"][i, b, src], full[r, slot], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(tr["p"][i, b, src], q[r, 0], atol=2e-5, rtol=1e-5)
    e = min(kv - 1, int(tr["e"][i, b, src]))           # the queries slot c+src had
    np.testing.assert_allclose(tr["q"][i, b, src, :e], q[r, 1:1 + e], atol=2e-5, rtol=1e-5)
    checked += e
  assert checked >= len(where)


@pytest.mark.slow
def test_one_pass_per_round_all_accepted(monkeypatch):
  """A model whose logits ignore the context and the target (p == q) accepts every draft: one
  pass for the first token, then K tokens per pass; the traced sampler calls the model twice
  (the prefill and the one pass of the round body)."""
  m = tiny_model()
  nnx.update(m, jax.tree.map(jnp.zeros_like, nnx.state(m, nnx.Param)))
  m.lm_head.bias[...] = jax.random.normal(jax.random.key(0), m.lm_head.bias.shape)
  calls = []
  hidden_slots = model_lib.AOGPT.hidden_slots
  monkeypatch.setattr(model_lib.AOGPT, "hidden_slots",
                      lambda *a, **kw: calls.append(1) or hidden_slots(*a, **kw))
  n, batch = 12, 3
  order = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, n))
  keys = tokens_lib.stream(tokens_lib.sample_keys(jax.random.key(1), batch),
                           tokens_lib.TOKEN_STREAM)
  for k in (1, 2, 4):
    calls.clear()
    fn = jax.jit(functools.partial(speculative.sample_speculative, m, draft=k))
    with tokens_lib.exact_sampling():
      _, passes, _ = fn(order, jnp.zeros((batch, n), jnp.int32), jnp.zeros((batch,), jnp.int32),
                        keys)
    assert (np.asarray(passes) == 1 + -(-(n - 1) // k)).all(), (k, passes)
    assert len(calls) == 2


@pytest.mark.parametrize("draft", [2, "auto"])
@pytest.mark.slow
def test_sample_independent_of_batch_composition(draft):
  """A row's tokens depend only on its key (and K): rows 2, 3 of one batch equal rows 0, 1 of
  the batch that starts two samples later (other companions, other orders and finishing times;
  one compiled sampler for both)."""
  m = tiny_model()
  s = sampler.SampleSettings(length=12, method="speculative", draft=draft, top_p=0.9,
                             top_p_rule="nucleus")
  first = sampler.generate(m, jax.random.key(5), s, batch=4)
  later = sampler.generate(m, jax.random.key(5), s, batch=4, sample_offset=2)
  np.testing.assert_array_equal(first.tokens[2:], later.tokens[:2])
  np.testing.assert_array_equal(first.passes[2:], later.passes[:2])
  assert not (first.tokens[:2] == later.tokens[2:]).all()


def test_settings_and_config_checks():
  cfg = tiny_model().cfg
  for bad, msg in [(dict(draft=0), "sample.draft"), (dict(draft="x"), "sample.draft"),
                   (dict(draft=True), "sample.draft"), (dict(greedy=True), "sample.greedy"),
                   (dict(draft_queries="some"), "sample.draft_queries")]:
    with pytest.raises(ValueError, match=msg):
      sampler.SampleSettings(length=8, method="speculative", **bad).validate(cfg)
  c = sample_config_lib.sample_config()
  c.method, c.draft, c.length = "speculative", "5", 8
  assert sample_config_lib.settings_from_config(c, cfg).draft == 5
  c.draft, c.draft_queries = "auto", "all"
  got = sample_config_lib.settings_from_config(c, cfg)
  assert (got.draft, got.draft_queries) == ("auto", "all")
  c.draft = "four"
  with pytest.raises(ValueError, match="sample.draft: must be 'auto' or an integer"):
    sample_config_lib.settings_from_config(c, cfg)
