"""Plain autoregressive (left-to-right) decoding of an AO-GPT with a KV cache, for comparison.

sigma = identity: rank-slot r holds START (r = 0) or x_{r-1} at position row r, targets
position r, and predicts x_r. The common part of the prefix prompts is prefilled in one causal
pass; then one `jax.lax.scan` step per position computes one slot, writes it at cache index r
and draws x_r (rows whose prefix is longer keep their given token). Tokens are drawn with the
same per-(sample, position) keys as the diffusion sampler, so L2R diffusion sampling with
T = n produces exactly the same tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aogpt_jax import orders as orders_lib
from aogpt_jax.model import AOGPT
from aogpt_jax.sampling import tokens as tokens_lib
from aogpt_jax.sampling.state import Draw


def _slot(tokens: jax.Array, r: jax.Array):
  """Token, position row and target of rank-slot(s) r [B, S] under sigma = identity."""
  identity = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  tok, pos = orders_lib.rank_slots(identity, tokens, r)
  return tok, pos, orders_lib.slot_target(identity, r)


def sample_ar(model: AOGPT, tokens0, prefix_len, tok_keys, prefill: int, draw: Draw):
  """Traced body: tokens0 int32 [B, n] (prompt tokens in place), prefix_len int32 [B];
  ``prefill`` = min prefix length (static). Returns (tokens, per-step logits [n-P, B, V])."""
  batch, n = tokens0.shape
  cache = model.init_cache(batch, n)
  kk = jnp.arange(n, dtype=jnp.int32)
  if prefill:
    r = jnp.broadcast_to(jnp.arange(prefill, dtype=jnp.int32), (batch, prefill))
    tok, pos, tgt = _slot(tokens0, r)
    mask = kk[None, None, :] <= r[:, :, None]
    _, cache = model.hidden_slots(tok, pos, tgt, mask=mask, cache=cache, write_index=r)

  def step(carry, x):
    cache, tokens = carry
    r, keys = x
    rr = jnp.full((batch, 1), r, jnp.int32)
    tok, pos, tgt = _slot(tokens, rr)
    mask = kk[None, None, :] <= rr[:, :, None]
    hidden, cache = model.hidden_slots(tok, pos, tgt, mask=mask, cache=cache, write_index=rr)
    logits = model.head(hidden, tgt)                          # [B, 1, V]
    commit = jnp.where(r < prefix_len, n, r)[:, None]         # prompt positions keep their token
    tokens, out = tokens_lib.draw_and_commit(tokens, logits, keys[:, None], commit,
                                             **draw.kwargs())
    return (cache, tokens), (out[:, 0] if draw.debug else None)

  steps = jnp.arange(prefill, n, dtype=jnp.int32)
  keys = tokens_lib.token_keys(tok_keys, jnp.broadcast_to(steps, (batch, n - prefill))).T
  (_, tokens), logits = jax.lax.scan(step, (cache, tokens0), (steps, keys))
  return tokens, logits
