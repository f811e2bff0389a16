"""The token draw under a mesh (a data-parallel sampler): it runs per shard of the batch, with no
collective in the compiled program, and draws the tokens a single device draws."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from aogpt_jax.train import sharding as sharding_lib
from aogpt_jax.sampling import tokens as tokens_lib


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sharded_draw_has_no_collective_and_draws_the_same_tokens(top_p):
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices")
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(8, 3, 300)).astype(np.float32) * 2.0
  logits[..., 290:] = -np.inf                                   # padding ids
  logits[0, 0, :40] = 1.5                                       # ties at the top
  keys = tokens_lib.sample_keys(jax.random.key(3), 24).reshape(8, 3)
  draw = lambda l, k: tokens_lib.sample_tokens(l, k, temperature=0.8, top_p=top_p)
  mesh = jax.make_mesh((8, 1, 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
  rows = NamedSharding(mesh, P(("data", "fsdp")))
  with tokens_lib.exact_sampling():
    want = np.asarray(jax.jit(draw)(jnp.asarray(logits), keys))
    with sharding_lib.activation_constraints(mesh, {}):
      compiled = jax.jit(draw).lower(jax.device_put(logits, rows),
                                     jax.device_put(keys, rows)).compile()
    got = compiled(jax.device_put(logits, rows), jax.device_put(keys, rows))
  hlo = compiled.as_text()
  assert not any(op in hlo for op in ("all-gather", "all-reduce", "all-to-all",
                                      "collective-permute")), "a collective in the draw"
  assert got.sharding.is_equivalent_to(rows, 2)               # the tokens stay split
  np.testing.assert_array_equal(np.asarray(got), want)
