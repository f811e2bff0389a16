"""`posttrain.estimators`: d1's one-step mean-field estimate equals a brute-force computation (one
plain causal forward per answer token, its context the prompt only, or the kept part of it) and
the diffusion sampler's own record when the whole answer is written in one step; it differs from
the exact value when tokens are written one per step. GRPO runs with it (`likelihood=
"mean_field"`, with d1's prompt masking too)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import tasks
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.posttrain import estimators, grpo, likelihood
from aogpt_jax.sampling import SampleSettings, generate
from helpers.sampler import forward, tiny_model

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


@pytest.mark.parametrize("prompt_mask", [0.0, 0.15])
def test_grpo_runs_with_the_mean_field_estimate(prompt_mask):
  task = tasks.make("sudoku", size=4)
  m = tiny_model(vocab=8, valid=task.vocab_size, block=task.length, std=0.3)
  s = grpo.GRPOSettings(reward="cell_accuracy", group_size=4, lr=1e-2, steps=4, inner_steps=2,
                        likelihood="mean_field", prompt_mask=prompt_mask)
  trainer = grpo.GRPO(m, s, task=task)
  params = lambda: [np.asarray(x) for x in jax.tree.leaves(nnx.state(m, nnx.Param))]  # noqa: E731
  before = params()
  for i in range(2):
    met = trainer.step(jax.random.key(i), trainer.task_prompts(seed=0, index=i, count=2))
    assert np.isfinite(met["loss"]) and np.isfinite(met["grad_norm"]) and met["grad_norm"] > 0
    assert met["ratio"] != 1.0                     # the second inner update moved off old
  assert any(np.abs(a - b).max() > 0 for a, b in zip(params(), before))


def test_mean_field_settings_are_one_line_errors():
  task = tasks.make("sudoku", size=4)
  m = tiny_model(vocab=8, valid=task.vocab_size, block=task.length)
  for kw, match in ((dict(likelihood="elbo"), "rl.likelihood: expected one of exact, mean_field"),
                    (dict(prompt_mask=0.15), "rl.prompt_mask: 0.15 > 0 masks the prompt"),
                    (dict(likelihood="mean_field", prompt_mask=1.0), "rl.prompt_mask: must be")):
    with pytest.raises(ValueError, match=match) as e:
      grpo.GRPO(m, grpo.GRPOSettings(**kw), task=task)
    assert "\n" not in str(e.value)
