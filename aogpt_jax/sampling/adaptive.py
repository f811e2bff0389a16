"""Adaptive-order generation: the model chooses where to write next (``method="adaptive"``).

Each step queries every still-masked position (or ``candidates=C`` of them, drawn at random) in
ONE cached pass: the queries are copies of the frontier rank-slot, one per candidate target (the
paper's Figure 10 layout, as in `sampling.diffusion`). Every candidate's token is drawn exactly
as the other samplers draw (`tokens.sample_tokens`, key by position), a *policy* scores the
candidates, and the step commits its chosen positions in descending score (ties: lower position
first): the first becomes rank m (its query IS rank-slot m, so its keys/values are moved from
the scratch region to cache index m), the others ranks m+1.. , whose slots are computed once, as
the *catch-up* slots of the next pass. How many a step commits follows ``steps`` / ``schedule``
/ ``count_mode`` (the counts of the diffusion sampler), or, for the ``threshold`` policy, every
candidate whose largest probability is at least ``threshold`` (at least one per step; the number
of steps adapts).

A policy is a heuristic: the samples are NOT drawn from the model's joint distribution (except
for ``random``, which is the diffusion sampler with a random order).

Stochastic policies (``policy_temperature`` tau > 0). The k positions a step commits are drawn
without replacement from ``softmax(scores / tau)`` over the step's candidates (Plackett-Luce,
by Gumbel-top-k: float64 Gumbel noise keyed by row, step and position) and committed in the
drawn order; the exact log-probability of each choice is recorded (`Samples.order_logp`):
``scores[j] / tau - logsumexp(scores / tau over the candidates not drawn before j)``. The scores
are those of a *recomputable* policy (`register(..., recomputable=True)`: a function of the
probabilities and positions only, not of the drawn tokens or keys: ``max_prob``, ``margin``,
``entropy``, ``threshold``) on ``softmax(logits / temperature)`` in float32, the draw
distribution without the top-p cut (a discontinuous function of the logits), so
`posttrain.likelihood.order_logp` recomputes them exactly, with gradients. Every masked position
is a candidate (``candidates`` must be None). At tau -> 0 the draw is the deterministic policy's
order (top-p 1).

Policies are registered functions (`register`)::

    fn(probs, tokens, positions, step, keys) -> scores
    probs      float32 [B, Q, V]  the distribution each candidate's token was drawn from (after
                                  temperature and top-p; the model's softmax when greedy)
    tokens     int32 [B, Q]       the drawn tokens
    positions  int32 [B, Q]       the candidates' positions (meaningless where not a candidate)
    step       int32 []           the step (0, 1, ...)
    keys       [B] PRNG keys      this row's key of this step (for random choices)
    scores     float [B, Q]       higher = written earlier (NaN ranks last, as -inf)

Static shapes: one `jax.lax.while_loop` over steps; each iteration is one pass over a block of S =
Q + catch-up slots (Q query slots, padding masked and dropped); the KV cache (length n + Q:
rank-slots 0..n-1, query scratch n..n+Q-1) and the tokens are the loop carry. ``cached=False``
(`AdaptiveShape`) runs the uncached reference instead: a full explicit-mask forward over all n
rank-slots plus the queries at every step, the same policy and keys (the test oracle).

Shape suffixes of local arrays: B rows, N sequence length n, Q query slots, C catch-up slots,
S = Q + C, K cache length n + Q, V vocabulary, T steps.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Callable

import jax
import jax.numpy as jnp

from aogpt_jax.model import blanks, layers
from aogpt_jax.model import order_head as order_head_lib
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT, NO_TARGET, prompt_block
from aogpt_jax.sampling import tokens as tokens_lib
from aogpt_jax.sampling.diffusion import parallel_generation_mask
from aogpt_jax.sampling.state import Draw

PolicyFn = Callable[..., jax.Array]
_POLICIES: dict[str, PolicyFn] = {}
_RECOMPUTABLE: set[str] = set()
# Streams of a row's adaptive key (`tokens.POLICY_STREAM`): candidate subsets, policy keys, the
# stochastic policy's Gumbel noise.
CANDIDATE_STREAM, SCORE_STREAM, GUMBEL_STREAM = 0, 1, 2
# A score that never wins (a NaN score, a non-candidate) in the stochastic policy's softmax:
# finite, so its log-probabilities and their gradients stay finite where they are unused.
NEVER = -1e30


def register(name: str, recomputable: bool = False) -> Callable[[PolicyFn], PolicyFn]:
  """Registers ``fn(probs, tokens, positions, step, keys) -> scores`` as policy ``name``.

  ``scores`` must be float [B, Q], one per row and candidate (another shape raises a ValueError
  naming the policy when the sampler is traced, before compiling). A NaN score ranks last, as
  -inf: the step commits it only when it must commit that many, after every scored candidate
  (ties by position), and every position is still written exactly once. ``recomputable``: the
  scores depend on ``probs``, ``positions`` and ``step`` only (``tokens`` and ``keys`` are None
  when `posttrain.likelihood.order_logp` recomputes them): the policy may be stochastic
  (``policy_temperature`` > 0)."""

  def deco(fn: PolicyFn) -> PolicyFn:
    if name in _POLICIES:
      raise ValueError(f"adaptive policy {name!r} is already registered")
    _POLICIES[name] = fn
    if recomputable:
      _RECOMPUTABLE.add(name)
    return fn

  return deco


def names() -> list[str]:
  return sorted(_POLICIES)


def get(name: str) -> PolicyFn:
  if name not in _POLICIES:
    raise ValueError(f"sample.policy: unknown policy {name!r}; known: {', '.join(names())}")
  return _POLICIES[name]


def recomputable() -> list[str]:
  """The policies whose scores a teacher-forced pass recomputes (they may be stochastic)."""
  return sorted(_RECOMPUTABLE)


def check_settings(policy: str, candidates, threshold, policy_temperature) -> None:
  """One-line ValueErrors for the adaptive ``sample.*`` settings."""
  get(policy)          # raises naming the known policies
  c = candidates
  if c is not None and (isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1):
    raise ValueError(f"sample.candidates: must be None (every masked position) or an int >= 1, "
                     f"got {c!r}")
  t = threshold
  if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 < t <= 1:
    raise ValueError(f"sample.threshold: must be a number in (0, 1], got {t!r}")
  check_stochastic(policy, policy_temperature, candidates)


def check_stochastic(policy: str, policy_temperature, candidates, key: str = "sample") -> None:
  """One-line ValueErrors for ``{key}.policy_temperature`` and what it needs (every masked
  position a candidate, a recomputable policy)."""
  t = policy_temperature
  if isinstance(t, bool) or not isinstance(t, numbers.Real) or not (math.isfinite(t) and t >= 0):
    raise ValueError(f"{key}.policy_temperature: must be a finite number >= 0 (0: the "
                     f"deterministic policy), got {t!r}")
  if t == 0:
    return
  get(policy)
  if policy not in _RECOMPUTABLE:
    raise ValueError(f"{key}.policy: {policy!r} cannot be stochastic (policy_temperature={t}): "
                     f"its scores depend on the drawn tokens or keys; use one of "
                     f"{', '.join(recomputable())}")
  if candidates:
    raise ValueError(f"{key}.candidates: the stochastic policy (policy_temperature={t}) draws "
                     f"from every masked position; leave candidates unset, got {candidates!r}")


@register("max_prob", recomputable=True)
def max_prob(probs, tokens, positions, step, keys):
  """The largest probability of the candidate's distribution (MaskGIT / LLaDA confidence)."""
  return jnp.max(probs, axis=-1)


@register("confidence")
def confidence(probs, tokens, positions, step, keys):
  """The probability of the token drawn there (Dream's ``maskgit_plus`` with sampling)."""
  return jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]


@register("margin", recomputable=True)
def margin(probs, tokens, positions, step, keys):
  """Top-1 minus top-2 probability (Dream's ``topk_margin``)."""
  top = jax.lax.top_k(probs, 2)[0]
  return top[..., 0] - top[..., 1]


@register("entropy", recomputable=True)
def entropy(probs, tokens, positions, step, keys):
  """Minus the entropy: the lowest-entropy candidates first (Dream's ``entropy``)."""
  return jnp.sum(jnp.where(probs > 0, probs * jnp.log(jnp.where(probs > 0, probs, 1.0)), 0.0),
                 axis=-1)


@register("random")
def random(probs, tokens, positions, step, keys):
  """The control: a uniform score per (row, step, position), whatever the model predicts."""
  return position_uniforms(keys, positions)


@register("l2r", recomputable=True)
def left_to_right(probs, tokens, positions, step, keys):
  """The control: the leftmost masked positions first, whatever the model predicts (a fixed
  order as a policy: how a ``model.blank_block`` model decodes left to right)."""
  return -positions.astype(jnp.float32)


@register("threshold", recomputable=True)
def threshold(probs, tokens, positions, step, keys):
  """Scores as ``max_prob``; the sampler commits every candidate whose score is at least
  ``threshold`` (at least one per step; Fast-dLLM's parallel decoding)."""
  return max_prob(probs, tokens, positions, step, keys)


def position_uniforms(keys: jax.Array, positions: jax.Array) -> jax.Array:
  """float32 [B, Q]: ``uniform(fold_in(keys[b], positions[b, q]))``: a row's random numbers keyed
  by position, so they do not depend on which other positions are candidates."""
  return jax.vmap(lambda k, p: jax.vmap(
      lambda q: jax.random.uniform(jax.random.fold_in(k, q)))(p))(keys, positions)


@dataclasses.dataclass(frozen=True)
class AdaptiveShape:
  """The static settings of one compiled adaptive sampler."""
  queries: int          # Q: query slots (candidates per step)
  catchup: int          # catch-up slots per pass (>= the largest step's commits - 1)
  prefill: int          # slots of the prompt's prefill pass (0: none)
  max_steps: int        # loop bound (T, or n - shortest prompt for ``threshold``)
  candidates: int       # 0: every masked position; else C drawn at random per step
  policy: str
  threshold: float      # ``threshold`` policy only
  cached: bool = True   # False: the uncached reference (full forward per step)
  policy_temperature: float = 0.0   # tau > 0: positions drawn from softmax(scores / tau)
  phase_min: int = 0    # > 0: Q from which the steps run in phases (`phases`); 0: one phase
  order_head: bool = False   # the model's `model.order_head.OrderHead` re-scores the policy

  @property
  def phases(self) -> tuple[int, ...]:
    """The query slots of each phase of `adaptive_loop`: (Q,), or (Q, ceil(Q / 2)) when every
    masked position is a candidate and Q >= ``phase_min`` > 0: once every row has at most
    ceil(Q / 2) positions left, the steps run with that many query slots. The samples are the
    same (candidates, keys and draws are by position); a late step costs about half."""
    q = self.queries
    return (q,) if self.candidates or not 0 < self.phase_min <= q else (q, -(-q // 2))


def _candidates(masked_BxN, ckeys_B, q: int, subset: bool):
  """Candidate positions and validity [B, Q]: the masked positions in ascending order, or (subset)
  the Q masked positions with the largest per-position uniforms of the row's step key."""
  n = masked_BxN.shape[1]
  pos_N = jnp.arange(n, dtype=jnp.int32)
  if subset:
    u_BxN = position_uniforms(ckeys_B, jnp.broadcast_to(pos_N, masked_BxN.shape))
    key_BxN = jnp.where(masked_BxN, u_BxN, -1.0)
  else:
    key_BxN = jnp.where(masked_BxN, (n - pos_N).astype(jnp.float32), -1.0)
  top_BxQ, cand_BxQ = jax.lax.top_k(key_BxN, q)
  return cand_BxQ.astype(jnp.int32), top_BxQ >= 0


def _choose(scores_BxQ, cand_BxQ, valid_BxQ, count_B):
  """Indices [B, Q] of the candidates in commit order (score descending, NaN as -inf, then
  position ascending; non-candidates last) and how many are committed [B]."""
  q = scores_BxQ.shape[1]
  s_BxQ = scores_BxQ.astype(jnp.promote_types(scores_BxQ.dtype, jnp.float32))
  # NaN sorts after +inf, so a NaN candidate would rank behind the non-candidates (positions
  # already written); as -inf it ties with them and the second key puts it first.
  s_BxQ = jnp.where(jnp.isnan(s_BxQ), -jnp.inf, s_BxQ)
  neg = jnp.where(valid_BxQ, -s_BxQ, jnp.inf)
  second = jnp.where(valid_BxQ, cand_BxQ, jnp.iinfo(jnp.int32).max)
  idx_BxQ = jnp.broadcast_to(jnp.arange(q, dtype=jnp.int32), scores_BxQ.shape)
  _, _, idx_BxQ = jax.lax.sort((neg, second, idx_BxQ), dimension=1, num_keys=2)
  return idx_BxQ, jnp.minimum(count_B, jnp.sum(valid_BxQ, axis=1)).astype(jnp.int32)


def policy_probs(logits, draw: Draw):
  """float32 [..., V]: the distribution each token is drawn from (the softmax when greedy)."""
  if draw.greedy:
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  x = tokens_lib.filter_logits(logits, temperature=draw.temperature, top_p=draw.top_p,
                               top_p_rule=draw.top_p_rule)
  return jax.nn.softmax(x, axis=-1).astype(jnp.float32)


def score_probs(logits, draw: Draw):
  """float32 [..., V]: the stochastic policy's probabilities, ``softmax(logits / temperature)``
  (temperature 1 when greedy; no top-p), as `posttrain.likelihood.order_logp` recomputes them."""
  t = 1.0 if draw.greedy else draw.temperature
  return jax.nn.softmax(logits.astype(jnp.float32) / jnp.float32(t), axis=-1)


def plackett_luce_logp(z):
  """[..., Q]: ``z[j] - logsumexp(z[j:])``: the log-probability that item j is drawn j-th given
  items 0..j-1 were drawn before it, for the logits ``z`` [..., Q] in drawn order (items never
  drawn last, at `NEVER`)."""
  return z - jax.lax.cumlogsumexp(z, axis=z.ndim - 1, reverse=True)


def policy_logits(scores, valid, tau: float):
  """float32 [..]: the stochastic policy's logits ``scores / tau`` (NaN and non-candidates:
  `NEVER`)."""
  s = scores.astype(jnp.float32)
  return jnp.where(valid & ~jnp.isnan(s), s / jnp.float32(tau), NEVER)


def gumbel_choice(scores_BxQ, cand_BxQ, valid_BxQ, count_B, gkeys_B, tau: float):
  """The stochastic policy's commit order (`_choose`'s outputs) and the log-probability of each
  choice [B, Q] in commit order: Gumbel-top-k on ``scores / tau`` (float64 noise keyed by row and
  position: a Plackett-Luce draw without replacement)."""
  z_BxQ = policy_logits(scores_BxQ, valid_BxQ, tau)
  u_BxQ = jax.vmap(lambda k, p: jax.vmap(lambda q: jax.random.uniform(
      jax.random.fold_in(k, q), (), jnp.float64, minval=jnp.finfo(jnp.float64).tiny))(p))(
          gkeys_B, cand_BxQ)
  g_BxQ = jnp.where(valid_BxQ, z_BxQ.astype(jnp.float64) - jnp.log(-jnp.log(u_BxQ)), -jnp.inf)
  idx_BxQ, k_B = _choose(g_BxQ, cand_BxQ, valid_BxQ, count_B)
  return idx_BxQ, k_B, plackett_luce_logp(jnp.take_along_axis(z_BxQ, idx_BxQ, axis=1))


def _move_slot(cache, src_B, dst_B):
  """Copies every layer's keys/values at cache index ``src`` to ``dst`` per row (dst out of
  range: nothing)."""
  b_B = jnp.arange(src_B.shape[0])
  return tuple(tuple(c.at[b_B, :, dst_B].set(c[b_B, :, src_B], mode="drop") for c in kv)
               for kv in cache)


def _rank_block(order, tokens, rank_BxS, valid_BxS, tgt_BxS, write_BxS, lim_BxS, cache_len):
  """Slot tokens, positions, targets, write indices and mask [B, S, K] of rank-slot copies."""
  tok_BxS, pos_BxS = orders_lib.rank_slots(order, tokens, rank_BxS)
  write_BxS = jnp.where(valid_BxS, write_BxS, cache_len).astype(jnp.int32)
  lim_BxS = jnp.where(valid_BxS, lim_BxS, 0)
  kk_1x1xK = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  mask_BxSxK = (kk_1x1xK < lim_BxS[:, :, None]) | (kk_1x1xK == write_BxS[:, :, None])
  return (tok_BxS, pos_BxS, jnp.where(valid_BxS, tgt_BxS, NO_TARGET).astype(jnp.int32),
          write_BxS, mask_BxSxK)


def check_scores(scores, name: str, batch: int, q: int) -> None:
  """Raises (at trace time, before compiling) unless policy ``name``'s scores are [B, Q]."""
  if tuple(scores.shape) != (batch, q):
    raise ValueError(f"sample.policy: policy {name!r} returned scores of shape "
                     f"{list(scores.shape)}, expected [B, Q] = [{batch}, {q}] (one score per row "
                     f"and candidate)")


# The AO-GPT samplers' `AdaptiveShape.phase_min`: from this Q on, the late steps run with half
# the query slots (below it, one phase: a second loop body is compile time for little)
PHASE_MIN_QUERIES = 16


def adaptive_loop(order0, tokens0, prompt_len, tok_keys, counts, adapt_keys, *,
                  shape: AdaptiveShape, draw: Draw, vocab: int, forward, on_commit, extra0,
                  phases: tuple[int, ...] | None = None, head=None):
  """The step loop both adaptive samplers share; only the forward differs. Each step: the candidates
  (`_candidates`), their logits and the output head's input features ``forward(extra, order,
  tokens, masked, m, cand, valid) -> ((logits [B, q, V], features [B, q, d] or None), extra)``
  (q: the phase's query slots, ``cand.shape[1]``; one `jax.lax.while_loop` per phase of
  ``phases``, decreasing, each next one entered once every row has at most that many positions
  masked; None: Q throughout), the token draw (key by position), the policy's scores (``head``: a
  `model.order_head.OrderHead` re-scores them, ``shape.order_head``), the commit (`_choose`, or
  `gumbel_choice` for a stochastic policy: counts, or ``threshold``), then ``on_commit(extra,
  idx, k, m) -> extra``. Returns (tokens [B, n], order [B, n], steps per row [B], step_of_rank
  int32 [B, n]: the step at which rank r was written, -1 for prompt ranks, per-step query logits
  [max_steps, B, Q, V] if ``draw.debug`` else None, and if ``draw.logp`` the record float32 [B,
  n, 3] in ORIGINAL order: each written token's `tokens.drawn_logp` (drawn, model) and the
  log-probability of the choice of its position (0 for a deterministic policy and at the prompt),
  else None)."""
  batch, n = order0.shape
  phases = tuple(phases or (shape.queries,))
  policy = get(shape.policy)
  tau = shape.policy_temperature
  rows_B = jnp.arange(batch)
  ckeys_B = tokens_lib.stream(adapt_keys, CANDIDATE_STREAM)
  skeys_B = tokens_lib.stream(adapt_keys, SCORE_STREAM)
  gkeys_B = tokens_lib.stream(adapt_keys, GUMBEL_STREAM)
  m0_B = prompt_len.astype(jnp.int32)
  in_prompt_BxN = jnp.zeros((batch, n), bool).at[rows_B[:, None], order0].set(
      jnp.arange(n)[None, :] < m0_B[:, None])
  dbg = (jnp.full((shape.max_steps, batch, shape.queries, vocab), -jnp.inf, jnp.float32)
         if draw.debug else None)
  rec = jnp.zeros((batch, n, 3), jnp.float32) if draw.logp else None
  fold = lambda keys, i: jax.vmap(lambda k: jax.random.fold_in(k, i))(keys)  # noqa: E731

  def cond(state, until):
    i, _, _, _, masked_BxN = state[:5]
    return (i < shape.max_steps) & (jnp.max(jnp.sum(masked_BxN, axis=1)) > until)

  def body(state, q):
    i, extra, tokens_BxN, order_BxN, masked_BxN, m_B, steps_B, sor_BxN, dbg, rec = state
    cand_BxQ, valid_BxQ = _candidates(masked_BxN, fold(ckeys_B, i), q, shape.candidates > 0)
    (logits_BxQxV, feats_BxQxD), extra = forward(extra, order_BxN, tokens_BxN, masked_BxN, m_B,
                                                 cand_BxQ, valid_BxQ)
    new_BxQ = tokens_lib.sample_tokens(
        logits_BxQxV, tokens_lib.token_keys(tok_keys, cand_BxQ), temperature=draw.temperature,
        top_p=draw.top_p, top_p_rule=draw.top_p_rule, greedy=draw.greedy)
    probs_BxQxV = (score_probs if tau > 0 else policy_probs)(logits_BxQxV, draw)
    scores_BxQ = policy(probs_BxQxV, new_BxQ, cand_BxQ, i, fold(skeys_B, i))
    check_scores(scores_BxQ, shape.policy, batch, q)
    if head is not None:
      scores_BxQ = head(probs_BxQxV, scores_BxQ, cand_BxQ, valid_BxQ, feats_BxQxD)
    if shape.policy == "threshold":
      sure_B = jnp.sum(valid_BxQ & (jnp.max(probs_BxQxV, axis=-1) >= shape.threshold), axis=1)
      count_B = jnp.maximum(sure_B, 1)
    else:
      count_B = jnp.where(i < counts.shape[1],
                          counts[:, jnp.minimum(i, counts.shape[1] - 1)], 0)
    if tau > 0:
      idx_BxQ, k_B, olp_BxQ = gumbel_choice(scores_BxQ, cand_BxQ, valid_BxQ, count_B,
                                            fold(gkeys_B, i), tau)
    else:
      idx_BxQ, k_B = _choose(scores_BxQ, cand_BxQ, valid_BxQ, count_B)
      olp_BxQ = jnp.zeros(idx_BxQ.shape, jnp.float32)
    j_1xQ = jnp.arange(q, dtype=jnp.int32)[None, :]
    take_BxQ = j_1xQ < k_B[:, None]
    pos_BxQ = jnp.take_along_axis(cand_BxQ, idx_BxQ, axis=1)        # in commit order
    tok_BxQ = jnp.take_along_axis(new_BxQ, idx_BxQ, axis=1)
    at_BxQ = jnp.where(take_BxQ, pos_BxQ, n)
    rank_BxQ = jnp.where(take_BxQ, m_B[:, None] + j_1xQ, n)
    tokens_BxN = tokens_lib.commit_tokens(tokens_BxN, at_BxQ, tok_BxQ)
    order_BxN = order_BxN.at[rows_B[:, None], rank_BxQ].set(pos_BxQ, mode="drop")
    sor_BxN = sor_BxN.at[rows_B[:, None], rank_BxQ].set(i, mode="drop")
    masked_BxN = masked_BxN.at[rows_B[:, None], at_BxQ].set(False, mode="drop")
    extra = on_commit(extra, idx_BxQ, k_B, m_B)
    if dbg is not None:
      dbg = dbg.at[i, :, :q].set(logits_BxQxV)
    if rec is not None:
      lp_BxQx2 = jnp.take_along_axis(tokens_lib.drawn_logp(
          logits_BxQxV, new_BxQ, temperature=draw.temperature, top_p=draw.top_p,
          top_p_rule=draw.top_p_rule, greedy=draw.greedy), idx_BxQ[..., None], axis=1)
      rec = layers.row_set(rec, at_BxQ, jnp.concatenate([lp_BxQx2, olp_BxQ[..., None]], -1))
    return (i + 1, extra, tokens_BxN, order_BxN, masked_BxN, m_B + k_B, steps_B + (k_B > 0),
            sor_BxN, dbg, rec)

  state = (jnp.int32(0), extra0, tokens0, order0, ~in_prompt_BxN, m0_B, jnp.zeros_like(m0_B),
           jnp.full((batch, n), -1, jnp.int32), dbg, rec)
  for k, q in enumerate(phases):
    until = phases[k + 1] if k + 1 < len(phases) else 0
    state = jax.lax.while_loop(functools.partial(cond, until=until),
                               functools.partial(body, q=q), state)
  _, _, tokens_BxN, order_BxN, _, _, steps_B, sor_BxN, dbg, rec = state
  return tokens_BxN, order_BxN, steps_B, sor_BxN, dbg, rec


def _head(model: AOGPT, shape: AdaptiveShape):
  """The model's order head when ``shape.order_head`` (a one-line error if it has none)."""
  return order_head_lib.require(model, "sample.order_head") if shape.order_head else None


def sample_adaptive(model: AOGPT, order0, tokens0, prompt_len, tok_keys, counts, adapt_keys, *,
                    shape: AdaptiveShape, draw: Draw):
  """Traced body of the adaptive sampler. ``order0`` [B, n]: prompt positions first (ranks <
  prompt_len; the rest is overwritten as positions are chosen); ``counts`` int32 [B, T] commits
  per step (unused by ``threshold``); ``adapt_keys`` [B]. Returns `adaptive_loop`'s (tokens,
  order, steps, step_of_rank, logits, record)."""
  if model.cfg.blank_block:
    return sample_blank(model, order0, tokens0, prompt_len, tok_keys, counts, adapt_keys,
                        shape=shape, draw=draw)
  batch, n = order0.shape
  c = shape.catchup
  cache_len = n + shape.queries
  m0_B = prompt_len.astype(jnp.int32)
  block_B = prompt_block(model.cfg, m0_B)     # a bidirectional prompt (None: causal)
  cache = None
  if shape.cached:
    cache = model.init_cache(batch, cache_len)
    if shape.prefill:
      r_BxP = jnp.broadcast_to(jnp.arange(shape.prefill, dtype=jnp.int32), (batch, shape.prefill))
      ok_BxP = r_BxP < m0_B[:, None]
      tok, pos, tgt, write, mask = _rank_block(order0, tokens0, r_BxP, ok_BxP,
                                               orders_lib.slot_target(order0, r_BxP), r_BxP,
                                               orders_lib.block_limit(r_BxP, block_B), cache_len)
      _, cache = model.hidden_slots(tok, pos, tgt, mask=mask, cache=cache, write_index=write)

  def forward(extra, order, tokens, masked_BxN, m_B, cand_BxQ, valid_BxQ):
    cache, prevk_B = extra
    q = cand_BxQ.shape[1]                     # this phase's query slots
    m_BxQ = jnp.broadcast_to(m_B[:, None], (batch, q))
    if not shape.cached:      # the reference: every rank-slot and the queries, explicit mask
      rank_BxN = orders_lib.all_ranks(order)
      rtok, rpos = orders_lib.rank_slots(order, tokens, rank_BxN)
      qtok, qpos = orders_lib.rank_slots(order, tokens, m_BxQ)
      tok = jnp.concatenate([rtok, qtok], axis=1)
      pos = jnp.concatenate([rpos, qpos], axis=1)
      tgt = jnp.concatenate([order, jnp.where(valid_BxQ, cand_BxQ, NO_TARGET)], axis=1)
      hidden, _ = model.hidden_slots(tok, pos, tgt.astype(jnp.int32),
                                     mask=parallel_generation_mask(m_B, n, q, block_B))
      return model.head_and_features(hidden[:, n:], tgt[:, n:].astype(jnp.int32)), extra
    j_1xC = jnp.arange(c, dtype=jnp.int32)[None, :]
    crank_BxC = (m_B - prevk_B + 1)[:, None] + j_1xC
    cok_BxC = j_1xC < (prevk_B - 1)[:, None]
    rank_BxS = jnp.concatenate([m_BxQ, crank_BxC], axis=1)
    ok_BxS = jnp.concatenate([valid_BxQ, cok_BxC], axis=1)
    tgt_BxS = jnp.concatenate([cand_BxQ, orders_lib.slot_target(order, crank_BxC)], axis=1)
    write_BxS = jnp.concatenate(
        [jnp.broadcast_to(n + jnp.arange(q, dtype=jnp.int32), (batch, q)), crank_BxC], axis=1)
    tok, pos, tgt, write, mask = _rank_block(order, tokens, rank_BxS, ok_BxS, tgt_BxS, write_BxS,
                                             rank_BxS, cache_len)
    hidden, cache = model.hidden_slots(tok, pos, tgt, mask=mask, cache=cache, write_index=write)
    return model.head_and_features(hidden[:, :q], tgt[:, :q]), (cache, prevk_B)

  def on_commit(extra, idx_BxQ, k_B, m_B):
    cache, _ = extra
    if shape.cached:      # the first chosen query IS rank-slot m: scratch n + j -> index m
      cache = _move_slot(cache, n + idx_BxQ[:, 0], jnp.where(k_B > 0, m_B, cache_len))
    return cache, k_B

  return adaptive_loop(order0, tokens0, prompt_len, tok_keys, counts, adapt_keys, shape=shape,
                       draw=draw, vocab=model.cfg.vocab_size, forward=forward,
                       on_commit=on_commit, extra0=(cache, jnp.zeros_like(m0_B)),
                       phases=shape.phases, head=_head(model, shape))


def sample_blank(model: AOGPT, order0, tokens0, prompt_len, tok_keys, counts, adapt_keys, *,
                 shape: AdaptiveShape, draw: Draw):
  """`sample_adaptive` for ``model.blank_block`` (`model.blanks`): the cache holds the WRITTEN
  slots (index r: the token of rank r at its position, no target; the prompt's prefilled, a
  bidirectional prompt as one block), and each pass computes every blank's query (the START
  vector at the blank's position, conditioned on it, in the scratch region n..n+Q-1, the queries
  seeing the written slots and each other) plus, as causal catch-up slots, the ranks the last
  step committed. The reference (``cached=False``): `blanks.query_layout`, a full forward of the
  n written slots and the queries at every step."""
  batch, n = order0.shape
  c = shape.catchup
  cache_len = n + shape.queries
  causal = model.cfg.blank_attention == "causal"
  m0_B = prompt_len.astype(jnp.int32)
  block_B = prompt_block(model.cfg, m0_B)
  kk_1x1xK = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]

  cache = None
  if shape.cached:
    cache = model.init_cache(batch, cache_len)
    if shape.prefill:
      r_BxP = jnp.broadcast_to(jnp.arange(shape.prefill, dtype=jnp.int32), (batch, shape.prefill))
      tok, pos, tgt, write, mask = blanks.written_cache_slots(
          order0, tokens0, r_BxP, r_BxP < m0_B[:, None], orders_lib.block_limit(r_BxP, block_B),
          cache_len)
      _, cache = model.hidden_slots(tok, pos, tgt, mask=mask, cache=cache, write_index=write)

  def forward(extra, order, tokens, masked_BxN, m_B, cand_BxQ, valid_BxQ):
    cache, prevk_B = extra
    q = cand_BxQ.shape[1]                     # this phase's query slots
    targets_BxQ = jnp.where(valid_BxQ, cand_BxQ, NO_TARGET)
    if not shape.cached:
      tok, pos, tgt, mask = blanks.query_layout(
          tokens, order, jnp.broadcast_to(m_B[:, None], (batch, q)), targets_BxQ, block_B,
          causal=causal)
      hidden, _ = model.hidden_slots(tok, pos, tgt, mask=mask)
      return model.head_and_features(hidden[:, n:], tgt[:, n:]), extra
    j_1xC = jnp.arange(c, dtype=jnp.int32)[None, :]
    crank_BxC = (m_B - prevk_B)[:, None] + j_1xC        # the last step's commits
    ctok, cpos, ctgt, cwrite, cmask = blanks.written_cache_slots(
        order, tokens, crank_BxC, j_1xC < prevk_B[:, None], crank_BxC, cache_len)
    qtok, qpos, qtgt = blanks.blank_queries(targets_BxQ)
    scratch_BxQ = jnp.broadcast_to(n + jnp.arange(q, dtype=jnp.int32), (batch, q))
    seen_BxQxQ = jnp.broadcast_to(valid_BxQ[:, None, :], (batch, q, q))
    if causal:          # a query sees the blanks at positions up to its own
      seen_BxQxQ = seen_BxQxQ & orders_lib.mask_from_ranks(targets_BxQ, targets_BxQ)
    seen_BxQxK = jnp.pad(seen_BxQxQ, ((0, 0), (0, 0), (n, cache_len - n - q)))
    qmask = ((kk_1x1xK < m_B[:, None, None]) | seen_BxQxK) & valid_BxQ[..., None]
    qmask = qmask | (kk_1x1xK == scratch_BxQ[..., None])
    hidden, cache = model.hidden_slots(
        jnp.concatenate([qtok, ctok], 1), jnp.concatenate([qpos, cpos], 1),
        jnp.concatenate([qtgt, ctgt], 1), mask=jnp.concatenate([qmask, cmask], 1), cache=cache,
        write_index=jnp.concatenate([scratch_BxQ, cwrite], 1))
    return model.head_and_features(hidden[:, :q], qtgt), (cache, prevk_B)

  def on_commit(extra, idx_BxQ, k_B, m_B):
    return extra[0], k_B          # the commits are the next pass's catch-up slots

  return adaptive_loop(order0, tokens0, prompt_len, tok_keys, counts, adapt_keys, shape=shape,
                       draw=draw, vocab=model.cfg.vocab_size, forward=forward,
                       on_commit=on_commit, extra0=(cache, jnp.zeros_like(m0_B)),
                       phases=shape.phases, head=_head(model, shape))
