"""The KV-cached masked-diffusion sampler: one `jax.lax.scan` over steps, and its uncached twin.

Slots (docs/method.md, "Slot layout"; the rules live in orders.py). With the generation order
sigma (``order[b, r]`` = sigma_{r+1}), rank-slot r holds START (r = 0) or the token x_{sigma_r}
at position sigma_r, and is conditioned on the target sigma_{r+1}. Because adaLN conditions every
block on the target, a slot's keys and values depend on that target: rank-slot r is only
reusable with target sigma_{r+1}.

One step (Figure 10's parallel-generation mask). With m tokens known (the frontier) and k
positions to reveal, the k *queries* are copies of rank-slot m (token x_{sigma_m}) with targets
sigma_{m+1}, ..., sigma_{m+k}; each sees rank-slots 0..m-1 and itself, never another query.
Query 0 IS rank-slot m (right token, right target), so it is written at its committed cache
index m; queries j >= 1 are written to a scratch region (index n + j) that only they can see.
The tokens just sampled at ranks m+1..m+k-1 have no slot in the cache yet (their slots target
sigma_{m+2..m+k}, unknown when the step ran). They are the *catch-up* slots of the next step:
the next forward block is [queries of step i+1] + [catch-up slots m+1..m+k-1], the catch-up slots
attending causally to the cache and to each other, the queries also seeing them (every layer
writes the block's keys/values before attending). So each committed slot is computed exactly
once and written once, queries j >= 1 are the only extra work, and the total is at most 2n
slot-passes (n at T = n), against T * n for a sampler that re-reads the sequence every step.

Static shapes. Every scan iteration is one *pass* over a block of S slots, the first Q of which
are query positions (the head runs on those only); padding slots write past the cache end
(dropped) and see nothing. Cache length K = n + S (committed rank-slots 0..n-1, scratch
n..n+S-1). S is one number per run (`schedules.choose_block`); a step with more than S slots
(catch-up + queries) is split over consecutive passes, catch-up first: a later pass of the same
step carries queries q0.. of that step, which see the same context (rank-slots < m) and only
query 0 of a step commits. The per-pass bookkeeping (frontier m, q0, k, catch-up range) is
planned on the host (`schedules.plan_steps`) and fed as scan inputs; the KV cache (a per-layer
pytree) and the token array are the scan carry. A prompt's rank-slots 0..P-1 are prefilled in
one pass before the scan (the same layout with only catch-up slots).

`sample_uncached` (method ``uncached``) runs the same plan with a full, uncached forward over all
n rank-slots plus the query slots at every step (explicit mask, no cache): the test oracle for
the logits and an AO-GPT with an encoder's cost profile. Both draw identical tokens. The real
encoder-only MDM baseline (bidirectional, [MASK] tokens) samples in `sampling.encoder`.

Shape suffixes of local arrays (nanodo style, ``mask_BxSxK`` = [B, S, K]): B rows, N sequence
length n, S slots per pass (block), Q query slots, K cache length n + S, P passes, F = n + Q
slots of the full (uncached) layout, V vocabulary, D model width.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT, NO_TARGET, prompt_block
from aogpt_jax.sampling import tokens as tokens_lib
from aogpt_jax.sampling.state import Draw, Passes, PassShape


def parallel_generation_mask(known: jax.Array, n: int, queries: int,
                             block: jax.Array | None = None) -> jax.Array:
  """Reference for the paper's Figure 10: the mask of one step of parallel generation over the
  full (uncached) layout of n rank-slots followed by ``queries`` query slots. Rank-slot r sees
  rank-slots 0..r (causal); query j (a copy of rank-slot ``known``, with its own target) sees
  the committed rank-slots 0..known-1 and itself, never another query. ``known`` int32 [B];
  returns bool [B, n + queries, n + queries] (``mask[b, a, c]``: slot a may see slot c).
  ``block`` [B]: a bidirectional prompt's rank-slots 0..block-1 also see each other
  (`aogpt.prompt_block`; ``known`` >= block, so every query sees the whole block).

  The cached sampler's mask (`pass_layout` + `block_inputs`) is this mask re-indexed into the
  cache (tests/test_sampler_figure10.py): query 0 of a step IS rank-slot ``known`` and is
  written at cache index ``known``; queries j >= 1 live in scratch indices n + j."""
  a_F = jnp.arange(n + queries, dtype=jnp.int32)
  row_1xFx1, col_1x1xF = a_F[None, :, None], a_F[None, None, :]
  tied_BxF = orders_lib.block_ranks(jnp.broadcast_to(a_F, (known.shape[0], n + queries)), block)
  rank_rows_BxFxF = (row_1xFx1 < n) & orders_lib.mask_from_ranks(tied_BxF, tied_BxF)
  query_rows_BxFxF = (row_1xFx1 >= n) & ((col_1x1xF < known[:, None, None])
                                         | (col_1x1xF == row_1xFx1))
  return rank_rows_BxFxF | query_rows_BxFxF


@struct.dataclass
class PassLayout:
  """The token-independent part of one pass's block, all int32 [B, S] (bool for ``rank0``)."""
  prev: jax.Array     # where each slot's token is read from ...
  rank0: jax.Array    # ... or START (rank-slot 0)
  pos: jax.Array      # position-embedding rows
  tgt: jax.Array      # target positions (NO_TARGET for padding)
  write: jax.Array    # cache index written (padding: K, dropped)
  lim: jax.Array      # the slot sees cache indices < lim and its own ``write``
  commit: jax.Array   # where a query's sampled token goes (n: nowhere)


def pass_layout(order, known, q0, k, cstart, ccount, *, block: int,
                cache_len: int) -> PassLayout:
  """The layout of one pass for a step with ``known`` committed tokens (the frontier,
  `StepPlan.m`): queries q0..q0+k-1 of the step at block positions 0..k-1, catch-up rank-slots
  cstart..cstart+ccount-1 after them, padding after that."""
  n = order.shape[1]
  qrank_BxS = orders_lib.query_ranks(known, q0, block)    # rank each query predicts
  j_1xS = jnp.arange(block, dtype=jnp.int32)[None, :]
  known_Bx1, q0_Bx1, k_Bx1, cstart_Bx1, ccount_Bx1 = (
      a[:, None].astype(jnp.int32) for a in (known, q0, k, cstart, ccount))
  is_q_BxS = j_1xS < k_Bx1
  is_c_BxS = ~is_q_BxS & (j_1xS < k_Bx1 + ccount_Bx1)
  valid_BxS = is_q_BxS | is_c_BxS
  rank_BxS = jnp.where(is_q_BxS, known_Bx1,
                       jnp.where(is_c_BxS, cstart_Bx1 + j_1xS - k_Bx1, 0))
  tgt_BxS = orders_lib.slot_target(order, jnp.where(is_q_BxS, qrank_BxS, rank_BxS))
  prev_BxS, pos_BxS = orders_lib.rank_slot_source(order, rank_BxS)
  # only query 0 of a step commits
  write_BxS = jnp.where(is_q_BxS & (q0_Bx1 + j_1xS > 0), n + j_1xS, rank_BxS)
  i32 = lambda x: x.astype(jnp.int32)
  return PassLayout(prev=prev_BxS, rank0=rank_BxS == 0, pos=pos_BxS,
                    tgt=i32(jnp.where(valid_BxS, tgt_BxS, NO_TARGET)),
                    write=i32(jnp.where(valid_BxS, write_BxS, cache_len)),
                    lim=i32(jnp.where(valid_BxS, rank_BxS, 0)),
                    commit=i32(jnp.where(is_q_BxS, tgt_BxS, n)))


def block_inputs(lay: PassLayout, tokens: jax.Array, cache_len: int):
  """Slot tokens [B, S] (read from the current tokens) and the mask [B, S, K] of a pass."""
  tok_BxS = orders_lib.rank_slot_tokens(tokens, lay.prev, lay.rank0)
  kk_1x1xK = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  mask_BxSxK = (kk_1x1xK < lay.lim[:, :, None]) | (kk_1x1xK == lay.write[:, :, None])
  return tok_BxS, mask_BxSxK


def sample_cached(model: AOGPT, order, tokens0, prompt_len, tok_keys, passes: Passes,
                  shape: PassShape, draw: Draw):
  """Traced body of the KV-cached sampler over ``passes`` (int32 [P, B] each).
  Returns (tokens [B, n], per-pass query logits [P, B, Q, V] if ``draw.debug`` else None, and
  if ``draw.logp`` the drawn tokens' log-probabilities float32 [B, n, 2] in original order
  (`tokens.drawn_logp`; 0 at the prompt) else None).

  Everything that does not depend on sampled tokens (slot positions, targets, cache indices,
  mask limits, the keys of every query) is computed for all passes before the scan; a scan
  iteration only gathers the slot tokens, runs the model and draws the queries' tokens."""
  batch, n = order.shape
  queries = shape.queries
  cache_len = n + shape.block
  cache = model.init_cache(batch, cache_len)
  if shape.prefill:
    zeros_B = jnp.zeros_like(prompt_len)
    lay = pass_layout(order, prompt_len, zeros_B, zeros_B, zeros_B, prompt_len,
                      block=shape.prefill, cache_len=cache_len)
    block_B = prompt_block(model.cfg, prompt_len)
    if block_B is not None:   # a bidirectional prompt: its rank-slots see each other
      lay = lay.replace(lim=jnp.where(lay.write < cache_len,
                                      orders_lib.block_limit(lay.lim, block_B), 0))
    tok_BxS, mask_BxSxK = block_inputs(lay, tokens0, cache_len)
    _, cache = model.hidden_slots(tok_BxS, lay.pos, lay.tgt, mask=mask_BxSxK, cache=cache,
                                  write_index=lay.write)
  layouts = jax.vmap(functools.partial(pass_layout, order, block=shape.block,
                                       cache_len=cache_len))(
      passes.m, passes.q0, passes.k, passes.cstart, passes.ccount)     # fields [P, B, S]
  keys_PxBxQ = jax.vmap(lambda c: tokens_lib.token_keys(tok_keys, c))(
      layouts.commit[:, :, :queries])

  def step(carry, x):
    cache, tokens_BxN, rec_BxNx2 = carry
    lay, qkeys_BxQ = x
    tok_BxS, mask_BxSxK = block_inputs(lay, tokens_BxN, cache_len)
    hidden_BxSxD, cache = model.hidden_slots(tok_BxS, lay.pos, lay.tgt, mask=mask_BxSxK,
                                             cache=cache, write_index=lay.write)
    logits_BxQxV = model.head(hidden_BxSxD[:, :queries], lay.tgt[:, :queries])
    tokens_BxN, out, rec_BxNx2 = tokens_lib.draw_commit_record(
        tokens_BxN, rec_BxNx2, logits_BxQxV, qkeys_BxQ, lay.commit[:, :queries],
        **draw.kwargs())
    return (cache, tokens_BxN, rec_BxNx2), out

  carry = (cache, tokens0, tokens_lib.new_record(tokens0, draw.logp))
  (_, tokens_BxN, rec_BxNx2), logits_PxBxQxV = jax.lax.scan(step, carry, (layouts, keys_PxBxQ))
  return tokens_BxN, logits_PxBxQxV, rec_BxNx2


def full_step_slots(order, tokens, known, q0, k, *, queries: int, block=None):
  """Slots and mask of a full, uncached forward for one pass: rank-slots 0..n-1 (causal) then
  ``queries`` query slots (copies of rank-slot ``known``, targets order[known+q0+j]), under
  `parallel_generation_mask`. Returns tokens, positions, targets [B, n+Q], mask [B, n+Q, n+Q]
  and the queries' target positions and validity [B, Q]. ``block``: `aogpt.prompt_block`."""
  batch, n = order.shape
  rank_BxN = orders_lib.all_ranks(order)
  tok_BxN, pos_BxN = orders_lib.rank_slots(order, tokens, rank_BxN)
  is_q_BxQ = jnp.arange(queries, dtype=jnp.int32)[None, :] < k[:, None]
  qtok_BxQ, qpos_row_BxQ = orders_lib.rank_slots(
      order, tokens, jnp.broadcast_to(known[:, None].astype(jnp.int32), (batch, queries)))
  qtgt_BxQ = orders_lib.slot_target(order, orders_lib.query_ranks(known, q0, queries))
  slot_tok_BxF = jnp.concatenate([tok_BxN, qtok_BxQ], axis=1)
  slot_pos_BxF = jnp.concatenate([pos_BxN, qpos_row_BxQ], axis=1)
  slot_tgt_BxF = jnp.concatenate([order, jnp.where(is_q_BxQ, qtgt_BxQ, NO_TARGET)], axis=1)
  mask_BxFxF = parallel_generation_mask(known.astype(jnp.int32), n, queries, block)
  return (slot_tok_BxF, slot_pos_BxF, slot_tgt_BxF.astype(jnp.int32), mask_BxFxF, qtgt_BxQ,
          is_q_BxQ)


def full_step_logits(model: AOGPT, order, tokens, known, q0, k, *, queries: int,
                     prompt_len=None):
  """One pass from a full, uncached forward with the explicit mask: query logits [B, Q, V],
  the queries' target positions and validity [B, Q]."""
  n = order.shape[1]
  tok_BxF, pos_BxF, tgt_BxF, mask_BxFxF, qpos_BxQ, is_q_BxQ = full_step_slots(
      order, tokens, known, q0, k, queries=queries,
      block=prompt_block(model.cfg, prompt_len))
  hidden_BxFxD, _ = model.hidden_slots(tok_BxF, pos_BxF, tgt_BxF, mask=mask_BxFxF)
  return model.head(hidden_BxFxD[:, n:], tgt_BxF[:, n:]), qpos_BxQ, is_q_BxQ


def sample_uncached(model: AOGPT, order, tokens0, prompt_len, tok_keys, passes: Passes,
                    queries: int, draw: Draw):
  """Same plan and keys (and returns) as `sample_cached`, but every step re-reads the whole
  sequence (the prompt is in ``tokens0`` at ranks < m; no block, no prefill)."""

  def step(carry, p):
    tokens_BxN, rec_BxNx2 = carry
    logits_BxQxV, qpos_BxQ, is_q_BxQ = full_step_logits(model, order, tokens_BxN, p.m, p.q0,
                                                        p.k, queries=queries,
                                                        prompt_len=prompt_len)
    tokens_BxN, out, rec_BxNx2 = tokens_lib.draw_commit_record(
        tokens_BxN, rec_BxNx2, logits_BxQxV, tokens_lib.token_keys(tok_keys, qpos_BxQ),
        jnp.where(is_q_BxQ, qpos_BxQ, order.shape[1]), **draw.kwargs())
    return (tokens_BxN, rec_BxNx2), out

  carry = (tokens0, tokens_lib.new_record(tokens0, draw.logp))
  (tokens_BxN, rec_BxNx2), logits_PxBxQxV = jax.lax.scan(step, carry, passes)
  return tokens_BxN, logits_PxBxQxV, rec_BxNx2
