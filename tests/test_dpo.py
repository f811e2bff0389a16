"""`posttrain.dpo`: the sequence log-likelihoods are `aogpt.loss`'s per-token NLLs summed (l2r:
exact; random: their mean over the drawn orders); the loss and its gradient equal a float64
reference and a finite difference; a few dozen updates on a tiny model raise the held-out
preference accuracy and margin; pairs from text and from a task; one-line errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import tasks
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.posttrain import dpo
from helpers.sampler import tiny_model


@pytest.fixture(scope="module")
def task():
  return tasks.make("sudoku", size=4)


def _model(task, seed=0, **kw):
  return tiny_model(vocab=8, valid=task.vocab_size, block=task.length, seed=seed, **kw)


@nnx.jit
def _nll(model, tokens, order, prompt):
  return model_lib.loss(model, tokens, order, prompt=prompt)[1]


_seq_logps = nnx.jit(dpo.sequence_logps)


def _loss_logp(model, tokens, order, prompt):
  """float64 [B]: minus `aogpt.loss`'s per-token NLL summed over the answer ranks."""
  nll_BxN = _nll(model, jnp.asarray(tokens), jnp.asarray(order), jnp.asarray(prompt))
  keep = np.take_along_axis(~np.asarray(prompt), np.asarray(order), 1)
  return -np.where(keep, np.asarray(nll_BxN, np.float64), 0.0).sum(1)


def test_sequence_logps_are_the_summed_per_token_nll_of_aogpt_loss(task):
  model = _model(task)
  pairs = dpo.preferences(task, seed=0, index=0, count=3)
  tokens, prompt = pairs["chosen"], pairs["prompt"]
  # l2r: one order, the prompt then the response left to right
  o = dpo.pair_orders(None, jnp.asarray(prompt), "l2r", 5)
  assert o.shape == (1, 3, 16)
  for b in range(3):
    given = np.flatnonzero(prompt[b])
    assert np.asarray(o[0, b]).tolist() == [*given, *np.flatnonzero(~prompt[b])]
  got = np.asarray(_seq_logps(model, jnp.asarray(tokens), jnp.asarray(prompt), o))
  np.testing.assert_allclose(got, _loss_logp(model, tokens, o[0], prompt), rtol=1e-5)
  # random: the mean over the M drawn orders of each order's exact value
  o = dpo.pair_orders(jax.random.key(1), jnp.asarray(prompt), "random", 4)
  assert o.shape == (4, 3, 16) and len({tuple(np.asarray(o[m, 0])) for m in range(4)}) > 1
  got = np.asarray(_seq_logps(model, jnp.asarray(tokens), jnp.asarray(prompt), o))
  want = np.mean([_loss_logp(model, tokens, o[m], prompt) for m in range(4)], axis=0)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_objective_and_its_gradient_equal_a_float64_reference():
  rng = np.random.default_rng(0)
  b, beta = 5, 0.7
  lp = rng.uniform(-20, -2, (4, b))
  with jax.enable_x64(True):
    f = lambda x: dpo.dpo_objective(x[0], x[1], x[2], x[3], beta)  # noqa: E731
    (loss, m), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(lp, jnp.float64))
    assert g.dtype == jnp.float64
  z = beta * ((lp[0] - lp[2]) - (lp[1] - lp[3]))
  np.testing.assert_allclose(float(loss), np.mean(np.log1p(np.exp(-z))), rtol=1e-12)
  s = 1 / (1 + np.exp(z))                       # d(-log sigmoid z)/dz = -sigmoid(-z)
  want = np.stack([-beta * s, beta * s, beta * s, -beta * s]) / b
  np.testing.assert_allclose(np.asarray(g), want, rtol=1e-12)
  np.testing.assert_allclose(float(m["accuracy"]), np.mean(z > 0))
  np.testing.assert_allclose(float(m["margin"]), np.mean(z), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["l2r", "random"])
def test_loss_gradient_is_the_chain_rule_through_the_policy_only(task, order):
  """grad loss = sum_i w_i grad log pi(y_i) with w_i from float64 numpy (the reference gets no
  gradient), and a finite difference along a random direction agrees."""
  model, reference = _model(task, seed=0, std=0.3), _model(task, seed=1, std=0.3)
  pairs = {k: jnp.asarray(v) for k, v in dpo.preferences(task, 0, 0, 3, max_changes=3).items()}
  beta, key = 0.5, jax.random.key(3)
  orders = dpo.pair_orders(key, pairs["prompt"], order, 2)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  merge = lambda p: nnx.merge(graphdef, p, rest)  # noqa: E731

  def loss(p):
    return dpo.dpo_loss(merge(p), reference, pairs, orders, beta)[0]

  grads = jax.jit(jax.grad(loss))(params)
  # the reference, from aogpt.loss in float64
  seq = lambda m, t: np.mean([_loss_logp(m, t, orders[k], pairs["prompt"])  # noqa: E731
                              for k in range(orders.shape[0])], axis=0)
  pc, pr = seq(model, pairs["chosen"]), seq(model, pairs["rejected"])
  rc, rr = seq(reference, pairs["chosen"]), seq(reference, pairs["rejected"])
  z = beta * ((pc - rc) - (pr - rr))
  loss_j = jax.jit(loss)
  np.testing.assert_allclose(float(loss_j(params)), np.mean(np.log1p(np.exp(-z))), rtol=1e-5)
  w = -beta / (1 + np.exp(z)) / len(z)          # d loss / d log pi(chosen); rejected: -w
  tokens, prompt, orders2 = dpo.both(pairs, orders)

  def weighted(p):
    lp = dpo.sequence_logps(merge(p), tokens, prompt, orders2)
    return jnp.sum(jnp.asarray(np.concatenate([w, -w]), jnp.float32) * lp)

  chain = jax.jit(jax.grad(weighted))(params)
  for a, c in zip(jax.tree.leaves(grads), jax.tree.leaves(chain)):
    np.testing.assert_allclose(a, c, rtol=2e-4, atol=1e-6)
  rng = np.random.default_rng(1)
  direction = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), params)
  analytic = sum(float(jnp.sum(g * d)) for g, d in
                 zip(jax.tree.leaves(grads), jax.tree.leaves(direction)))
  h = 1e-3
  shift = lambda s: jax.tree.map(lambda x, d: x + s * d, params, direction)  # noqa: E731
  numeric = (float(loss_j(shift(h))) - float(loss_j(shift(-h)))) / (2 * h)
  assert abs(analytic) > 1e-3
  np.testing.assert_allclose(analytic, numeric, rtol=2e-2)


@pytest.mark.slow
def test_a_few_dozen_updates_raise_the_heldout_preference(task):
  """Rejected rows are the reference grids with one or two cells changed (each breaks a rule):
  100 updates of 32 pairs teach a tiny random model to prefer valid grids it never saw (from
  chance, 0.5, to about 0.83 of 64 held-out pairs; 0.5 +- 0.125 is chance's 95% range)."""
  model = _model(task, std=0.02)
  trainer = dpo.DPO(model, dpo.DPOSettings(beta=1.0, lr=1e-2, max_changes=2))
  held = dpo.heldout_preferences(task, seed=0, count=64)
  before = trainer.evaluate(held)
  # the reference is the starting model: margins and rewards start at 0, the loss at log 2
  assert abs(before["margin"]) < 1e-5 and abs(before["loss"] - np.log(2)) < 1e-5
  for i in range(100):
    m = trainer.step(dpo.preferences(task, seed=0, index=i, count=32))
    assert np.isfinite(m["loss"])
  after = trainer.evaluate(held)
  print("before", before, "after", after)
  assert after["accuracy"] > 0.7 and after["margin"] > 1.0 and after["loss"] < 0.55
  assert after["chosen_reward"] > after["rejected_reward"]
  # the reference stayed frozen: its own margin is 0 against itself
  ref = dpo.DPO(trainer.reference, dpo.DPOSettings(beta=1.0))
  assert abs(ref.evaluate(held)["margin"]) < 1e-5


def test_text_preferences_are_encoded_like_sft_rows(tmp_path):
  from aogpt_jax.data import tokenizers
  from aogpt_jax.tasks import text_pairs
  rows = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(40)]
  path = tmp_path / "prefs.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  t = tasks.make("preferences", path=str(path), length=8, heldout_frac=0.2)
  pairs = dpo.preferences(t, seed=0, index=1, count=6)
  idx = t.train_indices(0, 1, 6)
  byte = tokenizers.get_tokenizer("byte")
  for j, i in enumerate(idx):
    c, pm = text_pairs.encode_pair(byte, rows[i]["prompt"], rows[i]["chosen"], 8)
    r, _ = text_pairs.encode_pair(byte, rows[i]["prompt"], rows[i]["rejected"], 8)
    assert pairs["chosen"][j].tolist() == c.tolist() and pairs["rejected"][j].tolist() == r.tolist()
    assert pairs["prompt"][j].tolist() == pm.tolist()
  # as a task its rows are the chosen responses; the split is by prompt, as "pairs"
  np.testing.assert_array_equal(t.train_batch(0, 1, 6)["tokens"], pairs["chosen"])
  held = dpo.heldout_preferences(t, seed=0, count=100)
  assert 0 < len(held["chosen"]) == len(t.heldout_index)
  dpo.check_pairs(held)


def test_corrupted_task_pairs_fail_the_verifier(task):
  pairs = dpo.preferences(task, seed=0, index=0, count=64, max_changes=3)
  ref = {"tokens": pairs["chosen"], "prompt": pairs["prompt"]}
  assert task.verify(pairs["chosen"], ref)["solved"].all()
  assert not task.verify(pairs["rejected"], ref)["solved"].any()
  changed = (pairs["chosen"] != pairs["rejected"]).sum(1)
  assert changed.min() >= 1 and changed.max() <= 3 and set(changed) == {1, 2, 3}
  assert not ((pairs["chosen"] != pairs["rejected"]) & pairs["prompt"]).any()
  np.testing.assert_array_equal(pairs["rejected"],
                                dpo.preferences(task, 0, 0, 64, max_changes=3)["rejected"])


def test_bad_settings_reference_and_pairs_are_one_line_errors(task):
  model = _model(task)
  for kw, match in [(dict(beta=0), r"^dpo.beta: must be a finite number > 0, got 0"),
                    (dict(order="r2l"), r"^dpo.order: must be one of \('l2r', 'random'\)"),
                    (dict(orders=0), r"^dpo.orders: must be an integer >= 1, got 0"),
                    (dict(lr=-1.0), r"^dpo.lr: must be a number > 0")]:
    with pytest.raises(ValueError, match=match) as e:
      dpo.DPO(model, dpo.DPOSettings(**kw))
    assert "\n" not in str(e.value)
  other = model_lib.AOGPT(model.cfg.replace(n_embd=32), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"^dpo.reference: the reference model differs in shape"):
    dpo.DPO(model, dpo.DPOSettings(), reference=other)
  trainer = dpo.DPO(model, dpo.DPOSettings())
  pairs = dpo.preferences(task, 0, 0, 2)
  bad = dict(pairs, rejected=np.where(pairs["prompt"], 0, pairs["rejected"]) + pairs["prompt"])
  bad["rejected"] = np.where(pairs["prompt"], (pairs["chosen"] + 1) % 4, pairs["rejected"])
  with pytest.raises(ValueError, match=r"^dpo.pairs: row 0: chosen and rejected differ inside "
                     r"the prompt"):
    trainer.step(bad)
  full = dict(pairs, prompt=np.ones_like(pairs["prompt"]), rejected=pairs["chosen"])
  with pytest.raises(ValueError, match=r"^dpo.pairs: row 0 is all prompt"):
    trainer.step(full)
