"""The exact log-likelihood of a rollout under the order and step structure it was generated with.

A sampler writes the tokens of a row in an order (``order[b, r]``: the position written r-th,
as `sampling.Samples.order`) over steps (``steps[b, r]``: the step that wrote rank r; several
ranks share a step under parallel generation). Every token of a step is drawn from the model
conditioned on the tokens of EARLIER steps only (docs/method.md, Figure 10's
parallel-generation mask: tokens of one step do not see each other), so the probability the
model gave the rollout is a product over ranks, and one teacher-forced pass recomputes it,
exactly and with gradients (a masked-diffusion model would have to estimate it)::

    logp_BxN = sequence_logp(model, tokens, order, steps, prompt)
    logp_BxN[b, r] = log p(x_{order[b, r]} | the tokens of ranks with steps < steps[b, r])

(0 at the prompt's ranks). The pass: the n rank-slots in sigma order, causal (rank-slot r holds
START or x_{order[r-1]} and targets order[r], `orders.rank_slots`), then one *query* slot per
rank: the query of rank r is a copy of rank-slot m(r) = the first rank of its step (the frontier
of that step) with target order[r]; it sees rank-slots 0..m(r)-1 and itself, never another
query: exactly the query the sampler drew rank r from (`diffusion.full_step_slots`, with all
steps' queries in one pass). With one token per step m(r) = r, the query is rank-slot r itself,
and the result is minus `aogpt.loss`'s per-token NLL.

Conventions: ``steps`` must be non-decreasing along the ranks after the prompt (a sampler's
steps are); the prompt's ranks (``prompt`` bool [B, n] in ORIGINAL order, put first by
`orders.prompt_first`) may hold any step value (-1 by convention) and are context for every
answer rank. `check_rollout` checks shapes and these rules on host arrays.

Shape suffixes: B rows, N sequence length n, F = 2n slots (rank-slots, then queries), V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flax import struct

from aogpt_jax.model import blanks, layers
from aogpt_jax.model import order_head as order_head_lib
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT, NO_TARGET, check_length, prompt_block
from aogpt_jax.sampling import adaptive as adaptive_lib

NO_PROMPT_STEP = -1     # the step value of prompt ranks (any value < every answer step works)
# `blank_scan` folds two steps into a pass (False: one step a pass, W query slots;
# benchmarks/grpo_speed.py measures what folding buys)
FOLD_STEPS = True


def frontier(steps: jax.Array, scored: jax.Array) -> jax.Array:
  """int32 [B, n]: m(r), the number of ranks written at steps before rank r's (prompt ranks
  count as written before every answer rank); for non-decreasing steps, the first rank of r's
  step, i.e. the frontier of the step that wrote rank r."""
  low = jnp.iinfo(jnp.int32).min
  eff_BxN = jnp.where(scored, steps.astype(jnp.int32), low)
  return jnp.sum(eff_BxN[:, None, :] < eff_BxN[:, :, None], axis=-1, dtype=jnp.int32)


def likelihood_slots(tokens: jax.Array, order: jax.Array, m: jax.Array,
                     targets: jax.Array | None = None, block: jax.Array | None = None):
  """The slots of a teacher-forced pass: the n rank-slots (causal), then G query slots, query g
  a copy of rank-slot ``m[b, g]`` with target position ``targets[b, g]`` (None: ``order``, G =
  n: the pass of the module docstring; NO_TARGET: a padding query) that sees rank-slots
  0..m-1 and itself. Returns tokens, position rows, targets [B, n + G] and the mask
  [B, n + G, n + G]; ``m`` [B, G] (`frontier` for the module's pass). ``block`` [B]: a
  bidirectional prompt's rank-slots (`aogpt.prompt_block`) see each other both ways."""
  n, g = order.shape[1], m.shape[1]
  rtok_BxN, rpos_BxN = orders_lib.rank_slots(order, tokens, orders_lib.all_ranks(order))
  qtok_BxG, qpos_BxG = orders_lib.rank_slots(order, tokens, m)
  tok_BxF = jnp.concatenate([rtok_BxN, qtok_BxG], axis=1)
  pos_BxF = jnp.concatenate([rpos_BxN, qpos_BxG], axis=1)
  tgt_BxF = jnp.concatenate([order, order if targets is None else targets],
                            axis=1).astype(jnp.int32)
  a_F = jnp.arange(n + g, dtype=jnp.int32)
  row_1xFx1, col_1x1xF = a_F[None, :, None], a_F[None, None, :]
  lim_BxFx1 = jnp.concatenate([jnp.zeros((order.shape[0], n), m.dtype), m], axis=1)[:, :, None]
  tied_BxF = orders_lib.block_ranks(jnp.broadcast_to(a_F, (order.shape[0], n + g)), block)
  rank_rows_BxFxF = (row_1xFx1 < n) & orders_lib.mask_from_ranks(tied_BxF, tied_BxF)
  query_rows_BxFxF = (row_1xFx1 >= n) & ((col_1x1xF < lim_BxFx1) | (col_1x1xF == row_1xFx1))
  return tok_BxF, pos_BxF, tgt_BxF, rank_rows_BxFxF | query_rows_BxFxF


def rollout_logits(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
                   prompt: jax.Array | None = None, *, width: int | None = None) -> jax.Array:
  """float32 [B, n, V] in rank layout: the logits rank r's token was drawn from (temperature
  1), i.e. the model's conditional given the ranks of earlier steps (meaningless at the prompt's
  ranks); arguments as `sequence_logp`. One pass over 2n slots; for ``model.blank_block``, whose
  queries of a step see each other, the written slots once and then the steps' blanks, two steps
  a pass (`blank_scan`; ``width``: W, at least every row's answer length, None: n)."""
  b, n = tokens.shape
  check_length(model.cfg, n)
  if model.cfg.blank_block:
    return blank_scan(model, tokens, order, steps, prompt, width=width)
  prompt = jnp.zeros((b, n), bool) if prompt is None else prompt
  m_BxN = frontier(steps, orders_lib.scored_ranks(prompt))
  tok_BxF, pos_BxF, tgt_BxF, mask_BxFxF = likelihood_slots(
      tokens, order, m_BxN, block=prompt_block(model.cfg, jnp.sum(prompt, -1, dtype=jnp.int32)))
  query_BxN = jnp.broadcast_to(jnp.arange(n, 2 * n, dtype=jnp.int32), (b, n))
  hidden_BxNxD, _ = model.hidden_slots(tok_BxF, pos_BxF, tgt_BxF, mask=mask_BxFxF,
                                       query=query_BxN)
  return model.head(hidden_BxNxD, order.astype(jnp.int32))


def target_logp(logits: jax.Array, target: jax.Array, temperature: float = 1.0) -> jax.Array:
  """[B, n]: log-softmax of ``logits`` [B, n, V] / ``temperature`` at ``target`` [B, n]."""
  logits_BxNxV = logits / jnp.float32(temperature)
  return (jnp.take_along_axis(logits_BxNxV, target[..., None], axis=-1)[..., 0]
          - jax.nn.logsumexp(logits_BxNxV, axis=-1))


def token_logp(logits: jax.Array, tokens: jax.Array, order: jax.Array, prompt: jax.Array | None,
               temperature: float = 1.0) -> jax.Array:
  """[B, n]: log-softmax of `rollout_logits` / ``temperature`` at each rank's token (0 at the
  prompt's ranks)."""
  logp_BxN = target_logp(logits, orders_lib.permute(tokens, order), temperature)
  if prompt is None:
    return logp_BxN
  return jnp.where(orders_lib.scored_ranks(prompt), logp_BxN, 0.0)


def sequence_logp(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
                  prompt: jax.Array | None = None, *, temperature: float = 1.0,
                  width: int | None = None) -> jax.Array:
  """float32 [B, n] in rank layout: ``logp[b, r] = log p(x_{order[b, r]} | tokens of the ranks
  written at steps < steps[b, r])``, 0 at the prompt's ranks (module docstring). ``tokens``
  int [B, n] in ORIGINAL order; ``order``, ``steps`` int [B, n]; ``prompt`` bool [B, n] in
  original order (None: no prompt). ``temperature``: the logits are divided by it first (the
  model's own distribution at 1). ``width``: a blank model's (`rollout_logits`); its
  log-probabilities are taken inside each checkpointed pass (`blank_scan`'s ``reduce``).
  Traceable and differentiable in the model's parameters."""
  if not model.cfg.blank_block:
    return token_logp(rollout_logits(model, tokens, order, steps, prompt), tokens, order, prompt,
                      temperature)
  target_BxN = orders_lib.permute(tokens, order)
  logp_BxN = blank_scan(model, tokens, order, steps, prompt, width=width,
                        reduce=lambda lg: target_logp(lg, target_BxN, temperature))
  return logp_BxN if prompt is None else jnp.where(orders_lib.scored_ranks(prompt), logp_BxN, 0.0)


# ------------------------------------------------------------------- the order's log-probability

@struct.dataclass
class StepQueries:
  """The queries of `order_pass`, T steps x W candidates: query (t, j) is a copy of rank-slot
  ``start[t]`` (the frontier of the row's t-th step) with target rank ``start[t] + j``."""
  start: jax.Array     # int32 [B, T]: first rank of step t (n: the row has no step t)
  valid: jax.Array     # bool [B, T, W]: start[t] + j < n (a candidate still unwritten at t)
  step: jax.Array      # int32 [B, n]: t of each rank (-1 at the prompt)
  slot: jax.Array      # int32 [B, n]: j of each rank's own query at its step (r - start[t])


def step_queries(steps: jax.Array, scored: jax.Array, max_steps: int, width: int) -> StepQueries:
  """The `StepQueries` of a rollout (``steps`` as `sequence_logp`'s, ``scored`` its answer
  ranks); a row's steps beyond ``max_steps`` or candidates beyond ``width`` are dropped
  (`check_rollout` refuses such rows on the host)."""
  b, n = steps.shape
  m_BxN = frontier(steps, scored)
  r_1xN = jnp.arange(n, dtype=jnp.int32)[None, :]
  first_BxN = scored & (m_BxN == r_1xN)                       # the first rank of its step
  t_BxN = jnp.where(scored, jnp.cumsum(first_BxN, axis=1, dtype=jnp.int32) - 1, -1)
  start_BxT = layers.row_set(jnp.full((b, max_steps), n, jnp.int32),
                             jnp.where(first_BxN, t_BxN, max_steps),
                             jnp.broadcast_to(r_1xN, (b, n)))
  j_W = jnp.arange(width, dtype=jnp.int32)
  return StepQueries(start=start_BxT, valid=start_BxT[:, :, None] + j_W < n, step=t_BxN,
                     slot=jnp.where(scored, r_1xN - m_BxN, 0))


def _passes(model: AOGPT, tokens, order, steps, prompt, max_steps, width, steps_per_pass):
  """What `order_pass` and `order_scan` share: (`StepQueries`, c steps per pass, the passes'
  inputs (frontiers, targets) [P, B, c W] (padding queries past the last step), and
  ``logits_of(m, targets)``: one pass's query logits [B, c W, V] and the output head's input
  features [B, c W, d])."""
  b, n = tokens.shape
  check_length(model.cfg, n)
  t, w = int(max_steps or n), int(width or n)
  prompt = jnp.zeros((b, n), bool) if prompt is None else prompt
  sq = step_queries(steps, orders_lib.scored_ranks(prompt), t, w)
  block = prompt_block(model.cfg, jnp.sum(prompt, -1, dtype=jnp.int32))
  # model.blank_block: a step's queries are its blanks (every candidate; they see each other),
  # over the written slots' keys and values computed once (`_blank_cache`): one step per pass
  per = 1 if model.cfg.blank_block else max(1, min(t, int(steps_per_pass or n // w)))
  passes = -(-t // per)
  start_BxP = jnp.pad(sq.start, ((0, 0), (0, passes * per - t)), constant_values=n)
  valid_BxPxW = start_BxP[:, :, None] + jnp.arange(w, dtype=jnp.int32) < n
  rank_BxPxW = jnp.minimum(start_BxP[:, :, None] + jnp.arange(w, dtype=jnp.int32), n - 1)
  tgt_BxPxW = jnp.where(valid_BxPxW, orders_lib.slot_target(order, rank_BxPxW.reshape(b, -1))
                        .reshape(b, -1, w), NO_TARGET)
  m_BxPxW = jnp.where(valid_BxPxW, start_BxP[:, :, None], 0)
  chunks = lambda x: jnp.moveaxis(x.reshape(b, passes, per * w), 1, 0)  # noqa: E731
  query_BxG = jnp.broadcast_to(jnp.arange(n, n + per * w, dtype=jnp.int32), (b, per * w))

  if model.cfg.blank_block:
    logits_of = _blank_cache(model, tokens, order, block, w)
  else:
    def logits_of(m_BxG, tgt_BxG):
      tok, pos, tgt, mask = likelihood_slots(tokens, order, m_BxG, tgt_BxG, block)
      hidden_BxGxD, _ = model.hidden_slots(tok, pos, tgt, mask=mask, query=query_BxG)
      return model.head_and_features(hidden_BxGxD, tgt_BxG)

  return sq, per, (chunks(m_BxPxW), chunks(tgt_BxPxW)), logits_of


def _blank_cache(model: AOGPT, tokens, order, block, w: int):
  """For ``model.blank_block``: ``logits_of(m, targets)`` -> (logits, the output head's input
  features) of one step's W blank queries
  (`blanks.query_layout`'s rows, exactly), over the n written slots' keys and values computed
  ONCE here (written slots never see a blank, so they are the same at every step; the cached
  sampler's prefill): a step costs W query slots against n + W keys instead of a pass over
  n + W slots, n + T W slots in all instead of T (n + W)."""
  b, n = tokens.shape
  tok, pos, tgt = blanks.written_slots(order, tokens, orders_lib.all_ranks(order))
  mask_BxNxK = blanks.written_mask(b, n, w, block)
  _, cache = model.hidden_slots(tok, pos, tgt, mask=mask_BxNxK, cache=model.init_cache(b, n + w),
                                write_index=jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32),
                                                             (b, n)))
  at_W = jnp.broadcast_to(jnp.arange(n, n + w, dtype=jnp.int32), (b, w))
  causal = model.cfg.blank_attention == "causal"

  def logits_of(m_BxW, tgt_BxW):
    qtok, qpos, qtgt = blanks.blank_queries(tgt_BxW)
    hidden_BxWxD, _ = model.hidden_slots(qtok, qpos, qtgt,
                                         mask=blanks.query_mask(m_BxW, qtgt, n, causal),
                                         cache=cache, write_index=at_W)
    return model.head_and_features(hidden_BxWxD, tgt_BxW)

  return logits_of


def fold_steps(sq: StepQueries, n: int, width: int):
  """The passes of `blank_scan`: (pass [B, T], column offset [B, T]) of each step's queries.
  Step t of a row of T_r steps has c_t = n - start[t] blank queries (every unwritten answer
  position), so the T_r steps hold a triangle of queries; a row FOLDS it when every pair (t,
  T_r - 1 - t) fits ``width`` columns: step t and its partner share pass min(t, T_r - 1 - t),
  the lower step in columns 0..c_t - 1, the upper one after it (one token a step: c_t +
  c_{T_r-1-t} = answer + 1, so width W + 1 folds every row into ceil(T_r / 2) passes instead of
  T_r). A row that does not fit keeps one step a pass (pass t, offset 0)."""
  b, t = sq.start.shape
  t_1xT = jnp.arange(t, dtype=jnp.int32)[None, :]
  count_BxT = jnp.maximum(n - sq.start, 0)                   # 0 past the row's last step
  last_Bx1 = jnp.sum(sq.start < n, axis=1, dtype=jnp.int32)[:, None] - 1
  partner_BxT = last_Bx1 - t_1xT
  pc_BxT = jnp.where((partner_BxT >= 0) & (partner_BxT < t),
                     jnp.take_along_axis(count_BxT, jnp.clip(partner_BxT, 0, t - 1), axis=1), 0)
  upper_BxT = t_1xT > partner_BxT                            # after its partner in the pass
  fits_B = jnp.all(upper_BxT | (t_1xT == partner_BxT) | (count_BxT + pc_BxT <= width), axis=1)
  pass_BxT = jnp.where(fits_B[:, None], jnp.minimum(t_1xT, jnp.maximum(partner_BxT, 0)), t_1xT)
  off_BxT = jnp.where(fits_B[:, None] & upper_BxT & (partner_BxT >= 0), pc_BxT, 0)
  return pass_BxT, off_BxT


def check_width(width: int | None, prompt, n: int) -> None:
  """A one-line ValueError when ``width`` is below a row's answer length (its queries would be
  dropped and their log-probabilities read 0); checked when ``prompt`` is known on the host
  (None, or a concrete array), not on a traced one (`check_rollout` checks host rollouts)."""
  if width is None or isinstance(prompt, jax.core.Tracer):
    return
  need = n if prompt is None else n - int(np.asarray(prompt, bool).sum(-1).min(initial=n))
  if int(width) < need:
    raise ValueError(f"width={width}: below the longest answer ({need} positions of {n}); "
                     f"expected at least {need}, or None")


def blank_scan(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
               prompt: jax.Array | None = None, *, width: int | None = None,
               reduce=None) -> jax.Array:
  """float32 [B, n, V]: `rollout_logits` of a ``model.blank_block`` model (each rank's token's
  conditional: its step's blank query, which sees the written ranks of earlier steps and the
  step's other blanks). The written slots' keys and values once (`_blank_cache`), then a
  `jax.lax.scan` over passes of W + 1 query columns (W = ``width``, at least every row's answer
  length; None: n), each holding two steps' blanks folded together (`fold_steps`: half the
  passes of one step a pass, and no padding query at one token a step), each under
  `jax.checkpoint`; passes past every row's last one are skipped. The values and gradients are
  those of one pass per step (tests/test_blank_block.py). ``reduce(logits [B, n, V]) -> [B, n,
  ...]``: applied to each pass's rank logits inside the checkpointed pass, its sum over the
  passes returned instead (`sequence_logp`: the token log-probabilities, so that a gradient
  whose cotangent does not depend on them never runs the passes forward outside the
  recompute)."""
  b, n = tokens.shape
  check_length(model.cfg, n)
  check_width(width, prompt, n)
  w = int(width or n)
  fw = w + 1 if FOLD_STEPS else w
  prompt = jnp.zeros((b, n), bool) if prompt is None else prompt
  sq = step_queries(steps, orders_lib.scored_ranks(prompt), w, w)   # a step writes >= 1 rank
  t = w
  if FOLD_STEPS:
    pass_BxT, off_BxT = fold_steps(sq, n, fw)
  else:
    pass_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    off_BxT = jnp.zeros((b, t), jnp.int32)
  j_1x1xW = jnp.arange(w, dtype=jnp.int32)[None, None, :]
  valid_BxTxW = sq.valid & (sq.start < n)[:, :, None]
  col_BxTxW = pass_BxT[:, :, None] * fw + off_BxT[:, :, None] + j_1x1xW
  at_BxTW = jnp.where(valid_BxTxW, col_BxTxW, t * fw).reshape(b, t * w)   # invalid: dropped
  rank_BxTW = jnp.minimum(sq.start[:, :, None] + j_1x1xW, n - 1).reshape(b, t * w)
  m_BxPF = layers.row_set(jnp.zeros((b, t * fw), jnp.int32), at_BxTW,
                          jnp.broadcast_to(sq.start[:, :, None], (b, t, w)).reshape(b, t * w))
  tgt_BxPF = layers.row_set(jnp.full((b, t * fw), NO_TARGET, jnp.int32), at_BxTW,
                            orders_lib.slot_target(order, rank_BxTW))
  chunks = lambda x: jnp.moveaxis(x.reshape(b, t, fw), 1, 0)  # noqa: E731
  logits_of = _blank_cache(model, tokens, order,
                           prompt_block(model.cfg, jnp.sum(prompt, -1, dtype=jnp.int32)), fw)
  # each rank's own query: its step's pass, the step's offset plus its slot
  step_BxN = jnp.maximum(sq.step, 0)
  own_pass_BxN = jnp.where(sq.step >= 0, jnp.take_along_axis(pass_BxT, step_BxN, axis=1), -1)
  own_col_BxN = (jnp.take_along_axis(off_BxT, step_BxN, axis=1)
                 + jnp.clip(sq.slot, 0, w - 1))

  reduce = reduce or (lambda x: x)

  @jax.checkpoint
  def one(args):
    k, m_BxF, tgt_BxF = args
    logits_BxFxV = logits_of(m_BxF, tgt_BxF)[0]
    own_BxNxV = jnp.take_along_axis(logits_BxFxV, own_col_BxN[..., None], axis=1)
    out = reduce(own_BxNxV)
    mine = (own_pass_BxN == k).reshape((b, n) + (1,) * (out.ndim - 2))
    return jnp.where(mine, out, 0.0)

  def body(acc, args):
    return acc + jax.lax.cond(jnp.any(args[2] != NO_TARGET), one,
                              lambda _: jnp.zeros_like(acc), args), None

  shape = jax.eval_shape(reduce, jax.ShapeDtypeStruct((b, n, model.cfg.vocab_size), jnp.float32))
  return jax.lax.scan(body, jnp.zeros(shape.shape, shape.dtype),
                      (jnp.arange(t, dtype=jnp.int32), chunks(m_BxPF), chunks(tgt_BxPF)))[0]


def order_pass(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
               prompt: jax.Array | None = None, *, max_steps: int | None = None,
               width: int | None = None, steps_per_pass: int | None = None):
  """(logits [B, T, W, V], `StepQueries`): the model's conditional at every candidate of every
  step: query (t, j) targets the position of rank start[t] + j, seeing the ranks of steps
  before t (invalid queries: garbage). T = ``max_steps`` (None: n) steps per row at most, W =
  ``width`` (None: n) candidates per step (at least the row's answer length).

  Cost: teacher-forced passes over the n rank-slots plus ``steps_per_pass`` = c steps' queries
  (c W slots), T / c of them (`jax.lax.map`; c = T: ONE pass of n + T W slots). The same numbers
  for every c; the attention costs (T / c) (n + c W)^2, least at c W = n, so None takes
  c = max(1, n // W): about T passes of 2n slots at W = n, T times `sequence_logp`'s one pass of
  2n (6x6 Sudoku, n = 36 at one cell per step: 36 passes of 72 slots)."""
  sq, per, args, logits_of = _passes(model, tokens, order, steps, prompt, max_steps, width,
                                     steps_per_pass)
  (b, t), w, passes = sq.start.shape, sq.valid.shape[2], args[0].shape[0]
  one = lambda a: logits_of(*a)[0]  # noqa: E731
  logits = one(jax.tree.map(lambda x: x[0], args))[None] if passes == 1 else jax.lax.map(one, args)
  logits_BxTxWxV = jnp.moveaxis(logits, 0, 1).reshape(b, passes * per, w, -1)[:, :t]
  return logits_BxTxWxV, sq


def step_scores(logits: jax.Array, sq: StepQueries, first_step, order: jax.Array, *,
                policy: str, temperature: float = 1.0, head=None, feats=None):
  """The policy's scores of the candidates of steps ``first_step`` .. ``first_step + c - 1``
  (``logits`` [B, c, W, V], those steps' queries of `order_pass`), as the sampler computed them:
  (scores [B, c, W], valid [B, c, W], the heuristic's own scores, positions [B, c, W]). ``head``:
  a `model.order_head.OrderHead` re-scoring the heuristic's (the sampler's ``order_head``), with
  the queries' output-head features ``feats`` [B, c, W, d]."""
  b, c, w, _ = logits.shape
  n, t = order.shape[1], sq.start.shape[1]
  steps_C = first_step + jnp.arange(c, dtype=jnp.int32)
  start_BxC = jnp.take(sq.start, jnp.minimum(steps_C, t - 1), axis=1)
  valid_BxCxW = jnp.take(sq.valid, jnp.minimum(steps_C, t - 1), axis=1) & (steps_C < t)[:, None]
  probs_BxCxWxV = jax.nn.softmax(logits.astype(jnp.float32) / jnp.float32(temperature), axis=-1)
  rank_BxCxW = jnp.minimum(start_BxC[:, :, None] + jnp.arange(w, dtype=jnp.int32), n - 1)
  pos_BxCxW = orders_lib.slot_target(order, rank_BxCxW.reshape(b, -1)).reshape(b, c, w)
  fn = adaptive_lib.get(policy)
  base_BxCxW = jax.vmap(lambda p, x, i: fn(p, None, x, i, None), in_axes=(1, 1, 0),
                        out_axes=1)(probs_BxCxWxV, pos_BxCxW, steps_C)
  scores_BxCxW = base_BxCxW
  if head is not None:
    flat = lambda x: x.reshape(b * c, w, *x.shape[3:])  # noqa: E731
    scores_BxCxW = head(flat(probs_BxCxWxV), flat(base_BxCxW), flat(pos_BxCxW),
                        flat(valid_BxCxW), None if feats is None else flat(feats)).reshape(b, c, w)
  return scores_BxCxW, valid_BxCxW, base_BxCxW, pos_BxCxW


def step_order_logp(logits: jax.Array, sq: StepQueries, first_step, order: jax.Array, *,
                    policy: str, policy_temperature: float,
                    temperature: float = 1.0) -> jax.Array:
  """float32 [B, c, W]: the Plackett-Luce log-probability of each candidate of steps
  ``first_step`` .. ``first_step + c - 1`` (``logits`` [B, c, W, V], those steps' queries of
  `order_pass`) being drawn at its place in the step's order: ``z_j - logsumexp(z_j' for j' >=
  j)`` over the step's valid candidates, z = the policy's scores (`step_scores`) /
  ``policy_temperature``. Steps at or beyond T (padding) give garbage."""
  scores_BxCxW, valid_BxCxW = step_scores(logits, sq, first_step, order, policy=policy,
                                          temperature=temperature)[:2]
  return adaptive_lib.plackett_luce_logp(
      adaptive_lib.policy_logits(scores_BxCxW, valid_BxCxW, policy_temperature))


def gather_steps(x: jax.Array, sq: StepQueries) -> jax.Array:
  """[B, n, ...]: from ``x`` [B, T, W, ...] (one entry per step's candidate), each rank's own
  entry (its step's candidate at its slot); meaningless at the prompt's ranks."""
  b, t, w = x.shape[:3]
  flat_BxN = jnp.maximum(sq.step, 0) * w + jnp.minimum(sq.slot, w - 1)
  flat = x.reshape(b, t * w, *x.shape[3:])
  return jnp.take_along_axis(flat, flat_BxN.reshape(b, -1, *([1] * (x.ndim - 3))), axis=1)


def rank_logits(logits: jax.Array, sq: StepQueries) -> jax.Array:
  """[B, n, V]: from `order_pass`'s logits, each rank's own query (its token's conditional, as
  `rollout_logits`; meaningless at the prompt)."""
  return gather_steps(logits, sq)


def order_logp_of(logits: jax.Array, sq: StepQueries, order: jax.Array, *, policy: str,
                  policy_temperature: float, temperature: float = 1.0) -> jax.Array:
  """`order_logp` from `order_pass`'s outputs (all T W queries' logits at once)."""
  if not policy_temperature > 0:
    return jnp.zeros(order.shape, jnp.float32)
  pl_BxTxW = step_order_logp(logits, sq, 0, order, policy=policy,
                             policy_temperature=policy_temperature, temperature=temperature)
  return jnp.where(sq.step >= 0, gather_steps(pl_BxTxW, sq), 0.0)


def order_scan(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
               prompt: jax.Array | None = None, *, policy: str, policy_temperature: float,
               temperature: float = 1.0, max_steps: int | None = None,
               width: int | None = None, steps_per_pass: int | None = None,
               order_head: bool = False):
  """(`order_logp` [B, n], the rank logits [B, n, V], the order head's KL to its heuristic [B])
  in bounded memory: `order_pass`'s passes (c = ``steps_per_pass`` steps each) one at a time in
  a `jax.lax.scan`, each reduced at once to its steps' Plackett-Luce terms [B, c, W] and its
  ranks' own logits (added into [B, n, V]), under `jax.checkpoint` (the gradient recomputes a
  pass instead of keeping its activations). Memory: one pass of n + c W slots and O(B T W + B
  n V) outputs, never the [B, T, W, V] logits or every pass's activations; the values and
  gradients are `order_pass`'s. ``order_head``: the policy is the model's order head
  (`model.order_head`) over the heuristic ``policy``; the KL is `order_head.step_kl` summed over
  the row's steps (0 without a head or when tau = 0)."""
  sq, per, (m_PxBxG, tgt_PxBxG), logits_of = _passes(model, tokens, order, steps, prompt,
                                                     max_steps, width, steps_per_pass)
  (b, t), w, passes, n = sq.start.shape, sq.valid.shape[2], m_PxBxG.shape[0], tokens.shape[1]
  step_BxN = jnp.maximum(sq.step, 0)
  head = order_head_lib.require(model, "order_head") if order_head else None
  tau = policy_temperature

  @jax.checkpoint
  def one(args):
    k, m_BxG, tgt_BxG = args
    logits_BxGxV, feats_BxGxD = logits_of(m_BxG, tgt_BxG)
    logits_BxCxWxV = logits_BxGxV.reshape(b, per, w, -1)
    pl_BxCxW, kl_B = jnp.zeros((b, per, w), jnp.float32), jnp.zeros((b,), jnp.float32)
    if tau > 0:
      sc_BxCxW, ok_BxCxW, base_BxCxW, pos_BxCxW = step_scores(
          logits_BxCxWxV, sq, k * per, order, policy=policy, temperature=temperature, head=head,
          feats=feats_BxGxD.reshape(b, per, w, -1))
      pl_BxCxW = adaptive_lib.plackett_luce_logp(
          adaptive_lib.policy_logits(sc_BxCxW, ok_BxCxW, tau))
      if head is not None:
        flat = lambda x: x.reshape(b * per, w)  # noqa: E731
        kl_B = order_head_lib.step_kl(flat(sc_BxCxW), flat(base_BxCxW), flat(pos_BxCxW),
                                      flat(ok_BxCxW), head.top_k, tau).reshape(b, per).sum(1)
    mine_BxN = (step_BxN >= k * per) & (step_BxN < (k + 1) * per)
    flat_BxN = jnp.clip(step_BxN - k * per, 0, per - 1) * w + jnp.minimum(sq.slot, w - 1)
    own_BxNxV = jnp.take_along_axis(logits_BxCxWxV.reshape(b, per * w, -1), flat_BxN[..., None],
                                    axis=1)
    return pl_BxCxW, kl_B, jnp.where(mine_BxN[..., None], own_BxNxV, 0.0)

  def body(acc, args):
    acc_BxNxV, kl_B = acc
    # a pass past every row's last step (T is static; rows have fewer steps) is skipped
    pl_BxCxW, dkl_B, own_BxNxV = jax.lax.cond(
        jnp.any(args[2] != NO_TARGET), one,
        lambda _: (jnp.zeros((b, per, w), jnp.float32), jnp.zeros((b,), jnp.float32),
                   jnp.zeros_like(acc_BxNxV)), args)
    return (acc_BxNxV + own_BxNxV, kl_B + dkl_B), pl_BxCxW

  v = model.cfg.vocab_size
  acc0 = (jnp.zeros((b, n, v), jnp.float32), jnp.zeros((b,), jnp.float32))
  args = (jnp.arange(passes, dtype=jnp.int32), m_PxBxG, tgt_PxBxG)
  (rl_BxNxV, kl_B), pl_PxBxCxW = jax.lax.scan(body, acc0, args)
  pl_BxTxW = jnp.moveaxis(pl_PxBxCxW, 0, 1).reshape(b, passes * per, w)[:, :t]
  olp_BxN = (jnp.where(sq.step >= 0, gather_steps(pl_BxTxW, sq), 0.0) if tau > 0
             else jnp.zeros((b, n), jnp.float32))
  return olp_BxN, rl_BxNxV, kl_B


def order_logp(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
               prompt: jax.Array | None = None, *, policy: str, policy_temperature: float,
               temperature: float = 1.0, max_steps: int | None = None,
               width: int | None = None, steps_per_pass: int | None = None,
               order_head: bool = False) -> jax.Array:
  """float32 [B, n] in rank layout: the exact log-probability that the stochastic adaptive
  policy (``policy``, ``policy_temperature`` tau > 0; `sampling.adaptive`) chose each rank's
  position, as recorded in `Samples.order_logp`: with step s (frontier m_s) writing ranks
  m_s.., ``order_logp[b, r] = z(order[r]) - logsumexp(z(order[r']) for r' >= r)``, z = the
  policy's score at step s / tau (Plackett-Luce over the candidates still unwritten, minus
  those drawn earlier in the step); 0 at the prompt and when tau = 0. Scores on
  ``softmax(logits / temperature)`` (the sampling temperature). Cost: `order_pass`'s T W query
  slots (``max_steps``, ``width``, ``steps_per_pass`` are its), in `order_scan`'s bounded
  memory. ``order_head``: the model's order head re-scores ``policy`` (`model.order_head`).
  Traceable and differentiable in the model's parameters."""
  if not policy_temperature > 0:
    return jnp.zeros(order.shape, jnp.float32)
  return order_scan(model, tokens, order, steps, prompt, policy=policy,
                    policy_temperature=policy_temperature, temperature=temperature,
                    max_steps=max_steps, width=width, steps_per_pass=steps_per_pass,
                    order_head=order_head)[0]


def token_and_order_logp(model: AOGPT, tokens, order, steps, prompt=None, *, policy: str,
                         policy_temperature: float, temperature: float = 1.0,
                         max_steps: int | None = None, width: int | None = None,
                         steps_per_pass: int | None = None, order_head: bool = False):
  """(`sequence_logp`, `order_logp`, the rank logits [B, n, V], the order head's KL [B]) from
  the same passes (`order_scan`): each rank's own query is among its step's candidates."""
  olp_BxN, rl_BxNxV, kl_B = order_scan(
      model, tokens, order, steps, prompt, policy=policy, policy_temperature=policy_temperature,
      temperature=temperature, max_steps=max_steps, width=width, steps_per_pass=steps_per_pass,
      order_head=order_head)
  return token_logp(rl_BxNxV, tokens, order, prompt, temperature), olp_BxN, rl_BxNxV, kl_B


def check_rollout(tokens, order, steps, prompt=None, *, vocab_size: int | None = None,
                  block_size: int | None = None, max_steps: int | None = None,
                  width: int | None = None) -> None:
  """One-line ValueErrors for host arrays before anything compiles: shapes [B, n], each order
  row a permutation with the prompt first, steps non-decreasing after the prompt, tokens in the
  vocabulary, n within the model's block size."""
  tokens, order, steps = np.asarray(tokens), np.asarray(order), np.asarray(steps)
  if tokens.ndim != 2:
    raise ValueError(f"rollout.tokens: expected [batch, n], got shape {tokens.shape}")
  b, n = tokens.shape
  for name, a in (("order", order), ("steps", steps)) + (
      (("prompt", np.asarray(prompt)),) if prompt is not None else ()):
    if a.shape != (b, n):
      raise ValueError(f"rollout.{name}: expected shape {(b, n)} (as tokens), got {a.shape}")
  if block_size is not None and n > block_size:
    raise ValueError(f"rollout.tokens: length {n} exceeds model.block_size {block_size}")
  if vocab_size is not None and (tokens.min(initial=0) < 0 or tokens.max(initial=0) >= vocab_size):
    raise ValueError(f"rollout.tokens: ids must be in [0, {vocab_size}), got "
                     f"[{tokens.min()}, {tokens.max()}]")
  if not (np.sort(order, axis=1) == np.arange(n)).all():
    row = int(np.argmax(~(np.sort(order, axis=1) == np.arange(n)).all(axis=1)))
    raise ValueError(f"rollout.order: row {row} is not a permutation of 0..{n - 1}")
  plen = np.zeros(b, np.int64) if prompt is None else np.asarray(prompt, bool).sum(1)
  if prompt is not None:
    first = np.take_along_axis(np.asarray(prompt, bool), order, axis=1)
    bad = first != (np.arange(n)[None, :] < plen[:, None])
    if bad.any():
      raise ValueError(f"rollout.order: row {int(np.argmax(bad.any(1)))} does not put the "
                       f"prompt's positions first (orders.prompt_first)")
  scored = np.arange(n)[None, :] >= plen[:, None]
  drop = scored[:, 1:] & scored[:, :-1] & (np.diff(steps, axis=1) < 0)
  if drop.any():
    row = int(np.argmax(drop.any(1)))
    raise ValueError(f"rollout.steps: row {row} decreases along the answer ranks; expected "
                     f"the step of each rank, non-decreasing in generation order")
  if max_steps is not None or width is not None:       # `order_pass`'s static sizes
    for b_, sc in enumerate(scored):
      count = len(np.unique(steps[b_, sc]))
      if max_steps is not None and count > max_steps:
        raise ValueError(f"rollout.steps: row {b_} has {count} steps, more than max_steps="
                         f"{max_steps}")
      if width is not None and sc.sum() > width:
        raise ValueError(f"rollout.prompt: row {b_} has {int(sc.sum())} answer positions, more "
                         f"than width={width}")
