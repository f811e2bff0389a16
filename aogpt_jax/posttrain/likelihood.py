"""The exact log-likelihood of a rollout under the order and step structure it was generated with.

A sampler writes the tokens of a row in an order (``order[b, r]``: the position written r-th,
as `sampling.Samples.order`) over steps (``steps[b, r]``: the step that wrote rank r; several
ranks share a step under parallel generation). Every token of a step is drawn from the model
conditioned on the tokens of EARLIER steps only (docs/method.md, Figure 10's
parallel-generation mask: tokens of one step do not see each other), so the probability the
model gave the rollout is a product over ranks, and one teacher-forced pass recomputes it,
exactly and with gradients (a masked-diffusion model would have to estimate it)::

    logp_BxN = sequence_logp(model, tokens, order, steps, prompt)
    logp_BxN[b, r] = log p(x_{order[b, r]} | the tokens of ranks with steps < steps[b, r])

(0 at the prompt's ranks). The pass: the n rank-slots in sigma order, causal (rank-slot r holds
START or x_{order[r-1]} and targets order[r], `orders.rank_slots`), then one *query* slot per
rank: the query of rank r is a copy of rank-slot m(r) = the first rank of its step (the frontier
of that step) with target order[r]; it sees rank-slots 0..m(r)-1 and itself, never another
query: exactly the query the sampler drew rank r from (`diffusion.full_step_slots`, with all
steps' queries in one pass). With one token per step m(r) = r, the query is rank-slot r itself,
and the result is minus `aogpt.loss`'s per-token NLL.

Conventions: ``steps`` must be non-decreasing along the ranks after the prompt (a sampler's
steps are); the prompt's ranks (``prompt`` bool [B, n] in ORIGINAL order, put first by
`orders.prompt_first`) may hold any step value (-1 by convention) and are context for every
answer rank. `check_rollout` checks shapes and these rules on host arrays.

Shape suffixes: B rows, N sequence length n, F = 2n slots (rank-slots, then queries), V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT, check_length

NO_PROMPT_STEP = -1     # the step value of prompt ranks (any value < every answer step works)


def frontier(steps: jax.Array, scored: jax.Array) -> jax.Array:
  """int32 [B, n]: m(r), the number of ranks written at steps before rank r's (prompt ranks
  count as written before every answer rank); for non-decreasing steps, the first rank of r's
  step, i.e. the frontier of the step that wrote rank r."""
  low = jnp.iinfo(jnp.int32).min
  eff_BxN = jnp.where(scored, steps.astype(jnp.int32), low)
  return jnp.sum(eff_BxN[:, None, :] < eff_BxN[:, :, None], axis=-1, dtype=jnp.int32)


def likelihood_slots(tokens: jax.Array, order: jax.Array, m: jax.Array):
  """The slots of the teacher-forced pass (module docstring): tokens, position rows, targets
  [B, 2n] and the mask [B, 2n, 2n]; ``m`` [B, n] from `frontier`."""
  n = order.shape[1]
  rtok_BxN, rpos_BxN = orders_lib.rank_slots(order, tokens, orders_lib.all_ranks(order))
  qtok_BxN, qpos_BxN = orders_lib.rank_slots(order, tokens, m)
  tok_BxF = jnp.concatenate([rtok_BxN, qtok_BxN], axis=1)
  pos_BxF = jnp.concatenate([rpos_BxN, qpos_BxN], axis=1)
  tgt_BxF = jnp.concatenate([order, order], axis=1).astype(jnp.int32)
  a_F = jnp.arange(2 * n, dtype=jnp.int32)
  row_1xFx1, col_1x1xF = a_F[None, :, None], a_F[None, None, :]
  lim_BxFx1 = jnp.concatenate([jnp.zeros_like(m), m], axis=1)[:, :, None]
  rank_rows_1xFxF = (row_1xFx1 < n) & (col_1x1xF <= row_1xFx1)
  query_rows_BxFxF = (row_1xFx1 >= n) & ((col_1x1xF < lim_BxFx1) | (col_1x1xF == row_1xFx1))
  return tok_BxF, pos_BxF, tgt_BxF, rank_rows_1xFxF | query_rows_BxFxF


def rollout_logits(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
                   prompt: jax.Array | None = None) -> jax.Array:
  """float32 [B, n, V] in rank layout: the logits rank r's token was drawn from (temperature
  1), i.e. the model's conditional given the ranks of earlier steps (meaningless at the prompt's
  ranks); arguments as `sequence_logp`. One pass over 2n slots."""
  b, n = tokens.shape
  check_length(model.cfg, n)
  prompt = jnp.zeros((b, n), bool) if prompt is None else prompt
  m_BxN = frontier(steps, orders_lib.scored_ranks(prompt))
  tok_BxF, pos_BxF, tgt_BxF, mask_BxFxF = likelihood_slots(tokens, order, m_BxN)
  query_BxN = jnp.broadcast_to(jnp.arange(n, 2 * n, dtype=jnp.int32), (b, n))
  hidden_BxNxD, _ = model.hidden_slots(tok_BxF, pos_BxF, tgt_BxF, mask=mask_BxFxF,
                                       query=query_BxN)
  return model.head(hidden_BxNxD, order.astype(jnp.int32))


def token_logp(logits: jax.Array, tokens: jax.Array, order: jax.Array, prompt: jax.Array | None,
               temperature: float = 1.0) -> jax.Array:
  """[B, n]: log-softmax of `rollout_logits` / ``temperature`` at each rank's token (0 at the
  prompt's ranks)."""
  logits_BxNxV = logits / jnp.float32(temperature)
  target_BxN = orders_lib.permute(tokens, order)
  logp_BxN = (jnp.take_along_axis(logits_BxNxV, target_BxN[..., None], axis=-1)[..., 0]
              - jax.nn.logsumexp(logits_BxNxV, axis=-1))
  if prompt is None:
    return logp_BxN
  return jnp.where(orders_lib.scored_ranks(prompt), logp_BxN, 0.0)


def sequence_logp(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
                  prompt: jax.Array | None = None, *, temperature: float = 1.0) -> jax.Array:
  """float32 [B, n] in rank layout: ``logp[b, r] = log p(x_{order[b, r]} | tokens of the ranks
  written at steps < steps[b, r])``, 0 at the prompt's ranks (module docstring). ``tokens``
  int [B, n] in ORIGINAL order; ``order``, ``steps`` int [B, n]; ``prompt`` bool [B, n] in
  original order (None: no prompt). ``temperature``: the logits are divided by it first (the
  model's own distribution at 1). Traceable and differentiable in the model's parameters."""
  logits_BxNxV = rollout_logits(model, tokens, order, steps, prompt)
  return token_logp(logits_BxNxV, tokens, order, prompt, temperature)


def check_rollout(tokens, order, steps, prompt=None, *, vocab_size: int | None = None,
                  block_size: int | None = None) -> None:
  """One-line ValueErrors for host arrays before anything compiles: shapes [B, n], each order
  row a permutation with the prompt first, steps non-decreasing after the prompt, tokens in the
  vocabulary, n within the model's block size."""
  tokens, order, steps = np.asarray(tokens), np.asarray(order), np.asarray(steps)
  if tokens.ndim != 2:
    raise ValueError(f"rollout.tokens: expected [batch, n], got shape {tokens.shape}")
  b, n = tokens.shape
  for name, a in (("order", order), ("steps", steps)) + (
      (("prompt", np.asarray(prompt)),) if prompt is not None else ()):
    if a.shape != (b, n):
      raise ValueError(f"rollout.{name}: expected shape {(b, n)} (as tokens), got {a.shape}")
  if block_size is not None and n > block_size:
    raise ValueError(f"rollout.tokens: length {n} exceeds model.block_size {block_size}")
  if vocab_size is not None and (tokens.min(initial=0) < 0 or tokens.max(initial=0) >= vocab_size):
    raise ValueError(f"rollout.tokens: ids must be in [0, {vocab_size}), got "
                     f"[{tokens.min()}, {tokens.max()}]")
  if not (np.sort(order, axis=1) == np.arange(n)).all():
    row = int(np.argmax(~(np.sort(order, axis=1) == np.arange(n)).all(axis=1)))
    raise ValueError(f"rollout.order: row {row} is not a permutation of 0..{n - 1}")
  plen = np.zeros(b, np.int64) if prompt is None else np.asarray(prompt, bool).sum(1)
  if prompt is not None:
    first = np.take_along_axis(np.asarray(prompt, bool), order, axis=1)
    bad = first != (np.arange(n)[None, :] < plen[:, None])
    if bad.any():
      raise ValueError(f"rollout.order: row {int(np.argmax(bad.any(1)))} does not put the "
                       f"prompt's positions first (orders.prompt_first)")
  scored = np.arange(n)[None, :] >= plen[:, None]
  drop = scored[:, 1:] & scored[:, :-1] & (np.diff(steps, axis=1) < 0)
  if drop.any():
    row = int(np.argmax(drop.any(1)))
    raise ValueError(f"rollout.steps: row {row} decreases along the answer ranks; expected "
                     f"the step of each rank, non-decreasing in generation order")
