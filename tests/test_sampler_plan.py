"""Sampler plans and schedules, prompts and orders, key reproducibility, input validation."""

import dataclasses

import jax
import numpy as np
import pytest

from aogpt_jax.sampling import sampler
from aogpt_jax.sampling import prompts, schedules
from helpers.sampler import tiny_model

N = 10


@pytest.fixture(scope="module")
def model():
  return tiny_model()


def _prompt():
  return prompts.pairs_prompt([{1: 3, 7: 5}, {}, {0: 1, 1: 2, 2: 3, 9: 4}], N, 13)


def test_prompt_kept_verbatim_and_first_in_order(model):
  ptok, pmask = _prompt()
  out = sampler.generate(model, jax.random.key(2), sampler.SampleSettings(length=N, steps=4),
                         prompt=(ptok, pmask))
  np.testing.assert_array_equal(out.tokens[pmask], ptok[pmask])
  for b in range(3):
    p = int(pmask[b].sum())
    np.testing.assert_array_equal(out.order[b, :p], np.flatnonzero(pmask[b]))
    assert sorted(out.order[b]) == list(range(N))
  assert (out.tokens < 13).all() and (out.tokens >= 0).all()


@pytest.mark.parametrize("count_mode", ["deterministic", "stochastic"])
def test_same_key_same_samples_across_batch_sizes(model, count_mode):
  s = sampler.SampleSettings(length=N, steps=4, count_mode=count_mode)
  key = jax.random.key(11)
  full = sampler.generate(model, key, s, batch=4).tokens
  one = sampler.generate(model, key, s, batch=1, sample_offset=2).tokens
  np.testing.assert_array_equal(full[2:3], one)
  assert not (full[0] == full[1]).all()
  np.testing.assert_array_equal(full, sampler.generate(model, key, s, batch=4).tokens)
  other = sampler.generate(model, jax.random.key(12), s, batch=4).tokens
  assert not (full == other).all()


def test_plan_commits_every_needed_slot_exactly_once():
  n, batch = 40, 5
  plen = np.array([0, 3, 10, 39, 1])
  for mode in schedules.COUNT_MODES:
    for steps in (1, 4, 13, 39):
      t = schedules.noise_schedule("cosine", steps)
      counts = (schedules.deterministic_counts(n - plen, t) if mode == "deterministic" else
                schedules.stochastic_counts(jax.random.split(jax.random.key(steps), batch),
                                            n - plen, t))
      np.testing.assert_array_equal(counts.sum(1), n - plen)
      for block in (None, 1, 3, 7):
        plan = schedules.plan_steps(counts, plen, block=block)
        for b in range(batch):
          written = list(range(plen[b]))              # prefill
          revealed = list(range(plen[b]))             # ranks whose tokens are known
          step_queries = {}
          for i in range(plan.steps):
            m, q0, k, c0, cc = (int(a[i, b]) for a in plan.xs())
            assert k + cc <= plan.block and k <= plan.queries
            written += list(range(c0, c0 + cc))
            if k == 0:
              continue
            assert m == len(revealed)
            assert set(range(m)) <= set(written), (mode, steps, block, b, i)   # context ready
            if q0 == 0:
              written.append(m)                       # query 0 commits rank-slot m
            step_queries.setdefault(m, []).extend(range(q0, q0 + k))
            step_k = counts[b][counts[b] > 0][len(step_queries) - 1]
            if len(step_queries[m]) == step_k:        # step done: its tokens become known
              assert step_queries[m] == list(range(step_k))
              revealed += list(range(m, m + step_k))
          assert len(written) == len(set(written))    # each slot written once
          assert len(revealed) == n
        if block:
          assert plan.block == block


def test_block_choice_trades_padding_for_passes():
  t = schedules.noise_schedule("linear", 16)
  work = schedules.step_work(schedules.deterministic_counts(np.full(4, 256), t), np.zeros(4))
  assert schedules.choose_block([work]) == 31                 # uniform steps: one pass each
  keys = jax.random.split(jax.random.key(0), 8)
  tn = schedules.noise_schedule("linear", 256)
  counts = schedules.stochastic_counts(keys, np.full(8, 256), tn)
  work = schedules.step_work(counts, np.zeros(8))
  widest = int(np.max(work[0] + work[1]))
  chosen = schedules.choose_block([work])
  assert chosen < widest
  waste = lambda blk: schedules.plan_steps(counts, np.zeros(8), block=blk).stats()["padding_waste"]
  assert waste(chosen) < waste(widest)


def test_deterministic_counts_follow_the_schedule():
  t = schedules.noise_schedule("linear", 8)
  c = schedules.deterministic_counts(np.array([64, 20, 8, 5]), t)
  np.testing.assert_array_equal(c[0], [8] * 8)
  np.testing.assert_array_equal(np.cumsum(c[1]), [2, 5, 7, 10, 12, 15, 17, 20])
  np.testing.assert_array_equal(c[2], [1] * 8)
  np.testing.assert_array_equal(c[3], [1, 1, 1, 1, 1, 0, 0, 0])
  tc = schedules.noise_schedule("cosine", 4)
  assert (np.diff(tc) < 0).all() and tc[0] == 1 and tc[-1] == 0
  cc = schedules.deterministic_counts(np.array([100]), tc)[0]
  np.testing.assert_array_equal(np.cumsum(cc), np.floor(100 * (1 - tc[1:]) + 1e-9))


def test_stochastic_counts_are_multinomial():
  """Lemma 4.1: each position is revealed at step i with probability t_{i-1} - t_i."""
  from scipy import stats
  t = schedules.noise_schedule("cosine", 5)
  keys = jax.random.split(jax.random.key(0), 400)
  c = schedules.stochastic_counts(keys, np.full(400, 50), t)
  assert (c.sum(1) == 50).all()
  p = stats.chisquare(c.sum(0), 400 * 50 * -np.diff(t)).pvalue
  assert p > 1e-3
  assert stats.chisquare(c.sum(0), np.full(5, 4000)).pvalue < 1e-6    # not uniform


@pytest.mark.parametrize("change,match", [
    (dict(steps=0), "sample.steps"), (dict(steps=N + 1), "sample.steps"),
    (dict(top_p=0.0), "sample.top_p"), (dict(top_p=1.5), "sample.top_p"),
    (dict(temperature=0.0), "sample.temperature"), (dict(length=13), "sample.length"),
    (dict(schedule="exp"), "sample.schedule"), (dict(count_mode="x"), "sample.count_mode"),
    (dict(order="sideways"), "sideways"), (dict(method="mcmc"), "sample.method"),
    (dict(order=[0, 0, 1, 2, 3, 4, 5, 6, 7, 8]), "not a permutation"),
    # Python-API types (issue 16): one message naming the field, not a TypeError deep inside.
    (dict(length=float(N)), "sample.length: must be an int, got float"),
    (dict(steps=4.0), "sample.steps: must be an int, got float"),
    (dict(temperature="1.0"), "sample.temperature: must be a number, got str"),
    (dict(top_p="0.9"), "sample.top_p: must be a number, got str")])
def test_bad_settings_raise_before_compiling(model, change, match):
  s = dataclasses.replace(sampler.SampleSettings(length=N, steps=4), **change)
  with pytest.raises(ValueError, match=match):
    sampler.prepare(model.cfg, jax.random.key(0), s, batch=2)


def test_legacy_prngkey_is_the_same_key_and_other_keys_are_named(model):
  s = sampler.SampleSettings(length=N, steps=4)
  p_new = sampler.prepare(model.cfg, jax.random.key(3), s, batch=2)
  p_old = sampler.prepare(model.cfg, jax.random.PRNGKey(3), s, batch=2)
  np.testing.assert_array_equal(p_new.order, p_old.order)
  np.testing.assert_array_equal(p_new.counts, p_old.counts)
  for bad in (0, jax.random.split(jax.random.key(0), 2), np.zeros(3, np.uint32)):
    with pytest.raises(ValueError, match="^key: "):
      sampler.prepare(model.cfg, bad, s, batch=2)


def test_bad_prompts_raise():
  with pytest.raises(ValueError, match="position 10 is out of range"):
    prompts.pairs_prompt([{10: 1}], N, 13)
  with pytest.raises(ValueError, match="position 2 is given more than once"):
    prompts.pairs_prompt([[(2, 1), (2, 3)]], N, 13)
  with pytest.raises(ValueError, match="token 13 is outside the vocabulary"):
    prompts.pairs_prompt([{0: 13}], N, 13)
  with pytest.raises(ValueError, match="token -1 is outside"):
    prompts.validate_prompt(np.full((1, N), -1), np.ones((1, N), bool), N, 13)
  with pytest.raises(ValueError, match="exceed length"):
    prompts.infill_prompt([[1] * 6], [[2] * 5], N, 13)
  m = tiny_model()
  with pytest.raises(ValueError, match="prefix prompts only"):
    sampler.prepare(m.cfg, jax.random.key(0), sampler.SampleSettings(length=N, method="ar"),
                    prompt=prompts.pairs_prompt([{3: 1}], N, 13))


def test_infill_and_given_order(model):
  ptok, pmask = prompts.infill_prompt([[1, 2]], [[3, 4]], N, 13)
  np.testing.assert_array_equal(np.flatnonzero(pmask[0]), [0, 1, 8, 9])
  given = np.arange(N)[::-1].copy()
  out = sampler.generate(model, jax.random.key(0),
                         sampler.SampleSettings(length=N, steps=2, order=given),
                         prompt=(ptok, pmask))
  np.testing.assert_array_equal(out.order[0], [0, 1, 8, 9, 7, 6, 5, 4, 3, 2])
  np.testing.assert_array_equal(out.tokens[0, [0, 1, 8, 9]], [1, 2, 3, 4])
