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
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax import orders as orders_lib
from aogpt_jax.layers import check_choice
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
  e = k - 1
  if queries == "all":
    return jnp.broadcast_to(e, jnp.broadcast_shapes(jnp.shape(i), e.shape))
  return jnp.where(bonus, e, jnp.minimum(e, jnp.maximum(1, jnp.right_shift(e, i + 1))))


def query_layout(K: int, queries: str):
  """Static layout of the draft queries of a block K: per query its group (0..K-2: causal slot
  i when a = i < m; K-1: the bonus group, causal slot m) and offset t >= 1, and per group its
  first query and size (numpy int32)."""
  sizes = np.asarray(query_groups(K, queries) + (K - 1,), np.int32)
  grp = np.repeat(np.arange(K, dtype=np.int32), sizes)
  first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
  return grp, (np.arange(grp.size) - first[grp] + 1).astype(np.int32), first, sizes


def _round(model, order, tok_keys, filt, carry, *, K: int, kmax: int, cache_len: int,
           queries: str, debug: bool):
  """One round (one pass) with static block K: causal slots c..c+m (m <= K-1 pending drafts)
  and the draft queries of `query_layout`; every row drafts its own k - 1 <= K - 1 next."""
  cache, tokens, c, m, logq, passes, k_row, it, trace = carry
  batch, n = order.shape
  uni = _round_uniforms(tok_keys, c, kmax)
  E = K - 1
  grp, qt, first, _ = query_layout(K, queries)
  Q = grp.size
  kk = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  i = jnp.arange(K, dtype=jnp.int32)[None, :]
  t = jnp.arange(1, K, dtype=jnp.int32)[None, :]
  live = c < n
  c2, m2, k2 = c[:, None], m[:, None], jnp.minimum(k_row, K)[:, None]
  crank = c2 + i                                                        # [B, K]
  cvalid = live[:, None] & (i <= m2) & (crank < n)
  qsrc = jnp.where(grp[None, :] == E, m2, grp[None, :])                 # [B, Q]: causal slot
  xrank = c2 + qsrc + qt[None, :]
  bonus = grp[None, :] == E
  xvalid = (live[:, None] & (bonus | (grp[None, :] < m2)) & (xrank < n)
            & (qt[None, :] <= _row_sizes(grp[None, :], bonus, k2, queries)))
  src = jnp.concatenate([crank, c2 + qsrc], axis=1)                     # whose slot copy
  valid = jnp.concatenate([cvalid, xvalid], axis=1)
  tgt_rank = jnp.concatenate([crank, xrank], axis=1)
  tok, pos = orders_lib.rank_slots(order, tokens, src)
  tgt_pos = jnp.take_along_axis(order, jnp.clip(tgt_rank, 0, n - 1), axis=1)
  scratch = n + jnp.arange(Q, dtype=jnp.int32)[None, :]
  write = jnp.where(valid, jnp.concatenate(
      [crank, jnp.broadcast_to(scratch, (batch, Q))], axis=1), cache_len)
  mask = ((kk < src[:, :, None]) | (kk == write[:, :, None])) & valid[:, :, None]
  hidden, cache = model.hidden_slots(
      tok, pos, jnp.where(valid, tgt_pos, NO_TARGET).astype(jnp.int32), mask=mask, cache=cache,
      write_index=write)
  raw_p = model.head(hidden[:, :K], tgt_pos[:, :K])
  logp = filt(raw_p)                               # p_i: rank c+i given ranks < c+i
  # Accept / reject the pending drafts d_i (rank c+i, i < m) against p_i.
  dpos = tgt_pos[:, :K]                            # positions of ranks c..c+K-1
  d = jnp.take_along_axis(tokens, dpos, axis=1)
  lq = logq[:, :max(E, 1)]
  lp_d = jnp.take_along_axis(logp[:, :lq.shape[1]], d[:, :lq.shape[1], None], axis=-1)[..., 0]
  lq_d = jnp.take_along_axis(lq, d[:, :lq.shape[1], None], axis=-1)[..., 0]
  u = uni[:, 1, :lq.shape[1]]
  acc = (u < jnp.exp(jnp.minimum(lp_d - lq_d, 0.0))) & (i[:, :lq.shape[1]] < m2)
  a = jnp.sum(jnp.cumprod(acc.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  # The token of rank c + a: the residual at the first rejection, else the bonus p_m.
  rej = a < m
  p_a = _gather_v(logp, jnp.minimum(a, K - 1))
  q_a = _gather_v(lq, jnp.minimum(a, lq.shape[1] - 1))
  resid = jnp.log(jnp.maximum(jnp.exp(p_a) - jnp.exp(q_a), 0.0))
  nlog = jnp.where(rej[:, None], resid, p_a)
  npos = jnp.take_along_axis(order, jnp.clip(c + a, 0, n - 1)[:, None], axis=1)
  new = tokens_lib.inverse_cdf(nlog, uni[:, 2, 0])
  has_new = live & (c + a < n)
  tokens = tokens.at[jnp.arange(batch), jnp.where(has_new, npos[:, 0], n)].set(new, mode="drop")
  c_new = jnp.where(has_new, c + a + 1, jnp.where(live, n, c)).astype(jnp.int32)
  # The next drafts: the queries of causal slot c + a (ranks c+a+1 .., given ranks < c+a): its
  # group a after a rejection, the bonus group when all m were accepted. Only those queries go
  # through the head and the filter.
  if E > 0:
    g = jnp.where(rej, a, E)
    erank = (c + a)[:, None] + t
    evalid = (has_new[:, None] & (t <= _row_sizes(g[:, None], ~rej[:, None], k2, queries))
              & (erank < n))
    epos = jnp.take_along_axis(order, jnp.clip(erank, 0, n - 1), axis=1)
    qidx = jnp.minimum(jnp.asarray(first)[g][:, None] + t - 1, Q - 1)
    h_sel = jnp.take_along_axis(hidden[:, K:], qidx[:, :, None], axis=1)
    sel = filt(model.head(h_sel, epos))
    e = tokens_lib.inverse_cdf(sel, uni[:, 0, :E])
    tokens = tokens_lib.commit_tokens(tokens, jnp.where(evalid, epos, n), e)
    m_new = jnp.sum(evalid, axis=1).astype(jnp.int32)
    logq_new = jnp.pad(sel, [(0, 0), (0, logq.shape[1] - E), (0, 0)])
    logq = jnp.where(live[:, None, None], logq_new, logq)
  else:
    m_new = jnp.zeros_like(m)
  m = jnp.where(live, m_new, m)
  if debug:
    trace = _trace_round(model, trace, it, hidden[:, K:], tgt_pos[:, K:], first, queries,
                         dict(c=jnp.where(live, c, -1), m=m2[:, 0], k=k2[:, 0], a=a, d=d,
                              p=raw_p), K=K, kmax=kmax)
  passes = (passes + live.astype(jnp.int32)).astype(jnp.int32)
  return (cache, tokens, c_new, m, logq, passes, k_row, it + 1, trace), a, live


def _trace_round(model, trace, it, h_x, tgt_x, first, queries, upd, *, K: int, kmax: int):
  """debug: records round ``it``; ``q[:, :, i, t-1]`` holds the query logits of causal slot i
  (its group i if i < m, the bonus group if i == m; ``e[:, :, i]`` queries, zeros after)."""
  batch, E = h_x.shape[0], K - 1
  xs = model.head(h_x, tgt_x)                                            # [B, Q, V]
  m2 = upd["m"][:, None]
  i = jnp.arange(K, dtype=jnp.int32)[None, :]
  g = jnp.where(i == m2, E, i)                                           # [B, K]
  size = jnp.where(i <= m2, _row_sizes(g, i == m2, upd["k"][:, None], queries), 0)
  start = jnp.asarray(first)[g]
  t = jnp.arange(E, dtype=jnp.int32)[None, None, :]
  qidx = jnp.minimum(start[:, :, None] + t, max(h_x.shape[1] - 1, 0)).reshape(batch, K * E)
  q = jnp.take_along_axis(xs, qidx[:, :, None], axis=1).reshape(batch, K, E, -1)
  upd["q"] = jnp.where((t < size[:, :, None])[..., None], q, 0.0)
  upd["e"] = size
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
  v = model.cfg.vocab_size
  trace = None
  if debug:
    trace = dict(c=jnp.full((n, batch), -1, jnp.int32), m=jnp.zeros((n, batch), jnp.int32),
                 k=jnp.zeros((n, batch), jnp.int32), a=jnp.zeros((n, batch), jnp.int32),
                 e=jnp.zeros((n, batch, kmax), jnp.int32),
                 d=jnp.zeros((n, batch, kmax), jnp.int32),
                 p=jnp.zeros((n, batch, kmax, v), jnp.float32),
                 q=jnp.zeros((n, batch, kmax, max(kmax - 1, 0), v), jnp.float32))
  rnd = [functools.partial(_round, model, order, tok_keys, filt, K=b, kmax=kmax,
                           cache_len=cache_len, queries=queries, debug=debug) for b in blocks]

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

  k0 = jnp.full((batch,), 2 if auto else kmax, jnp.int32)
  logq0 = jnp.zeros((batch, max(kmax - 1, 1), v), jnp.float64)
  carry = (cache, tokens0, plen, jnp.zeros((batch,), jnp.int32), logq0,
           jnp.zeros((batch,), jnp.int32), k0, jnp.int32(0), trace)
  _, tokens, _, _, _, passes, _, _, trace = jax.lax.while_loop(cond, body, carry)
  return tokens, passes, trace
