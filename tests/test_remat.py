"""Rematerialisation (model.remat, model.remat_policy): the same loss and gradients under every
policy, and less memory: XLA's temporaries of the compiled loss gradient shrink with remat
(before `blocks.late_remat`, XLA:CPU scheduled jax.checkpoint's recomputation right after each
block's forward pass, so remat held every block's activations and saved almost nothing)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.model import aogpt as model
from aogpt_jax.model import blocks, objectives
from aogpt_jax.model import orders


def _cfg(**kw):
  base = dict(block_size=64, n_layer=2, n_head=2, n_embd=32, target_dim=8, vocab_size=64,
              valid_vocab_size=50, init_std=0.1)
  return model.preset("tiny", **{**base, **kw})


def _grad_fn(cfg):
  gd, params = nnx.split(model.AOGPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  params = nnx.to_pure_dict(params)

  def f(p, tokens, order, key):
    return jax.value_and_grad(objectives.merged_loss, has_aux=True)(p, gd, tokens, order, None,
                                                                    key, "ao")
  return jax.jit(f), params


def _batch(b=2, n=48):
  k1, k2 = jax.random.split(jax.random.key(1))
  tokens = jax.random.randint(k1, (b, n), 0, 50, dtype=jnp.int32)
  return tokens, orders.sample("mixture", k2, b, n, p_l2r=0.3)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"dropout": 0.1, "loss_chunk": 32,
                                         "attention_impl": "blockwise", "attention_block": 16}])
def test_every_policy_gives_the_same_loss_and_gradients(extra):
  tokens, order = _batch()
  key = jax.random.key(7) if extra.get("dropout") else None
  f, p = _grad_fn(_cfg(**extra))
  (ref_loss, _), ref = f(p, tokens, order, key)
  for policy in blocks.REMAT_POLICIES:
    g, p2 = _grad_fn(_cfg(remat=True, remat_policy=policy, **extra))
    (loss, _), grads = g(p2, tokens, order, key)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=policy)


def _temp_bytes(**kw):
  cfg = _cfg(n_layer=4, n_embd=64, block_size=256, **kw)
  gd, params = nnx.split(nnx.eval_shape(lambda: model.AOGPT(cfg, rngs=nnx.Rngs(0))), nnx.Param)

  def f(p, tokens, order):
    return jax.grad(objectives.merged_loss, has_aux=True)(p, gd, tokens, order, None, None, "ao")
  tok = jax.ShapeDtypeStruct((8, 256), jnp.int32)
  compiled = jax.jit(f).lower(nnx.to_pure_dict(params), tok, tok).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_remat_shrinks_the_compiled_gradients_temporaries():
  plain = _temp_bytes()
  block = _temp_bytes(remat=True)
  dots = _temp_bytes(remat=True, remat_policy="dots")
  # Full remat keeps the block inputs only: well under half of the plain gradient's
  # temporaries (jax.checkpoint alone: ~0.9x); saving every matmul output lies in between.
  assert block < 0.5 * plain, (block, plain)
  assert block < dots < plain, (block, dots, plain)


@pytest.mark.slow
def test_remat_with_the_encoders_full_mask_and_the_cached_sampler():
  """Non-array block arguments (the encoder's FULL mask string) stay static under remat, and the
  KV-cached forward (no gradient) gives the same logits."""
  from aogpt_jax.model import encoder
  tok = jax.random.randint(jax.random.key(2), (2, 32), 0, 50, dtype=jnp.int32)
  out = []
  for remat in (False, True):
    mc = encoder.encoder_config(_cfg(remat=remat, target="none"))
    gd, p = nnx.split(model.AOGPT(mc, rngs=nnx.Rngs(0)), nnx.Param)
    out.append(jax.jit(jax.grad(lambda p, gd=gd: encoder.mdm_loss(
        nnx.merge(gd, p), tok, jax.random.key(0))[0]))(p))
  for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  logits = []
  for remat in (False, True):
    m = model.AOGPT(_cfg(remat=remat), rngs=nnx.Rngs(0))
    cache = m.init_cache(2, 8)
    slots = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8))
    mask = jnp.tril(jnp.ones((8, 8), bool))[None].repeat(2, 0)
    logits.append(m.forward_slots(jnp.where(slots == 0, -1, slots), slots, slots, mask=mask,
                                  cache=cache, write_index=slots)[0])
  np.testing.assert_allclose(logits[0], logits[1], rtol=1e-6)


def test_train_remat_auto_chooses_from_the_compiled_steps_memory(caplog, monkeypatch):
  """train.remat=auto (train.loop.choose_remat): off when the step fits the device's memory,
  the policy that saves most when nothing fits; the choice written into the config (config.json
  and the checkpoints record it); as set where the device reports no limit (CPU)."""
  from aogpt_jax import config as config_lib
  from aogpt_jax import recipes
  from aogpt_jax.train import loop, sharding

  def setup(**kw):
    cfg = recipes.apply(recipes.config_file("configs/quickstart.py", ""),
                        {"batch_size": 8, "seq_len": 32, "model.n_layer": 1, "train.remat": "auto",
                         **kw})
    mc = config_lib.resolve(cfg)
    return cfg, mc, sharding.make_mesh(cfg)

  caplog.set_level("INFO")
  monkeypatch.setattr(loop, "REMAT_ORDER", ("attention", "block"))      # fewer compilations
  cfg, mc, mesh = setup(**{"model.remat": True})
  assert loop.choose_remat(cfg, mc, mesh, limit=2**40).remat is False     # fits: off
  assert cfg.model.remat is False
  cfg, mc, mesh = setup()
  chosen = loop.choose_remat(cfg, mc, mesh, limit=1)                     # nothing fits
  assert (chosen.remat, chosen.remat_policy) == (True, "block")
  assert (cfg.model.remat, cfg.model.remat_policy) == (True, "block")
  assert "remat=block" in caplog.text and "off " in caplog.text and "attention " in caplog.text
  cfg, mc, mesh = setup(**{"model.remat": True})
  assert loop.choose_remat(cfg, mc, mesh).remat is True                  # CPU: no limit
  with pytest.raises(config_lib.ConfigError, match=r"^train.remat: expected '' .* got 'on'"):
    config_lib.resolve(setup(**{"train.remat": "on"})[0])
