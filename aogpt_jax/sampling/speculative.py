"""Exact any-order speculative decoding in the KV-cached sampler (issue 13; first version).

Method. AO-GPT's parallel-generation queries (Figure 10, `sampling.diffusion`) give, in ONE pass,
the drafts q_j = p(x_{sigma_{c+j}} | the c known tokens) for j = 0..K-1; the causal slots of the
same model then give the exact ancestral conditionals p_j = p(x_{sigma_{c+j}} | known, d_0..d_{j-1})
in a second pass. Each iteration (two passes) of a row with c known tokens:
  1. draft pass: K queries, copies of rank-slot c with targets sigma_{c..c+K-1} (each sees the
     committed rank-slots < c and itself; query 0 IS rank-slot c and is written at cache index c,
     queries j >= 1 at scratch indices n + j). Draw d_j ~ q_j (after `tokens.filter_logits`).
  2. verify pass: rank-slots c+1..c+K holding d_0..d_{K-1} (causal, written at indices c+1..c+K).
     Slot c+j's output is p_{j+1}.
  3. d_0 is exact (q_0 = p_0: same slot, same target). For j = 1..: accept d_j with probability
     min(1, p_j(d_j) / q_j(d_j)); at the first rejection draw the token from the residual
     norm(max(p_j - q_j, 0)) and stop; if every draft is accepted draw a bonus token from p_K.
Exactness: the standard speculative-sampling argument (Leviathan et al. 2023, Chen et al. 2023)
applied token by token: P(accept d_j = x) + P(reject) * residual(x) = min(p,q)(x) + (p - min(p,q))(x)
= p_j(x), and p_j conditions on exactly the tokens before it in sigma, so the sequence is drawn
from the ancestral (T = n) distribution of the order sigma, with any temperature / top-p rule
applied to both p and q (both come from `filter_logits`, the shared contract).
Cache: after an iteration that accepts a drafts (1 <= a <= K) and adds one drawn token, the row
knows c' = c + a + 1 tokens and rank-slots 0..c+a are valid (slot c+a holds d_{a-1} with its true
target). The slot written for a rejected draft (index c+a+1) is overwritten by the next draft pass
(query 0 is rank-slot c') before anything can see it: a slot sees only indices < its rank and
itself, so rejected drafts leave no trace.
Batching: every row keeps its own frontier c inside one `lax.while_loop` with static shapes
(block K); finished rows idle (their slots write past the cache end). Keys: the uniforms of the
iteration of a row with frontier c for position p come from
``fold_in(fold_in(fold_in(token_key, SPEC_STREAM), c), p)`` split by `fold_in` into draft (0),
accept (1) and residual/bonus (2) keys; c strictly increases, so no key is reused. Samples are
independent of the batch they ran in (all randomness is per row); they differ from the AR
sampler's tokens under the same key (different streams).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aogpt_jax import orders as orders_lib
from aogpt_jax.model import AOGPT, NO_TARGET
from aogpt_jax.sampling import tokens as tokens_lib

SPEC_STREAM = 7


def _gumbel_argmax(logp, keys):
  """Exact categorical draw from float64 log-weights [B, S, V] with keys [B, S]."""
  flat = keys.reshape(-1)
  v = logp.shape[-1]
  u = jax.vmap(lambda k: jax.random.uniform(k, (v,), jnp.float64,
                                            minval=jnp.finfo(jnp.float64).tiny))(flat)
  g = -jnp.log(-jnp.log(u)).reshape(logp.shape)
  return jnp.argmax(logp + g, axis=-1).astype(jnp.int32)


def _keys(tok_keys, c, pos, which):
  """Keys [B, S] for the iteration with frontier c [B] at positions pos [B, S]."""
  def row(k, cc, pp):
    k = jax.random.fold_in(jax.random.fold_in(k, SPEC_STREAM), cc)
    return jax.vmap(lambda q: jax.random.fold_in(jax.random.fold_in(k, q), which))(pp)
  return jax.vmap(row)(tok_keys, c.astype(jnp.int32), pos.astype(jnp.int32))


def sample_speculative(model: AOGPT, order, tokens0, prompt_len, tok_keys, *, draft: int,
                       temperature: float = 1.0, top_p: float = 1.0,
                       top_p_rule: str = "published"):
  """Traced body. order int32 [B, n] (prompt positions first), tokens0 int32 [B, n] (prompt
  tokens in place), prompt_len int32 [B], tok_keys [B]. Returns (tokens [B, n], passes [B]:
  the number of model passes each row needed, prefill excluded)."""
  batch, n = order.shape
  K = int(draft)
  if K < 1:
    raise ValueError(f"draft: must be >= 1, got {draft}")
  cache_len = n + K
  kk = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  j = jnp.arange(K, dtype=jnp.int32)[None, :]
  filt = lambda lg: jax.nn.log_softmax(tokens_lib.filter_logits(
      lg, temperature=temperature, top_p=top_p, top_p_rule=top_p_rule), axis=-1)
  cache = model.init_cache(batch, cache_len)
  # Prefill: rank-slots 0..P-1 of every row (P = its prompt length), one pass over n slots.
  plen = prompt_len.astype(jnp.int32)
  r = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, n))
  ok = r < plen[:, None]
  tok, pos = orders_lib.rank_slots(order, tokens0, r)
  tgt = jnp.where(ok, order, NO_TARGET).astype(jnp.int32)
  write = jnp.where(ok, r, cache_len)
  mask = ((kk < r[:, :, None]) | (kk == write[:, :, None])) & ok[:, :, None]
  _, cache = model.encode(tok, pos, tgt, mask=mask, cache=cache, write_index=write)

  def cond(carry):
    return jnp.any(carry[2] < n)

  def body(carry):
    cache, tokens, c, passes = carry
    live = c < n
    c2 = c[:, None]
    # 1. draft pass: queries = copies of rank-slot c, targets sigma_{c+j}.
    valid = live[:, None] & (c2 + j < n)
    rank = jnp.broadcast_to(c2, (batch, K))
    tok, pos = orders_lib.rank_slots(order, tokens, rank)
    qtgt_pos = orders_lib.slot_target(order, orders_lib.query_ranks(c, jnp.zeros_like(c), K))
    write = jnp.where(valid, jnp.where(j == 0, c2, n + j), cache_len)
    mask = ((kk < rank[:, :, None]) | (kk == write[:, :, None])) & valid[:, :, None]
    hidden, cache = model.encode(tok, pos, jnp.where(valid, qtgt_pos, NO_TARGET).astype(jnp.int32),
                                 mask=mask, cache=cache, write_index=write)
    logq = filt(model.head(hidden, qtgt_pos))
    d = _gumbel_argmax(logq, _keys(tok_keys, c, qtgt_pos, 0))
    rows = jnp.arange(batch)[:, None]
    tokens = tokens.at[rows, jnp.where(valid, qtgt_pos, n)].set(d, mode="drop")
    # 2. verify pass: rank-slots c+1..c+K holding d_0..d_{K-1}.
    vrank = c2 + 1 + j
    vvalid = live[:, None] & (vrank < n)
    tok, pos = orders_lib.rank_slots(order, tokens, vrank)
    vtgt_pos = orders_lib.slot_target(order, vrank)
    write = jnp.where(vvalid, vrank, cache_len)
    mask = ((kk < vrank[:, :, None]) | (kk == write[:, :, None])) & vvalid[:, :, None]
    hidden, cache = model.encode(tok, pos, jnp.where(vvalid, vtgt_pos, NO_TARGET).astype(jnp.int32),
                                 mask=mask, cache=cache, write_index=write)
    logp = filt(model.head(hidden, vtgt_pos))       # logp[:, i] = p_{i+1} (target sigma_{c+i+1})
    # 3. accept / reject. Drafts j = 1..K-1 are checked against p_j = logp[:, j-1].
    p_j = jnp.concatenate([logq[:, :1], logp[:, :K - 1]], axis=1)           # [B, K, V]; p_0 = q_0
    lp_d = jnp.take_along_axis(p_j, d[..., None], axis=-1)[..., 0]
    lq_d = jnp.take_along_axis(logq, d[..., None], axis=-1)[..., 0]
    u = jax.vmap(jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float64)))(
        _keys(tok_keys, c, qtgt_pos, 1))
    acc = (j == 0) | (u < jnp.exp(jnp.minimum(lp_d - lq_d, 0.0)))
    acc = acc & (c2 + j < n)
    a = jnp.sum(jnp.cumprod(acc.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)         # accepted drafts
    # The next token (rank c + a): residual at the first rejection, else the bonus from p_K.
    rej = a < K
    ai = jnp.minimum(a, K - 1)[:, None, None]
    p_r = jnp.take_along_axis(p_j, ai, axis=1)[:, 0]
    q_r = jnp.take_along_axis(logq, ai, axis=1)[:, 0]
    resid = jnp.log(jnp.maximum(jnp.exp(p_r) - jnp.exp(q_r), 0.0))
    bonus = logp[:, K - 1]
    nlog = jnp.where(rej[:, None], resid, bonus)
    npos = orders_lib.slot_target(order, (c + a)[:, None])
    new = _gumbel_argmax(nlog[:, None], _keys(tok_keys, c, npos, 2))[:, 0]
    has_new = live & (c + a < n)
    tokens = tokens.at[jnp.arange(batch), jnp.where(has_new, npos[:, 0], n)].set(new, mode="drop")
    c = jnp.where(live, jnp.minimum(c + a + 1, n), c).astype(jnp.int32)
    passes = (passes + 2 * live.astype(jnp.int32)).astype(jnp.int32)
    return cache, tokens, c, passes

  carry = (cache, tokens0, plen, jnp.zeros((batch,), jnp.int32))
  _, tokens, _, passes = jax.lax.while_loop(cond, body, carry)
  return tokens, passes
