"""The blanks get a place to think (``model.blank_block=True``): the training objective.

In the published AO-GPT an unwritten cell has no slot: the query that predicts position p is a
copy of the frontier rank-slot with target p, and it sees the written tokens only. In an encoder
MDM every masked cell has a hidden state at every layer, so the model can keep "what may still go
here" for each blank and reason across blanks. ``model.blank_block`` gives AO-GPT the same: at a
cut after ``k`` written ranks (rank-slots 0..k-1, causal in the order, a bidirectional prompt as
one block), EVERY unwritten position has a query slot (a copy of rank-slot ``k``: START or the
last written token, with the blank's position as its adaLN target), and the queries see the
written prefix and each other (an MDM-style block over the blanks); the written rank-slots never
see a query, so their keys and values, and the KV cache, are the published model's.

Training cuts each row's order at a uniform rank ``k`` (after the prompt: k in [m, n - 1], m the
prompt's length) and scores every query: ``(n - m) / (n - k)`` times the sum of the queries'
NLLs is an unbiased estimate of the row's NLL under one-position-per-step decoding in a uniform
order (given the prefix, the next position is uniform over the blanks), the same estimate an
MDM's ELBO makes. For orders that are not exchangeable (left to right), ``every_blank=False``
scores only the query of rank ``k`` (times n - m): unbiased for any order, noisier.

Decoding is the adaptive sampler (`sampling.adaptive`, every blank a candidate): the written
prefix is cached exactly as without the option; each step's queries attend to each other, and a
committed position's rank-slot is computed as a causal catch-up slot of the next pass. A rollout's
exact likelihood takes one pass per step (`posttrain.likelihood.order_scan`), not AO-GPT's single
pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model import packing
from aogpt_jax.model.aogpt import AOGPT, NO_TARGET, START, nll_from_logits, prompt_block


def draw_cuts(key: jax.Array, prompt_len: jax.Array, n: int) -> jax.Array:
  """int32 [B]: a uniform cut ``k`` in [prompt_len, n - 1] per row (how many ranks are written;
  at least one blank is left)."""
  m = prompt_len.astype(jnp.int32)
  u = jax.random.uniform(key, m.shape)
  return jnp.minimum(m + jnp.floor(u * (n - m)).astype(jnp.int32), n - 1)


def blank_slots(tokens: jax.Array, order: jax.Array, cut: jax.Array,
                block: jax.Array | None = None, causal: bool = False):
  """The slots of one cut, in order space (slot r is about position ``order[r]``): for r < cut
  a *written* slot, the token ``tokens[order[r]]`` at its position with no target, causal in
  the order (``block`` [B]: a bidirectional prompt's slots see each other, `aogpt.prompt_block`);
  for r >= cut a *blank* slot, the START vector at position ``order[r]`` with that position as
  its target, seeing every written slot and every other blank (``causal``: the blanks at
  positions up to its own, ``model.blank_attention="causal"``). Returns tokens, position rows,
  targets [B, n] and the mask [B, n, n] (`AOGPT.hidden_slots`)."""
  rank_BxN = orders_lib.all_ranks(order)
  blank_BxN = rank_BxN >= cut[:, None]
  wtok_BxN, pos_BxN, wtgt_BxN = written_slots(order, tokens, rank_BxN)
  qtok_BxN, _, qtgt_BxN = blank_queries(order)         # the same position rows
  tied_BxN = orders_lib.block_ranks(rank_BxN, block)
  mask_BxNxN = orders_lib.mask_from_ranks(tied_BxN, tied_BxN)
  if causal:      # a blank: every written slot and the blanks at positions up to its own
    by_pos = ~blank_BxN[:, None, :] | orders_lib.mask_from_ranks(order, order)
    mask_BxNxN = jnp.where(blank_BxN[:, :, None], by_pos, mask_BxNxN)
  else:           # a blank: every slot
    mask_BxNxN = blank_BxN[:, :, None] | mask_BxNxN
  return (jnp.where(blank_BxN, qtok_BxN, wtok_BxN), pos_BxN,
          jnp.where(blank_BxN, qtgt_BxN, wtgt_BxN), mask_BxNxN)


def blank_loss(m: AOGPT, tokens: jax.Array, order: jax.Array, cut_key: jax.Array, *,
               prompt: jax.Array | None = None, dropout_key: jax.Array | None = None,
               denominator: jax.Array | None = None,
               every_blank: bool = True) -> tuple[jax.Array, jax.Array]:
  """The objective of ``model.blank_block`` (module docstring), shaped as `aogpt.loss`:
  (mean NLL estimate per scored token, per-token terms [B, n] in ORDER space). The terms of a row
  add up to the estimate of its NLL (0 at the prefix; each query's NLL times ``(n - m) / (n -
  k)``, or only rank k's times ``n - m`` when not ``every_blank``), so `aogpt.loss_metrics` and
  the held-out sums read them as `aogpt.loss`'s. ``prompt`` bool [B, n] (original order; ``order``
  puts it first, `orders.prompt_first`); ``denominator`` as `aogpt.loss`. ``cut_key``: the cuts
  (`draw_cuts`)."""
  b, n = tokens.shape
  plen_B = (jnp.zeros((b,), jnp.int32) if prompt is None
            else jnp.sum(prompt, axis=-1, dtype=jnp.int32))
  cut_B = draw_cuts(cut_key, plen_B, n)
  block = None if prompt is None else prompt_block(m.cfg, plen_B)
  tok, pos, tgt, mask = blank_slots(tokens, order, cut_B, block,
                                    causal=m.cfg.blank_attention == "causal")
  h = packing.hidden(m, m.cfg.pack, tok, pos, tgt, mask, dropout_key=dropout_key)
  nll_BxN = nll_from_logits(m.head(h, tgt), orders_lib.permute(tokens, order))
  rank_BxN = orders_lib.all_ranks(order)
  answer_B = (n - plen_B).astype(jnp.float32)
  if every_blank:
    w_BxN = jnp.where(rank_BxN >= cut_B[:, None], (answer_B / (n - cut_B))[:, None], 0.0)
  else:
    w_BxN = jnp.where(rank_BxN == cut_B[:, None], answer_B[:, None], 0.0)
  per_token = nll_BxN * w_BxN
  count = jnp.maximum(jnp.sum(answer_B), 1.0) if denominator is None else denominator
  return jnp.sum(per_token) / count, per_token


# ----------------------------------------------------------------------------- decoding layouts


def written_slots(order: jax.Array, tokens: jax.Array, rank: jax.Array):
  """(tokens, position rows, targets) of the written slots of ranks ``rank`` [B, S]: the token
  at ``order[rank]`` at its position, no target (what the KV cache holds at index ``rank``)."""
  pos = orders_lib.slot_target(order, rank)
  tok = jnp.take_along_axis(tokens, pos, axis=-1).astype(jnp.int32)
  return tok, pos + 1, jnp.full(rank.shape, NO_TARGET, jnp.int32)


def written_cache_slots(order: jax.Array, tokens: jax.Array, rank: jax.Array, ok: jax.Array,
                        limit: jax.Array, cache_len: int):
  """Written slots of ranks ``rank`` [B, S] for a KV cache of ``cache_len`` indices (index =
  rank): (tokens, position rows, targets, write index, mask [B, S, cache_len]); each sees the
  indices below its ``limit`` (`orders.block_limit`) and itself; a slot not ``ok`` is written
  nowhere (index ``cache_len``: dropped) and sees nothing."""
  tok, pos, tgt = written_slots(order, tokens, rank)
  kk = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  write = jnp.where(ok, rank, cache_len)
  lim = jnp.where(ok, limit, 0)[:, :, None]
  return tok, pos, tgt, write, (kk < lim) | (kk == write[..., None])


def blank_queries(targets: jax.Array):
  """(tokens, position rows, targets) of blank query slots for positions ``targets`` [B, G]
  (NO_TARGET: a padding query): the START vector at the position, conditioned on it."""
  t = targets.astype(jnp.int32)
  return (jnp.full(t.shape, START, jnp.int32), jnp.where(t >= 0, t + 1, 0),
          jnp.where(t >= 0, t, NO_TARGET))


def query_layout(tokens: jax.Array, order: jax.Array, m: jax.Array, targets: jax.Array,
                 block: jax.Array | None = None, causal: bool = False):
  """The uncached layout of blank queries: the n written slots in ``order`` (causal, ``block``
  a bidirectional prompt), then G blank queries for positions ``targets`` [B, G] (NO_TARGET:
  padding); query g sees the written slots 0..``m[b, g]``-1 and every valid query with the same
  ``m`` (one step's block over the blanks; a pass may hold several steps). Returns tokens,
  position rows, targets [B, n + G] and the mask [B, n + G, n + G]. The adaptive sampler's
  reference (one step, every blank a query) uses it; the cached sampler and the rollout
  likelihood (`posttrain.likelihood`, the written slots' keys and values computed once) are this
  mask re-indexed into a cache (tests/test_blank_block.py checks both against it)."""
  b, n = order.shape
  g = targets.shape[1]
  wtok, wpos, wtgt = written_slots(order, tokens, orders_lib.all_ranks(order))
  qtok, qpos, qtgt = blank_queries(targets)
  mask = jnp.concatenate([written_mask(b, n, g, block), query_mask(m, qtgt, n, causal)],
                         axis=1)
  return (jnp.concatenate([wtok, qtok], 1), jnp.concatenate([wpos, qpos], 1),
          jnp.concatenate([wtgt, qtgt], 1), mask)


def written_mask(b: int, n: int, g: int, block: jax.Array | None = None) -> jax.Array:
  """bool [B, n, n + G]: the n written slots' rows (in rank order) over n written slots and G
  query slots: causal, ``block`` [B] leading ranks a bidirectional prompt; no blank."""
  tied_BxN = orders_lib.block_ranks(jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n)),
                                    block)
  return jnp.pad(orders_lib.mask_from_ranks(tied_BxN, tied_BxN), ((0, 0), (0, 0), (0, g)))


def query_mask(m: jax.Array, targets: jax.Array, n: int, causal: bool = False) -> jax.Array:
  """bool [B, G, n + G]: the rows of G blank queries (targets [B, G], NO_TARGET: padding) over
  n written slots and the queries: query g sees the written slots 0..``m[b, g]``-1, itself and
  every valid query with the same ``m`` (its step's blanks); ``causal``
  (``model.blank_attention="causal"``): only those at positions up to its own."""
  g = targets.shape[1]
  valid_BxG = targets != NO_TARGET
  m_BxG = m.astype(jnp.int32)
  peers_BxGxG = (valid_BxG[:, :, None] & valid_BxG[:, None, :]
                 & (m_BxG[:, :, None] == m_BxG[:, None, :]))
  if causal:
    peers_BxGxG &= orders_lib.mask_from_ranks(targets, targets)
  peers_BxGxG |= jnp.eye(g, dtype=bool)[None]
  return jnp.concatenate([jnp.arange(n)[None, None, :] < m_BxG[:, :, None], peers_BxGxG],
                         axis=2)
