"""Likelihood of the encoder-only MDM baseline (`model.encoder`) in the evaluation format of
perplexity.py, so an encoder and an AO-GPT sit in one table (``EvalSettings.model_kind``).

* Exact order NLL (`order_nll`): for the scoring orders of `perplexity.eval_orders` — the SAME
  orders as the AO-GPT rows (same seed, block ids and order index), identity for L2R —
  ``-log p(x_{sigma_r} | x_{sigma_<r})`` with every position of rank >= r set to [MASK]: n
  bidirectional forwards per block and order (`encoder_model.exact_order_nll`), against one causal
  forward for an AO-GPT.
* ELBO (`add_elbo_batch`): the Monte Carlo estimate of the negative ELBO (Eq. 1), the encoder's
  NLL upper bound, which equals the any-order NLL averaged over uniform orders. Sample k of block
  b draws, from ``fold_in(fold_in(fold_in(key(seed), ELBO_STREAM), block_id(b)), k)`` split in
  two, a time t = 1 - U in (0, 1] and a mask (each position masked with probability t), and
  scores
  ``(1/t) * sum of -log p(x_i | unmasked)`` over the masked positions (`encoder_model.weighted_nll`).
  Draws depend only on (seed, block id, k), not on the batch. Each of the K samples gives a
  dataset-level estimate (weighted sum over blocks / tokens); the row reports their mean and a
  95% Student-t interval over the K estimates (i.i.d. across k given the data). With
  ``stratified`` the K times of a block are ``t_k = 1 - ((u_b + k/K) mod 1)`` (one uniform u_b
  per block from ``fold_in(fold_in(key(seed), SHIFT_STREAM), block_id(b))``; lower variance,
  the interval, over estimates that are then dependent, is typically conservative).

The ELBO is a per-sequence quantity: it needs one weight per row (what `data.eval_batches`
gives), and raises on per-token weights that differ within a row.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.evaluation import perplexity as ppl_lib
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.model import jit as model_jit

ELBO_STREAM = 0xE1B0      # fold-in tag of the ELBO times and masks
SHIFT_STREAM = 0xE1B1     # fold-in tag of the per-block shift u_b of stratified times


def order_nll(m: model_lib.AOGPT, tokens, ids, **kw):
  """The encoder's `perplexity.token_nll`: (per-token NLL [B, n] in ORDER space, order [B, n])."""
  return ppl_lib.token_nll(m, tokens, ids, encoder=True, **kw)


def elbo_masks(seed, ids: jax.Array, n: int, sample_index, *, num_samples: int,
               stratified: bool) -> tuple[jax.Array, jax.Array]:
  """(t float32 [B] in (0, 1], masked bool [B, n]) of ELBO sample ``sample_index`` of each block
  (see the module docstring)."""
  base = jax.random.fold_in(jax.random.key(seed), ELBO_STREAM)
  shift = jax.random.fold_in(jax.random.key(seed), SHIFT_STREAM)

  def one(bid):
    k_t, k_m = jax.random.split(jax.random.fold_in(jax.random.fold_in(base, bid), sample_index))
    if stratified:
      u_b = jax.random.uniform(jax.random.fold_in(shift, bid), ())
      t = encoder_model.stratified_times(u_b, sample_index, num_samples)
    else:
      t = 1.0 - jax.random.uniform(k_t, ())
    return t, encoder_model.masks_at(k_m, t, n)

  return jax.vmap(one)(ids)


@model_jit.jit("num_samples", "stratified")
def _elbo_terms(m, tokens, ids, seed, sample_index, *, num_samples, stratified):
  t, masked = elbo_masks(seed, ids, tokens.shape[1], sample_index, num_samples=num_samples,
                         stratified=stratified)
  return encoder_model.weighted_nll(m, tokens, masked, t)


def elbo_terms(m: model_lib.AOGPT, tokens, ids, *, seed: int = 0, sample_index: int = 0,
               num_samples: int = 1, stratified: bool = False) -> jax.Array:
  """Per-block ELBO terms [B] (nats per sequence) of one sample index."""
  return model_jit.call(_elbo_terms, m, jnp.asarray(tokens, jnp.int32), jnp.asarray(ids),
                        jnp.uint32(seed), jnp.int32(sample_index), num_samples=num_samples,
                        stratified=stratified)


def row_weights(weight: np.ndarray) -> np.ndarray:
  """[B] from token weights [B, n] that are constant along each row (raises otherwise)."""
  bad = np.flatnonzero(np.any(weight != weight[:, :1], axis=1))
  if len(bad):
    raise ValueError(f"eval: the encoder's ELBO needs one weight per row (a per-sequence bound); "
                     f"row {bad[0]} of the batch has token weights that differ")
  return weight[:, 0]


def add_elbo_batch(acc: ppl_lib.NLLSum, m: model_lib.AOGPT, tokens: np.ndarray, ids, weight,
                   *, seed: int, stratified: bool) -> None:
  """Adds the K = ``len(acc.nll)`` ELBO samples of one batch (slot k = sample k); the caller
  counts the batch's tokens (``acc.count``)."""
  row_weights(np.asarray(weight, np.float64))   # refuses per-token weights within a row
  n = tokens.shape[1]
  k_total = len(acc.nll)
  for k in range(k_total):
    terms = np.asarray(elbo_terms(m, tokens, ids, seed=seed, sample_index=k,
                                  num_samples=k_total, stratified=stratified), np.float64)
    # spread each sequence's term evenly over its n tokens: the weighted sum is sum_b w_b term_b
    acc.add(np.broadcast_to(terms[:, None] / n, tokens.shape), weight, k)


def summarize_elbo(acc: ppl_lib.NLLSum, *, seed: int, stratified: bool) -> dict:
  """The ELBO row: mean over the K samples of the per-token negative ELBO, its perplexity bound,
  every sample's estimate, and (K > 1) a 95% Student-t interval over the K estimates."""
  out = ppl_lib.summarize(acc.means(), acc.tokens, acc.blocks, estimator="elbo", seed=seed,
                          stratified=stratified)
  k = out.pop("num_orders")
  out["t_samples"] = k
  out["per_sample_nll"] = out.pop("per_order_nll")
  out["per_sample_ppl"] = out.pop("per_order_ppl")
  if "ci_method" in out:
    out["ci_method"] = (f"95% Student-t over {k} t-sample estimates ({k - 1} dof)" +
                        (", stratified t (typically conservative)" if stratified else ""))
  return out


def encoder_perplexity(m: model_lib.AOGPT, batches, *, seed: int = 0, num_samples: int = 16,
                       stratified: bool = False, max_batches: int = 0) -> dict:
  """The ELBO row alone over ``batches`` of ``{"tokens", "weight"}`` (see `summarize_elbo`)."""
  if num_samples < 1:
    raise ValueError(f"eval.elbo_samples must be >= 1, got {num_samples}")
  encoder_model.check_encoder(m.cfg, "the ELBO")
  acc = ppl_lib.NLLSum(num_samples)
  for _, tokens, weight, ids in ppl_lib.eval_blocks(batches, m.cfg, max_batches):
    acc.count(weight)
    add_elbo_batch(acc, m, tokens, ids, weight, seed=seed, stratified=stratified)
  acc.reduce()
  return summarize_elbo(acc, seed=seed, stratified=stratified)
