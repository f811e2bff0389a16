"""Context-order ensembles: the prefix estimator against one full forward per (i, ordering)."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.evaluation import ensembles as ens
from aogpt_jax.evaluation import perplexity as ppl

N = 8


@pytest.fixture(scope="module")
def setup():
  cfg = model_lib.preset("tiny", n_layer=2, n_embd=32, n_head=4, block_size=16, target_dim=8)
  m = model_lib.AOGPT(cfg, rngs=nnx.Rngs(1))
  x = np.random.default_rng(0).integers(0, 257, (2, N)).astype(np.int32)
  ids = ppl.block_ids({"tokens": x})
  nll, sigma = ppl.token_nll(m, x, ids, seed=7)
  return m, x, ids, np.asarray(sigma), -np.asarray(nll)


@pytest.fixture(scope="module")
def naive(setup):
  m, x, ids, sigma, _ = setup
  return ens.naive_logp(m, x, ids, sigma, max_m=4, seed=7, path="mask")


@pytest.mark.parametrize("layout", ["pairs", "buckets"])
@pytest.mark.slow
def test_fast_equals_naive_mask_path(setup, naive, layout):
  m, x, ids, sigma, base = setup
  fast = ens.ensemble_logp(m, x, ids, sigma, base, max_m=4, seed=7, layout=layout,
                           num_buckets=3, slots_per_call=3 * (N + 1))  # several calls
  assert not np.isnan(fast).any()
  np.testing.assert_allclose(fast, naive, atol=2e-5)
  for mm in (2, 3, 4):
    np.testing.assert_allclose(ens.ensemble_nll(fast, [mm]), ens.ensemble_nll(naive, [mm]),
                               atol=2e-5)
  # orderings really differ: for ranks >= 3 some j >= 1 gives another probability
  assert np.abs(fast[:, 3:, 1:] - fast[:, 3:, :1]).max() > 1e-3


@pytest.mark.slow
def test_rank_subset_and_nesting(setup, naive):
  m, x, ids, sigma, base = setup
  part = ens.ensemble_logp(m, x, ids, sigma, base, max_m=2, seed=7, ranks=[2, 5, 7], rows=[1])
  np.testing.assert_allclose(part[[1]][:, [2, 5, 7]], naive[[1]][:, [2, 5, 7], :2], atol=2e-5)
  assert np.isnan(part[0, :, 1]).all() and np.isnan(part[1, 4, 1])


@pytest.mark.parametrize("program", ["packed_logp_any", "packed_logp_cpu"])
@pytest.mark.parametrize("layout", [pytest.param("pairs", marks=pytest.mark.slow), "buckets"])
def test_identity_ordering_of_the_prefix_kernel_is_the_base(setup, layout, program):
  """j = 0 through the prefix kernel reproduces the full base forward at every rank, with and
  without the CPU compiler options (the evaluator's choice on CPU)."""
  assert ens.packed_logp_jit() is ens.packed_logp_cpu      # the tests run on CPU
  m, x, ids, sigma, base = setup
  g = ens.pack_prefixes(range(N), N, layout, num_buckets=1)[0]
  items = len(g.ranks) * 2
  graphdef, params = nnx.split(m)
  logp = getattr(ens, program)(
      graphdef, params, jnp.asarray(x), jnp.asarray(sigma), jnp.asarray(ids), jnp.uint32(7),
      jnp.repeat(jnp.arange(2), len(g.ranks)), jnp.zeros((items,), jnp.int32),
      jnp.asarray(np.tile(g.ranks, (2, 1))), row_len=g.row_len, masked=g.masked)
  got = np.full((2, N), np.nan)
  for it, (b, r) in enumerate(zip(np.repeat(np.arange(2), len(g.ranks)), np.tile(g.ranks, (2, 1)))):
    for gi, rank in enumerate(r):
      if rank >= 0:
        got[b, rank] = logp[it, gi]
  np.testing.assert_allclose(got, base, atol=2e-5)


@pytest.mark.slow
def test_m1_equals_the_any_order_nll(setup):
  m, x, _, _, _ = setup
  batches = [{"tokens": np.concatenate([x, x[:1]]), "weight": np.array([1, 1, 0])}]
  res = ens.ensemble_perplexity(m, batches, max_m=4, seed=7, num_buckets=2)
  ao = ppl.perplexity(m, batches, seed=7)
  np.testing.assert_allclose(res["nll"]["1"], ao["nll"], rtol=1e-7)
  assert res["m_values"] == [1, 2, 4] and res["tokens"] == 2 * N
  assert res["nll"]["4"] != res["nll"]["1"]


def test_context_permutations():
  key = ens.ensemble_key(3, 123)
  for i in (0, 1, 5, 7):
    for j in (0, 1, 2):
      p = np.asarray(ens.context_permutation(key, i, j, N))
      assert sorted(p[:i]) == list(range(i)) and list(p[i:]) == list(range(i, N))
      if j == 0:
        assert list(p) == list(range(N))
      np.testing.assert_array_equal(p, ens.context_permutation(key, i, j, N))
  draws = {tuple(np.asarray(ens.context_permutation(key, 7, j, N))) for j in range(1, 6)}
  assert len(draws) == 5


def test_plans_cover_every_rank_once():
  for n in (1, 2, 7, 10, 256):
    for layout in ("pairs", "buckets"):
      groups = ens.pack_prefixes(range(n), n, layout, num_buckets=4)
      ranks = np.concatenate([g.ranks.ravel() for g in groups])
      assert sorted(ranks[ranks >= 0]) == list(range(n))
      for g in groups:
        lens = np.where(g.ranks >= 0, g.ranks + 1, 0).sum(1)
        assert lens.max() <= g.row_len
    pairs = ens.pack_prefixes(range(n), n, "pairs")[0]
    assert pairs.row_len == n + 1 and len(pairs.ranks) == (n + 1) // 2
  with pytest.raises(ValueError, match="ensemble_layout"):
    ens.pack_prefixes([1], 4, "nope")
  with pytest.raises(ValueError, match=r"\[0, 4\)"):
    ens.pack_prefixes([4], 4)


@pytest.mark.slow
def test_default_plan_compiles_one_program(setup):
  """The default layout is one compiled shape (16 bucket shapes cost ~47 s of compilation at
  n = 256 on the 2-core box), and calls are split evenly: padding < one item per call."""
  assert len(ens.compiled_shapes(range(256), [0], 256, 8)) == 1
  assert len(ens.compiled_shapes(range(256), [0], 256, 8, "buckets", 16)) == 16
  for total, size in ((903, 63), (112, 102), (5, 5), (7, 2)):
    calls = list(ens._chunks([np.arange(total)], size))
    assert sum(c for _, c, _ in calls) == total and len(calls) == -(-total // size)
    assert len(calls) * len(calls[0][2][0]) - total < len(calls)
  m, x, ids, sigma, base = setup
  before = ens.packed_logp_jit()._cache_size()
  res = ens.ensemble_perplexity(m, [{"tokens": np.concatenate([x, x]), "weight": np.ones(4)}],
                                max_m=3, seed=5)
  assert ens.packed_logp_jit()._cache_size() - before == 1 and res["layout"] == "pairs"


def test_m_values():
  assert ens.m_values(64) == [1, 2, 4, 8, 16, 32, 64]
  assert ens.m_values(6) == [1, 2, 4, 6]
  assert ens.m_values(1) == [1]
  with pytest.raises(ValueError):
    ens.m_values(0)


def test_ensemble_nll_is_minus_log_mean_probability():
  lp = np.log(np.array([[[0.5, 0.1, 0.3, 0.1]]]))
  np.testing.assert_allclose(ens.ensemble_nll(lp, [1, 2, 4])[:, 0, 0],
                             -np.log([0.5, 0.3, 0.25]))
