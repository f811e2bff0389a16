"""`posttrain.estimators`: d1's one-step mean-field estimate equals a brute-force computation (one
plain causal forward per answer token, its context the prompt only, or the kept part of it) and
the diffusion sampler's own record when the whole answer is written in one step; it differs from
the exact value when tokens are written one per step. The Monte Carlo ELBO (``elbo``): its
expectation (every mask at once) equals the exact log-likelihood averaged over every generation
order of the answer (and the exact value for a one-token answer); its masks follow their
distribution (chi-square). GRPO runs with both
estimates (``likelihood="mean_field"``, with d1's prompt masking too, and ``"elbo"``), its first
ratio 1 (old values at the same weights and masks)."""

import functools
import itertools


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import tasks
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.posttrain import estimators, grpo, likelihood
from aogpt_jax.sampling import SampleSettings, generate
from helpers.sampler import chisquare_p, forward, tiny_model

B, N, V = 3, 10, 13


@pytest.fixture(scope="module")
def model():
  return tiny_model(block=N)


def _rollout(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, V, (B, N)).astype(np.int32)
  prompt = np.zeros((B, N), bool)
  prompt[0, [1, 4, 7]] = True
  prompt[2, :3] = True                 # row 1: no prompt
  base = np.stack([rng.permutation(N) for _ in range(B)]).astype(np.int32)
  order = np.asarray(orders_lib.prompt_first(base, prompt))
  steps = np.full((B, N), likelihood.NO_PROMPT_STEP, np.int32)
  for b in range(B):
    p = int(prompt[b].sum())
    steps[b, p:] = np.arange(N - p)          # one token per step
  return tokens, order, steps, prompt


def _brute_force(model, tokens, order, context):
  """[B, n] rank layout: for each rank r outside ``context`` (bool [B, n] original order), a plain
  causal forward under the order [context positions in generation order, order[r], the rest]
  with every token outside the context replaced by 0; float64 log-softmax at slot |context|."""
  out = np.zeros((B, N))
  for b in range(B):
    ctx = [int(i) for i in order[b] if context[b, i]]
    for r in range(N):
      pos = int(order[b, r])
      if context[b, pos]:
        continue
      rest = [int(i) for i in order[b] if not context[b, i] and i != pos]
      o = np.asarray(ctx + [pos] + rest, np.int32)
      t = np.where(context[b], tokens[b], 0).astype(np.int32)
      logits = np.asarray(forward(model)(jnp.asarray(t[None]), jnp.asarray(o[None])))[0, len(ctx)]
      logits = logits.astype(np.float64)
      lse = np.log(np.sum(np.exp(logits - logits.max()))) + logits.max()
      out[b, r] = logits[tokens[b, pos]] - lse
  return out


def test_mean_field_equals_one_forward_per_token_given_the_prompt(model):
  tokens, order, steps, prompt = _rollout()
  mf = np.asarray(estimators.mean_field_logp(model, tokens, order, prompt))
  ref = _brute_force(model, tokens, order, prompt)
  np.testing.assert_allclose(mf, ref, atol=2e-5)
  assert (mf[np.asarray(~orders_lib.scored_ranks(prompt))] == 0).all()


def test_mean_field_with_a_masked_prompt_conditions_on_the_kept_part_only(model):
  tokens, order, steps, prompt = _rollout(1)
  keep = np.asarray(estimators.prompt_keep(jax.random.key(3), prompt, 0.5))
  dropped = prompt & ~keep
  assert dropped.any() and keep.any()                    # both kinds of prompt positions
  mf = np.asarray(estimators.mean_field_logp(model, tokens, order, prompt, keep=keep))
  ref = _brute_force(model, tokens, order, keep)
  scored = np.asarray(orders_lib.scored_ranks(prompt))
  np.testing.assert_allclose(mf, np.where(scored, ref, 0.0), atol=2e-5)
  full = np.asarray(estimators.mean_field_logp(model, tokens, order, prompt))
  assert np.abs(mf - full)[scored].max() > 1e-3         # dropping givens changes the estimate


def test_mean_field_differs_from_exact_unless_the_answer_is_one_step(model):
  tokens, order, steps, prompt = _rollout(2)
  scored = np.asarray(orders_lib.scored_ranks(prompt))
  exact = np.asarray(likelihood.sequence_logp(model, tokens, order, steps, prompt))
  mf = np.asarray(estimators.estimate_logp(model, tokens, order, steps, prompt,
                                           estimator="mean_field"))
  first = scored & (np.cumsum(scored, axis=1) == 1)             # each row's first answer rank
  np.testing.assert_allclose(mf[first], exact[first], atol=2e-6)  # the first step sees the prompt
  assert np.abs(mf - exact)[scored & ~first].min() > 0          # later ones see earlier steps
  assert np.abs(mf - exact)[scored].max() > 1e-2
  one_step = np.where(scored, 0, likelihood.NO_PROMPT_STEP).astype(np.int32)
  exact_one = np.asarray(likelihood.sequence_logp(model, tokens, order, one_step, prompt))
  np.testing.assert_allclose(mf, exact_one, atol=2e-6)


def test_mean_field_equals_the_samplers_record_of_a_one_step_answer():
  task = tasks.make("sudoku", size=4)
  m = tiny_model(vocab=8, valid=task.vocab_size, block=task.length, std=0.3)
  puzzles = task.heldout(seed=0, count=4)
  toks = np.where(puzzles["prompt"], puzzles["tokens"], 0).astype(np.int32)
  one = generate(m, jax.random.key(1), SampleSettings(length=task.length, steps=1),
                 prompt=(toks, puzzles["prompt"]), return_logp=True)
  mf = np.asarray(estimators.mean_field_logp(m, one.tokens, one.order, puzzles["prompt"]))
  np.testing.assert_allclose(mf, one.model_logp, atol=2e-6)
  many = generate(m, jax.random.key(1), SampleSettings(length=task.length, steps=task.length),
                  prompt=(toks, puzzles["prompt"]), return_logp=True)
  mf = np.asarray(estimators.mean_field_logp(m, many.tokens, many.order, puzzles["prompt"]))
  assert np.abs(mf - many.model_logp).max() > 1e-2


def _elbo_case():
  """Two rows of n = N: row 0 with a 3-token answer, row 1 with a 1-token answer."""
  rng = np.random.default_rng(4)
  tokens = rng.integers(0, V, (2, N)).astype(np.int32)
  prompt = np.ones((2, N), bool)
  prompt[0, [2, 5, 8]] = False
  prompt[1, 6] = False
  base = np.stack([rng.permutation(N) for _ in range(2)]).astype(np.int32)
  order = np.asarray(orders_lib.prompt_first(base, prompt))
  return tokens, order, prompt


def test_elbo_expectation_is_the_likelihood_averaged_over_generation_orders(model):
  """Every mask (an order of the answer's L positions and l = 1..L hidden, each with
  probability 1 / (L! L)) at once: the estimate is then its exact expectation, and it equals,
  per position, the exact log-likelihood of that token averaged over all L! generation orders
  of the answer (`likelihood.sequence_logp`, one token per step); for L = 1, the exact value."""
  tokens, order, prompt = _elbo_case()
  ranks = np.asarray(orders_lib.ranks(order))
  for b in range(2):
    p_len = int(prompt[b].sum())
    big = N - p_len
    perms = [np.concatenate([order[b, :p_len], p]) for p in
             itertools.permutations(order[b, p_len:])]
    masks = np.asarray([p for p in perms for _ in range(big)], np.int32)[None]
    hidden = np.asarray([h for _ in perms for h in range(1, big + 1)], np.int32)[None]
    row = lambda x: x[b:b + 1]  # noqa: E731
    expect = np.asarray(jax.jit(functools.partial(estimators.estimate_logp, estimator="elbo"))(
        model, row(tokens), row(order), row(order), row(prompt), mask_order=masks,
        hidden=hidden))[0]
    steps = np.full((len(perms), N), likelihood.NO_PROMPT_STEP, np.int32)
    steps[:, p_len:] = np.arange(big)
    rep = lambda x: np.repeat(row(x), len(perms), axis=0)  # noqa: E731
    lp = np.asarray(jax.jit(likelihood.sequence_logp)(model, rep(tokens), np.stack(perms), steps,
                                                      rep(prompt)))
    avg = np.zeros(N)
    for p, lp_p in zip(perms, lp):
      avg[ranks[b, p[p_len:]]] += lp_p[p_len:] / len(perms)    # to the rollout's rank layout
    print(f"row {b}: ELBO expectation {expect.sum():.4f}, order average {avg.sum():.4f}")
    np.testing.assert_allclose(expect, avg, atol=2e-5)
    exact = np.asarray(likelihood.sequence_logp(model, row(tokens), row(order), steps[:1],
                                                row(prompt)))[0]
    if big == 1:
      np.testing.assert_allclose(expect, exact, atol=2e-5)
    else:
      assert np.abs(expect - exact).max() > 1e-3        # the rollout's order is one of six


def test_elbo_masks_follow_their_distribution():
  """The prompt first in the rollout's order; (the answer's order, l) uniform over its 3! x 3
  values (chi-square; the hidden sets uniform instead: rejected)."""
  _, order, prompt = _elbo_case()
  count = 6000
  mask_order, hidden = (np.asarray(x) for x in estimators.elbo_masks(
      jax.random.key(0), jnp.asarray(order), jnp.asarray(prompt), count))
  p_len = prompt.sum(1)
  for b in range(2):
    np.testing.assert_array_equal(mask_order[b, :, :p_len[b]],
                                  np.broadcast_to(order[b, :p_len[b]], (count, p_len[b])))
  assert (hidden[1] == 1).all() and (hidden[0] >= 1).all() and (hidden[0] <= 3).all()
  perms = list(itertools.permutations(order[0, p_len[0]:]))
  idx = np.array([perms.index(tuple(o[p_len[0]:])) * 3 + h - 1
                  for o, h in zip(mask_order[0], hidden[0])])
  assert chisquare_p(np.bincount(idx, minlength=18), np.full(18, 1 / 18), count) > 1e-3
  sets = [frozenset(o[N - h:]) for o, h in zip(mask_order[0], hidden[0])]
  kinds = sorted(set(sets), key=lambda x: (len(x), sorted(x)))
  hist = np.array([sets.count(k) for k in kinds])
  assert len(kinds) == 7 and chisquare_p(hist, np.full(7, 1 / 7), count) < 1e-6


@pytest.mark.parametrize("kw", [dict(likelihood="mean_field", prompt_mask=0.15),
                                dict(likelihood="elbo", elbo_samples=3, kl_coef=0.1)])
def test_grpo_runs_with_the_estimates(kw):
  """The batch carries each inner update's masks and old values, computed at the rollouts'
  weights: the first inner update's ratios are 1; the second moves off them."""
  task = tasks.make("sudoku", size=4)
  m = tiny_model(vocab=8, valid=task.vocab_size, block=task.length, std=0.3)
  s = grpo.GRPOSettings(reward="cell_accuracy", group_size=4, lr=1e-2, steps=4, inner_steps=2,
                        **kw)
  trainer = grpo.GRPO(m, s, task=task)
  params = lambda: [np.asarray(x) for x in jax.tree.leaves(nnx.state(m, nnx.Param))]  # noqa: E731
  before = params()
  batch, _, _ = trainer.rollout_batch(jax.random.key(0), trainer.task_prompts(0, 0, count=2))
  first = {k: v for k, v in batch.items() if not k.endswith("_steps")}
  first.update({k[:-len("_steps")]: v[:, 0] for k, v in batch.items() if k.endswith("_steps")})
  _, met = grpo.grpo_loss(m, first, clip_eps=0.2, estimator=s.likelihood,
                          reference=trainer.reference, kl_coef=s.kl_coef)
  assert abs(float(met["ratio_min"]) - 1) < 1e-5 and abs(float(met["ratio_max"]) - 1) < 1e-5
  if s.likelihood == "elbo":
    assert batch["mask_order_steps"].shape == (8, 2, 3, task.length)
    assert abs(float(met["kl"])) < 1e-6        # the reference is the starting weights
  met = trainer.step(jax.random.key(1), trainer.task_prompts(seed=0, index=1, count=2))
  assert np.isfinite(met["loss"]) and np.isfinite(met["grad_norm"]) and met["grad_norm"] > 0
  assert met["ratio"] != 1.0                     # the second inner update moved off old
  assert any(np.abs(a - b).max() > 0 for a, b in zip(params(), before))


def test_mean_field_settings_are_one_line_errors():
  task = tasks.make("sudoku", size=4)
  m = tiny_model(vocab=8, valid=task.vocab_size, block=task.length)
  for kw, match in ((dict(likelihood="ELBO"),
                     "rl.likelihood: expected one of exact, mean_field, elbo"),
                    (dict(prompt_mask=0.15), "rl.prompt_mask: 0.15 > 0 masks the prompt"),
                    (dict(likelihood="mean_field", prompt_mask=1.0), "rl.prompt_mask: must be")):
    with pytest.raises(ValueError, match=match) as e:
      grpo.GRPO(m, grpo.GRPOSettings(**kw), task=task)
    assert "\n" not in str(e.value)
