"""Adaptive order (`sampling.adaptive`, ``method="adaptive"``): the cached sampler equals an
uncached reference that runs the full explicit-mask forward every step with the same policy and
keys (tokens, chosen order, query logits); samples do not depend on the batch or the block size;
``policy="random"`` over all candidates is the diffusion sampler with a random order (chi-square
on the tiny exact model, against the enumerated distribution, with a wrong alternative
rejected); the policies score what their docstrings say; settings are checked before compiling;
``--mode=sample`` writes the chosen order."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.data import get_tokenizer
from aogpt_jax.sampling import adaptive, prompts, sampler
from aogpt_jax.sampling import config as sample_config_lib
from aogpt_jax.sampling import write as sample_write
from helpers import exact_tiny
from helpers import trainer as tu
from helpers.sampler import (chisquare_p, histogram, mixture_over_orders, tiny_encoder,
                             tiny_model)

N_SAMPLES, V, LEN = exact_tiny.N_SAMPLES, exact_tiny.V, exact_tiny.LEN
seqs = exact_tiny.seqs


@pytest.fixture(scope="module")
def model():
  return tiny_model(vocab=16, valid=13, block=12, std=0.5)


@pytest.fixture(scope="module")
def exact_model():
  return tiny_model(vocab=4, valid=V, block=LEN, std=0.5)       # as exact_tiny.model


def _gen(model, s, key=0, **kw):
  return sampler.generate(model, jax.random.key(key), s, **kw)


def _is_permutation(order):
  return (np.sort(order, axis=1) == np.arange(order.shape[1])).all()


# Each case: settings, and an infill prompt or not. Together they cover every policy, all
# candidates and a random subset, counts from the schedule (both count modes) and threshold.
slow = pytest.mark.slow
CASES = [     # the first in the fast subset (seconds each)
    (dict(policy="max_prob", steps=4), False),
    pytest.param(dict(policy="confidence", steps=5, temperature=0.8, top_p=0.9), True, marks=slow),
    pytest.param(dict(policy="margin", steps=3, candidates=5), True, marks=slow),
    pytest.param(dict(policy="entropy", steps=6, count_mode="stochastic", greedy=True), False,
                 marks=slow),
    pytest.param(dict(policy="random", steps=12), True, marks=slow),
    pytest.param(dict(policy="threshold", threshold=0.3, candidates=6), False, marks=slow),
]


@pytest.mark.parametrize("kw,infill", CASES)
def test_cached_equals_the_uncached_reference(model, kw, infill):
  """Tokens, chosen order and every step's query logits equal the reference's (full forward
  with `parallel_generation_mask`, same policy, same keys); prompts stay where they were put."""
  s = sampler.SampleSettings(length=12, method="adaptive", **kw)
  prompt = (prompts.pairs_prompt([{0: 3, 11: 4}, {5: 1}, {}], 12, 13) if infill else None)
  batch = None if infill else 3
  out = _gen(model, s, 1, prompt=prompt, batch=batch, debug=True)
  ref = _gen(model, s, 1, prompt=prompt, batch=batch, debug=True, reference=True)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.order, ref.order)
  np.testing.assert_array_equal(out.passes, ref.passes)
  fin = np.isfinite(ref.logits)
  np.testing.assert_array_equal(np.isfinite(out.logits), fin)
  np.testing.assert_allclose(out.logits[fin], ref.logits[fin], atol=2e-5)
  assert _is_permutation(out.order) and (out.tokens < 13).all()
  if infill:
    assert out.tokens[0, 0] == 3 and out.tokens[0, 11] == 4 and out.tokens[1, 5] == 1
    assert list(out.order[0, :2]) == [0, 11] and out.order[1, 0] == 5
  if kw["policy"] != "threshold" and kw.get("count_mode") != "stochastic":
    todo = 12 - (np.array([2, 1, 0]) if infill else 0)
    np.testing.assert_array_equal(out.passes, np.minimum(kw["steps"], todo))
  np.testing.assert_array_equal(out.step_of_rank, ref.step_of_rank)
  counts = (None if kw["policy"] == "threshold" else
            sampler.prepare(model.cfg, jax.random.key(1), s, prompt=prompt, batch=batch).counts)
  check_step_of_rank(out, np.array([2, 1, 0]) if infill else np.zeros(3, int), counts)


@pytest.mark.parametrize("kw", [dict(policy="threshold", threshold=0.3)])
def test_query_phases_change_nothing_but_the_cost(model, monkeypatch, kw):
  """With the late steps run on ceil(Q / 2) query slots (`AdaptiveShape.phases`, here from Q =
  4 on), the cached sampler draws what one phase of Q slots draws (tokens, order, steps, the
  recorded log-probabilities) and what its uncached reference draws with the same phases (query
  logits included), prompts at any positions. Here the threshold policy (a step's commits vary);
  tests/test_blank_block.py checks a stochastic policy's recorded log-probabilities."""
  kw = dict(kw)
  logp = kw.pop("return_logp", False)
  s = sampler.SampleSettings(length=12, method="adaptive", **kw)
  prompt = prompts.pairs_prompt([{0: 3, 11: 4}, {5: 1}, {}], 12, 13)
  monkeypatch.setattr(adaptive, "PHASE_MIN_QUERIES", 0)
  one = _gen(model, s, 1, prompt=prompt, return_logp=logp)
  monkeypatch.setattr(adaptive, "PHASE_MIN_QUERIES", 4)
  p = sampler.prepare(model.cfg, jax.random.key(1), s, prompt=prompt)
  assert sampler.adaptive_shape(p, s).phases == (12, 6)
  two = _gen(model, s, 1, prompt=prompt, debug=True, return_logp=logp)
  ref = _gen(model, s, 1, prompt=prompt, debug=True, reference=True)
  for a in (two, ref):
    for f in ("tokens", "order", "passes", "step_of_rank"):
      np.testing.assert_array_equal(getattr(a, f), getattr(one, f))
  if logp:
    np.testing.assert_allclose(two.model_logp, one.model_logp, atol=1e-6)
    np.testing.assert_allclose(two.order_logp, one.order_logp, atol=1e-6)
  fin = np.isfinite(ref.logits)
  np.testing.assert_array_equal(np.isfinite(two.logits), fin)
  np.testing.assert_allclose(two.logits[fin], ref.logits[fin], atol=2e-5)
  assert not fin[-1, :, 6:].any()      # the last step ran on 6 query slots


def check_step_of_rank(out, plen, counts=None):
  """``out.step_of_rank``: -1 at the prompt's ranks, then steps 0 .. passes-1 in rank order,
  every step committing at least one position (as many as ``counts`` [B, T] says, if given)."""
  assert out.step_of_rank.shape == out.order.shape and out.step_of_rank.dtype == np.int32
  for r, sor in enumerate(out.step_of_rank):
    assert (sor[:plen[r]] == -1).all() and (np.diff(sor[plen[r]:]) >= 0).all()
    per_step = np.bincount(sor[plen[r]:], minlength=out.passes[r])
    assert len(per_step) == out.passes[r] and (per_step > 0).all(), (r, sor, out.passes)
    if counts is not None:
      np.testing.assert_array_equal(per_step, counts[r, :out.passes[r]])


def test_reference_queries_are_plain_causal_forwards(model):
  """The reference's first-step query logits are the gather-path forward of the order that puts
  each candidate first (an independent computation)."""
  s = sampler.SampleSettings(length=12, method="adaptive", steps=4)
  ref = _gen(model, s, 2, batch=2, debug=True, reference=True)
  for pos in (0, 5, 11):
    order = np.array([pos] + [p for p in range(12) if p != pos])
    o = jnp.broadcast_to(jnp.asarray(order, jnp.int32), (2, 12))
    want = np.asarray(model(jnp.zeros((2, 12), jnp.int32), o))[:, 0]
    fin = np.isfinite(want)
    np.testing.assert_allclose(ref.logits[0, :, pos][fin], want[fin], atol=2e-5)


@pytest.mark.slow
def test_samples_do_not_depend_on_batch_or_block(model):
  s = sampler.SampleSettings(length=12, method="adaptive", policy="margin", steps=4,
                             candidates=6, temperature=0.9)
  full = _gen(model, s, 3, batch=4)
  alone = _gen(model, s, 3, batch=1, sample_offset=2)
  np.testing.assert_array_equal(full.tokens[2:3], alone.tokens)
  np.testing.assert_array_equal(full.order[2:3], alone.order)
  wide = _gen(model, s, 3, batch=4, block=16)
  np.testing.assert_array_equal(full.tokens, wide.tokens)
  np.testing.assert_array_equal(full.order, wide.order)
  # a batch whose other row has a prompt (fewer query slots, a prefill pass)
  p = prompts.pairs_prompt([{}, {}, {}, {4: 7, 9: 2}], 12, 13)
  mixed = _gen(model, s, 3, prompt=p)
  np.testing.assert_array_equal(full.tokens[:3], mixed.tokens[:3])


def test_max_prob_commits_the_most_confident_position_first(model):
  """Greedy, one commit per step: at each step the committed position is the argmax over the
  still-masked positions of the query's max probability, recomputed here by plain forwards."""
  s = sampler.SampleSettings(length=12, method="adaptive", steps=12, greedy=True)
  out = _gen(model, s, 0, batch=1)
  order, toks = out.order[0], out.tokens[0]
  for m in range(4):
    best = None
    for pos in set(range(12)) - set(order[:m]):
      o = np.array(list(order[:m]) + [pos] + [p for p in range(12) if p not in order[:m] and
                                             p != pos])
      logits = np.asarray(model(jnp.asarray(toks)[None], jnp.asarray(o, jnp.int32)[None]))[0, m]
      p = np.exp(logits - np.logaddexp.reduce(logits))
      if best is None or p.max() > best[0]:
        best = (p.max(), pos, int(np.argmax(p)))
    assert order[m] == best[1] and toks[best[1]] == best[2]


def test_policies_score_as_documented():
  probs = jnp.array([[[0.7, 0.2, 0.1], [0.4, 0.4, 0.2], [1.0, 0.0, 0.0]]])
  toks = jnp.array([[1, 0, 0]])
  pos = jnp.array([[3, 1, 2]])
  keys = jax.random.split(jax.random.key(0), 1)
  f = lambda name: np.asarray(adaptive.get(name)(probs, toks, pos, 0, keys))[0]
  np.testing.assert_allclose(f("max_prob"), [0.7, 0.4, 1.0])
  np.testing.assert_allclose(f("confidence"), [0.2, 0.4, 1.0])
  np.testing.assert_allclose(f("margin"), [0.5, 0.0, 1.0], atol=1e-7)
  ent = -np.array([0.7 * np.log(0.7) + 0.2 * np.log(0.2) + 0.1 * np.log(0.1),
                   2 * 0.4 * np.log(0.4) + 0.2 * np.log(0.2), 0.0])
  np.testing.assert_allclose(f("entropy"), -ent, rtol=1e-6)
  r = f("random")
  assert ((r >= 0) & (r < 1)).all() and len(set(r)) == 3
  np.testing.assert_allclose(f("threshold"), f("max_prob"))


@adaptive.register("test_nan_all")
def _nan_all(probs, tokens, positions, step, keys):
  return jnp.full(probs.shape[:2], jnp.nan)


@adaptive.register("test_nan_some")
def _nan_some(probs, tokens, positions, step, keys):
  return jnp.where(positions % 3 == 0, jnp.nan, jnp.max(probs, axis=-1))


@adaptive.register("test_scores_b")
def _scores_b(probs, tokens, positions, step, keys):
  return jnp.max(probs, axis=(1, 2))


@adaptive.register("test_scores_bqv")
def _scores_bqv(probs, tokens, positions, step, keys):
  return probs


@pytest.mark.parametrize("which", ["aogpt", pytest.param("encoder", marks=slow)])
@pytest.mark.parametrize("policy,steps", [("test_nan_all", 12), ("test_nan_some", 12),
                                          pytest.param("test_nan_some", 5, marks=slow)])
def test_nan_scores_rank_last_and_every_position_is_written_once(model, which, policy, steps):
  """A policy's NaN scores rank as -inf (issue: an order like [0, 1, 2, 3, 0, 1, ...] with most
  positions never written): every position is written exactly once, the prompt kept, the
  positions with a real score before the NaN ones (one per step), NaN ties by position."""
  m = model if which == "aogpt" else tiny_encoder(vocab=16, valid=13, block=12, std=0.5)
  s = sampler.SampleSettings(length=12, method="adaptive", policy=policy, steps=steps)
  prompt = prompts.pairs_prompt([{4: 3, 10: 4}, {}], 12, 13)
  out = _gen(m, s, 3, prompt=prompt)
  assert _is_permutation(out.order) and (out.tokens < 13).all()
  assert out.tokens[0, 4] == 3 and out.tokens[0, 10] == 4 and list(out.order[0, :2]) == [4, 10]
  check_step_of_rank(out, np.array([2, 0]))
  if steps < 12:
    return
  nan_pos = [[p for p in range(12) if p % 3 == 0 and p not in (4, 10)], [0, 3, 6, 9]]
  for r, plen in enumerate((2, 0)):
    if policy == "test_nan_all":
      want = [p for p in range(12) if p not in (4, 10)] if r == 0 else list(range(12))
      assert list(out.order[r, plen:]) == want
    else:
      assert list(out.order[r, 12 - len(nan_pos[r]):]) == nan_pos[r]


@pytest.mark.parametrize("policy,got", [("test_scores_b", r"\[2\]"),
                                        ("test_scores_bqv", r"\[2, 12, 16\]")])
def test_misshapen_scores_raise_one_line_naming_the_policy(model, policy, got):
  s = sampler.SampleSettings(length=12, method="adaptive", policy=policy, steps=4)
  with pytest.raises(ValueError, match=rf"^sample.policy: policy '{policy}' returned scores of "
                                       rf"shape {got}, expected \[B, Q\] = \[2, 12\]") as e:
    _gen(model, s, batch=2)
  assert "\n" not in str(e.value)


def test_threshold_commits_every_sure_candidate_at_least_one(model):
  s = lambda t, **kw: sampler.SampleSettings(length=12, method="adaptive", policy="threshold",
                                             threshold=t, greedy=True, **kw)
  never = _gen(model, s(1.0), 0, batch=2)         # nothing reaches 1: one per step
  assert (never.passes == 12).all()
  capped = _gen(model, s(1.0, candidates=4), 0, batch=2)    # 4 queries, still every position
  assert (capped.passes == 12).all() and _is_permutation(capped.order)
  always = _gen(model, s(1e-9), 0, batch=2)       # everything: one step
  assert (always.passes == 1).all() and _is_permutation(always.order)


@pytest.mark.parametrize("change,match", [
    (dict(policy="nope"), "sample.policy: unknown policy 'nope'"),
    (dict(candidates=0), "sample.candidates"),
    (dict(policy="threshold", threshold=1.5), "sample.threshold"),
    (dict(steps=2, candidates=3), "sample.candidates: 3 is fewer than the 6"),
])
def test_bad_settings_raise_one_line_before_compiling(model, monkeypatch, change, match):
  monkeypatch.setattr(sampler, "sample_batch", lambda *a, **k: pytest.fail("compiled"))
  s = sampler.SampleSettings(length=12, method="adaptive", **change)
  with pytest.raises(ValueError, match=match):
    _gen(model, s, batch=1)


@pytest.mark.slow
def test_mode_sample_writes_the_chosen_order(tmp_path):
  m = tiny_model(vocab=320, valid=257, block=16)
  c = sample_config_lib.sample_config()
  c.update(dict(num_samples=3, batch_size=2, length=16, steps=4, method="adaptive",
                policy="entropy", candidates=8, prompt="Hi", name="adaptive_run"))
  path = sample_write.write_samples(m, c, str(tmp_path), get_tokenizer("byte"))
  lines = [json.loads(line) for line in open(path)]
  assert len(lines) == 3
  for line in lines:
    assert sorted(line["order"]) == list(range(16)) and line["order"][:2] == [0, 1]
    assert line["tokens"][:2] == [72, 105]
  s = sampler.SampleSettings(length=16, steps=4, method="adaptive", policy="entropy",
                             candidates=8)
  p = prompts.prefix_prompt([[72, 105]] * 3, 16, 257)
  direct = sampler.generate(m, jax.random.key(0), s, prompt=p)
  assert [line["order"] for line in lines] == direct.order.tolist()
  meta = json.load(open(str(path)[:-len(".jsonl")] + ".json"))
  assert meta["settings"]["policy"] == "entropy" and meta["settings"]["candidates"] == 8


def test_random_policy_is_the_random_order_diffusion_sampler(exact_model, seqs):
  """policy="random" over all candidates, T = 2 (reveals 2 then 2): the distribution of the
  diffusion sampler with a uniformly random order at the same counts, by enumeration; one token
  per step (the T = n distribution) is rejected."""
  s = sampler.SampleSettings(length=LEN, steps=2, method="adaptive", policy="random")
  out = sampler.generate(exact_model, jax.random.key(7), s, batch=N_SAMPLES)
  hist = histogram(out.tokens, V)
  exact = mixture_over_orders(exact_model, seqs, range(LEN), [2, 2])
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  ancestral = mixture_over_orders(exact_model, seqs, range(LEN), [1] * LEN)
  assert chisquare_p(hist, ancestral, N_SAMPLES) < 1e-6
  # and the orders it chose are uniform: each of the 4! orders about 1/24 of the time
  ranks = np.unique(out.order, axis=0, return_counts=True)[1]
  assert len(ranks) == 24 and chisquare_p(ranks, np.full(24, 1 / 24), N_SAMPLES) > 1e-3


@pytest.mark.slow
@pytest.mark.subprocess
def test_frontier_benchmark_tiny_run(tmp_path):
  """benchmarks/sampling_frontier.py --tiny: every sampler's row, the goals, the JSON schema and
  the PNG."""
  import pathlib
  import subprocess
  import sys
  repo = pathlib.Path(__file__).resolve().parent.parent
  out = tmp_path / "frontier.json"
  subprocess.run([sys.executable, str(repo / "benchmarks" / "sampling_frontier.py"), "--tiny",
                  f"--out={out}"], check=True, cwd=repo, capture_output=True, timeout=900,
                 env=tu.cpu_env(fast_compile=True))     # one CPU device, as a user runs it
  rec = json.loads(out.read_text())
  assert rec["benchmark"] == "sampling_frontier" and rec["machine"]["slug"]
  names = {r["sampler"] for r in rec["results"]["rows"]}
  assert names == {"ar", "diffusion", "speculative", "adaptive threshold",
                   "adaptive max_prob C=8"} | {f"adaptive {p}" for p in
                                               ("max_prob", "confidence", "margin", "entropy",
                                                "random")}
  for r in rec["results"]["rows"]:
    assert r["run_s"] > 0 and r["judge_nll"] > 0 and 0 <= r["repeat_4gram_rate"] <= 1
  assert set(rec["results"]["goals"]["time_ratio"]) == {
      f"{p} T=4" for p in ("max_prob", "confidence", "margin", "entropy", "random")}
  assert (tmp_path / "frontier.png").stat().st_size > 10000


@pytest.mark.slow
def test_rope_cached_equals_the_uncached_reference():
  """``model.rope`` (keys turned in the cache, queries by target): still the reference's tokens,
  order and logits, with an infill prompt and a subset of candidates."""
  test_cached_equals_the_uncached_reference(
      tiny_model(rope=True, seed=2), dict(policy="margin", steps=3, candidates=5), True)
