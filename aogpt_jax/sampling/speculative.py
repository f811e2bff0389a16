"""Exact any-order speculative decoding in the KV-cached sampler (``method="speculative"``), ONE
model pass per round.

Method. Along the sampling order sigma, a row knows c tokens (ranks < c) and holds m pending
drafts d_0..d_{m-1} for ranks c..c+m-1, each drawn from a stored draft distribution q_i. One
pass runs
  * the causal rank-slots c..c+m (slot c+i holds the token of rank c+i-1: known for i = 0, the
    draft d_{i-1} after; written at cache index c+i; each sees the cache below its rank and the
    slots of this pass before it): slot c+i gives the exact ancestral conditional
    p_i = p(x_{sigma_{c+i}} | known, d_0..d_{i-1});
  * for EVERY causal slot c+i, the Figure 10 draft queries of the next round: K-1 copies of that
    slot with targets sigma_{c+i+1..c+i+K-1} (each sees what slot c+i sees and itself; written at
    scratch indices >= n, which no other slot reads), giving q_{i,t} = p(x_{sigma_{c+i+t}} |
    ranks < c+i).
Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) for i = 0, 1, ..; let a be the number
accepted. The token of rank c+a is drawn from the residual norm(max(p_a - q_a, 0)) if d_a was
rejected, else (all m accepted) from p_m (the "bonus"). Both ways the known prefix grows to
c' = c+a+1, and the next round's drafts are the queries of causal slot c+a, which condition on
ranks < c+a: all of them known (accepted) tokens, never a rejected draft. So every round is one
pass, whatever is rejected, and yields a+1 tokens: at least one, K when all K-1 drafts pass.
Exactness: the standard speculative-sampling argument (Leviathan et al. 2023, Chen et al. 2023)
applied token by token: P(accept d = x) + P(reject) * residual(x) = min(p,q)(x) + (p - min(p,q))(x)
= p(x), and p_i conditions on exactly the tokens before it in sigma, so the sequence is drawn
from the ancestral (T = n) distribution of the order sigma, with any temperature / top-p rule
applied to both p and q (both come from `filter_logits`, the shared contract). A draft may
come from any distribution fixed before it is drawn: q_{a,t} conditions on known tokens only,
and which source slot a supplies the drafts is decided by uniforms and tokens independent of the
drafts' own uniforms.
Cache: after a round, rank-slots 0..c'-1 hold known tokens (slot c+i for i <= a holds a known
token). Slot c' and above may hold a rejected draft; the next pass rewrites slot c' (its first
causal slot) before anything reads it, and a slot reads only indices below its rank plus
itself, so rejected drafts leave no trace.
Batching: every row keeps its own frontier c and pending count m inside one `lax.while_loop` with
static shapes (block K: K causal slots + K (K-1) draft queries per row); finished rows idle
(their slots write past the cache end). Keys: the round of a row with frontier c draws all its
uniforms at once from ``fold_in(fold_in(token_key, SPEC_STREAM), c)`` (`_round_uniforms`: drafts,
accepts, the drawn token); c strictly increases, so no uniform is reused (the K alternative
drafts for one rank in one round share a uniform; only one of them is ever used, chosen
independently of it). Samples are independent of the batch they ran in (all randomness is per
row); they differ from the AR sampler's tokens under the same key (different streams).
Draft length. ``draft=K``: K-1 drafts per round after the first, so at least 1 / K passes per
token (one more pass for the first token). ``draft="auto"`` keeps a K per row (start 2, at most
min(`AUTO_MAX`, n)), set from the row's PAST outcomes only (`next_draft`); each round runs with
the smallest static block in 2, 4, .., AUTO_MAX that holds every live row's K and pending drafts
(`lax.switch` between compiled bodies), so low-acceptance batches compute narrower passes.
What K changes: the samples' distribution is the same for every K and "auto"; the tokens drawn
under one key differ between K (the rounds split differently); for a fixed K they do not depend
on the batch they ran in.

Shape suffixes of local arrays (``mask_BxXxC`` = [B, X, C]): B rows, N sequence length n,
K causal slots of a pass (the static block), E = K - 1 draft queries per causal slot,
X = K + K E slots of a pass, Y = K E draft-query slots, C cache length n + W (W - 1),
W = the largest K (``kmax``), W1 = W - 1, L = max(E, 1) stored drafts compared, V vocabulary,
D model width.
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


def _round_uniforms(tok_keys, c, kmax: int):
  """The float64 uniforms of the round of every row with frontier c [B]: [B, 3, kmax] from ONE
  random-bits call per row on ``fold_in(fold_in(token_key, SPEC_STREAM), c)``; [:, 0, t] draws
  the draft of rank c+a+t, [:, 1, i] accepts the draft of rank c+i, [:, 2, 0] draws the token of
  rank c+a. c strictly increases from round to round, so no uniform is used twice."""
  def row(k, cc):
    k = jax.random.fold_in(jax.random.fold_in(k, SPEC_STREAM), cc)
    return jax.random.uniform(k, (3, kmax), jnp.float64)
  return jax.vmap(row)(tok_keys, c.astype(jnp.int32))


def auto_blocks(kmax: int) -> tuple[int, ...]:
  """The static block sizes of ``draft="auto"``: 2, 4, ... up to ``kmax``."""
  out, b = [], 2
  while b < kmax:
    out.append(b)
    b *= 2
  return tuple(out) + (kmax,)


def next_draft(k, a, m, kmax: int):
  """The auto rule, from the round's outcome only: a row that verified m >= 1 drafts and accepted
  all doubles its K (up to kmax); one that rejected after a accepted drafts uses a + 2 (its
  accepted drafts plus the drawn token, plus one; at least 2); m = 0 keeps K."""
  k_all = jnp.minimum(2 * k, kmax)
  return jnp.where(m == 0, k, jnp.where(a >= m, k_all, jnp.clip(a + 2, 2, kmax))).astype(jnp.int32)


def _gather_v(x, idx):
  """x [B, S, V], idx [B] -> x[b, idx[b]] [B, V]."""
  return jnp.take_along_axis(x, idx[:, None, None], axis=1)[:, 0]


def _round(model, order, tok_keys, filt, carry, *, K: int, kmax: int, cache_len: int,
           debug: bool):
  """One round (one pass) with static block K: causal slots c..c+m (m <= K-1 pending drafts)
  and K-1 draft queries per causal slot; every row drafts its own k - 1 <= K - 1 next."""
  cache, tokens_BxN, c_B, m_B, logq_BxW1xV, passes_B, k_row_B, it, trace = carry
  batch, n = order.shape
  uni_Bx3xW = _round_uniforms(tok_keys, c_B, kmax)
  E = K - 1
  kk_1x1xC = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  i_1xK = jnp.arange(K, dtype=jnp.int32)[None, :]
  t_1x1xE = jnp.arange(1, K, dtype=jnp.int32)[None, None, :]
  live_B = c_B < n
  c_Bx1, m_Bx1, k_Bx1 = c_B[:, None], m_B[:, None], jnp.minimum(k_row_B, K)[:, None]
  crank_BxK = c_Bx1 + i_1xK
  cvalid_BxK = live_B[:, None] & (i_1xK <= m_Bx1) & (crank_BxK < n)
  xrank_BxKxE = crank_BxK[:, :, None] + t_1x1xE
  xvalid_BxKxE = cvalid_BxK[:, :, None] & (t_1x1xE < k_Bx1[:, :, None]) & (xrank_BxKxE < n)
  src_BxX = jnp.concatenate([crank_BxK, jnp.broadcast_to(
      crank_BxK[:, :, None], xrank_BxKxE.shape).reshape(batch, K * E)], axis=1)  # whose copy
  valid_BxX = jnp.concatenate([cvalid_BxK, xvalid_BxKxE.reshape(batch, K * E)], axis=1)
  tgt_rank_BxX = jnp.concatenate([crank_BxK, xrank_BxKxE.reshape(batch, K * E)], axis=1)
  tok_BxX, pos_BxX = orders_lib.rank_slots(order, tokens_BxN, src_BxX)
  tgt_pos_BxX = jnp.take_along_axis(order, jnp.clip(tgt_rank_BxX, 0, n - 1), axis=1)
  scratch_1xY = n + jnp.arange(K * E, dtype=jnp.int32)[None, :]
  write_BxX = jnp.where(valid_BxX, jnp.concatenate(
      [crank_BxK, jnp.broadcast_to(scratch_1xY, (batch, K * E))], axis=1), cache_len)
  mask_BxXxC = (((kk_1x1xC < src_BxX[:, :, None]) | (kk_1x1xC == write_BxX[:, :, None]))
                & valid_BxX[:, :, None])
  hidden_BxXxD, cache = model.hidden_slots(
      tok_BxX, pos_BxX, jnp.where(valid_BxX, tgt_pos_BxX, NO_TARGET).astype(jnp.int32),
      mask=mask_BxXxC, cache=cache, write_index=write_BxX)
  raw_p_BxKxV = model.head(hidden_BxXxD[:, :K], tgt_pos_BxX[:, :K])
  logp_BxKxV = filt(raw_p_BxKxV)                 # p_i: rank c+i given ranks < c+i
  v = logp_BxKxV.shape[-1]
  # Accept / reject the pending drafts d_i (rank c+i, i < m) against p_i.
  dpos_BxK = tgt_pos_BxX[:, :K]                  # positions of ranks c..c+K-1
  d_BxK = jnp.take_along_axis(tokens_BxN, dpos_BxK, axis=1)
  lq_BxLxV = logq_BxW1xV[:, :max(E, 1)]
  lp_d_BxL = jnp.take_along_axis(logp_BxKxV[:, :lq_BxLxV.shape[1]],
                                 d_BxK[:, :lq_BxLxV.shape[1], None], axis=-1)[..., 0]
  lq_d_BxL = jnp.take_along_axis(lq_BxLxV, d_BxK[:, :lq_BxLxV.shape[1], None], axis=-1)[..., 0]
  u_BxL = uni_Bx3xW[:, 1, :lq_BxLxV.shape[1]]
  acc_BxL = ((u_BxL < jnp.exp(jnp.minimum(lp_d_BxL - lq_d_BxL, 0.0)))
             & (i_1xK[:, :lq_BxLxV.shape[1]] < m_Bx1))
  a_B = jnp.sum(jnp.cumprod(acc_BxL.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  # The token of rank c + a: the residual at the first rejection, else the bonus p_m.
  rej_B = a_B < m_B
  p_a_BxV = _gather_v(logp_BxKxV, jnp.minimum(a_B, K - 1))
  q_a_BxV = _gather_v(lq_BxLxV, jnp.minimum(a_B, lq_BxLxV.shape[1] - 1))
  resid_BxV = jnp.log(jnp.maximum(jnp.exp(p_a_BxV) - jnp.exp(q_a_BxV), 0.0))
  nlog_BxV = jnp.where(rej_B[:, None], resid_BxV, p_a_BxV)
  npos_Bx1 = jnp.take_along_axis(order, jnp.clip(c_B + a_B, 0, n - 1)[:, None], axis=1)
  new_B = tokens_lib.inverse_cdf(nlog_BxV, uni_Bx3xW[:, 2, 0])
  has_new_B = live_B & (c_B + a_B < n)
  tokens_BxN = tokens_BxN.at[jnp.arange(batch), jnp.where(has_new_B, npos_Bx1[:, 0], n)].set(
      new_B, mode="drop")
  c_new_B = jnp.where(has_new_B, c_B + a_B + 1, jnp.where(live_B, n, c_B)).astype(jnp.int32)
  # The next drafts: the queries of causal slot c + a (ranks c+a+1 .., given ranks < c+a).
  # Only that slot's queries go through the head and the filter.
  if E > 0:
    erank_BxE = (c_B + a_B)[:, None] + t_1x1xE[0]
    evalid_BxE = has_new_B[:, None] & (t_1x1xE[0] < k_Bx1) & (erank_BxE < n)
    epos_BxE = jnp.take_along_axis(order, jnp.clip(erank_BxE, 0, n - 1), axis=1)
    h_x_BxKxExD = hidden_BxXxD[:, K:].reshape(batch, K, E, hidden_BxXxD.shape[-1])
    h_sel_BxExD = jnp.take_along_axis(
        h_x_BxKxExD, jnp.minimum(a_B, K - 1)[:, None, None, None], axis=1)[:, 0]
    sel_BxExV = filt(model.head(h_sel_BxExD, epos_BxE))
    e_BxE = tokens_lib.inverse_cdf(sel_BxExV, uni_Bx3xW[:, 0, :E])
    tokens_BxN = tokens_lib.commit_tokens(tokens_BxN, jnp.where(evalid_BxE, epos_BxE, n), e_BxE)
    m_new_B = jnp.sum(evalid_BxE, axis=1).astype(jnp.int32)
    logq_new_BxW1xV = jnp.pad(sel_BxExV, [(0, 0), (0, logq_BxW1xV.shape[1] - E), (0, 0)])
    logq_BxW1xV = jnp.where(live_B[:, None, None], logq_new_BxW1xV, logq_BxW1xV)
  else:
    m_new_B = jnp.zeros_like(m_B)
  m_B = jnp.where(live_B, m_new_B, m_B)
  if debug:
    pad = lambda x, w: jnp.pad(x, [(0, 0), (0, w - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
    xs_BxKxExV = model.head(hidden_BxXxD[:, K:], tgt_pos_BxX[:, K:]).reshape(batch, K, E, v)
    xs_BxWxW1xV = jnp.pad(xs_BxKxExV, [(0, 0), (0, kmax - K), (0, kmax - 1 - E), (0, 0)])
    upd = dict(c=jnp.where(live_B, c_B, -1), m=m_Bx1[:, 0], k=k_Bx1[:, 0], a=a_B,
               d=pad(d_BxK, kmax), p=pad(raw_p_BxKxV, kmax), q=xs_BxWxW1xV)
    trace = {name: trace[name].at[it].set(upd[name]) for name in trace}
  passes_B = (passes_B + live_B.astype(jnp.int32)).astype(jnp.int32)
  return ((cache, tokens_BxN, c_new_B, m_B, logq_BxW1xV, passes_B, k_row_B, it + 1, trace), a_B,
          live_B)


def sample_speculative(model: AOGPT, order, tokens0, prompt_len, tok_keys, *, draft,
                       temperature: float = 1.0, top_p: float = 1.0,
                       top_p_rule: str = "published", debug: bool = False):
  """Traced body. order int32 [B, n] (prompt positions first), tokens0 int32 [B, n] (prompt
  tokens in place), prompt_len int32 [B], tok_keys [B]. ``draft``: K (int >= 1) or "auto"
  (per-row K from 2 up to `AUTO_MAX`). Returns (tokens [B, n], passes [B]: the model passes
  each row needed, prefill excluded, trace): ``trace`` is None unless ``debug``, else a dict of
  per-round arrays [n, B, ...] (rounds a row did not run have c = -1): frontier ``c``, pending
  drafts ``m``, K ``k``, accepted ``a``, the tokens at ranks c.. when the pass ran ``d``
  [n, B, K] (d[:m] are the drafts), raw causal-slot logits ``p`` [n, B, K, V] (``p[:, :, i]``
  predicts rank c+i) and raw draft-query logits ``q`` [n, B, K, K-1, V] (``q[:, :, i, t-1]``:
  rank c+i+t given ranks < c+i)."""
  batch, n = order.shape
  auto = draft == "auto"
  kmax = min(AUTO_MAX, n) if auto else int(draft)
  if kmax < 1:
    raise ValueError(f"draft: must be >= 1 or 'auto', got {draft!r}")
  cache_len = n + kmax * (kmax - 1)
  kk_1x1xC = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  filt = lambda lg: jax.nn.log_softmax(tokens_lib.filter_logits(
      lg, temperature=temperature, top_p=top_p, top_p_rule=top_p_rule), axis=-1)
  cache = model.init_cache(batch, cache_len)
  # Prefill: rank-slots 0..P-1 of every row (P = its prompt length), one pass over n slots.
  plen_B = prompt_len.astype(jnp.int32)
  r_BxN = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, n))
  ok_BxN = r_BxN < plen_B[:, None]
  tok_BxN, pos_BxN = orders_lib.rank_slots(order, tokens0, r_BxN)
  tgt_BxN = jnp.where(ok_BxN, order, NO_TARGET).astype(jnp.int32)
  write_BxN = jnp.where(ok_BxN, r_BxN, cache_len)
  mask_BxNxC = (((kk_1x1xC < r_BxN[:, :, None]) | (kk_1x1xC == write_BxN[:, :, None]))
                & ok_BxN[:, :, None])
  _, cache = model.hidden_slots(tok_BxN, pos_BxN, tgt_BxN, mask=mask_BxNxC, cache=cache,
                                write_index=write_BxN)
  v = model.cfg.vocab_size
  trace = None
  if debug:
    trace = dict(c=jnp.full((n, batch), -1, jnp.int32), m=jnp.zeros((n, batch), jnp.int32),
                 k=jnp.zeros((n, batch), jnp.int32), a=jnp.zeros((n, batch), jnp.int32),
                 d=jnp.zeros((n, batch, kmax), jnp.int32),
                 p=jnp.zeros((n, batch, kmax, v), jnp.float32),
                 q=jnp.zeros((n, batch, kmax, max(kmax - 1, 0), v), jnp.float32))
  blocks = auto_blocks(kmax) if auto else (kmax,)
  rnd = [functools.partial(_round, model, order, tok_keys, filt, K=b, kmax=kmax,
                           cache_len=cache_len, debug=debug) for b in blocks]

  def cond(carry):
    return jnp.any(carry[2] < n)

  def body(carry):
    m_before = carry[3]
    if len(rnd) == 1:
      carry, a, live = rnd[0](carry)
    else:     # the smallest block that holds every live row's k and pending drafts + 1
      need = jnp.max(jnp.where(carry[2] < n, jnp.maximum(carry[6], carry[3] + 1), 0))
      idx = jnp.sum(jnp.asarray(blocks, jnp.int32) < need).astype(jnp.int32)
      carry, a, live = jax.lax.switch(idx, rnd, carry)
    if auto:
      k = jnp.where(live, next_draft(carry[6], a, m_before, kmax), carry[6])
      carry = carry[:6] + (k,) + carry[7:]
    return carry

  k0_B = jnp.full((batch,), 2 if auto else kmax, jnp.int32)
  logq0_BxW1xV = jnp.zeros((batch, max(kmax - 1, 1), v), jnp.float64)
  carry = (cache, tokens0, plen_B, jnp.zeros((batch,), jnp.int32), logq0_BxW1xV,
           jnp.zeros((batch,), jnp.int32), k0_B, jnp.int32(0), trace)
  _, tokens_BxN, _, _, _, passes_B, _, _, trace = jax.lax.while_loop(cond, body, carry)
  return tokens_BxN, passes_B, trace
