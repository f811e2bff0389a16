"""`posttrain.likelihood.sequence_logp`: the exact log-likelihood of a rollout under its order and
steps equals minus `aogpt.loss`'s per-token NLL with one token per step, and a brute-force
computation (one plain causal forward per rank, its context = the ranks of earlier steps, the
tokens of later steps hidden) with parallel steps and a prompt; bad rollouts are one-line
errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.posttrain import likelihood
from helpers.sampler import tiny_model

B, N, V = 3, 10, 13


@pytest.fixture(scope="module")
def model():
  return tiny_model(block=N)


def _rollout(seed=0, with_prompt=True):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, V, (B, N)).astype(np.int32)
  prompt = np.zeros((B, N), bool)
  if with_prompt:
    prompt[0, [1, 4, 7]] = True
    prompt[2, :2] = True            # row 1: no prompt
  base = np.stack([rng.permutation(N) for _ in range(B)]).astype(np.int32)
  order = np.asarray(orders_lib.prompt_first(base, prompt))
  steps = np.full((B, N), likelihood.NO_PROMPT_STEP, np.int32)
  for b in range(B):
    p = int(prompt[b].sum())
    counts = rng.integers(1, 4, N)                                # 1..3 tokens per step
    steps[b, p:] = np.repeat(np.arange(N), counts)[:N - p]
  return tokens, order, steps, prompt


def _brute_force(model, tokens, order, steps, prompt):
  """For each answer rank r: a plain causal forward (`AOGPT.__call__`) under the order
  [context ranks in generation order, order[r], the rest], with every token outside the context
  replaced by 0 (hidden); the logits at slot |context| predict order[r]."""
  out = np.zeros((B, N))
  fwd = jax.jit(lambda t, o: model(t, o))
  for b in range(B):
    p = int(prompt[b].sum())
    for r in range(p, N):
      ctx = [i for i in range(N) if i < p or steps[b, i] < steps[b, r]]
      rest = [i for i in range(N) if i not in ctx and i != r]
      o = np.asarray([order[b, i] for i in ctx + [r] + rest], np.int32)
      t = np.zeros(N, np.int32)
      t[order[b, ctx]] = tokens[b, order[b, ctx]]
      logits = np.asarray(fwd(jnp.asarray(t[None]), jnp.asarray(o[None])))[0, len(ctx)]
      logits = logits.astype(np.float64)
      lse = np.log(np.sum(np.exp(logits - logits.max()))) + logits.max()
      out[b, r] = logits[tokens[b, order[b, r]]] - lse
  return out


def test_one_token_per_step_equals_minus_the_any_order_loss(model):
  tokens, order, _, _ = _rollout(1, with_prompt=False)
  steps = np.broadcast_to(np.arange(N, dtype=np.int32), (B, N))
  got = jax.jit(lambda t, o, s: likelihood.sequence_logp(model, t, o, s))(tokens, order, steps)
  _, per_token = model_lib.loss(model, jnp.asarray(tokens), jnp.asarray(order))
  np.testing.assert_allclose(np.asarray(got), -np.asarray(per_token), atol=1e-5, rtol=0)
  # With a prompt: the answer ranks are the loss's, the prompt's are 0.
  tokens, order, _, prompt = _rollout(2)
  steps = np.where(np.asarray(orders_lib.scored_ranks(prompt)), np.arange(N), -1).astype(np.int32)
  got = np.asarray(likelihood.sequence_logp(model, tokens, order, steps, prompt))
  _, per_token = model_lib.loss(model, jnp.asarray(tokens), jnp.asarray(order),
                                prompt=jnp.asarray(prompt))
  scored = np.asarray(orders_lib.scored_ranks(prompt))
  np.testing.assert_allclose(got[scored], -np.asarray(per_token)[scored], atol=1e-5, rtol=0)
  assert (got[~scored] == 0).all()


def test_parallel_steps_with_a_prompt_equal_the_brute_force_forwards(model):
  tokens, order, steps, prompt = _rollout(3)
  assert any(np.bincount(steps[b][steps[b] >= 0]).max() > 1 for b in range(B))  # parallel steps
  likelihood.check_rollout(tokens, order, steps, prompt, vocab_size=V, block_size=N)
  got = np.asarray(jax.jit(lambda *a: likelihood.sequence_logp(model, *a))(
      tokens, order, steps, prompt))
  ref = _brute_force(model, tokens, order, steps, prompt)
  np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
  # The tokens of a step do not see each other: changing a token changes only later steps.
  b = 1
  r = int(np.argmax(np.bincount(steps[b]) > 1))            # a step with >= 2 tokens
  ranks = np.flatnonzero(steps[b] == r)
  t2 = tokens.copy()
  t2[b, order[b, ranks[0]]] = (t2[b, order[b, ranks[0]]] + 1) % V
  got2 = np.asarray(likelihood.sequence_logp(model, t2, order, steps, prompt))
  same = steps[b] <= r
  same[ranks[0]] = False
  np.testing.assert_allclose(got2[b, same], got[b, same], atol=1e-6, rtol=0)


def test_gradient_flows_to_the_parameters(model):
  from flax import nnx
  tokens, order, steps, prompt = _rollout(4)
  grads = nnx.jit(nnx.grad(lambda m: jnp.sum(likelihood.sequence_logp(m, tokens, order, steps,
                                                                      prompt))))(model)
  total = sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(grads))
  assert np.isfinite(total) and total > 0


@pytest.mark.parametrize("change,match", [
    (lambda t, o, s, p: (t[:, :5], o, s, p), r"rollout.order: expected shape \(3, 5\)"),
    (lambda t, o, s, p: (t, o[:, ::-1], s, p), "does not put the prompt's positions first"),
    (lambda t, o, s, p: (t, np.zeros_like(o), s, p), "row 0 is not a permutation"),
    (lambda t, o, s, p: (t, o, s[:, ::-1], p), "rollout.steps: row 0 decreases"),
    (lambda t, o, s, p: (t + V, o, s, p), r"rollout.tokens: ids must be in \[0, 13\)"),
])
def test_bad_rollouts_are_one_line_errors(change, match):
  with pytest.raises(ValueError, match=match) as e:
    likelihood.check_rollout(*change(*_rollout(5)), vocab_size=V, block_size=N)
  assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- recorded rollouts

def _sample(model, method, *, temperature=1.0, top_p=1.0, block=None, seed=7):
  from aogpt_jax.sampling import prompts, sampler
  if method == "ar":
    p = prompts.prefix_prompt([[3, 4], [], [5]], N, V)
  else:
    p = prompts.pairs_prompt([{1: 3, 7: 5}, {}, {0: 1, 2: 3, 9: 4}], N, V)
  s = sampler.SampleSettings(length=N, steps=4, method=method, temperature=temperature,
                             top_p=top_p)
  return sampler.generate(model, jax.random.key(seed), s, prompt=p, block=block,
                          return_logp=True), p


@pytest.mark.parametrize("method,block", [("diffusion", None), ("diffusion", 2), ("ar", None)])
def test_recorded_logp_equals_the_recomputed_likelihood(model, method, block):
  out, (_, pmask) = _sample(model, method, block=block)
  scored = np.asarray(orders_lib.scored_ranks(pmask))
  assert out.step_of_rank.shape == (B, N) and (out.step_of_rank[~scored] == -1).all()
  if method == "diffusion":           # parallel steps: 4 steps for up to 10 tokens
    assert (out.step_of_rank.max(1) == 3).all()
  likelihood.check_rollout(out.tokens, out.order, out.step_of_rank, pmask, vocab_size=V)
  ref = np.asarray(likelihood.sequence_logp(model, out.tokens, out.order, out.step_of_rank,
                                            pmask))
  diff = max(np.abs(out.logp - ref).max(), np.abs(out.model_logp - ref).max())
  print(f"{method} block={block}: max |recorded - recomputed| logp = {diff:.2e}")
  assert diff < 1e-5
  assert (out.logp[~scored] == 0).all() and (out.logp[scored] < 0).all()


def test_recorded_logp_at_a_temperature_and_top_p(model):
  out, (_, pmask) = _sample(model, "diffusion", temperature=0.7)
  fn = lambda temp: np.asarray(likelihood.sequence_logp(      # noqa: E731
      model, out.tokens, out.order, out.step_of_rank, pmask, temperature=temp))
  np.testing.assert_allclose(out.logp, fn(0.7), atol=1e-5, rtol=0)     # drawn from
  np.testing.assert_allclose(out.model_logp, fn(1.0), atol=1e-5, rtol=0)   # the model's own
  # top-p: the drawn distribution is renormalised over fewer tokens: log p >= the model's at T=1.
  cut, _ = _sample(model, "diffusion", top_p=0.5)
  np.testing.assert_allclose(cut.model_logp, np.asarray(likelihood.sequence_logp(
      model, cut.tokens, cut.order, cut.step_of_rank, pmask)), atol=1e-5, rtol=0)
  assert (cut.logp >= cut.model_logp - 1e-6).all() and (cut.logp > cut.model_logp + 1e-3).any()


def test_recording_draws_the_same_tokens_and_is_refused_where_not_recorded(model):
  from aogpt_jax.sampling import sampler
  out, p = _sample(model, "diffusion")
  s = sampler.SampleSettings(length=N, steps=4)
  plain = sampler.generate(model, jax.random.key(7), s, prompt=p)
  np.testing.assert_array_equal(plain.tokens, out.tokens)
  assert plain.logp is None and plain.step_of_rank is not None
  with pytest.raises(ValueError, match="return_logp: recorded for sample.method in"):
    sampler.generate(model, jax.random.key(0), sampler.SampleSettings(
        length=N, method="speculative"), batch=2, return_logp=True)
