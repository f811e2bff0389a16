"""Packing (``model.pack = K``): the training losses run K rows of a batch as one attention row.

A task's rows are short (a 9x9 Sudoku is 81 tokens) and all of one length. With packing, rows
``i K .. i K + K - 1`` of a batch ``[B, n]`` become one row of ``K n`` slots whose attention mask
is block-diagonal: segment ``j`` (the slots ``j n .. j n + n - 1``) sees only its own slots, by
that row's own mask (causal in its order, its prompt block, its blank block). Each slot keeps its
own position row and target, and the orders, prompts and cuts are drawn per row before packing,
so every loss and gradient equals the unpacked one to float32 rounding
(tests/test_packing.py). What changes is the layout the kernels see: fewer, longer rows.

Packing is for training only (`aogpt.loss`, `blanks.blank_loss`); the samplers, likelihoods and
evaluators run rows one by one. The batch rows per microbatch and per device must be a
multiple of K (`config.validate`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aogpt_jax.model import orders as orders_lib


def check_rows(rows: int, k: int) -> None:
  """One line when ``rows`` rows do not pack ``k`` to a row."""
  if rows % k:
    raise ValueError(f"model.pack={k}: a batch of {rows} rows does not pack {k} rows to an "
                     f"attention row (rows per microbatch and per device must be a multiple)")


def block_diagonal(mask: jax.Array, k: int) -> jax.Array:
  """bool [B / k, k n, k n] from the per-row masks ``mask`` [B, n, n]: row ``i`` of the result
  holds rows ``i k .. i k + k - 1`` on its diagonal blocks, False everywhere else."""
  b, n, _ = mask.shape
  check_rows(b, k)
  m = mask.reshape(b // k, k, n, 1, n)
  same = jnp.eye(k, dtype=bool)[None, :, None, :, None]
  return (m & same).reshape(b // k, k * n, k * n)


def pack(k: int, *slots: jax.Array) -> tuple[jax.Array, ...]:
  """Per-row slot arrays [B, n] as packed rows [B / k, k n] (tokens, position rows, targets)."""
  out = []
  for x in slots:
    check_rows(x.shape[0], k)
    out.append(x.reshape(x.shape[0] // k, k * x.shape[1], *x.shape[2:]))
  return tuple(out)


def unpack(h: jax.Array, k: int) -> jax.Array:
  """Packed outputs [B / k, k n, ...] back to one row per segment [B, n, ...]."""
  return h.reshape(h.shape[0] * k, h.shape[1] // k, *h.shape[2:])


def hidden(m, k: int, tok, pos, tgt, mask, **kw) -> jax.Array:
  """``m.hidden_slots`` of per-row slots [B, n] (``mask`` [B, n, n], None: causal), run K rows
  to an attention row; returns the hidden states of each row [B, n, d]."""
  b, n = tok.shape
  if k == 1:
    return m.hidden_slots(tok, pos, tgt, mask=mask, **kw)[0]
  is_causal = mask is None
  if is_causal:    # the chain's own mask: each slot sees the slots up to its own
    rank = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
    mask = orders_lib.mask_from_ranks(rank, rank)
  mask = block_diagonal(mask, k)
  h, _ = m.hidden_slots(*pack(k, tok, pos, tgt), mask=mask, mask_causal=is_causal, **kw)
  return unpack(h, k)
