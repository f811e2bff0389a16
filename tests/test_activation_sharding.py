"""Activation sharding constraints (`sharding.activation_constraints`, `layers.constrain`) on 8
fake CPU devices as data 2 x fsdp 2 x tensor 2: the lowered loss really pins q/k/v and the MLP
hidden to the ``tensor`` axis and the batch to (data, fsdp), and the sharded loss and gradients
equal the single-device ones."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from aogpt_jax import config as config_lib
from aogpt_jax.model import layers
from aogpt_jax.model import aogpt as model
from aogpt_jax.model import orders
from aogpt_jax.train import sharding as sharding_lib


def _setup():
  cfg = model.preset("tiny", block_size=16, n_layer=1, n_head=2, n_embd=32, target_dim=8,
                     vocab_size=64, valid_vocab_size=50)
  gd, state = nnx.split(model.AOGPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  params = nnx.to_pure_dict(state)
  k1, k2 = jax.random.split(jax.random.key(1))
  tokens = jax.random.randint(k1, (8, 16), 0, 50, dtype=jnp.int32)
  order = orders.sample("uniform", k2, 8, 16)
  return gd, state, params, tokens, order


def _loss_fn(gd):
  return jax.value_and_grad(lambda p, t, o: model.loss(nnx.merge(gd, p), t, o)[0])


def test_constrain_is_a_no_op_without_a_mesh():
  x = jnp.ones((4, 3))
  assert layers.constrain(x, (layers.BATCH, None)) is x


def test_activation_rules_keep_features_whole_and_split_heads():
  act = sharding_lib.activation_rules(config_lib.rules(config_lib.default_config()))
  assert act[layers.BATCH] == ("data", "fsdp")
  assert act[layers.HEADS] == ("tensor",) and act[layers.MLP_ACT] == ("tensor",)


@pytest.mark.slow
def test_sharded_constrained_loss_equals_single_device():
  assert jax.device_count() >= 8, "conftest provides 8 fake CPU devices"
  gd, state, params, tokens, order = _setup()
  l1, g1 = jax.jit(_loss_fn(gd))(params, tokens, order)

  cfg = config_lib.default_config()
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 2, 2, 2
  mesh = sharding_lib.make_mesh(cfg, devices=jax.devices()[:8])
  rules = config_lib.rules(cfg)
  p_sh = sharding_lib.named(mesh, sharding_lib.param_specs(state, rules, mesh))
  b_sh = NamedSharding(mesh, P(("data", "fsdp")))

  def constrained(p, t, o):
    with sharding_lib.activation_constraints(mesh, rules):
      return _loss_fn(gd)(p, t, o)
  fn = jax.jit(constrained, in_shardings=(p_sh, b_sh, b_sh))
  lowered = fn.lower(params, tokens, order)
  text = lowered.as_text()
  # q, k, v [B, S, heads, H] with the batch over (data, fsdp) and the heads over tensor.
  assert '[{"data", "fsdp"}, {}, {"tensor"}, {}]' in text, text[:2000]
  # The adaLN rows stay replicated (mesh.rules.mod="") and the fused q|k|v kernel is split by
  # heads before the product (layers.dense_heads): no activation is re-laid-out between tensor
  # shards. Before: collective-permutes from splitting the tensor-sharded [B, S, 6d] modulation
  # into its six parts, all-to-alls from the transpose (concatenate) in the backward pass.
  hlo = lowered.compile().as_text()
  moved = [line.strip()[:200] for line in hlo.splitlines()
           if re.search(r" (collective-permute|all-to-all)(-start)?\(", line)
           and re.search(r'op_name="[^"]*(/split|concatenate)"', line)]
  assert not moved, moved
  with jax.set_mesh(mesh):
    l8, g8 = fn(jax.device_put(params, p_sh), jax.device_put(tokens, b_sh),
                jax.device_put(order, b_sh))
  np.testing.assert_allclose(l8, l1, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               jax.device_get(g8), jax.device_get(g1))
