"""`posttrain.grpo`: GRPO raises a simple verifiable reward on a tiny model within a few dozen
updates; the clipped surrogate's gradient equals a float64 analytic reference, and the whole
loss's gradient (exact likelihoods, exact KL to a reference) a finite difference; bad settings
are one-line errors before anything compiles."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import tasks
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.posttrain import grpo, objective
from helpers.posttrain import Compiles
from helpers.sampler import tiny_model


def zeros_reward(tokens, puzzles, task):
  """The fraction of answer cells that are 0 (a reward a random model must learn to raise)."""
  answer = ~puzzles["prompt"]
  return ((tokens == 0) & answer).sum(1) / np.maximum(answer.sum(1), 1)


@pytest.fixture(scope="module")
def task():
  return tasks.make("sudoku", size=4)


def _model(task, seed=0, **kw):
  return tiny_model(vocab=8, valid=task.vocab_size, block=task.length, seed=seed, **kw)


def test_grpo_raises_a_simple_reward_within_a_few_dozen_updates(task):
  """... and compiles nothing after its first update (the sampler and the update are sized for
  the task's prompt lengths at construction; the weights committed to a device, as
  `aogpt_jax.load` gives them, with the optimizer state placed alike)."""
  model = _model(task, std=0.02)
  nnx.update(model, jax.device_put(nnx.state(model), jax.devices()[0]))
  settings = grpo.GRPOSettings(reward=zeros_reward, group_size=8, lr=2e-2, steps=4)
  trainer = grpo.GRPO(model, settings, task=task)
  rewards, compiles = [], []
  for i in range(20):
    with Compiles() as c:
      m = trainer.step(jax.random.key(i), trainer.task_prompts(seed=0, index=i, count=4))
    rewards.append(m["reward"])
    compiles.append(c.count)
    assert np.isfinite(m["loss"]) and "ratio" not in m   # on-policy: the gradient at ratio 1
    assert m["rollouts_per_sec"] > 0 and 0 < m["update_share"] < 1
  print("rewards:", np.round(rewards, 3).tolist(), "compiles:", compiles)
  # before any update about 1/4 (4 digits, a near-uniform model); then it must climb
  assert rewards[0] < 0.4 and np.mean(rewards[-5:]) > rewards[0] + 0.3
  assert compiles[0] > 0 and compiles[1:] == [0] * 19


def test_grpo_raises_a_simple_reward_on_a_blank_block_model(task):
  """The same on a model with the query block over the blanks (`model.blank_block`), whose
  exact likelihood runs the blanks against the cached written slots: adaptive rollouts."""
  model = _model(task, std=0.02, prompt_attention="bidirectional", blank_block=True)
  settings = grpo.GRPOSettings(reward=zeros_reward, group_size=8, lr=2e-2, steps=task.length,
                               method="adaptive", policy="max_prob")
  trainer = grpo.GRPO(model, settings, task=task)
  rewards = [trainer.step(jax.random.key(i), trainer.task_prompts(seed=0, index=i, count=4))
             ["reward"] for i in range(12)]
  print("rewards:", np.round(rewards, 3).tolist())
  assert rewards[0] < 0.4 and np.mean(rewards[-4:]) > rewards[0] + 0.3


def parity_reward(tokens, puzzles, task):
  """Per position: 1 where the token is the position's parity (0 at even positions, 1 at odd)."""
  del puzzles, task
  tokens = np.asarray(tokens)
  return (tokens == np.arange(tokens.shape[1]) % 2).astype(np.float64)


def test_per_token_credit_raises_a_per_token_reward(task):
  """``credit="token"``: a reward per position (here: the token is the position's parity, which
  needs each position's own credit), advantages per position over the group, moved to the rank
  that wrote the position (the loss is in order space); the logged reward is each rollout's
  mean over its answer."""
  model = _model(task, std=0.02)
  settings = grpo.GRPOSettings(reward=parity_reward, credit="token", group_size=8, lr=2e-2,
                               steps=4)
  trainer = grpo.GRPO(model, settings, task=task)
  batch, _, _ = trainer.rollout_batch(jax.random.key(99), trainer.task_prompts(0, 99, count=4))
  pos = grpo.group_advantages(parity_reward(batch["tokens"], None, None), 8)
  rows = np.arange(len(pos))[:, None]
  np.testing.assert_array_equal(batch["adv"], pos[rows, batch["order"]])
  rewards = [trainer.step(jax.random.key(i), trainer.task_prompts(seed=0, index=i, count=4))
             ["reward"] for i in range(12)]
  print("rewards:", np.round(rewards, 3).tolist())
  assert rewards[0] < 0.4 and np.mean(rewards[-4:]) > rewards[0] + 0.3
  with pytest.raises(ValueError, match=r"rl.reward: returned shape \(32,\) on the rollouts; "
                                       r"expected \(32, 16\), one reward per position"):
    grpo.GRPO(model, dataclasses.replace(settings, reward=zeros_reward), task=task).step(
        jax.random.key(0), trainer.task_prompts(seed=0, index=0, count=4))


def test_step_transform_edits_the_update_batch(task):
  """``step(..., transform)``: the update uses the edited batch (zero advantages: no gradient,
  so AdamW without weight decay leaves every weight as it was), with the rollouts' puzzles."""
  model = _model(task, std=0.3)
  trainer = grpo.GRPO(model, grpo.GRPOSettings(reward=zeros_reward, group_size=4, steps=4,
                                               lr=1e-2), task=task)
  before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  seen = []

  def zero(batch, puzzles):
    seen.append(puzzles["tokens"].shape)
    return dict(batch, adv=np.zeros_like(batch["adv"]))

  trainer.step(jax.random.key(0), trainer.task_prompts(0, 0, count=2), zero)
  assert seen == [(8, task.length)]
  after = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, after))
  trainer.step(jax.random.key(0), trainer.task_prompts(0, 0, count=2))
  moved = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  assert any(np.abs(np.asarray(m) - b).max() > 0
             for m, b in zip(jax.tree.leaves(moved), jax.tree.leaves(before)))


def test_on_policy_gradient_is_the_clipped_objectives_at_ratio_one(task):
  """A batch's first update (`objective.on_policy_loss`: the gradient of ``-sum c logp`` with
  the likelihood's passes only in the backward) has the clipped objective's gradient computed in
  full from the sampler's recorded log-probabilities (`grpo_loss`, its ratios 1 to rounding), on
  a blank model with per-token advantages under the per-rollout normalisation; the loss value is
  the objective's at ratio 1 under every normalisation, per-rollout and per-token advantages."""
  model = _model(task, std=0.3, prompt_attention="bidirectional", blank_block=True)
  trainer = grpo.GRPO(model, grpo.GRPOSettings(
      reward=zeros_reward, group_size=4, steps=task.length, method="adaptive", policy="random"),
      task=task)
  batch, _, _ = trainer.rollout_batch(jax.random.key(3), trainer.task_prompts(0, 0, 2))
  width = trainer.answer_width(task.length)
  adv_tok = np.random.default_rng(0).normal(size=batch["tokens"].shape).astype(np.float32)
  b = dict(batch, adv=adv_tok)

  @nnx.jit
  def both(m):
    full = nnx.value_and_grad(lambda m: grpo.grpo_loss(m, b, clip_eps=0.2, loss_norm="sequence",
                                                       width=width), has_aux=True)(m)
    return full, nnx.grad(lambda m: grpo.on_policy_loss(m, b, loss_norm="sequence",
                                                        width=width), has_aux=True)(m)

  ((loss_full, met), g_full), (g_fast, aux) = both(model)
  assert abs(float(met["ratio_min"]) - 1) < 1e-4 and abs(float(met["ratio_max"]) - 1) < 1e-4
  np.testing.assert_allclose(float(aux["loss"]), float(loss_full), rtol=1e-4, atol=1e-6)
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g_full))
  assert scale > 0
  for x, y in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_full)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-4 * scale, rtol=0)
  s = trainer.settings           # the shortcut is the default where it applies, and only there
  assert s.on_policy_shortcut and not dataclasses.replace(s, on_policy_gradient=False,
                                                          ).on_policy_shortcut
  assert not any(dataclasses.replace(s, **kw).on_policy_shortcut for kw in (
      dict(kl_coef=0.1), dict(likelihood="elbo"), dict(policy="max_prob", policy_temperature=0.5)))
  scored = jnp.asarray(~batch["prompt"])
  for norm in grpo.LOSS_NORMS:       # the loss at ratio 1: -sum(adv x the normaliser's weights)
    for adv in (batch["adv"], adv_tok):
      a = jnp.asarray(adv)
      want = grpo.token_objective(jnp.zeros(scored.shape), jnp.zeros(scored.shape), a, scored,
                                  0.2, norm=norm)[0]
      got = -jnp.sum((a[:, None] if a.ndim == 1 else a) * objective.norm_weights(scored, norm))
      np.testing.assert_allclose(float(got), float(want), rtol=1e-5, atol=1e-7)


def test_rloo_advantages_and_loss_normalisations_equal_a_hand_computation():
  rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 2.0])
  g = 4
  want = np.array([r - np.mean(np.delete(rewards[(i // g) * g:(i // g + 1) * g], i % g))
                   for i, r in enumerate(rewards)])              # leave-one-out baseline
  np.testing.assert_allclose(grpo.group_advantages(rewards, g, scale=False, kind="rloo"), want,
                             rtol=1e-6)
  group = rewards - np.repeat(rewards.reshape(2, g).mean(1), g)
  np.testing.assert_allclose(grpo.group_advantages(rewards, g, scale=False), group, rtol=1e-6)
  std = np.repeat(rewards.reshape(2, g).std(1), g)
  np.testing.assert_allclose(grpo.group_advantages(rewards, g), group / (std + 1e-6), rtol=1e-6)
  # the loss at ratio 1 (no clipping) per norm: -sum_i A_i |o_i| over N, by hand
  rng = np.random.default_rng(0)
  r, n = 5, 6
  scored = rng.random((r, n)) < 0.6
  scored[:, 0] = True
  adv = rng.normal(size=r).astype(np.float32)
  lp = jnp.asarray(rng.uniform(-2, 0, (r, n)), jnp.float32)
  lens = scored.sum(1)
  hand = {"token": -np.sum(adv * lens) / lens.sum(),
          "sequence": -np.mean(adv * lens / lens),
          "constant": -np.sum(adv * lens) / (r * n)}
  for norm, want in hand.items():
    loss, _ = grpo.token_objective(lp, lp, jnp.asarray(adv), jnp.asarray(scored), 0.2, norm=norm)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  # per-token rewards [R, n]: each position against the same position of the group's rollouts
  per_tok = rng.random((8, n))
  cols = np.stack([grpo.group_advantages(per_tok[:, k], g) for k in range(n)], axis=1)
  np.testing.assert_allclose(grpo.group_advantages(per_tok, g), cols, rtol=1e-6)
  adv_tok = rng.normal(size=(r, n)).astype(np.float32)
  loss, _ = grpo.token_objective(lp, lp, jnp.asarray(adv_tok), jnp.asarray(scored), 0.2)
  np.testing.assert_allclose(float(loss), -np.sum(adv_tok * scored) / scored.sum(), rtol=1e-5)


def test_kl_to_the_start_needs_no_reference_and_nan_rewards_are_one_line_errors(task):
  """kl_coef > 0 without a reference: a frozen copy of the starting weights (the KL is 0 at the
  first update and the copy stays put); a reward that returns NaN or inf is one line naming it,
  and no update is taken."""
  model = _model(task, std=0.3)
  start = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
  trainer = grpo.GRPO(model, grpo.GRPOSettings(reward="cell_accuracy", group_size=2, steps=4,
                                               kl_coef=0.5, lr=1e-2), task=task)
  kls = [trainer.step(jax.random.key(i), trainer.task_prompts(0, i, count=2))["kl"]
         for i in range(2)]
  assert abs(kls[0]) < 1e-6 and kls[1] > 1e-6
  ref = [np.asarray(x) for x in jax.tree.leaves(nnx.state(trainer.reference, nnx.Param))]
  now = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
  assert all((a == b).all() for a, b in zip(ref, start))
  assert any(np.abs(a - b).max() > 0 for a, b in zip(now, start))

  def nan_reward(tokens, puzzles, task):
    out = np.zeros(len(tokens))
    out[3] = np.nan
    return out

  for fn, name in ((nan_reward, "nan_reward"), (lambda *a: np.full(4, np.inf), "<lambda>")):
    trainer = grpo.GRPO(model, grpo.GRPOSettings(reward=fn, group_size=2, steps=4), task=task)
    with pytest.raises(ValueError, match=f"rl.reward: '{name}' returned (nan|inf) for rollout") as e:
      trainer.step(jax.random.key(0), trainer.task_prompts(0, 0, count=2))
    assert "\n" not in str(e.value)
  assert all((np.asarray(a) == b).all()
             for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), now))


def test_clipped_surrogate_gradient_equals_a_float64_reference():
  rng = np.random.default_rng(0)
  r, n, eps = 6, 5, 0.2
  with jax.enable_x64(True):
    logp_new = rng.uniform(-3, -0.1, (r, n))
    logp_old = logp_new + rng.uniform(-0.6, 0.6, (r, n))       # ratios on both sides of the clip
    adv = rng.normal(size=r)
    scored = rng.random((r, n)) < 0.7
    g = jax.grad(lambda lp: grpo.token_objective(lp, logp_old, adv, scored, eps)[0])(
        jnp.asarray(logp_new, jnp.float64))
    assert g.dtype == jnp.float64
  ratio = np.exp(logp_new - logp_old)
  a = adv[:, None]
  active = (ratio * a <= np.clip(ratio, 1 - eps, 1 + eps) * a) | (np.abs(ratio - 1) <= eps)
  ref = np.where(scored & active, -ratio * a, 0.0) / scored.sum()
  assert (scored & ~active).any() and (scored & active).any()    # both branches are exercised
  np.testing.assert_allclose(np.asarray(g), ref, rtol=1e-12, atol=1e-15)


def test_loss_gradient_with_exact_kl_equals_a_finite_difference(task):
  model, reference = _model(task, seed=0, std=0.3), _model(task, seed=1, std=0.3)
  trainer = grpo.GRPO(model, grpo.GRPOSettings(reward="cell_accuracy", group_size=2, steps=4,
                                               kl_coef=0.5), task=task, reference=reference)
  out, puzzles = trainer.rollouts(jax.random.key(0), trainer.task_prompts(0, 0, count=2))
  rng = np.random.default_rng(1)
  batch = {"tokens": out.tokens, "order": out.order, "steps": out.step_of_rank,
           "prompt": puzzles["prompt"],
           "old_logp": (out.logp + rng.uniform(-0.3, 0.3, out.logp.shape)).astype(np.float32),
           "adv": rng.normal(size=4).astype(np.float32)}
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss(p):
    return grpo.grpo_loss(nnx.merge(graphdef, p, rest), batch, clip_eps=0.2,
                          reference=reference, kl_coef=0.5)[0]

  loss_j = jax.jit(loss)
  grads = jax.jit(jax.grad(loss))(params)
  direction = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), params)
  analytic = sum(float(jnp.sum(g * d)) for g, d in
                 zip(jax.tree.leaves(grads), jax.tree.leaves(direction)))
  h = 1e-3
  shift = lambda s: jax.tree.map(lambda x, d: x + s * d, params, direction)  # noqa: E731
  numeric = (float(loss_j(shift(h))) - float(loss_j(shift(-h)))) / (2 * h)
  assert abs(analytic) > 1e-3
  np.testing.assert_allclose(analytic, numeric, rtol=2e-2)


@pytest.mark.parametrize("kw,match", [
    (dict(reward="nope"), "rl.reward: unknown reward 'nope'"),
    (dict(credit="cell"), "rl.credit: expected one of sequence, token, got 'cell'"),
    (dict(group_size=1), "rl.group_size: must be an int >= 2"),
    (dict(kl_coef=-0.1), "rl.kl_coef: must be >= 0"),
    (dict(advantage="ppo"), "rl.advantage: expected one of group, rloo, got 'ppo'"),
    (dict(advantage="rloo"), "rl.scale_rewards: RLOO advantages are not divided"),
    (dict(loss_norm="row"), "rl.loss_norm: expected one of token, sequence, constant"),
    (dict(likelihood="elbo", elbo_samples=0), "rl.elbo_samples: must be an int >= 1"),
    (dict(method="speculative"), "rl.method: must be one of"),
    (dict(policy_temperature=0.5), "rl.policy_temperature: a stochastic order policy needs"),
    (dict(method="adaptive", order_only=True), "rl.order_only: trains the order's choices alone"),
    (dict(method="adaptive", policy="confidence", policy_temperature=0.5),
     "rl.policy: .confidence. cannot be stochastic"),
    (dict(hint=1.0), r"rl.hint: .*expected a number in \[0, 1\), got 1.0"),
    (dict(hint=0.5, likelihood="mean_field"), "rl.hint: a hinted rollout's old log-prob"),
    (dict(hint=0.5, method="adaptive", policy_temperature=0.5), "rl.hint: .*no stochastic"),
])
def test_bad_settings_are_one_line_errors(task, kw, match):
  with pytest.raises(ValueError, match=match) as e:
    grpo.GRPO(_model(task), grpo.GRPOSettings(**kw), task=task)
  assert "\n" not in str(e.value)


def test_bad_reference_and_prompts_are_one_line_errors(task):
  other = model_lib.AOGPT(_model(task).cfg.replace(n_embd=32), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="rl.reference: the reference model's parameters differ"):
    grpo.GRPO(_model(task), grpo.GRPOSettings(kl_coef=0.1), task=task, reference=other)
  trainer = grpo.GRPO(_model(task), grpo.GRPOSettings(), task=task)
  full = {"tokens": np.zeros((2, task.length), np.int32), "prompt": np.ones((2, task.length), bool)}
  with pytest.raises(ValueError, match="rl.prompts: row 0 is all prompt"):
    trainer.step(jax.random.key(0), full)
  long = {"tokens": np.zeros((2, 40), np.int32), "prompt": np.zeros((2, 40), bool)}
  with pytest.raises(ValueError, match="rl.prompts: sequence length 40 exceeds"):
    trainer.step(jax.random.key(0), long)


def test_a_verifier_reward_the_task_lacks_is_one_line_error():
  from aogpt_jax import tasks
  star = tasks.make("star_graph", degree=2, path_len=3, num_nodes=12)
  rows = star.heldout(0, 2)
  with pytest.raises(ValueError, match="rl.reward: 'rule_cells' is not a field of the verifier "
                                       "of task 'star_graph'; expected one of .*solved"):
    grpo.get_reward("rule_cells")(rows["tokens"], rows, star)


@pytest.mark.parametrize("method", ["diffusion", "adaptive"])
def test_rollouts_share_one_plan_size_and_draw_what_generate_draws(task, method):
  """The rollouts keep the sampler's static sizes at the largest seen (one compiled sampler for
  batches of different prompt lengths); the samples are generate's, token for token."""
  from aogpt_jax.sampling import generate
  settings = grpo.GRPOSettings(group_size=2, steps=task.length, method=method)
  trainer = grpo.GRPO(_model(task, std=0.3), settings, task=task)
  few = trainer.task_prompts(seed=0, index=0, count=2)
  many = {k: v.copy() for k, v in few.items()}
  many["prompt"][:, : task.length - 2] = True           # longer prompts first: sizes grow
  for prompts in (many, few):
    out, rep = trainer.rollouts(jax.random.key(5), prompts)
    toks = np.where(rep["prompt"], rep["tokens"], 0).astype(np.int32)
    ref = generate(trainer.model, jax.random.key(5), settings.sample_settings(task.length),
                   prompt=(toks, rep["prompt"]), return_logp=True)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logp, ref.logp, atol=1e-6)
  key = "prefill" if method == "adaptive" else "min_prefill"
  assert trainer._plan_sizes[key] == task.length - 2     # kept from the first batch


def solved_reward(tokens, puzzles, task):
  """1 for the stored answer, else 0: a random model fails every group."""
  return (np.asarray(tokens) == np.asarray(puzzles["tokens"])).all(1).astype(np.float64)


def test_a_group_that_fails_everywhere_gets_one_rollout_with_part_of_the_answer(task):
  """IGPO's hint (``hint`` > 0): in a group whose every rollout scores below the reference, the
  last rollout is replaced: the prompt, then ``ceil(hint * answer)`` cells of the reference
  (one step each), then the sampler's cells; its old log-probabilities are its exact ones at
  the current weights, the other rows are the plain rollouts, and the advantages are those of
  the rescored rows."""
  from aogpt_jax.posttrain import likelihood
  kw = dict(reward=solved_reward, group_size=4, steps=task.length, method="adaptive",
            policy="max_prob")
  model = _model(task, std=0.3)
  plain = grpo.GRPO(model, grpo.GRPOSettings(**kw), task=task)
  hinted = grpo.GRPO(model, grpo.GRPOSettings(**kw, hint=0.5), task=task)
  prompts = plain.task_prompts(seed=0, index=0, count=3)
  key = jax.random.key(1)
  b0, r0, puzzles = plain.rollout_batch(key, prompts)
  b1, r1, _ = hinted.rollout_batch(key, prompts)
  g, prompt = 4, puzzles["prompt"]
  groups = np.nonzero((r0 < 1).reshape(-1, g).all(1))[0]
  assert hinted.last_hinted == len(groups) > 0 and plain.last_hinted == 0
  rows = groups * g + g - 1
  keep = np.setdiff1d(np.arange(len(r0)), rows)
  for f in ("tokens", "order", "steps", "old_logp"):
    np.testing.assert_array_equal(b1[f][keep], b0[f][keep])
  lp = np.asarray(likelihood.sequence_logp(model, b1["tokens"], b1["order"], b1["steps"],
                                           prompt))
  for i in rows:
    m, a = int(prompt[i].sum()), int((~prompt[i]).sum())
    h = int(np.ceil(0.5 * a))
    given = b1["order"][i, m:m + h]
    assert prompt[i][b1["order"][i, :m]].all() and not prompt[i][given].any()
    np.testing.assert_array_equal(b1["tokens"][i, given], puzzles["tokens"][i, given])
    np.testing.assert_array_equal(b1["steps"][i, :m + h], np.r_[np.full(m, -1), np.arange(h)])
    assert (np.diff(b1["steps"][i, m:]) >= 0).all()
    np.testing.assert_allclose(b1["old_logp"][i], lp[i], atol=1e-5)
    assert lp[i, m:m + h].min() < -1e-3         # the hint was not drawn from the policy
  likelihood.check_rollout(b1["tokens"], b1["order"], b1["steps"], prompt)
  np.testing.assert_allclose(r1, solved_reward(b1["tokens"], puzzles, task))   # rescored
  np.testing.assert_allclose(b1["adv"], grpo.group_advantages(r1, g, True))
  m = hinted.step(key, prompts)
  assert m["hinted"] == len(groups) / 3 and np.isfinite(m["loss"])


@pytest.mark.parametrize("key", ["max_grad_norm", "weight_decay"])
def test_negative_clip_or_decay_is_one_line(key):
  """SILENT-WRONG: ``optax.clip_by_global_norm(-1)`` flips every gradient's sign (GRPO lowers
  its reward, DPO prefers the rejected answer); a negative weight decay grows the weights."""
  from aogpt_jax.posttrain import dpo
  for cls, group in ((grpo.GRPOSettings, "rl"), (dpo.DPOSettings, "dpo")):
    with pytest.raises(ValueError, match=rf"^{group}\.{key}: must be a finite number >= 0"):
      cls(**{key: -1.0}).validate(None)


def test_the_eval_line_names_what_decodes():
  """SILENT-WRONG (label): with rl.policy=max_prob the eval line said "order random" (rl.order,
  which the adaptive sampler ignores)."""
  from aogpt_jax.posttrain import rl
  from aogpt_jax.sampling import sampler
  s = sampler.SampleSettings(length=36, steps=36, method="adaptive", policy="max_prob",
                             order="random", greedy=True)
  assert rl.decoding_label(s) == "greedy adaptive, policy max_prob, 36 steps"
  s = sampler.SampleSettings(length=36, steps=36, method="diffusion", order="random")
  assert rl.decoding_label(s) == "greedy diffusion, order random, 36 steps"


def test_the_progress_line_leaves_the_compiling_update_out():
  """The RL progress line averaged the first update's compile time into the rollout rate: its
  timings are left out of the line's means (a line of that update alone says so)."""
  from aogpt_jax.posttrain import rl, run
  assert {"rollout_sec", "update_sec", "rollouts_per_sec"} <= set(run.COMPILE_TIMED)
  means = {"reward": 0.5, "reward_std": 0.1, "solved": 0.2, "loss": 0.3, "grad_norm": 1.0}
  line = rl.GRPOAlgorithm.progress(None, means)
  assert line.endswith("first update (compiling): not timed")
  line = rl.GRPOAlgorithm.progress(None, {**means, "rollout_sec": 0.5, "rollouts_per_sec": 128.0,
                                          "update_sec": 1.0})
  assert line.endswith("rollout 0.50s (128/s) update 1.00s")
