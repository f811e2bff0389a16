"""The encoder-only MDM sampler (method ``encoder``): exact to the encoder's distribution by
enumeration, logits equal plain encoder forwards, the shared key scheme, prompts, errors.

Tiny encoder: 3 valid tokens + [MASK], length 4 (81 sequences), init std 0.5. Expected
distributions come from plain bidirectional forwards with the not-yet-revealed positions set to
[MASK] (`helpers.sampler.encoder_parallel_logprob`) or from `mdm.exact_order_nll`; every
chi-square test also rejects a wrong alternative, so it can fail.
"""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.model import encoder as mdm
from aogpt_jax.sampling import adaptive, sampler
from aogpt_jax.sampling import config as sample_config_lib
from aogpt_jax.sampling import write as sample_write
from aogpt_jax.data import get_tokenizer
from aogpt_jax.sampling import prompts
from aogpt_jax.sampling import tokens as tokens_lib
from aogpt_jax.sampling.state import Draw
from helpers import exact_tiny
from helpers.sampler import (chisquare_p, encoder_forward, encoder_parallel_logprob, histogram,
                             mixture_over_orders, tiny_encoder, tiny_model)

N_SAMPLES, V, LEN = exact_tiny.N_SAMPLES, exact_tiny.V, exact_tiny.LEN
model, seqs = exact_tiny.encoder_model, exact_tiny.seqs     # the shared fixtures


def _mix(model, seqs, counts, positions=range(LEN), **kw):
  return mixture_over_orders(model, seqs, positions, counts, logprob=encoder_parallel_logprob,
                             **kw)


def _draw(model, key, **settings):
  s = sampler.SampleSettings(length=LEN, method="encoder", **settings)
  out = sampler.generate(model, jax.random.key(key), s, batch=N_SAMPLES)
  assert (out.tokens < V).all(), "a padding id or [MASK] was sampled"
  return histogram(out.tokens, V), out


def test_t_equals_n_fixed_order_is_ancestral_sampling_of_that_order(model, seqs):
  order = np.array([2, 0, 3, 1])
  hist, out = _draw(model, 0, steps=LEN, order=order)
  assert out.plan.queries == 1 and out.plan.steps == LEN
  nll = np.asarray(jax.jit(mdm.exact_order_nll)(
      model, jnp.asarray(seqs), jnp.broadcast_to(jnp.asarray(order), seqs.shape)))
  exact = np.exp(-nll.sum(1, dtype=np.float64))
  assert abs(exact.sum() - 1) < 1e-5
  # the two oracles agree: mdm's n-forward NLL and the testlib's masked forwards
  np.testing.assert_allclose(exact, np.exp(encoder_parallel_logprob(model, seqs, order, [1] * 4)),
                             rtol=1e-4)
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  other = np.exp(encoder_parallel_logprob(model, seqs, np.array([0, 1, 2, 3]), [1] * 4))
  assert chisquare_p(hist, other, N_SAMPLES) < 1e-6   # an encoder's joint depends on the order


def test_t_equals_n_random_order(model, seqs):
  hist, _ = _draw(model, 1, steps=LEN)
  exact = _mix(model, seqs, [1] * LEN)
  assert abs(exact.sum() - 1) < 1e-9
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  assert chisquare_p(hist, _mix(model, seqs, [2, 2]), N_SAMPLES) < 1e-6


def test_parallel_steps_are_products_of_conditionals_given_the_same_revealed_set(model, seqs):
  hist, out = _draw(model, 2, steps=2)                         # linear: reveals 2 then 2
  np.testing.assert_array_equal(out.plan.k, 2)
  exact = _mix(model, seqs, [2, 2])
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  assert chisquare_p(hist, _mix(model, seqs, [1] * LEN), N_SAMPLES) < 1e-6


def test_cosine_schedule_and_stochastic_counts(model, seqs):
  # cosine, T = 3, deterministic: floor(4 (1 - cos(pi/6))) = 0 -> 1 forced, then 2, then 4
  hist, out = _draw(model, 3, steps=3, schedule="cosine")
  np.testing.assert_array_equal(out.plan.k[:, 0], [1, 1, 2])
  assert chisquare_p(hist, _mix(model, seqs, [1, 1, 2]), N_SAMPLES) > 1e-3
  assert chisquare_p(hist, _mix(model, seqs, [2, 2]), N_SAMPLES) < 1e-6
  # Lemma 4.1, linear, T = 2: k_1 ~ Binomial(4, 1/2), then the rest
  hist, _ = _draw(model, 4, steps=2, count_mode="stochastic")
  exact = np.zeros(len(seqs))
  for k1 in range(LEN + 1):
    counts = [c for c in (k1, LEN - k1) if c > 0]
    exact += math.comb(LEN, k1) / 2 ** LEN * _mix(model, seqs, counts)
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  assert chisquare_p(hist, _mix(model, seqs, [2, 2]), N_SAMPLES) < 1e-6


def test_temperature_and_top_p(model, seqs):
  kw = dict(temperature=0.7, top_p=0.8)
  hist, _ = _draw(model, 5, steps=LEN, **kw)
  assert chisquare_p(hist, _mix(model, seqs, [1] * LEN, **kw), N_SAMPLES) > 1e-3
  assert chisquare_p(hist, _mix(model, seqs, [1] * LEN), N_SAMPLES) < 1e-6


def test_infilling_is_the_conditional_of_the_prompt(model, seqs):
  """Position 1 given (token 2), the rest generated in random order in 2 steps (1 then 2)."""
  prompt = prompts.pairs_prompt([{1: 2}] * N_SAMPLES, LEN, V)
  s = sampler.SampleSettings(length=LEN, steps=2, method="encoder")
  out = sampler.generate(model, jax.random.key(6), s, prompt=prompt)
  assert (out.tokens[:, 1] == 2).all()
  keep = seqs[:, 1] == 2
  hist = histogram(out.tokens, V)[keep]
  exact = _mix(model, seqs, [1, 2], positions=[0, 2, 3], prefix=(1,))[keep]
  assert abs(exact.sum() - 1) < 1e-9
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  wrong = _mix(model, seqs, [3], positions=[0, 2, 3], prefix=(1,))[keep]
  assert chisquare_p(hist, wrong, N_SAMPLES) < 1e-6


# ----------------------------------------------------------------------------- longer sequences

N = 10


@pytest.fixture(scope="module")
def enc10():
  return tiny_encoder(vocab=16, valid=13, block=N, std=0.3)


def _prompt():
  return prompts.pairs_prompt([{1: 3, 7: 5}, {}, {0: 1, 1: 2, 2: 3, 9: 4}], N, 13)


@pytest.mark.parametrize("count_mode,steps", [("deterministic", 4), ("stochastic", 6)])
@pytest.mark.slow
def test_pass_logits_are_masked_encoder_forwards_and_tokens_use_the_shared_keys(enc10, count_mode,
                                                                                steps):
  ptok, pmask = _prompt()
  s = sampler.SampleSettings(length=N, steps=steps, count_mode=count_mode, method="encoder",
                             top_p=0.9, temperature=0.8)
  key = jax.random.key(3)
  out = sampler.generate(enc10, key, s, prompt=(ptok, pmask), debug=True)
  plan, b = out.plan, 3
  np.testing.assert_array_equal(out.tokens[pmask], ptok[pmask])          # prompt verbatim
  for r in range(b):
    np.testing.assert_array_equal(out.order[r, :pmask[r].sum()], np.flatnonzero(pmask[r]))
  # committed tokens never change, so the input of pass i is the final tokens at ranks < m_i
  rank = np.argsort(out.order, axis=1)
  inp = np.where(rank[None] < plan.m[:, :, None], out.tokens[None], mdm.mask_id(enc10.cfg))
  ref = np.asarray(encoder_forward(enc10)(jnp.asarray(inp.reshape(-1, N)))).reshape(
      plan.steps, b, N, -1)
  j = np.arange(plan.queries)
  ranks_q = np.minimum(plan.m[..., None] + plan.q0[..., None] + j, N - 1)      # [P, B, Q]
  qpos = np.take_along_axis(np.broadcast_to(out.order, (plan.steps, b, N)), ranks_q, axis=2)
  valid = j < plan.k[..., None]
  want = np.take_along_axis(ref, qpos[..., None], axis=2)                      # [P, B, Q, V]
  fin = valid[..., None] & np.isfinite(want)
  np.testing.assert_array_equal(np.isfinite(out.logits)[valid], np.isfinite(want)[valid])
  np.testing.assert_allclose(out.logits[fin], want[fin], atol=1e-5, rtol=1e-5)
  # every generated position is drawn once, with the AO-GPT sampler's key for (sample, position)
  assert valid.sum() == int(np.sum(N - pmask.sum(1)))
  tok_keys = tokens_lib.stream(tokens_lib.sample_keys(key, b), tokens_lib.TOKEN_STREAM)
  keys = jax.vmap(lambda p: tokens_lib.token_keys(tok_keys, p))(jnp.asarray(qpos))
  with tokens_lib.exact_sampling():
    redrawn = jax.jit(lambda l, k: tokens_lib.sample_tokens(l, k, temperature=0.8, top_p=0.9))(
        jnp.asarray(out.logits), keys)
  rows = np.broadcast_to(np.arange(b)[None, :, None], qpos.shape)
  np.testing.assert_array_equal(np.asarray(redrawn)[valid], out.tokens[rows[valid], qpos[valid]])


@pytest.mark.slow
def test_same_key_same_samples_across_batch_sizes_and_block(enc10):
  s = sampler.SampleSettings(length=N, steps=4, count_mode="stochastic", method="encoder")
  key = jax.random.key(11)
  full = sampler.generate(enc10, key, s, batch=4).tokens
  one = sampler.generate(enc10, key, s, batch=1, sample_offset=2).tokens
  np.testing.assert_array_equal(full[2:3], one)
  assert not (full[0] == full[1]).all()
  split = sampler.generate(enc10, key, s, batch=4, block=1).tokens   # one position per forward
  np.testing.assert_array_equal(full, split)
  assert not (full == sampler.generate(enc10, jax.random.key(12), s, batch=4).tokens).all()


def test_greedy_infill_fills_every_gap_and_keeps_the_prompt(enc10):
  ptok, pmask = prompts.infill_prompt([[1, 2], [4]], [[3, 4], [5, 6, 7]], N, 13)
  s = sampler.SampleSettings(length=N, steps=3, method="encoder", greedy=True, order="l2r")
  out = sampler.generate(enc10, jax.random.key(0), s, prompt=(ptok, pmask), debug=True)
  np.testing.assert_array_equal(out.tokens[pmask], ptok[pmask])
  assert ((out.tokens >= 0) & (out.tokens < 13)).all()
  valid = out.plan.k[:, :, None] > np.arange(out.plan.queries)[None, None, :]
  assert (out.logits.argmax(-1)[valid] < 13).all()


def test_errors_name_the_problem(enc10):
  aogpt = tiny_model(block=N)
  with pytest.raises(ValueError, match="model.target='adaln'"):
    sampler.prepare(aogpt.cfg, jax.random.key(0),
                    sampler.SampleSettings(length=N, method="encoder"), batch=2)
  s = dataclasses.replace(sampler.SampleSettings(length=N, method="encoder"), steps=N + 1)
  with pytest.raises(ValueError, match="sample.steps"):
    sampler.prepare(enc10.cfg, jax.random.key(0), s, batch=2)
  no_mask = enc10.cfg.replace(vocab_size=13)
  with pytest.raises(ValueError, match="must exceed model.valid_vocab_size"):
    sampler.prepare(no_mask, jax.random.key(0), sampler.SampleSettings(length=N, method="encoder"),
                    batch=2)


def test_write_samples_with_the_encoder(tmp_path):
  enc = tiny_encoder(vocab=320, valid=257, block=16, std=0.02)
  c = sample_config_lib.sample_config()
  c.update(dict(method="encoder", num_samples=3, batch_size=2, length=16, steps=4, prompt="Hi",
                suffix="!"))
  path = sample_write.write_samples(enc, c, str(tmp_path), get_tokenizer("byte"))
  lines = [json.loads(l) for l in open(path)]
  assert len(lines) == 3 and path.endswith("encoder_T4_linear_deterministic_p1_t1_seed0.jsonl")
  for l in lines:
    assert l["tokens"][:2] == [72, 105] and l["tokens"][-1] == 33 and max(l["tokens"]) < 257


# ----------------------------------------------------------------------------- adaptive order

def _adaptive_reference(enc, key, s, ptok, pmask):
  """The encoder's adaptive sampler as a slow Python loop, row by row: at each step ONE full
  `mdm.masked_logits` forward ([MASK] at every unwritten position), every position's token drawn
  with its own key (`tokens.token_keys`), the policy's scores at the still-masked positions, and
  the best ones (score descending, then position) committed: as many as the step's count, or for
  ``threshold`` every one whose largest probability reaches it (at least one). Returns (tokens,
  order, steps per row, step_of_rank)."""
  b, n = ptok.shape
  counts = sampler.prepare(enc.cfg, key, s, prompt=(ptok, pmask)).counts
  keys = tokens_lib.sample_keys(key, b)
  tok_keys = tokens_lib.stream(keys, tokens_lib.TOKEN_STREAM)
  score_keys = tokens_lib.stream(tokens_lib.stream(keys, tokens_lib.POLICY_STREAM),
                                 adaptive.SCORE_STREAM)
  draw = Draw(temperature=s.temperature, top_p=s.top_p, greedy=s.greedy)
  every_1xN = jnp.arange(n, dtype=jnp.int32)[None]
  forward = jax.jit(lambda t, m: mdm.masked_logits(enc, t, m, every_1xN))
  sample = jax.jit(lambda lg, k: tokens_lib.sample_tokens(
      lg, k, temperature=s.temperature, top_p=s.top_p, greedy=s.greedy))
  policy = adaptive.get(s.policy)
  toks, order = ptok.copy(), np.full((b, n), -1)
  steps, step_of_rank = np.zeros(b, int), np.full((b, n), -1)
  with tokens_lib.exact_sampling():
    for r in range(b):
      written = list(np.flatnonzero(pmask[r]))          # the prompt: ranks 0.., ascending
      order[r, :len(written)] = written
      i = 0
      while len(written) < n:
        masked = np.ones(n, bool)
        masked[written] = False
        logits = forward(jnp.asarray(toks[r:r + 1]), jnp.asarray(masked[None]))  # [1, n, V]
        drawn = np.asarray(sample(logits, tokens_lib.token_keys(tok_keys[r:r + 1], every_1xN)))[0]
        cand = np.flatnonzero(masked)
        probs = adaptive.policy_probs(logits[:, cand], draw)                     # [1, Q, V]
        scores = np.asarray(policy(probs, jnp.asarray(drawn[cand][None]), jnp.asarray(cand[None]),
                                   jnp.int32(i), jax.random.fold_in(score_keys[r], i)[None]))[0]
        if s.policy == "threshold":
          k = max(1, int((np.asarray(probs[0]).max(-1) >= s.threshold).sum()))
        else:
          k = int(counts[r, i]) if i < counts.shape[1] else 0
        chosen = sorted(range(len(cand)), key=lambda j: (-scores[j], cand[j]))[:k]
        for j in chosen:
          order[r, len(written)] = cand[j]
          step_of_rank[r, len(written)] = i
          toks[r, cand[j]] = drawn[cand[j]]
          written.append(cand[j])
        steps[r] += k > 0
        i += 1
  return toks, order, steps, step_of_rank


def _adaptive_prompt():
  return prompts.pairs_prompt([{1: 3, 7: 5}, {}, {0: 1, 9: 4}], N, 13)


ADAPTIVE_CASES = [    # policy, greedy or drawn at temperature 1, counts or threshold, a prompt
    dict(policy="max_prob", steps=4, greedy=True),          # the first in the fast subset
    *(pytest.param(kw, marks=pytest.mark.slow) for kw in (
        dict(policy="max_prob", steps=5),
        dict(policy="margin", steps=N, greedy=True),
        dict(policy="margin", steps=3, count_mode="stochastic"),
        dict(policy="threshold", threshold=0.12),
        dict(policy="threshold", threshold=0.12, greedy=True))),
]


@pytest.mark.parametrize("kw", ADAPTIVE_CASES)
def test_adaptive_equals_the_slow_reference_and_writes_each_position_once(enc10, kw):
  """method='adaptive' on the encoder: tokens, order, steps and step_of_rank equal the Python
  reference's; every position is written exactly once, the prompt first and verbatim (rank -1
  in step_of_rank); each step's commits add up to the rows' steps and counts."""
  ptok, pmask = _adaptive_prompt()
  s = sampler.SampleSettings(length=N, method="adaptive", **kw)
  key = jax.random.key(5)
  out = sampler.generate(enc10, key, s, prompt=(ptok, pmask))
  toks, order, steps, step_of_rank = _adaptive_reference(enc10, key, s, ptok, pmask)
  np.testing.assert_array_equal(out.tokens, toks)
  np.testing.assert_array_equal(out.order, order)
  np.testing.assert_array_equal(out.passes, steps)
  np.testing.assert_array_equal(out.step_of_rank, step_of_rank)
  plen = pmask.sum(1)
  assert (np.sort(out.order, axis=1) == np.arange(N)).all()
  assert ((out.tokens >= 0) & (out.tokens < 13)).all()
  np.testing.assert_array_equal(out.tokens[pmask], ptok[pmask])
  for r in range(3):
    np.testing.assert_array_equal(np.sort(out.order[r, :plen[r]]), np.flatnonzero(pmask[r]))
    sor = out.step_of_rank[r]
    assert (sor[:plen[r]] == -1).all() and (np.diff(sor[plen[r]:]) >= 0).all()
    per_step = np.bincount(sor[plen[r]:], minlength=out.passes[r])
    assert len(per_step) == out.passes[r] and (per_step > 0).all()
    if s.policy != "threshold":
      prep = sampler.prepare(enc10.cfg, key, s, prompt=(ptok, pmask))
      np.testing.assert_array_equal(per_step, prep.counts[r, :out.passes[r]])
  if s.policy == "threshold":
    assert out.passes.min() < N - plen.max()       # some step committed several


def test_adaptive_on_an_mdm_config_validates_and_samples(tmp_path):
  """objective=mdm takes sample.method=adaptive (config check, the objective's methods) and its
  sample group samples the encoder through `generate`; reference=True and block are refused."""
  from aogpt_jax import config as config_lib
  from aogpt_jax.model import objectives
  from helpers.trainer import tiny_config
  assert objectives.get("mdm").sample_methods == ("encoder", "adaptive")
  cfg = tiny_config(tmp_path, objective="mdm", sample__method="adaptive",
                    sample__policy="margin", sample__steps=4, eval__ensemble_max_m=0)
  config_lib.resolve(cfg)
  assert cfg.sample.method == "adaptive"
  enc = tiny_encoder(vocab=320, valid=257, block=16, std=0.02)
  s = sample_config_lib.settings_from_config(cfg.sample, enc.cfg, trained_length=8)
  assert (s.method, s.policy, s.length) == ("adaptive", "margin", 8)
  out = sampler.generate(enc, jax.random.key(0), s, batch=2)
  assert (np.sort(out.order, axis=1) == np.arange(8)).all() and (out.tokens < 257).all()
  np.testing.assert_array_equal(out.passes, 4)
  with pytest.raises(ValueError, match="generate: reference=True"):
    sampler.generate(enc, jax.random.key(0), s, batch=2, reference=True)
  with pytest.raises(ValueError, match="^block: the encoder's adaptive sampler"):
    sampler.generate(enc, jax.random.key(0), s, batch=2, block=16)
  no_mask = enc.cfg.replace(vocab_size=257)
  with pytest.raises(ValueError, match="must exceed model.valid_vocab_size"):
    sampler.prepare(no_mask, jax.random.key(0), s, batch=2)
