"""Adaptive rollouts that carry their likelihood, and the stochastic order policy
(`sampling.adaptive`, ``policy_temperature`` > 0; `posttrain.likelihood.order_logp`): the
recorded token and order log-probabilities equal the teacher-forced recomputation (cached sampler
and uncached reference, with a prompt and parallel steps, at temperature 1 and another); at
tau -> 0 the stochastic policy is the deterministic one; its orders follow the Plackett-Luce
probabilities of an independent float64 computation (chi-square, a uniform alternative
rejected); the order log-probability's gradient equals a finite difference; GRPO's gradient
carries the order term; bad settings are one-line errors before anything compiles."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import tasks
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.posttrain import grpo, likelihood
from aogpt_jax.sampling import config as sample_config_lib
from aogpt_jax.sampling import prompts, sampler
from helpers.sampler import chisquare_p, tiny_encoder, tiny_model

B, N, V = 3, 10, 13
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
  return tiny_model(block=N)


def _prompt():
  return prompts.pairs_prompt([{1: 3, 7: 5}, {}, {0: 1, 2: 3, 9: 4}], N, V)


def _sample(model, key=7, reference=False, return_logp=True, **kw):
  s = sampler.SampleSettings(length=N, method="adaptive", **dict(dict(steps=4), **kw))
  return sampler.generate(model, jax.random.key(key), s, prompt=_prompt(), reference=reference,
                          return_logp=return_logp)


CASES = [     # the first in the fast subset
    dict(policy="max_prob", policy_temperature=0.5),
    pytest.param(dict(policy="entropy", policy_temperature=2.0, temperature=0.7), marks=slow),
    pytest.param(dict(policy="margin", policy_temperature=0.3, count_mode="stochastic"),
                 marks=slow),
    pytest.param(dict(policy="threshold", policy_temperature=0.5, threshold=0.12, steps=None),
                 marks=slow),
    pytest.param(dict(policy="confidence", temperature=0.8), marks=slow),    # deterministic
]


@pytest.mark.parametrize("kw", CASES)
def test_recorded_logp_equals_the_recomputed(model, kw):
  """`Samples.logp` / ``model_logp`` equal `sequence_logp` (at the sampling temperature / at 1),
  `Samples.order_logp` equals `order_logp` (a pass per step) and `token_and_order_logp` (one
  pass, and two steps a pass), for the cached sampler and its uncached reference (the same samples)."""
  pmask = _prompt()[1]
  scored = np.asarray(orders_lib.scored_ranks(pmask))
  tau, temp = kw.get("policy_temperature", 0.0), kw.get("temperature", 1.0)
  outs = [_sample(model, reference=ref, **kw) for ref in (False, True)]
  for f in ("tokens", "order", "step_of_rank"):
    np.testing.assert_array_equal(getattr(outs[0], f), getattr(outs[1], f))
  for f in ("logp", "model_logp", "order_logp"):
    np.testing.assert_allclose(getattr(outs[0], f), getattr(outs[1], f), atol=1e-6, rtol=0)
  out = outs[0]
  if kw["policy"] != "threshold":        # parallel steps: 4 steps for up to 10 tokens
    assert all(np.bincount(out.step_of_rank[b][scored[b]]).max() > 1 for b in range(B))
  likelihood.check_rollout(out.tokens, out.order, out.step_of_rank, pmask, vocab_size=V,
                           max_steps=N, width=N)
  args = (model, out.tokens, out.order, out.step_of_rank, pmask)
  seq = lambda t: np.asarray(likelihood.sequence_logp(*args, temperature=t))  # noqa: E731
  okw = dict(policy=kw["policy"], policy_temperature=tau, temperature=temp)
  olp = np.asarray(likelihood.order_logp(*args, **okw))
  tl, ol = likelihood.token_and_order_logp(*args, **okw, max_steps=out.passes.max(),
                                           steps_per_pass=out.passes.max())[:2]     # one pass
  split = likelihood.token_and_order_logp(*args, **okw, max_steps=5, steps_per_pass=2)[1]
  diffs = {"logp": np.abs(out.logp - seq(temp)).max(),
           "model_logp": np.abs(out.model_logp - seq(1.0)).max(),
           "order_logp": np.abs(out.order_logp - olp).max(),
           "one pass": max(np.abs(out.logp - tl).max(), np.abs(out.order_logp - ol).max()),
           "split passes": np.abs(out.order_logp - split).max()}
  print(kw, {k: f"{v:.1e}" for k, v in diffs.items()})
  assert max(diffs.values()) < 1e-5
  assert (out.order_logp[~scored] == 0).all() and (out.logp[~scored] == 0).all()
  if tau > 0:
    assert (out.order_logp[scored] <= 0).all() and (out.order_logp[scored] < -0.1).mean() > 0.5
  else:
    assert (out.order_logp == 0).all()
  plain = _sample(model, return_logp=False, **kw)
  np.testing.assert_array_equal(plain.tokens, out.tokens)
  np.testing.assert_array_equal(plain.order, out.order)
  assert plain.logp is None and plain.order_logp is None


def test_bounded_memory_scan_equals_the_one_pass_logits_in_values_and_gradients(model):
  """`order_scan` (a pass per step in a checkpointed scan, each reduced at once) gives
  `order_pass`'s values (all T W logits materialised in one pass: the direct computation) and
  gradients; its gradient's compiled temporaries are a fraction of the direct one's, which grow
  with the T W queries. (Two steps a pass: test_recorded_logp_equals_the_recomputed.)"""
  out = _sample(model, **CASES[0])           # CASES[0]'s compiled sampler
  pmask = _prompt()[1]
  args = (out.tokens, out.order, out.step_of_rank, pmask)
  okw = dict(policy="margin", policy_temperature=0.5, temperature=0.8)
  rng = np.random.default_rng(0)
  w_tok, w_ord = (jnp.asarray(rng.normal(size=(B, N)), jnp.float32) for _ in range(2))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  m = lambda p: nnx.merge(graphdef, p, rest)  # noqa: E731

  def direct(p):
    logits, sq = likelihood.order_pass(m(p), *args, max_steps=N, steps_per_pass=N)
    tok = likelihood.token_logp(likelihood.rank_logits(logits, sq), out.tokens, out.order, pmask,
                                0.8)
    return tok, likelihood.order_logp_of(logits, sq, out.order, **okw)

  def scanned(p):
    return likelihood.token_and_order_logp(m(p), *args, **okw, max_steps=N)[:2]

  def compiled(f):
    def loss(p):
      values = f(p)
      return sum(jnp.sum(w * x) for w, x in zip((w_tok, w_ord), values)), values
    c = jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(params).compile()
    (_, values), grads = c(params)
    return values, grads, c.memory_analysis().temp_size_in_bytes

  (want_v, want_g, t_direct), (got_v, got_g, t_scan) = compiled(direct), compiled(scanned)
  for a, b in zip(got_v, want_v):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=0)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(want_g))
  for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * scale, rtol=0)
  print(f"gradient temporaries: direct {t_direct} bytes, scan {t_scan} bytes")
  assert scale > 1e-2 and t_scan < t_direct / 3


def test_tau_to_zero_is_the_deterministic_policy(model):
  det = _sample(model, 3, return_logp=False)
  cold = _sample(model, 3, return_logp=False, policy_temperature=1e-7)
  np.testing.assert_array_equal(cold.order, det.order)
  np.testing.assert_array_equal(cold.tokens, det.tokens)
  warm = _sample(model, 3, return_logp=False, policy_temperature=1.0)
  assert (warm.order != det.order).any()


def test_orders_follow_the_plackett_luce_probabilities():
  """Three positions written in one step: the order is one Plackett-Luce draw over the first
  step's scores (max_prob of each position's conditional given nothing), computed here by plain
  forwards in float64; 3000 rows against the 6 orders' exact probabilities, and the recorded
  order_logp of each row is its order's exact log-probability."""
  m = tiny_model(vocab=4, valid=3, block=3, std=0.8, seed=3)
  score = np.zeros(3)
  for p in range(3):
    o = jnp.asarray([[p] + [q for q in range(3) if q != p]], jnp.int32)
    logits = np.asarray(m(jnp.zeros((1, 3), jnp.int32), o))[0, 0, :3].astype(np.float64)
    score[p] = np.exp(logits - logits.max()).max() / np.exp(logits - logits.max()).sum()
  tau = (score.max() - score.min()) / 1.5       # logits spread over 1.5
  z = score / tau
  perms = list(itertools.permutations(range(3)))
  exact = np.array([np.exp(z[a] - np.logaddexp.reduce(z) + z[b] - np.logaddexp(z[b], z[c]))
                    for a, b, c in perms])
  count = 3000
  s = sampler.SampleSettings(length=3, steps=1, method="adaptive", policy_temperature=tau)
  out = sampler.generate(m, jax.random.key(0), s, batch=count, return_logp=True)
  idx = np.array([perms.index(tuple(o)) for o in out.order])
  hist = np.bincount(idx, minlength=6)
  print("empirical:", np.round(hist / count, 3), "exact:", np.round(exact, 3))
  assert chisquare_p(hist, exact, count) > 1e-3
  assert chisquare_p(hist, np.full(6, 1 / 6), count) < 1e-6      # a wrong alternative
  np.testing.assert_allclose(out.order_logp.sum(1), np.log(exact[idx]), atol=1e-5)


@slow
def test_order_logp_gradient_equals_a_finite_difference(model):
  out = _sample(model, policy="entropy", policy_temperature=0.5)
  w = np.random.default_rng(0).normal(size=(B, N)).astype(np.float32)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def f(p):
    lp = likelihood.order_logp(nnx.merge(graphdef, p, rest), out.tokens, out.order,
                               out.step_of_rank, _prompt()[1], policy="entropy",
                               policy_temperature=0.5, max_steps=4)
    return jnp.sum(lp * w)

  rng = np.random.default_rng(1)
  direction = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), params)
  grads = jax.jit(jax.grad(f))(params)
  analytic = sum(float(jnp.sum(g * d)) for g, d in
                 zip(jax.tree.leaves(grads), jax.tree.leaves(direction)))
  f_j, h = jax.jit(f), 1e-3
  shift = lambda s: jax.tree.map(lambda x, d: x + s * d, params, direction)  # noqa: E731
  numeric = (float(f_j(shift(h))) - float(f_j(shift(-h)))) / (2 * h)
  print(f"analytic {analytic:.5f} numeric {numeric:.5f}")
  assert abs(analytic) > 1e-2
  np.testing.assert_allclose(analytic, numeric, rtol=2e-2)


@slow
def test_grpo_with_the_stochastic_policy_trains_the_order():
  """The loss gradient with the order term minus the one without it is the order's own
  policy-gradient term ``-mean(A grad order_logp)`` (ratios at 1: unclipped); a step runs with
  ratio 1 (recorded = recomputed)."""
  task = tasks.make("sudoku", size=4)
  model = tiny_model(vocab=8, valid=task.vocab_size, block=task.length, std=0.3)
  settings = grpo.GRPOSettings(reward="cell_accuracy", group_size=2, steps=4, method="adaptive",
                               policy="margin", policy_temperature=0.5)
  trainer = grpo.GRPO(model, settings, task=task)
  out, puzzles = trainer.rollouts(jax.random.key(0), trainer.task_prompts(0, 0, count=2))
  assert np.abs(out.order_logp).max() > 0.1
  adv = np.random.default_rng(0).normal(size=4).astype(np.float32)
  base = {"tokens": out.tokens, "order": out.order, "steps": out.step_of_rank,
          "prompt": puzzles["prompt"], "adv": adv}
  t, w = trainer.order_sizes(task.length)
  order_kw = dict(policy="margin", policy_temperature=0.5, max_steps=t, width=w)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  m = lambda p: nnx.merge(graphdef, p, rest)  # noqa: E731
  with_order = jax.jit(jax.grad(lambda p: grpo.grpo_loss(
      m(p), dict(base, old_logp=out.logp + out.order_logp), clip_eps=0.2, order=order_kw)[0]))
  without = jax.jit(jax.grad(lambda p: grpo.grpo_loss(m(p), dict(base, old_logp=out.logp),
                                                      clip_eps=0.2)[0]))
  scored = np.asarray(orders_lib.scored_ranks(puzzles["prompt"]))

  def order_term(p):
    olp = likelihood.order_logp(m(p), out.tokens, out.order, out.step_of_rank,
                                puzzles["prompt"], policy="margin", policy_temperature=0.5)
    return -jnp.sum(jnp.where(scored, adv[:, None] * olp, 0.0)) / scored.sum()

  diff = jax.tree.map(lambda a, b: a - b, with_order(params), without(params))
  want = jax.jit(jax.grad(order_term))(params)
  scale = max(float(jnp.abs(x).max()) for x in jax.tree.leaves(want))
  assert scale > 1e-3
  for d, w in zip(jax.tree.leaves(diff), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(d), np.asarray(w), atol=1e-4 * scale, rtol=1e-3)
  # order_only: the order's term alone
  only = jax.jit(jax.grad(lambda p: grpo.grpo_loss(
      m(p), dict(base, old_logp=out.order_logp), clip_eps=0.2, order=order_kw,
      order_only=True)[0]))(params)
  for d, w in zip(jax.tree.leaves(only), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(d), np.asarray(w), atol=1e-4 * scale, rtol=1e-3)
  metrics = trainer.step(jax.random.key(1), trainer.task_prompts(0, 1, count=2))
  assert np.isfinite(metrics["loss"]) and abs(metrics["ratio"] - 1) < 1e-4
  trainer = grpo.GRPO(model, dataclasses.replace(settings, order_only=True), task=task)
  metrics = trainer.step(jax.random.key(2), trainer.task_prompts(0, 2, count=2))
  assert np.isfinite(metrics["loss"]) and abs(metrics["ratio"] - 1) < 1e-4


@pytest.mark.parametrize("kw,match", [
    (dict(policy="confidence", policy_temperature=0.5),
     "sample.policy: 'confidence' cannot be stochastic"),
    (dict(policy="random", policy_temperature=0.5), "sample.policy: 'random' cannot be"),
    (dict(policy_temperature=0.5, candidates=4), "sample.candidates: the stochastic policy"),
    (dict(policy_temperature=-1.0), "sample.policy_temperature: must be a finite number >= 0"),
    (dict(policy_temperature=0.5, method="diffusion"),
     "sample.policy_temperature: a stochastic order policy is for sample.method='adaptive'"),
])
def test_bad_settings_are_one_line_errors_before_compiling(model, monkeypatch, kw, match):
  monkeypatch.setattr(sampler, "sample_batch", lambda *a, **k: pytest.fail("compiled"))
  s = sampler.SampleSettings(length=N, steps=4, **dict(dict(method="adaptive"), **kw))
  with pytest.raises(ValueError, match=match) as e:
    sampler.generate(model, jax.random.key(0), s, batch=2, return_logp=True)
  assert "\n" not in str(e.value)


def test_other_bad_inputs_are_one_line_errors(monkeypatch):
  monkeypatch.setattr(sampler, "sample_batch", lambda *a, **k: pytest.fail("compiled"))
  s = sampler.SampleSettings(length=4, steps=2, method="adaptive")
  with pytest.raises(ValueError, match="return_logp: recorded for the AO-GPT decoder") as e:
    sampler.generate(tiny_encoder(), jax.random.key(0), s, batch=2, return_logp=True)
  assert "\n" not in str(e.value)
  tokens = np.zeros((1, 4), np.int32)
  order = np.arange(4, dtype=np.int32)[None]
  steps = np.arange(4, dtype=np.int32)[None]
  with pytest.raises(ValueError, match="rollout.steps: row 0 has 4 steps, more than max_steps=3"):
    likelihood.check_rollout(tokens, order, steps, max_steps=3)
  with pytest.raises(ValueError, match="rollout.prompt: row 0 has 4 answer positions, more than"):
    likelihood.check_rollout(tokens, order, steps, width=2)


def test_config_key():
  c = sample_config_lib.sample_config()
  c.update(dict(method="adaptive", policy="margin", policy_temperature=0.25, length=8))
  s = sample_config_lib.settings_from_config(c, tiny_model().cfg)
  assert s.policy_temperature == 0.25 and s.policy == "margin"
