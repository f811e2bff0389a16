"""The slot-layout rules of orders.py (docs/method.md, "Slot layout"), each pinned against the
table written out in plain Python, one slot at a time: rank-slot r holds START (r = 0) or
x_{order[r-1]} with position row order[r-1] + 1, and the slot predicting rank r is conditioned on
order[r]. The model's two layouts (`gather_slots`, `mask_slots`) and the parallel-generation
query targets are checked against the same table."""

import numpy as np
import jax.numpy as jnp

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import orders

B, N = 3, 7
RNG = np.random.default_rng(0)
ORDER = np.stack([RNG.permutation(N) for _ in range(B)]).astype(np.int32)
TOKENS = RNG.integers(0, 100, (B, N)).astype(np.int32)


def table(order, tokens, r):
  """(token, position row, target) of rank-slot r of one sequence, from the table."""
  if r == 0:
    return orders.START, 0, int(order[0])
  return int(tokens[order[r - 1]]), int(order[r - 1]) + 1, int(order[r]) if r < len(order) else None


def test_constants_are_shared_with_the_model():
  assert (model_lib.START, model_lib.NO_TARGET) == (orders.START, orders.NO_TARGET) == (-1, -1)


def test_rank_slot_rules_match_the_table_at_any_ranks():
  rank = RNG.integers(0, N, (B, 11)).astype(np.int32)           # repeats, any order
  rank[:, 0] = 0
  src, pos = map(np.asarray, orders.rank_slot_source(jnp.asarray(ORDER), jnp.asarray(rank)))
  tok, pos2 = map(np.asarray, orders.rank_slots(jnp.asarray(ORDER), jnp.asarray(TOKENS),
                                                jnp.asarray(rank)))
  tgt = np.asarray(orders.slot_target(jnp.asarray(ORDER), jnp.asarray(rank)))
  for a in (src, pos, tok, pos2, tgt):
    assert a.dtype == np.int32 and a.shape == rank.shape
  for b in range(B):
    for s, r in enumerate(rank[b]):
      want_tok, want_pos, want_tgt = table(ORDER[b], TOKENS[b], int(r))
      assert (tok[b, s], pos[b, s], pos2[b, s], tgt[b, s]) == (want_tok, want_pos, want_pos,
                                                                want_tgt), (b, s, r)
      if r > 0:
        assert src[b, s] == ORDER[b, r - 1]
  is_start = jnp.asarray(rank == 0)
  np.testing.assert_array_equal(
      np.asarray(orders.rank_slot_tokens(jnp.asarray(TOKENS), jnp.asarray(src), is_start)), tok)


def test_rules_take_leading_dims_and_clip_out_of_range_ranks():
  """Ensembles evaluate the rules on [G, n] orderings; samplers may ask for rank n (no slot)."""
  order = jnp.asarray(ORDER[:2])
  rank = jnp.asarray([[N, N + 3, 0], [-2, 1, N - 1]], jnp.int32)
  src, pos = map(np.asarray, orders.rank_slot_source(order, rank))
  np.testing.assert_array_equal(pos[0, :2], ORDER[0, N - 1] + 1)     # clipped to order[n-1]
  assert pos[0, 2] == 0 and pos[1, 0] == ORDER[1, 0] + 1             # rank < 0 clips to 0
  tgt = np.asarray(orders.slot_target(order, rank))
  np.testing.assert_array_equal(tgt, [[ORDER[0, N - 1]] * 2 + [ORDER[0, 0]],
                                      [ORDER[1, 0], ORDER[1, 1], ORDER[1, N - 1]]])


def test_query_ranks_is_the_figure10_query_target_rule():
  known, first = jnp.asarray([0, 2, 5], jnp.int32), jnp.asarray([0, 1, 0], jnp.int32)
  qr = np.asarray(orders.query_ranks(known, first, 3))
  assert qr.dtype == np.int32
  np.testing.assert_array_equal(qr, [[0, 1, 2], [3, 4, 5], [5, 6, 7]])
  tgt = np.asarray(orders.slot_target(jnp.asarray(ORDER), jnp.asarray(qr)))
  for b in range(B):
    for j in range(3):
      assert tgt[b, j] == ORDER[b, min(int(qr[b, j]), N - 1)]


def test_gather_slots_is_the_table_in_order_space():
  tok, pos, tgt = map(np.asarray, model_lib.gather_slots(jnp.asarray(TOKENS), jnp.asarray(ORDER)))
  for b in range(B):
    for r in range(N):
      assert (tok[b, r], pos[b, r], tgt[b, r]) == table(ORDER[b], TOKENS[b], r)


def test_mask_slots_is_the_table_in_original_order():
  """Slot 0 is rank-slot 0; the slot of position p is rank-slot rank(p) + 1 (the last one
  predicts nothing); slot a sees slot c iff c's rank-slot <= a's."""
  tok, pos, tgt, mask = map(np.asarray, model_lib.mask_slots(jnp.asarray(TOKENS),
                                                             jnp.asarray(ORDER)))
  for b in range(B):
    rank_of = np.empty(N + 1, int)
    rank_of[0] = 0
    rank_of[1 + ORDER[b]] = np.arange(1, N + 1)
    for p in range(N + 1):
      r = rank_of[p]
      want_tok, want_pos, want_tgt = table(ORDER[b], TOKENS[b], r) if r < N else (
          int(TOKENS[b, ORDER[b, N - 1]]), int(ORDER[b, N - 1]) + 1, None)
      want_tgt = orders.NO_TARGET if want_tgt is None else want_tgt
      assert (tok[b, p], pos[b, p], tgt[b, p]) == (want_tok, want_pos, want_tgt), (b, p)
      for c in range(N + 1):
        assert mask[b, p, c] == (rank_of[c] <= r)
