"""Plain autoregressive (left-to-right) decoding of an AO-GPT with a KV cache, for comparison.

sigma = identity: rank-slot r holds START (r = 0) or x_{r-1} at position row r, targets
position r, and predicts x_r. The common part of the prefix prompts is prefilled in one causal
pass; then one `jax.lax.scan` step per position computes one slot, writes it at cache index r
and draws x_r (rows whose prefix is longer keep their given token). Tokens are drawn with the
same per-(sample, position) keys as the diffusion sampler, so L2R diffusion sampling with
T = n produces exactly the same tokens.

Shape suffixes of local arrays (``mask_BxSxN`` = [B, S, N]): B rows, N sequence length n (also
the cache length), S slots of one forward (the prefill length, then 1), V vocabulary, D model
width, T decoding steps n - prefill.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT, prompt_block
from aogpt_jax.sampling import tokens as tokens_lib
from aogpt_jax.sampling.state import Draw


def _slot(tokens: jax.Array, r: jax.Array):
  """Token, position row and target of rank-slot(s) r [B, S] under sigma = identity."""
  identity_BxN = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  tok_BxS, pos_BxS = orders_lib.rank_slots(identity_BxN, tokens, r)
  return tok_BxS, pos_BxS, orders_lib.slot_target(identity_BxN, r)


def sample_ar(model: AOGPT, tokens0, prefix_len, tok_keys, prefill: int, draw: Draw,
              prefill_width: int = 0):
  """Traced body: tokens0 int32 [B, n] (prompt tokens in place), prefix_len int32 [B];
  ``prefill`` = min prefix length (static): the steps start there. With a bidirectional prompt
  (`aogpt.prompt_block`) the prefill pass covers ``prefill_width`` (the max prefix length)
  rank-slots instead, each row's own block seeing itself both ways, and a later step over a
  rank-slot inside the row's block keeps the prefilled keys and values. Returns (tokens,
  per-step logits [n-P, B, V] if ``draw.debug``, the drawn tokens' log-probabilities [B, n, 2]
  if ``draw.logp``: as `diffusion.sample_cached`)."""
  batch, n = tokens0.shape
  cache = model.init_cache(batch, n)
  kk_N = jnp.arange(n, dtype=jnp.int32)
  block_B = prompt_block(model.cfg, prefix_len)
  width = prefill if block_B is None else max(prefill_width, prefill)
  if width:
    r_BxS = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
    tok_BxS, pos_BxS, tgt_BxS = _slot(tokens0, r_BxS)
    write_BxS = r_BxS
    if block_B is not None:   # only each row's own prompt block, seeing itself both ways
      write_BxS = jnp.where(r_BxS < block_B[:, None], r_BxS, n)
    mask_BxSxN = ((kk_N[None, None, :] < orders_lib.block_limit(r_BxS, block_B)[:, :, None])
                  | (kk_N[None, None, :] == write_BxS[:, :, None]))
    _, cache = model.hidden_slots(tok_BxS, pos_BxS, tgt_BxS, mask=mask_BxSxN, cache=cache,
                                  write_index=write_BxS)

  def step(carry, x):
    cache, tokens_BxN, rec_BxNx2 = carry
    r, keys_B = x
    r_Bx1 = jnp.full((batch, 1), r, jnp.int32)
    tok_Bx1, pos_Bx1, tgt_Bx1 = _slot(tokens_BxN, r_Bx1)
    mask_Bx1xN = kk_N[None, None, :] <= r_Bx1[:, :, None]
    write_Bx1 = r_Bx1
    if block_B is not None:   # the prompt block's slots were prefilled: keep them
      write_Bx1 = jnp.where(r_Bx1 < block_B[:, None], n, r_Bx1)
    hidden_Bx1xD, cache = model.hidden_slots(tok_Bx1, pos_Bx1, tgt_Bx1, mask=mask_Bx1xN,
                                             cache=cache, write_index=write_Bx1)
    logits_Bx1xV = model.head(hidden_Bx1xD, tgt_Bx1)
    commit_Bx1 = jnp.where(r < prefix_len, n, r)[:, None]   # prompt positions keep their token
    tokens_BxN, out, rec_BxNx2 = tokens_lib.draw_commit_record(
        tokens_BxN, rec_BxNx2, logits_Bx1xV, keys_B[:, None], commit_Bx1,
        **draw.kwargs())
    return (cache, tokens_BxN, rec_BxNx2), (out[:, 0] if draw.debug else None)

  steps_T = jnp.arange(prefill, n, dtype=jnp.int32)
  keys_TxB = tokens_lib.token_keys(tok_keys,
                                   jnp.broadcast_to(steps_T, (batch, n - prefill))).T
  carry = (cache, tokens0, tokens_lib.new_record(tokens0, draw.logp))
  (_, tokens_BxN, rec_BxNx2), logits_TxBxV = jax.lax.scan(step, carry, (steps_T, keys_TxB))
  return tokens_BxN, logits_TxBxV, rec_BxNx2
