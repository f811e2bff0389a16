"""Eq. 4: the packed-prefix ensemble (`ensemble_logp` + `ensemble_nll`) equals the plain
reference `ensembles.eq4_reference` (one full forward per context ordering)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.evaluation import ensembles as ens
from aogpt_jax.evaluation import perplexity as ppl

N, M, SEED = 8, 4, 3


def test_fast_ensemble_equals_eq4_reference():
  cfg = model_lib.preset("tiny", n_layer=1, n_embd=32, n_head=4, block_size=16, target_dim=8)
  m = model_lib.AOGPT(cfg, rngs=nnx.Rngs(2))
  x = np.random.default_rng(1).integers(0, 257, (2, N)).astype(np.int32)
  ids = ppl.block_ids({"tokens": x})
  nll, sigma = ppl.token_nll(m, x, ids, seed=SEED)
  sigma = np.asarray(sigma)
  logp = ens.ensemble_logp(m, x, ids, sigma, -np.asarray(nll), max_m=M, seed=SEED,
                           layout="pairs")
  fast = ens.ensemble_nll(logp, [1, M])                    # [2, B, n], order space
  # (M = 1 is the any-order NLL: tests/test_eval_ensembles.py)
  reference = jax.jit(lambda *a: ens.eq4_reference(m, *a), static_argnums=2)
  checked = 0
  for b in range(2):
    ekey = ens.ensemble_key(SEED, ids[b])
    for i in (3, N - 1):
      ctx = np.stack([sigma[b][np.asarray(ens.context_permutation(ekey, i, j, N))][:i]
                      for j in range(M)])
      assert sorted(ctx[-1]) == sorted(sigma[b][:i])          # an ordering of the context set
      ref = reference(jnp.asarray(x[b]), jnp.asarray(sigma[b]), i, jnp.asarray(ctx))
      np.testing.assert_allclose(fast[1, b, i], float(ref), atol=2e-5)
      checked += 1
  assert checked == 4
  # the orderings matter: M = 4 differs from M = 1 at a rank with >= 3 context tokens
  assert np.abs(fast[1, :, N - 1] - fast[0, :, N - 1]).max() > 1e-4
