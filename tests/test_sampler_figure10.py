"""Figure 10: the cached sampler's per-pass block (`diffusion.pass_layout` + `block_inputs`) is the
reference parallel-generation layout (`diffusion.parallel_generation_mask`, via
`full_step_slots`) re-indexed into the KV cache: same tokens, position rows and targets per slot,
and the same "who sees whom", where query 0 of a step IS rank-slot m (cache index m)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.model import orders
from aogpt_jax.sampling import diffusion, schedules


def test_parallel_generation_mask_reference():
  """The reference itself, spelled out for n = 4, known = 2, two queries."""
  mask = np.asarray(diffusion.parallel_generation_mask(jnp.array([2]), 4, 2))[0]
  expected = np.array([[1, 0, 0, 0, 0, 0],      # rank-slots: causal
                       [1, 1, 0, 0, 0, 0],
                       [1, 1, 1, 0, 0, 0],
                       [1, 1, 1, 1, 0, 0],
                       [1, 1, 0, 0, 1, 0],      # query 0: rank-slots < 2 and itself
                       [1, 1, 0, 0, 0, 1]],     # query 1: never query 0
                      bool)
  np.testing.assert_array_equal(mask, expected)


@pytest.mark.slow
def test_cached_pass_layout_equals_the_figure10_reference():
  n, batch = 12, 4
  plen = np.array([0, 2, 5, 11])
  order = orders.sample("uniform", jax.random.key(0), batch, n)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (batch, n)), jnp.int32)
  t = schedules.noise_schedule("linear", 4)
  counts = schedules.deterministic_counts(n - plen, t)
  checked = 0
  for block in (None, 2, 3):                    # 2, 3: steps split over several passes
    plan = schedules.plan_steps(counts, plen, block=block)
    S, K = plan.block, n + plan.block
    for p in range(plan.steps):
      m, q0, k, c0, cc = (jnp.asarray(a[p]) for a in plan.xs())
      lay = diffusion.pass_layout(order, m, q0, k, c0, cc, block=S, cache_len=K)
      tok, mask = diffusion.block_inputs(lay, tokens, K)
      rtok, rpos, rtgt, rmask, _, _ = diffusion.full_step_slots(order, tokens, m, q0, k, queries=S)
      tok, mask, rtok, rpos, rtgt, rmask = map(np.asarray, (tok, mask, rtok, rpos, rtgt, rmask))
      pos, tgt, write = (np.asarray(getattr(lay, f)) for f in ("pos", "tgt", "write"))
      for b in range(batch):
        mb, q0b, kb, c0b, ccb = (int(a[p, b]) for a in plan.xs())
        for s in range(S):
          if s < kb:                              # query s of the pass: reference row n + s
            row = n + s
            want = rmask[b, row].copy()
            if q0b + s == 0:                      # query 0 of the step IS rank-slot m
              want[row], want[mb] = False, True
              assert write[b, s] == mb
          elif s < kb + ccb:                      # catch-up rank-slot r: reference row r
            row = c0b + s - kb
            want = rmask[b, row]
            assert write[b, s] == row
          else:                                   # padding: sees nothing, predicts nothing
            assert not mask[b, s].any() and tgt[b, s] == orders.NO_TARGET
            continue
          assert (tok[b, s], pos[b, s], tgt[b, s]) == (rtok[b, row], rpos[b, row], rtgt[b, row])
          np.testing.assert_array_equal(mask[b, s], want, err_msg=f"{block=} {p=} {b=} {s=}")
          checked += 1
  assert checked > 100
