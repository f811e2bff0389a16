"""Order distributions and the permutation helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.model import orders


def _is_perm_rows(o):
  o = np.asarray(o)
  return all(sorted(row) == list(range(o.shape[1])) for row in o)


@pytest.mark.parametrize("name,kw", [("l2r", {}), ("uniform", {}), ("mixture", {"p_l2r": 0.3}),
                                     ("fixed_random", {"seed": 3}),
                                     ("blockwise", {"block": 4, "seed": 1})])
def test_every_row_is_a_permutation(name, kw):
  o = orders.sample(name, jax.random.key(0), 16, 13, **kw)
  assert o.shape == (16, 13) and o.dtype == jnp.int32
  assert _is_perm_rows(o)


def test_uniform_rows_differ_and_do_not_depend_on_batch_size():
  a = orders.sample("uniform", jax.random.key(1), 8, 32)
  b = orders.sample("uniform", jax.random.key(1), 3, 32)
  np.testing.assert_array_equal(a[:3], b)
  assert len({tuple(r) for r in np.asarray(a)}) == 8


def test_uniform_positions_are_uniform():
  # Each position's rank should be uniform over 0..n-1: chi-square on 4000 rows.
  from scipy import stats
  n = 6
  o = np.asarray(orders.sample("uniform", jax.random.key(2), 4000, n))
  counts = np.stack([np.bincount(o[:, r], minlength=n) for r in range(n)])
  _, p = stats.chisquare(counts.ravel(), np.full(n * n, 4000 / n))
  assert p > 1e-3


def test_mixture_rate_within_binomial_bounds():
  batch, p = 20000, 0.1
  o = orders.sample("mixture", jax.random.key(3), batch, 16, p_l2r=p)
  # uniform rows are the identity with probability 1/16! (negligible)
  rate = float(jnp.mean(orders.is_l2r(o)))
  sd = np.sqrt(p * (1 - p) / batch)
  assert abs(rate - p) < 4 * sd
  assert float(jnp.mean(orders.is_l2r(orders.sample("mixture", jax.random.key(3), 100, 16,
                                                    p_l2r=0.0)))) == 0.0


def test_mixture_right_to_left_rows_within_binomial_bounds():
  batch, n = 20000, 16
  o = np.asarray(orders.sample("mixture", jax.random.key(4), batch, n, p_l2r=0.1, p_r2l=0.3))
  rev = (o == np.arange(n - 1, -1, -1)).all(1)
  for got, p in ((float(np.mean(orders.is_l2r(o))), 0.1), (float(rev.mean()), 0.3)):
    assert abs(got - p) < 4 * np.sqrt(p * (1 - p) / batch)
  np.testing.assert_array_equal(orders.sample("r2l", jax.random.key(0), 2, 5),
                                [[4, 3, 2, 1, 0]] * 2)
  with pytest.raises(ValueError, match=r"p_l2r \+ p_r2l must be at most 1"):
    orders.sample("mixture", jax.random.key(0), 2, 5, p_l2r=0.6, p_r2l=0.6)


def test_fixed_random_and_blockwise_are_fixed_by_seed():
  for name, kw in [("fixed_random", {"seed": 7}), ("blockwise", {"block": 5, "seed": 7})]:
    a = orders.sample(name, jax.random.key(0), 4, 23, **kw)
    b = orders.sample(name, jax.random.key(99), 2, 23, **kw)
    np.testing.assert_array_equal(a[0], b[1])
    np.testing.assert_array_equal(a[0], a[3])
  seed7 = orders.sample("fixed_random", jax.random.key(0), 1, 23, seed=7)
  seed8 = orders.sample("fixed_random", jax.random.key(0), 1, 23, seed=8)
  assert not np.array_equal(seed7, seed8)


def test_blockwise_visits_blocks_left_to_right_with_the_same_inner_permutation():
  block, n = 4, 18
  o = np.asarray(orders.sample("blockwise", jax.random.key(0), 1, n, block=block, seed=2))[0]
  assert list(o // block) == sorted(o // block)           # blocks in order
  inner = [list(o[i:i + block] - i) for i in range(0, n - n % block, block)]
  assert all(x == inner[0] for x in inner) and inner[0] != list(range(block))
  tail = list(o[n - n % block:] - (n - n % block))
  assert tail == [x for x in inner[0] if x < n % block]   # partial block keeps relative order


def test_registry_and_errors():
  assert {"l2r", "uniform", "mixture", "fixed_random", "blockwise"} <= set(orders.names())
  with pytest.raises(ValueError, match="unknown order distribution 'nope'"):
    orders.sample("nope", jax.random.key(0), 1, 4)
  with pytest.raises(ValueError, match="unknown option"):
    orders.sample("uniform", jax.random.key(0), 1, 4, p_l2r=0.5)

  @orders.register("reverse_for_test")
  def reverse(key, batch, length):
    return jnp.broadcast_to(jnp.arange(length)[::-1], (batch, length)).astype(jnp.int32)

  np.testing.assert_array_equal(orders.sample("reverse_for_test", None, 1, 3)[0], [2, 1, 0])


def test_permute_unpermute_ranks_roundtrip():
  key = jax.random.key(4)
  o = orders.sample("uniform", key, 5, 11)
  x = jax.random.normal(key, (5, 11, 3))
  y = orders.permute(x, o)
  np.testing.assert_array_equal(y[2, 4], x[2, o[2, 4]])
  np.testing.assert_array_equal(orders.unpermute(y, o), x)
  r = orders.ranks(o)
  np.testing.assert_array_equal(np.take_along_axis(np.asarray(r), np.asarray(o), 1),
                                np.broadcast_to(np.arange(11), (5, 11)))


def test_rank_mask_matches_definition():
  o = orders.sample("uniform", jax.random.key(5), 2, 6)
  m = np.asarray(orders.rank_mask(o))
  r = np.asarray(orders.ranks(o))
  slot_rank = np.concatenate([np.zeros((2, 1), int), r + 1], axis=1)
  for b in range(2):
    for a in range(7):
      for c in range(7):
        assert m[b, a, c] == (slot_rank[b, c] <= slot_rank[b, a])
  # identity order: an ordinary lower-triangular causal mask
  ident = np.asarray(orders.rank_mask(orders.sample("l2r", None, 1, 5)))[0]
  np.testing.assert_array_equal(ident, np.tril(np.ones((6, 6), bool)))


def test_every_registered_order_works_under_jit_with_a_fresh_cache():
  # The fixed permutations are cached per process; a jit that is the first to ask for one must
  # not need a concrete value (it used to raise TracerArrayConversionError).
  orders._fixed_permutation.cache_clear()
  kwargs = {"mixture": {"p_l2r": 0.5}, "fixed_random": {"seed": 5},
            "blockwise": {"block": 4, "seed": 2}}
  for name in orders.names():
    kw = kwargs.get(name, {})
    jitted = jax.jit(lambda k, name=name, kw=kw: orders.sample(name, k, 3, 10, **kw))
    got = jitted(jax.random.key(7))
    orders._fixed_permutation.cache_clear()
    np.testing.assert_array_equal(got, orders.sample(name, jax.random.key(7), 3, 10, **kw))
    assert _is_perm_rows(got)
