"""Packing (`model.pack`, model/packing.py): the block-diagonal mask against one written out by
hand, and every AO-GPT training loss (the chain, gather and mask paths, with a bidirectional
prompt; the blank block, its blanks seeing each other or causal) and its gradients packed equal
to the same rows one by one; the one-line errors where packing cannot apply."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import config as config_lib
from aogpt_jax import data as data_lib
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import blanks, objectives, packing
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.train import sharding as sharding_lib
from aogpt_jax.train import step as train_lib
from helpers.sampler import mixed_prompt_rows, tiny_model
from helpers.trainer import tiny_config

N, V = 10, 13


def test_block_diagonal_equals_the_hand_written_mask():
  rng = np.random.default_rng(0)
  mask = rng.random((6, 4, 4)) < 0.5
  out = np.asarray(packing.block_diagonal(jnp.asarray(mask), 3))
  assert out.shape == (2, 12, 12)
  for i in range(2):
    for r in range(12):
      for c in range(12):
        same = r // 4 == c // 4
        assert out[i, r, c] == (same and mask[3 * i + r // 4, r % 4, c % 4])


def _rows(copies=2):
  """The four mixed-prompt rows twice over with different tokens and orders: 8 rows."""
  parts = [mixed_prompt_rows(seed, N, V) for seed in range(copies)]
  return tuple(jnp.concatenate([p[i] for p in parts]) for i in range(3))


def _pair(**kw):
  """The same weights with ``pack`` 1 and 4."""
  return tiny_model(vocab=16, valid=V, block=12, std=0.5, **kw), tiny_model(
      vocab=16, valid=V, block=12, std=0.5, pack=4, **kw)


def _loss_and_grads(m, fn):
  graphdef, params = nnx.split(m, nnx.Param)

  def f(p):
    mean, per_token = fn(nnx.merge(graphdef, p))
    return mean, per_token
  (mean, per_token), g = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
  return mean, per_token, g


def _assert_same(a, b):
  mean_a, tok_a, g_a = a
  mean_b, tok_b, g_b = b
  np.testing.assert_allclose(mean_a, mean_b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tok_a, tok_b, rtol=1e-5, atol=1e-5)
  for x, y in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_b)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
  assert float(mean_a) > 0


@pytest.mark.parametrize("attention,prompted", [("gather", False), ("gather", True),
                                                ("mask", True)])
def test_chain_loss_packed_equals_row_by_row(attention, prompted):
  tokens, order, prompt = _rows()
  ms = _pair(attention=attention, prompt_attention="bidirectional")
  fn = lambda m: model_lib.loss(m, tokens, order, prompt=prompt if prompted else None)  # noqa
  _assert_same(*(_loss_and_grads(m, fn) for m in ms))


@pytest.mark.parametrize("blank_attention", ["block", "causal"])
def test_blank_loss_packed_equals_row_by_row(blank_attention):
  tokens, order, prompt = _rows()
  ms = _pair(prompt_attention="bidirectional", blank_block=True,
             blank_attention=blank_attention)
  key = jax.random.key(3)
  fn = lambda m: blanks.blank_loss(m, tokens, order, key, prompt=prompt)  # noqa: E731
  _assert_same(*(_loss_and_grads(m, fn) for m in ms))


def test_packing_changes_the_layout_the_model_runs():
  """Not a no-op: with a packed model the block stack sees rows of K n slots."""
  tokens, order, _ = _rows()
  _, packed = _pair()
  seen = []
  run = packed.hidden_slots

  def spy(tok, *a, **kw):
    seen.append(tok.shape)
    return run(tok, *a, **kw)
  packed.hidden_slots = spy
  model_lib.loss(packed, tokens, order)
  assert seen == [(2, 4 * N)]


def test_heldout_loss_packs_too():
  tokens, order, prompt = _rows()
  del order
  w = jnp.ones((tokens.shape[0],))
  orders = (("random", "uniform", ()),)
  outs = [objectives.get("ao").heldout(m, tokens, w, jax.random.key(0), orders, prompt)
          for m in _pair(blank_block=True, prompt_attention="bidirectional")]
  np.testing.assert_allclose(outs[0]["nll_random"], outs[1]["nll_random"], rtol=1e-5)


@pytest.mark.parametrize("kw,needle", [
    ({"model__pack": 0}, "model.pack: must be >= 1"),
    ({"model__pack": 3}, "model.pack: 3 does not divide the 8 rows"),
    ({"model__pack": 4, "microbatches": 4}, "rows of a microbatch"),
    ({"model__pack": 4, "eval__batch_size": 6}, "eval.batch_size=6"),
    ({"model__pack": 2, "objective": "mdm"}, "objective='ao'"),
])
def test_bad_pack_is_one_line(tmp_path, kw, needle):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.resolve(tiny_config(tmp_path, **kw))
  assert needle in str(e.value) and "\n" not in str(e.value)


def test_packed_rows_never_straddle_devices(tmp_path):
  cfg = tiny_config(tmp_path, model__pack=4, batch_size=16)
  config_lib.resolve(cfg)
  with pytest.raises(config_lib.ConfigError, match=r"^model.pack: 4 does not divide the 2 rows "
                     r"per device"):
    sharding_lib.check_batch_sizes(cfg, sharding_lib.make_mesh(cfg, jax.devices()[:8]))


def test_packed_sharded_accumulated_step_equals_the_plain_one(tmp_path):
  """The trainer end to end: 2 rows to an attention row, 2 microbatches, 2 devices, against one
  device, one batch, no packing (losses, gradient norms and parameters after 2 steps; Adam's
  eps at 1 so that an update is smooth in its gradient, as tests/test_train_step.py)."""
  base = dict(batch_size=16, optimizer__warmup_steps=1, optimizer__eps=1.0, optimizer__lr=1.0)
  runs = []
  for kw, devices in (({}, 1), ({"model__pack": 2, "microbatches": 2}, 2)):
    cfg = tiny_config(tmp_path, **base, **kw)
    mesh = sharding_lib.make_mesh(cfg, devices=jax.devices()[:devices])
    sharding_lib.check_batch_sizes(cfg, mesh)
    trainer = train_lib.build(cfg, config_lib.resolve(cfg), mesh)
    it = data_lib.train_iterator(cfg.data, seq_len=cfg.seq_len, global_batch_size=16, seed=0)
    with jax.set_mesh(mesh):
      state, metrics = trainer.init(), []
      for _ in range(2):
        batch = sharding_lib.global_batch({"tokens": next(it)["tokens"]}, mesh)
        state, m = trainer.step(state, batch)
        metrics.append(jax.device_get(m))
      runs.append((metrics, jax.device_get(state["params"])))
  (m1, p1), (m2, p2) = runs
  for a, b in zip(m1, m2):
    for k in ("nll_sum", "token_count", "grad_norm"):
      np.testing.assert_allclose(a[k], b[k], rtol=2e-5, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p1, p2)


def test_orders_are_drawn_per_row_before_packing():
  """What makes the losses equal: packing reshapes slots, never the orders or cuts."""
  o = orders_lib.sample("uniform", jax.random.key(0), 8, N)
  tok, pos, tgt = packing.pack(4, o, o + 1, o)
  np.testing.assert_array_equal(packing.unpack(tok[..., None], 4)[..., 0], o)
  assert pos.shape == (2, 4 * N)
