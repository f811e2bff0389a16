"""The learned order head (`model.order_head`, UPO adapted): a new head decodes exactly as its
heuristic (token-identical samples); a trained one's recorded order log-probabilities equal the
teacher-forced recomputation (cached sampler and uncached reference) and an independent numpy
Plackett-Luce over the top-k; its choices stay in the heuristic's top-k; the top-k set does not
depend on the candidates' order; the KL to the heuristic equals a numpy computation; GRPO with
``head_only`` moves the head alone; bad settings are one-line errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import tasks
from aogpt_jax.model import order_head as order_head_lib
from aogpt_jax.posttrain import grpo, likelihood
from aogpt_jax.sampling import prompts, sampler
from helpers.sampler import tiny_model

N, V = 10, 13


def _prompt(rows=3):
  return prompts.pairs_prompt([{1: 3, 7: 5}, {}, {0: 1, 2: 3, 9: 4}][:rows], N, V)


def _trained(model, seed=0, scale=0.3, context=0):
  """``model`` with an order head whose output layer is random (not the heuristic)."""
  head = order_head_lib.attach(model, top_k=3, width=8, seed=seed, context=context)
  rng = np.random.default_rng(seed)
  head.out.kernel[...] = jnp.asarray(rng.normal(size=head.out.kernel.shape) * scale, jnp.float32)
  return head


def _gen(model, reference=False, **kw):
  s = sampler.SampleSettings(length=N, method="adaptive", **kw)
  return sampler.generate(model, jax.random.key(3), s, prompt=_prompt(), reference=reference,
                          return_logp=True)


def test_a_new_head_decodes_as_its_heuristic():
  """Zero-initialised output: the head's scores are the heuristic's on its top-k, so greedy
  decoding (several cells a step, top_k >= a step's commits) is token- and order-identical."""
  model = tiny_model(block=N)
  want = _gen(model, steps=4, greedy=True, policy="margin")
  order_head_lib.attach(model, top_k=3)
  got = _gen(model, steps=4, greedy=True, policy="margin", order_head=True)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.order, want.order)


@pytest.mark.parametrize("context", [0, 16])
def test_recorded_order_logp_equals_the_recomputed_and_stays_in_the_top_k(context):
  """The head's order log-probabilities: the cached sampler's record, the uncached reference's
  and the teacher-forced `order_logp` agree, with the model's features read (context 16, the
  model's width: the sampler's queries and the teacher-forced ones give the head the same
  features) or not; without them, also a numpy Plackett-Luce over the top k of its scores."""
  model = tiny_model(block=N)
  head = _trained(model, context=context)
  kw = dict(policy="max_prob", policy_temperature=0.05, temperature=0.8, order_head=True)
  out, ref = _gen(model, **kw), _gen(model, reference=True, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.order_logp, ref.order_logp, atol=1e-5)
  pmask = _prompt()[1]
  okw = dict(policy="max_prob", policy_temperature=0.05, temperature=0.8, order_head=True)
  olp = likelihood.order_logp(model, out.tokens, out.order, out.step_of_rank, pmask, **okw)
  np.testing.assert_allclose(np.asarray(olp), out.order_logp, atol=1e-4)
  assert np.abs(out.order_logp).max() > 0.1
  if context:
    return
  # independent: numpy Plackett-Luce of the head's scores over the heuristic's top-k, per step
  logits, sq = likelihood.order_pass(model, out.tokens, out.order, out.step_of_rank, pmask)
  probs = np.asarray(jax.nn.softmax(logits / 0.8, axis=-1))            # [B, T, W, V]
  order = np.asarray(out.order)
  plen = np.asarray(pmask).sum(1)
  for b in range(order.shape[0]):
    for t in range(N - plen[b]):
      r0 = plen[b] + t                                                  # one cell per step
      pos = order[b, r0:]
      p = probs[b, t, :len(pos)]
      base = p.max(-1)
      rank = np.array([np.sum((base > base[j]) | ((base == base[j]) & (pos < pos[j])))
                       for j in range(len(pos))])
      top = rank < head.top_k
      assert top[0], (b, t)                                             # chosen in the top-k
      s = np.asarray(head(jnp.asarray(p[None]), jnp.asarray(base[None]), jnp.asarray(pos[None]),
                          jnp.ones((1, len(pos)), bool)))[0]
      z = np.where(top, s / 0.05, -np.inf)
      want = z[0] - np.logaddexp.reduce(z[top])
      np.testing.assert_allclose(out.order_logp[b, r0], want, atol=1e-3)


def test_the_top_k_does_not_depend_on_the_candidates_order():
  rng = np.random.default_rng(0)
  base = np.round(rng.uniform(size=(2, 9)), 1).astype(np.float32)     # ties
  pos = np.stack([rng.permutation(9) for _ in range(2)]).astype(np.int32)
  valid = rng.uniform(size=(2, 9)) < 0.8
  top, _ = order_head_lib.top_candidates(jnp.asarray(base), jnp.asarray(pos), jnp.asarray(valid), 3)
  perm = rng.permutation(9)
  top2, _ = order_head_lib.top_candidates(jnp.asarray(base[:, perm]), jnp.asarray(pos[:, perm]),
                                          jnp.asarray(valid[:, perm]), 3)
  np.testing.assert_array_equal(np.asarray(top)[:, perm], np.asarray(top2))
  for b in range(2):         # the 3 best valid by (score desc, position asc)
    ok = [j for j in range(9) if valid[b, j]]
    best = sorted(ok, key=lambda j: (-base[b, j], pos[b, j]))[:3]
    assert set(np.flatnonzero(np.asarray(top)[b])) == set(best)


def test_step_kl_is_zero_for_a_new_head_and_equals_numpy():
  rng = np.random.default_rng(1)
  base = jnp.asarray(rng.uniform(size=(2, 6)), jnp.float32)
  pos = jnp.asarray(np.tile(np.arange(6), (2, 1)), jnp.int32)
  valid = jnp.asarray([[True] * 6, [True, False, True, True, False, True]])
  assert np.abs(np.asarray(order_head_lib.step_kl(base, base, pos, valid, 3, 0.1))).max() < 1e-6
  head = base + jnp.asarray(rng.normal(size=(2, 6)) * 0.1, jnp.float32)
  got = np.asarray(order_head_lib.step_kl(head, base, pos, valid, 3, 0.1))
  for b in range(2):
    top = np.asarray(order_head_lib.top_candidates(base, pos, valid, 3)[0])[b]
    lp = np.asarray(head)[b][top] / 0.1
    lr = np.asarray(base)[b][top] / 0.1
    lp, lr = lp - np.logaddexp.reduce(lp), lr - np.logaddexp.reduce(lr)
    np.testing.assert_allclose(got[b], np.sum(np.exp(lp) * (lp - lr)), rtol=1e-4, atol=1e-6)
  assert got.min() > 1e-4


def _grpo(model, task, **kw):
  s = grpo.GRPOSettings(**dict(dict(reward="cell_accuracy", group_size=2, steps=task.length,
                                    method="adaptive", policy="max_prob", policy_temperature=0.1,
                                    temperature=0.8, order_head=3, lr=1e-2), **kw))
  return grpo.GRPO(model, s, task=task)


def test_grpo_head_only_moves_the_head_alone():
  task = tasks.make("sudoku", size=4)
  model = tiny_model(vocab=8, valid=task.vocab_size, block=task.length, std=0.3)
  order_head_lib.attach(model, top_k=3, width=8)
  before = nnx.to_pure_dict(nnx.clone(nnx.state(model, nnx.Param)))
  trainer = _grpo(model, task, head_only=True, head_kl=1e-4, weight_decay=0.1)
  moved = {"head": 0.0, "rest": 0.0}
  for i in range(3):
    m = trainer.step(jax.random.key(i), trainer.task_prompts(0, i, count=2))
    assert np.isfinite(m["loss"]) and "order_kl" in m
  after = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  flat_b = jax.tree_util.tree_flatten_with_path(before)[0]
  for (path, x), y in zip(flat_b, jax.tree.leaves(after)):
    moved["head" if path[0].key == "order_head" else "rest"] += float(np.abs(x - y).max())
  assert moved["rest"] == 0.0
  assert moved["head"] > 1e-4


@pytest.mark.parametrize("kw, match", [
    (dict(order_head=0, head_kl=1e-4), "rl.head_kl: is for an order head"),
    (dict(order_head=0, head_only=True), "rl.head_only: is for an order head"),
    (dict(order_head=True), "rl.order_head: .* expected an int >= 0 .* got True"),
    (dict(order_head=4), "rl.order_head: the model's order head re-scores the top 3; expected "
                         "rl.order_head=3, got 4"),
    (dict(policy_temperature=0.0), "rl.order_head: trains the order"),
    (dict(head_kl=-1.0), "rl.head_kl: .* got -1.0"),
    (dict(policy="threshold"), "rl.policy: the threshold policy"),
])
def test_bad_head_settings_are_one_line(kw, match):
  task = tasks.make("sudoku", size=4)
  model = tiny_model(vocab=8, valid=task.vocab_size, block=task.length)
  order_head_lib.attach(model, top_k=3)
  with pytest.raises(ValueError, match=match):
    _grpo(model, task, **kw)


def test_grpo_attaches_a_new_head_and_refuses_bad_sizes():
  task = tasks.make("sudoku", size=4)
  model = tiny_model(vocab=8, valid=task.vocab_size, block=task.length)
  with pytest.raises(ValueError, match="top_k=16 is at least every training row's free cells"):
    _grpo(model, task, order_head=16)
  assert order_head_lib.head_of(model) is None        # nothing attached on the way to the error
  _grpo(model, task)
  head = order_head_lib.head_of(model)
  assert head.top_k == 3 and float(jnp.abs(head.out.kernel[...]).max()) == 0.0
  with pytest.raises(ValueError, match="sample.order_head: True needs a model"):
    sampler.generate(tiny_model(block=N), jax.random.key(0), sampler.SampleSettings(
        length=N, method="adaptive", greedy=True, order_head=True), batch=1)
  with pytest.raises(ValueError, match="sample.steps: a stochastic order head draws one cell"):
    sampler.SampleSettings(length=N, steps=4, method="adaptive", policy_temperature=0.1,
                           order_head=True).validate(model.cfg)
  with pytest.raises(ValueError, match="order_head.top_k: must be an int >= 1, got 0"):
    order_head_lib.attach(model, top_k=0)
