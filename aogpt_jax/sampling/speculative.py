"""Exact any-order speculative decoding in the KV-cached sampler (``method="speculative"``).

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
Draft length. ``draft=K`` drafts K tokens per round (at most K + 1 tokens per two passes, so at
least 2 / (K + 1) passes per token). ``draft="auto"`` keeps a K per row (start 2, at most
min(`AUTO_MAX`, n)): a row that accepted all its drafts doubles K, one that rejected after a accepted
drafts uses a + 1 (`next_draft`); each round runs with the smallest static block in 2, 4, ..,
AUTO_MAX that holds every live row's K (`lax.switch` between compiled bodies), so low-acceptance
batches compute narrower passes. K depends only on the row's PAST accept / reject outcomes,
never on the current drafts, so every round is still a valid speculative step and "auto" is
exact too. What K changes: the samples' distribution is the same for every K and "auto"; the
tokens drawn under one key differ between K (the rounds split differently); for a fixed K they
do not depend on the batch they ran in.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from aogpt_jax import orders as orders_lib
from aogpt_jax.model import AOGPT, NO_TARGET
from aogpt_jax.sampling import tokens as tokens_lib

SPEC_STREAM = 7
AUTO_MAX = 8          # draft="auto": per-row K in 2..AUTO_MAX


def _gumbel_argmax(logp, keys):
  """Exact categorical draw from float64 log-weights [B, S, V] with keys [B, S] (one float64
  uniform per draw, `tokens.inverse_cdf`)."""
  u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float64))(keys.reshape(-1))
  return tokens_lib.inverse_cdf(logp, u.reshape(logp.shape[:-1]))


def _keys(tok_keys, c, pos, which):
  """Keys [B, S] for the iteration with frontier c [B] at positions pos [B, S]."""
  def row(k, cc, pp):
    k = jax.random.fold_in(jax.random.fold_in(k, SPEC_STREAM), cc)
    return jax.vmap(lambda q: jax.random.fold_in(jax.random.fold_in(k, q), which))(pp)
  return jax.vmap(row)(tok_keys, c.astype(jnp.int32), pos.astype(jnp.int32))


def auto_blocks(kmax: int) -> tuple[int, ...]:
  """The static block sizes of ``draft="auto"``: 2, 4, ... up to ``kmax``."""
  out, b = [], 2
  while b < kmax:
    out.append(b)
    b *= 2
  return tuple(out) + (kmax,)


def next_draft(k, a, kmax: int):
  """The auto rule: a row that accepted all its k drafts doubles k (up to kmax); one that
  rejected after a accepted drafts tries a + 1 next (at least 2). Depends only on past outcomes."""
  return jnp.where(a >= k, jnp.minimum(2 * k, kmax), jnp.clip(a + 1, 2, kmax)).astype(jnp.int32)


def _round(model, order, tok_keys, filt, carry, *, K: int, cache_len: int, debug: bool):
  """One round (two passes) with static block K; every row drafts its own k <= K."""
  cache, tokens, c, passes, k_row, it, trace = carry
  batch, n = order.shape
  kk = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  j = jnp.arange(K, dtype=jnp.int32)[None, :]
  live = c < n
  c2, k2 = c[:, None], jnp.minimum(k_row, K)[:, None]
  # 1. draft pass: queries = copies of rank-slot c, targets sigma_{c+j}, j < k.
  valid = live[:, None] & (c2 + j < n) & (j < k2)
  rank = jnp.broadcast_to(c2, (batch, K))
  tok, pos = orders_lib.rank_slots(order, tokens, rank)
  qtgt_pos = jnp.take_along_axis(order, jnp.clip(c2 + j, 0, n - 1), axis=1)
  write = jnp.where(valid, jnp.where(j == 0, c2, n + j), cache_len)
  mask = ((kk < rank[:, :, None]) | (kk == write[:, :, None])) & valid[:, :, None]
  hidden, cache = model.hidden_slots(
      tok, pos, jnp.where(valid, qtgt_pos, NO_TARGET).astype(jnp.int32), mask=mask,
      cache=cache, write_index=write)
  raw_q = model.head(hidden, qtgt_pos)
  logq = filt(raw_q)
  d = _gumbel_argmax(logq, _keys(tok_keys, c, qtgt_pos, 0))
  rows = jnp.arange(batch)[:, None]
  tokens = tokens.at[rows, jnp.where(valid, qtgt_pos, n)].set(d, mode="drop")
  # 2. verify pass: rank-slots c+1..c+k holding d_0..d_{k-1}.
  vrank = c2 + 1 + j
  vvalid = live[:, None] & (vrank < n) & (j < k2)
  tok, pos = orders_lib.rank_slots(order, tokens, vrank)
  vtgt_pos = jnp.take_along_axis(order, jnp.clip(vrank, 0, n - 1), axis=1)
  write = jnp.where(vvalid, vrank, cache_len)
  mask = ((kk < vrank[:, :, None]) | (kk == write[:, :, None])) & vvalid[:, :, None]
  hidden, cache = model.hidden_slots(
      tok, pos, jnp.where(vvalid, vtgt_pos, NO_TARGET).astype(jnp.int32), mask=mask,
      cache=cache, write_index=write)
  raw_p = model.head(hidden, vtgt_pos)
  logp = filt(raw_p)                                # logp[:, i] = p_{i+1} (target sigma_{c+i+1})
  # 3. accept / reject. Drafts j = 1..k-1 are checked against p_j = logp[:, j-1].
  p_j = jnp.concatenate([logq[:, :1], logp[:, :K - 1]], axis=1)           # [B, K, V]; p_0 = q_0
  lp_d = jnp.take_along_axis(p_j, d[..., None], axis=-1)[..., 0]
  lq_d = jnp.take_along_axis(logq, d[..., None], axis=-1)[..., 0]
  u = jax.vmap(jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float64)))(
      _keys(tok_keys, c, qtgt_pos, 1))
  acc = (j == 0) | (u < jnp.exp(jnp.minimum(lp_d - lq_d, 0.0)))
  acc = acc & (c2 + j < n) & (j < k2)
  a = jnp.sum(jnp.cumprod(acc.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  # The next token (rank c + a): residual at the first rejection, else the bonus from p_k.
  rej = a < k2[:, 0]
  ai = jnp.minimum(a, K - 1)[:, None, None]
  p_r = jnp.take_along_axis(p_j, ai, axis=1)[:, 0]
  q_r = jnp.take_along_axis(logq, ai, axis=1)[:, 0]
  resid = jnp.log(jnp.maximum(jnp.exp(p_r) - jnp.exp(q_r), 0.0))
  bonus = jnp.take_along_axis(logp, (k2 - 1)[:, :, None], axis=1)[:, 0]
  nlog = jnp.where(rej[:, None], resid, bonus)
  npos = jnp.take_along_axis(order, jnp.clip(c + a, 0, n - 1)[:, None], axis=1)
  new = _gumbel_argmax(nlog[:, None], _keys(tok_keys, c, npos, 2))[:, 0]
  has_new = live & (c + a < n)
  tokens = tokens.at[jnp.arange(batch), jnp.where(has_new, npos[:, 0], n)].set(new, mode="drop")
  if debug:
    pad = lambda x: jnp.pad(x, [(0, 0), (0, trace["d"].shape[2] - K)] + [(0, 0)] * (x.ndim - 2))
    upd = dict(c=jnp.where(live, c, -1), k=k2[:, 0], d=pad(d), a=a,
               q=pad(raw_q), p=pad(raw_p))
    trace = {name: trace[name].at[it].set(upd[name]) for name in trace}
  c_new = jnp.where(live, jnp.minimum(c + a + 1, n), c).astype(jnp.int32)
  passes = (passes + 2 * live.astype(jnp.int32)).astype(jnp.int32)
  return (cache, tokens, c_new, passes, k_row, it + 1, trace), a, k2[:, 0], live


def sample_speculative(model: AOGPT, order, tokens0, prompt_len, tok_keys, *, draft,
                       temperature: float = 1.0, top_p: float = 1.0,
                       top_p_rule: str = "published", debug: bool = False):
  """Traced body. order int32 [B, n] (prompt positions first), tokens0 int32 [B, n] (prompt
  tokens in place), prompt_len int32 [B], tok_keys [B]. ``draft``: K (int >= 1) or "auto"
  (per-row K from 2 up to `AUTO_MAX`). Returns (tokens [B, n], passes [B]: the model passes
  each row needed, prefill excluded, trace): ``trace`` is None unless ``debug``, else a dict of
  per-round arrays [n, B, ...] (rounds a row did not run have c = -1): frontier ``c``, drafts
  ``k``, draft tokens ``d``, accepted ``a``, raw draft logits ``q`` and verify logits ``p``
  [n, B, K, V] (``p[:, :, i]`` is rank-slot c+1+i's output)."""
  batch, n = order.shape
  auto = draft == "auto"
  kmax = min(AUTO_MAX, n) if auto else int(draft)
  if kmax < 1:
    raise ValueError(f"draft: must be >= 1 or 'auto', got {draft!r}")
  cache_len = n + kmax
  kk = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
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
  _, cache = model.hidden_slots(tok, pos, tgt, mask=mask, cache=cache, write_index=write)
  trace = None
  if debug:
    v = model.cfg.vocab_size
    trace = dict(c=jnp.full((n, batch), -1, jnp.int32), k=jnp.zeros((n, batch), jnp.int32),
                 d=jnp.zeros((n, batch, kmax), jnp.int32), a=jnp.zeros((n, batch), jnp.int32),
                 q=jnp.zeros((n, batch, kmax, v), jnp.float32),
                 p=jnp.zeros((n, batch, kmax, v), jnp.float32))
  blocks = auto_blocks(kmax) if auto else (kmax,)
  rnd = [functools.partial(_round, model, order, tok_keys, filt, K=b, cache_len=cache_len,
                           debug=debug) for b in blocks]

  def cond(carry):
    return jnp.any(carry[2] < n)

  def body(carry):
    if len(rnd) == 1:
      carry, a, k, live = rnd[0](carry)
    else:     # the smallest block that holds every live row's k
      need = jnp.max(jnp.where(carry[2] < n, carry[4], 0))
      idx = jnp.sum(jnp.asarray(blocks, jnp.int32) < need).astype(jnp.int32)
      carry, a, k, live = jax.lax.switch(idx, rnd, carry)
    if auto:
      carry = carry[:4] + (jnp.where(live, next_draft(k, a, kmax), carry[4]),) + carry[5:]
    return carry

  k0 = jnp.full((batch,), 2 if auto else kmax, jnp.int32)
  carry = (cache, tokens0, plen, jnp.zeros((batch,), jnp.int32), k0, jnp.int32(0), trace)
  _, tokens, _, passes, _, _, trace = jax.lax.while_loop(cond, body, carry)
  return tokens, passes, trace
