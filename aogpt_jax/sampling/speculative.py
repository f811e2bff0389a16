"""Exact any-order speculative decoding in the KV-cached sampler (``method="speculative"``), ONE
model pass per round.

Method. Along the sampling order sigma, a row knows c tokens (ranks < c) and holds m pending
drafts d_0..d_{m-1} for ranks c..c+m-1, each drawn from a stored draft distribution q_i. One
pass runs
  * the causal rank-slots c..c+m (slot c+i holds the token of rank c+i-1: known for i = 0, the
    draft d_{i-1} after; written at cache index c+i; each sees the cache below its rank and the
    slots of this pass before it): slot c+i gives the exact ancestral conditional
    p_i = p(x_{sigma_{c+i}} | known, d_0..d_{i-1});
  * the Figure 10 draft queries of the next round: copies of causal slot c+i with targets
    sigma_{c+i+1..c+i+e} (each sees what slot c+i sees and itself; written at scratch indices
    >= n, which no other slot reads), giving q_{i,t} = p(x_{sigma_{c+i+t}} | ranks < c+i):
    e = K-1 for the slot c+m after the last draft (used when all m are accepted) and, for the
    slots c+i, i < m (used after a rejection at i), e = K-1 with ``draft_queries="all"`` or
    the tapered max(1, (K-1) >> (i+1)) with ``"taper"`` (default; `query_groups`): a round
    stops early far more often than late, so most of the K (K-1) queries of "all" are never
    used; the taper computes K + K-1 + sum(e_i) slots (K = 8: 24 instead of 64).
Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) for i = 0, 1, ..; let a be the number
accepted. The token of rank c+a is drawn from the residual norm(max(p_a - q_a, 0)) if d_a was
rejected, else (all m accepted) from p_m (the "bonus"). Both ways the known prefix grows to
c' = c+a+1, and the next round's drafts are the queries of causal slot c+a, which condition on
ranks < c+a: all of them known (accepted) tokens, never a rejected draft. So every round is one
pass, whatever is rejected, and yields a+1 tokens: at least one, K when all K-1 drafts pass.
The number of drafts (K-1 after an all-accepted round, e_a after a rejection at a) is fixed by
the round's outcome before any draft is drawn.
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
static shapes (block K: K causal slots + the draft queries per row); finished rows idle
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

Shape suffixes of local arrays (nanodo style, ``mask_BxXxC`` = [B, X, C]): B rows, N sequence
length n, K causal slots of a pass (the static block), E = K - 1 drafts of the next round,
Q draft-query slots of the block (`query_layout`), X = K + Q slots of a pass, C cache length
(n + the widest block's Q), W = kmax (the largest K), G = max(W - 1, 1) stored draft
distributions, L = max(E, 1) drafts compared, Y = K E (trace: E queries per causal slot),
V vocabulary, D model width.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT, NO_TARGET, prompt_block
from aogpt_jax.model.layers import check_choice
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
  k_all_B = jnp.minimum(2 * k, kmax)
  return jnp.where(m == 0, k, jnp.where(a >= m, k_all_B, jnp.clip(a + 2, 2, kmax))).astype(
      jnp.int32)


def _gather_v(x, idx):
  """x [B, S, V], idx [B] -> x[b, idx[b]] [B, V]."""
  return jnp.take_along_axis(x, idx[:, None, None], axis=1)[:, 0]


QUERY_PLANS = ("taper", "all")


def query_groups(K: int, queries: str) -> tuple[int, ...]:
  """Draft queries of causal slot c+i for i < K-1, used when the round stops at a = i < m (a
  rejection there): ``"all"``: K-1 each; ``"taper"``: max(1, (K-1) >> (i+1)) (with per-draft
  acceptance alpha a round stops at i with chance ~alpha^i (1 - alpha), so later slots rarely
  supply the drafts). The slot c+m that follows the last pending draft (all accepted) always has
  K-1 queries (the "bonus" group)."""
  check_choice("sample.draft_queries", queries, QUERY_PLANS)
  e = K - 1
  return tuple(e if queries == "all" else max(1, e >> (i + 1)) for i in range(e))


def _row_sizes(i, bonus, k, queries: str):
  """Traced `query_groups` for a row's own K = k [B, 1] (``draft="auto"``): the drafts group i
  (``bonus``: the bonus group) gives; at most the block's static group size since k <= K, and
  independent of the block the batch ran with."""
  e_Bx1 = k - 1
  if queries == "all":
    return jnp.broadcast_to(e_Bx1, jnp.broadcast_shapes(jnp.shape(i), e_Bx1.shape))
  return jnp.where(bonus, e_Bx1,
                   jnp.minimum(e_Bx1, jnp.maximum(1, jnp.right_shift(e_Bx1, i + 1))))


def query_layout(K: int, queries: str):
  """Static layout of the draft queries of a block K: per query its group (0..K-2: causal slot
  i when a = i < m; K-1: the bonus group, causal slot m) and offset t >= 1, and per group its
  first query and size (numpy int32)."""
  sizes_K = np.asarray(query_groups(K, queries) + (K - 1,), np.int32)
  grp_Q = np.repeat(np.arange(K, dtype=np.int32), sizes_K)
  first_K = np.concatenate([[0], np.cumsum(sizes_K)[:-1]]).astype(np.int32)
  return grp_Q, (np.arange(grp_Q.size) - first_K[grp_Q] + 1).astype(np.int32), first_K, sizes_K


def speculative_round(model, order, tok_keys, filt, carry, *, K: int, kmax: int,
                      cache_len: int, queries: str, debug: bool):
  """One round (one pass) with static block K: causal slots c..c+m (m <= K-1 pending drafts)
  and the draft queries of `query_layout`; every row drafts its own k - 1 <= K - 1 next."""
  cache, tokens_BxN, c_B, m_B, logq_BxGxV, passes_B, k_row_B, it, trace = carry
  batch, n = order.shape
  uni_Bx3xW = _round_uniforms(tok_keys, c_B, kmax)
  E = K - 1
  grp_Q, qt_Q, first_K, _ = query_layout(K, queries)
  Q = grp_Q.size
  kk_1x1xC = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  i_1xK = jnp.arange(K, dtype=jnp.int32)[None, :]
  t_1xE = jnp.arange(1, K, dtype=jnp.int32)[None, :]
  live_B = c_B < n
  c_Bx1, m_Bx1, k_Bx1 = c_B[:, None], m_B[:, None], jnp.minimum(k_row_B, K)[:, None]
  crank_BxK = c_Bx1 + i_1xK
  cvalid_BxK = live_B[:, None] & (i_1xK <= m_Bx1) & (crank_BxK < n)
  qsrc_BxQ = jnp.where(grp_Q[None, :] == E, m_Bx1, grp_Q[None, :])    # each query's causal slot
  xrank_BxQ = c_Bx1 + qsrc_BxQ + qt_Q[None, :]
  bonus_1xQ = grp_Q[None, :] == E
  xvalid_BxQ = (live_B[:, None] & (bonus_1xQ | (grp_Q[None, :] < m_Bx1)) & (xrank_BxQ < n)
                & (qt_Q[None, :] <= _row_sizes(grp_Q[None, :], bonus_1xQ, k_Bx1, queries)))
  src_BxX = jnp.concatenate([crank_BxK, c_Bx1 + qsrc_BxQ], axis=1)     # whose slot copy
  valid_BxX = jnp.concatenate([cvalid_BxK, xvalid_BxQ], axis=1)
  tgt_rank_BxX = jnp.concatenate([crank_BxK, xrank_BxQ], axis=1)
  tok_BxX, pos_BxX = orders_lib.rank_slots(order, tokens_BxN, src_BxX)
  tgt_pos_BxX = jnp.take_along_axis(order, jnp.clip(tgt_rank_BxX, 0, n - 1), axis=1)
  scratch_1xQ = n + jnp.arange(Q, dtype=jnp.int32)[None, :]
  write_BxX = jnp.where(valid_BxX, jnp.concatenate(
      [crank_BxK, jnp.broadcast_to(scratch_1xQ, (batch, Q))], axis=1), cache_len)
  mask_BxXxC = (((kk_1x1xC < src_BxX[:, :, None]) | (kk_1x1xC == write_BxX[:, :, None]))
                & valid_BxX[:, :, None])
  hidden_BxXxD, cache = model.hidden_slots(
      tok_BxX, pos_BxX, jnp.where(valid_BxX, tgt_pos_BxX, NO_TARGET).astype(jnp.int32),
      mask=mask_BxXxC, cache=cache, write_index=write_BxX)
  raw_p_BxKxV = model.head(hidden_BxXxD[:, :K], tgt_pos_BxX[:, :K])
  logp_BxKxV = filt(raw_p_BxKxV)                   # p_i: rank c+i given ranks < c+i
  # Accept / reject the pending drafts d_i (rank c+i, i < m) against p_i.
  dpos_BxK = tgt_pos_BxX[:, :K]                    # positions of ranks c..c+K-1
  d_BxK = jnp.take_along_axis(tokens_BxN, dpos_BxK, axis=1)
  lq_BxLxV = logq_BxGxV[:, :max(E, 1)]
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
  # The next drafts: the queries of causal slot c + a (ranks c+a+1 .., given ranks < c+a): its
  # group a after a rejection, the bonus group when all m were accepted. Only those queries go
  # through the head and the filter.
  if E > 0:
    g_B = jnp.where(rej_B, a_B, E)
    erank_BxE = (c_B + a_B)[:, None] + t_1xE
    evalid_BxE = (has_new_B[:, None]
                  & (t_1xE <= _row_sizes(g_B[:, None], ~rej_B[:, None], k_Bx1, queries))
                  & (erank_BxE < n))
    epos_BxE = jnp.take_along_axis(order, jnp.clip(erank_BxE, 0, n - 1), axis=1)
    qidx_BxE = jnp.minimum(jnp.asarray(first_K)[g_B][:, None] + t_1xE - 1, Q - 1)
    h_sel_BxExD = jnp.take_along_axis(hidden_BxXxD[:, K:], qidx_BxE[:, :, None], axis=1)
    sel_BxExV = filt(model.head(h_sel_BxExD, epos_BxE))
    e_BxE = tokens_lib.inverse_cdf(sel_BxExV, uni_Bx3xW[:, 0, :E])
    tokens_BxN = tokens_lib.commit_tokens(tokens_BxN, jnp.where(evalid_BxE, epos_BxE, n), e_BxE)
    m_new_B = jnp.sum(evalid_BxE, axis=1).astype(jnp.int32)
    logq_new_BxGxV = jnp.pad(sel_BxExV, [(0, 0), (0, logq_BxGxV.shape[1] - E), (0, 0)])
    logq_BxGxV = jnp.where(live_B[:, None, None], logq_new_BxGxV, logq_BxGxV)
  else:
    m_new_B = jnp.zeros_like(m_B)
  m_B = jnp.where(live_B, m_new_B, m_B)
  if debug:
    trace = _trace_round(model, trace, it, hidden_BxXxD[:, K:], tgt_pos_BxX[:, K:], first_K,
                         queries, dict(c=jnp.where(live_B, c_B, -1), m=m_Bx1[:, 0],
                                       k=k_Bx1[:, 0], a=a_B, d=d_BxK, p=raw_p_BxKxV),
                         K=K, kmax=kmax)
  passes_B = (passes_B + live_B.astype(jnp.int32)).astype(jnp.int32)
  return ((cache, tokens_BxN, c_new_B, m_B, logq_BxGxV, passes_B, k_row_B, it + 1, trace), a_B,
          live_B)


def _trace_round(model, trace, it, h_x, tgt_x, first, queries, upd, *, K: int, kmax: int):
  """debug: records round ``it``; ``q[:, :, i, t-1]`` holds the query logits of causal slot i
  (its group i if i < m, the bonus group if i == m; ``e[:, :, i]`` queries, zeros after)."""
  batch, E = h_x.shape[0], K - 1
  xs_BxQxV = model.head(h_x, tgt_x)
  m_Bx1 = upd["m"][:, None]
  i_1xK = jnp.arange(K, dtype=jnp.int32)[None, :]
  g_BxK = jnp.where(i_1xK == m_Bx1, E, i_1xK)
  size_BxK = jnp.where(i_1xK <= m_Bx1,
                       _row_sizes(g_BxK, i_1xK == m_Bx1, upd["k"][:, None], queries), 0)
  start_BxK = jnp.asarray(first)[g_BxK]
  t_1x1xE = jnp.arange(E, dtype=jnp.int32)[None, None, :]
  qidx_BxY = jnp.minimum(start_BxK[:, :, None] + t_1x1xE, max(h_x.shape[1] - 1, 0)).reshape(
      batch, K * E)
  q_BxKxExV = jnp.take_along_axis(xs_BxQxV, qidx_BxY[:, :, None], axis=1).reshape(batch, K, E, -1)
  upd["q"] = jnp.where((t_1x1xE < size_BxK[:, :, None])[..., None], q_BxKxExV, 0.0)
  upd["e"] = size_BxK
  pad = lambda x, w, ax: jnp.pad(x, [(0, 0)] * ax + [(0, w - x.shape[ax])] + [(0, 0)] * (
      x.ndim - ax - 1))
  upd["d"], upd["p"], upd["e"] = pad(upd["d"], kmax, 1), pad(upd["p"], kmax, 1), pad(
      upd["e"], kmax, 1)
  upd["q"] = pad(pad(upd["q"], kmax, 1), max(kmax - 1, 0), 2)
  return {name: trace[name].at[it].set(upd[name]) for name in trace}


def sample_speculative(model: AOGPT, order, tokens0, prompt_len, tok_keys, *, draft,
                       temperature: float = 1.0, top_p: float = 1.0,
                       top_p_rule: str = "published", queries: str = "taper",
                       debug: bool = False):
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
  blocks = auto_blocks(kmax) if auto else (kmax,)
  cache_len = n + max(query_layout(b, queries)[0].size for b in blocks)
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
  lim_BxN = orders_lib.block_limit(r_BxN, prompt_block(model.cfg, plen_B))  # (bidirectional)
  mask_BxNxC = (((kk_1x1xC < lim_BxN[:, :, None]) | (kk_1x1xC == write_BxN[:, :, None]))
                & ok_BxN[:, :, None])
  _, cache = model.hidden_slots(tok_BxN, pos_BxN, tgt_BxN, mask=mask_BxNxC, cache=cache,
                                write_index=write_BxN)
  v = model.cfg.vocab_size
  trace = None
  if debug:
    trace = dict(c=jnp.full((n, batch), -1, jnp.int32), m=jnp.zeros((n, batch), jnp.int32),
                 k=jnp.zeros((n, batch), jnp.int32), a=jnp.zeros((n, batch), jnp.int32),
                 e=jnp.zeros((n, batch, kmax), jnp.int32),
                 d=jnp.zeros((n, batch, kmax), jnp.int32),
                 p=jnp.zeros((n, batch, kmax, v), jnp.float32),
                 q=jnp.zeros((n, batch, kmax, max(kmax - 1, 0), v), jnp.float32))
  rnd = [functools.partial(speculative_round, model, order, tok_keys, filt, K=b, kmax=kmax,
                           cache_len=cache_len, queries=queries, debug=debug) for b in blocks]

  def cond(carry):
    return jnp.any(carry[2] < n)

  def body(carry):
    m_before_B = carry[3]
    if len(rnd) == 1:
      carry, a_B, live_B = rnd[0](carry)
    else:     # the smallest block that holds every live row's k and pending drafts + 1
      need = jnp.max(jnp.where(carry[2] < n, jnp.maximum(carry[6], carry[3] + 1), 0))
      idx = jnp.sum(jnp.asarray(blocks, jnp.int32) < need).astype(jnp.int32)
      carry, a_B, live_B = jax.lax.switch(idx, rnd, carry)
    if auto:
      k_B = jnp.where(live_B, next_draft(carry[6], a_B, m_before_B, kmax), carry[6])
      carry = carry[:6] + (k_B,) + carry[7:]
    return carry

  k0_B = jnp.full((batch,), 2 if auto else kmax, jnp.int32)
  logq0_BxGxV = jnp.zeros((batch, max(kmax - 1, 1), v), jnp.float64)
  carry = (cache, tokens0, plen_B, jnp.zeros((batch,), jnp.int32), logq0_BxGxV,
           jnp.zeros((batch,), jnp.int32), k0_B, jnp.int32(0), trace)
  _, tokens_BxN, _, _, _, passes_B, _, _, trace = jax.lax.while_loop(cond, body, carry)
  return tokens_BxN, passes_B, trace
