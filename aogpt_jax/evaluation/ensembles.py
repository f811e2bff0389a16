"""Context-order ensembles (the paper's Eq. 4), computed with prefixes only.

For the target at rank i of a block's base order sigma (the any-order scoring order of
perplexity.py, order index 0), the ensemble of size M averages the predicted PROBABILITY of
x_{sigma_i} over M orderings of the context set sigma_<i and takes -log of the mean. Ordering
j = 0 is the base ordering sigma_<i itself. Ordering j >= 1 is

    perm = argsort(where(r < i, U_{b,i,j}[r], 2 + r))  for r = 0..n-1,
    U_{b,i,j} = uniform(fold_in(fold_in(fold_in(fold_in(key(seed), ENSEMBLE_STREAM),
                                                block_id(b)), i), j), (n,))

applied to sigma (``sigma[perm]``): its first i entries are a uniformly random ordering of the
context, drawn independently for every (block, i, j) (with replacement, as the published code:
two orderings may coincide, and for i <= 1 all coincide), and entries i.. stay sigma_i, ...
Ordering j does not depend on M, so one run with M = max_m nests every smaller M (the first M
orderings). Each token keeps its own position; each context slot's target is the next
context token's position; the last context slot targets sigma_i.

Work: the published code runs 1 + n (M - 1) full-length forwards per block and keeps one logit
row of each. Here column j = 0 comes from the base forward (shared with the any-order NLL),
and each (i, j >= 1) pair runs only its i + 1 slots ``[START, c_0, ..., c_{i-1}]`` and takes the
head of the last slot only. Prefixes are packed into fixed-size rows: ``layout="pairs"``
(default) puts the prefixes of ranks i and n-1-i in one row of n + 1 slots under a
block-diagonal causal mask: no padding and ONE compiled shape (the calls are split evenly, see
`packed_calls`); ``layout="buckets"`` groups the ranks by length into ``num_buckets`` shapes of
causal rows (plain causal attention, flash-capable on GPU; at most one bucket width of padding,
one compilation per bucket: at n = 256 on the 2-core CPU box the 16 compilations cost as much as
the whole run, and the masked rows run as fast as causal ones there).

`eq4_reference` (below) is Eq. 4 for one target in a few plain lines; `naive_logp` is the
batched version of the same full-forward computation. See docs/method.md, "Estimators".

Shape suffixes of local arrays (nanodo style, ``tok_IxS`` = [I, S]): B blocks of the batch,
N block length n, M orderings, C context length i, I items of one call, G prefixes (segments)
per packed row, S slots per packed row (``row_len``), T slots of a full forward, V vocabulary,
D model width.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.evaluation import perplexity as ppl_lib
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import jit as model_jit
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.train import metrics as metrics_lib

LAYOUTS = ("pairs", "buckets")


def eq4_reference(model: model_lib.AOGPT, tokens: jax.Array, sigma: jax.Array, i: int,
                  context_orders: jax.Array) -> jax.Array:
  """Reference for the paper's Eq. 4 at one target, written plainly (one full forward per
  ordering): ``-log (1/M) sum_j p(x_{sigma[i]} | x at sigma[:i] fed in ordering j)``.

  tokens int [n] (original order); sigma int [n]: the base order, target at rank ``i``;
  context_orders int [M, i]: M orderings of the context positions ``sigma[:i]`` (each token
  keeps its own position). Ordering j is run as the full order ``(context_orders[j],
  sigma[i:])``, whose rank-slot i predicts the target. The fast path (`ensemble_logp` +
  `ensemble_nll`) is tested equal to this (tests/test_ensembles_eq4.py)."""
  M, n = context_orders.shape[0], tokens.shape[0]
  orders_MxN = jnp.concatenate([context_orders, jnp.broadcast_to(sigma[i:], (M, n - i))], axis=1)
  logits_MxV = model(jnp.broadcast_to(tokens, (M, n)), orders_MxN.astype(jnp.int32))[:, i]
  logp_M = jax.nn.log_softmax(logits_MxV.astype(jnp.float32), axis=-1)[:, tokens[sigma[i]]]
  return -(jax.nn.logsumexp(logp_M) - math.log(M))


def ensemble_key(seed, block_id) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), ppl_lib.ENSEMBLE_STREAM),
                            block_id)


def context_permutation(ekey: jax.Array, i, j, n: int) -> jax.Array:
  """int32 [n]: perm[:i] orders the context ranks 0..i-1 (identity for j = 0), perm[i:] = i.."""
  u_N = jax.random.uniform(jax.random.fold_in(jax.random.fold_in(ekey, i), j), (n,))
  r_N = jnp.arange(n)
  score_N = jnp.where(r_N < i, u_N, 2.0 + r_N)
  score_N = jnp.where(j == 0, r_N.astype(score_N.dtype), score_N)
  return jnp.argsort(score_N).astype(jnp.int32)


def m_values(max_m: int) -> list[int]:
  """1, 2, 4, ... up to max_m (max_m itself included)."""
  if max_m < 1:
    raise ValueError(f"eval.ensemble_max_m must be >= 1, got {max_m}")
  vals = [1 << k for k in range(max_m.bit_length()) if (1 << k) <= max_m]
  return vals if vals[-1] == max_m else vals + [max_m]


# ----------------------------------------------------------------------------- packing plan


@dataclasses.dataclass(frozen=True)
class Group:
  """Rows of ``row_len`` slots; ``ranks[r]`` are the ranks whose prefixes row r holds (-1: none),
  packed back to back. ``masked``: block-diagonal mask (else causal, one segment per row)."""
  row_len: int
  ranks: np.ndarray
  masked: bool


def pack_prefixes(ranks: Sequence[int], n: int, layout: str = "pairs",
                  num_buckets: int = 16) -> list[Group]:
  """Packs the prefixes (rank i -> i + 1 slots) of ``ranks`` into rows (see the module doc)."""
  rs = sorted(set(int(r) for r in ranks))
  if not rs:
    return []
  if rs[0] < 0 or rs[-1] >= n:
    raise ValueError(f"ensemble ranks must lie in [0, {n}), got {rs[0]}..{rs[-1]}")
  if layout == "pairs":
    rows, lo, hi = [], 0, len(rs) - 1
    while lo <= hi:                      # largest prefix with the largest one that still fits
      if lo < hi and rs[lo] + rs[hi] + 2 <= n + 1:
        rows.append((rs[hi], rs[lo]))
        lo += 1
      else:
        rows.append((rs[hi], -1))
      hi -= 1
    return [Group(n + 1, np.array(rows, np.int32), True)]
  if layout == "buckets":
    groups = []
    for chunk in np.array_split(np.array(rs, np.int32), min(num_buckets, len(rs))):
      groups.append(Group(int(chunk[-1]) + 1, chunk[:, None], False))
    return groups
  raise ValueError(f"eval.ensemble_layout must be one of {LAYOUTS}, got {layout!r}")


def _segment_slots(tokens, sigma, ekey, j, ranks, row_len):
  """Slots of one packed row (all arrays for one item: tokens, sigma [N], ranks [G]): returns
  tok, pos, tgt, seg [S] and the query slot index and label per segment [G]."""
  n = tokens.shape[0]
  s_S = jnp.arange(row_len)
  lens_G = jnp.where(ranks >= 0, ranks + 1, 0)
  starts_G = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                              jnp.cumsum(lens_G)[:-1]]).astype(jnp.int32)
  seg_S = jnp.sum(s_S[:, None] >= starts_G[None, :] + lens_G[None, :], axis=1)  # slot's segment
  g_S = jnp.minimum(seg_S, ranks.shape[0] - 1)
  seqs_GxN = jax.vmap(lambda i: sigma[context_permutation(ekey, i, j, n)])(jnp.maximum(ranks, 0))
  k_S = s_S - starts_G[g_S]
  valid_S = (seg_S < ranks.shape[0]) & (k_S >= 0) & (k_S <= ranks[g_S])
  # Slot s of segment g is rank-slot k = s - starts[g] of that segment's ordering seqs[g]; the
  # rules are evaluated for every segment (G <= 2) and the slot's own segment picked.
  k_GxS = s_S[None, :] - starts_G[:, None]
  pick = lambda a_GxS: jnp.take_along_axis(a_GxS, g_S[None, :], axis=0)[0]
  src_S, pos_S = (pick(a) for a in orders_lib.rank_slot_source(seqs_GxN, k_GxS))
  cur_S = pick(orders_lib.slot_target(seqs_GxN, k_GxS))                 # its target position
  tok_S = jnp.where(valid_S, orders_lib.rank_slot_tokens(tokens, src_S, k_S == 0),
                    model_lib.START)
  pos_S = jnp.where(valid_S, pos_S, 0)
  tgt_S = jnp.where(valid_S, cur_S, model_lib.NO_TARGET)
  seg_S = jnp.where(valid_S, seg_S, ranks.shape[0] + s_S)               # padding: own segment
  query_G = starts_G + jnp.maximum(ranks, 0)
  label_G = tokens[sigma[jnp.clip(ranks, 0, n - 1)]]
  return tok_S, pos_S, tgt_S, seg_S, query_G, label_G


# XLA:CPU's YNNPACK fuses attention's softmax into its dots at these shapes and runs the fused
# kernel far below the plain dots' speed; restricted to plain dots the evaluator runs about a
# quarter faster with the same log-probabilities. The program's run time is in those dots, so
# LLVM's optimisation level 1 instead of 3 compiles it faster and runs as fast (log-probabilities
# within 1e-6). Options of these programs only, on CPU only (`packed_logp_jit`); the samplers
# measured no gain from the first. Numbers: docs/performance.md.
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type":
                        "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
                        "xla_backend_optimization_level": 1}


def packed_logp_jit():
  """The jitted `packed_logp_any` for the default backend (`CPU_COMPILER_OPTIONS` on CPU)."""
  return packed_logp_cpu if jax.default_backend() == "cpu" else packed_logp_any


def packed_logp_fn(model, tokens, sigma, ids, seed, item_b, item_j, item_ranks, tables=None, *,
                    row_len, masked):
  ekeys_B = jax.vmap(lambda b: ensemble_key(seed, b))(ids)
  tok_IxS, pos_IxS, tgt_IxS, seg_IxS, query_IxG, label_IxG = jax.vmap(
      lambda b, j, r: _segment_slots(tokens[b], sigma[b], ekeys_B[b], j, r, row_len))(
          item_b, item_j, item_ranks)
  mask_IxSxS = None
  if masked:
    s_S = jnp.arange(row_len)
    mask_IxSxS = ((seg_IxS[:, :, None] == seg_IxS[:, None, :])
                  & (s_S[None, None, :] <= s_S[None, :, None]))
  hq_IxGxD, _ = model.hidden_slots(tok_IxS, pos_IxS, tgt_IxS, mask=mask_IxSxS, query=query_IxG,
                                   mask_causal=masked, tables=tables)
  tq_IxG = jnp.take_along_axis(tgt_IxS, query_IxG, axis=1)
  logits_IxGxV = model.head(hq_IxGxD, tq_IxG, tables)
  return -model_lib.nll_from_logits(logits_IxGxV, label_IxG)   # log p, [I, G]


@model_jit.jit()
def _modulation_tables(model):
  return model.modulation_tables()


packed_logp_any = model_jit.jit("row_len", "masked")(packed_logp_fn)
packed_logp_cpu = model_jit.jit("row_len", "masked",
                                 compiler_options=CPU_COMPILER_OPTIONS)(packed_logp_fn)


@model_jit.jit("path")
def naive_logp_program(model, tokens, sigma, ids, seed, item_b, item_i, item_j, *, path):
  """Reference: one full-length forward per (block, i, j); keeps logit row i (the jitted program
  of `naive_logp`; benchmarks/eval_cost.py lowers it for XLA's FLOP count)."""
  n = tokens.shape[1]
  x_IxN = tokens[item_b]
  order_IxN = jax.vmap(lambda b, i, j: sigma[b][context_permutation(
      ensemble_key(seed, ids[b]), i, j, n)])(item_b, item_i, item_j)
  if path == "gather":
    logits_IxTxV, _ = model.forward_slots(*model_lib.gather_slots(x_IxN, order_IxN))
    row_I = item_i
  else:
    tok_IxT, pos_IxT, tgt_IxT, mask_IxTxT = model_lib.mask_slots(x_IxN, order_IxN)
    logits_IxTxV, _ = model.forward_slots(tok_IxT, pos_IxT, tgt_IxT, mask=mask_IxTxT)
    row_I = orders_lib.rank_slot_source(order_IxN, item_i[:, None])[1][:, 0]  # rank-slot i's row
  lg_IxV = jnp.take_along_axis(logits_IxTxV, row_I[:, None, None], axis=1)[:, 0]
  label_I = jnp.take_along_axis(
      x_IxN, jnp.take_along_axis(order_IxN, item_i[:, None], axis=1), axis=1)[:, 0]
  return -model_lib.nll_from_logits(lg_IxV, label_I)


def _chunks(arrays: Sequence[np.ndarray], size: int):
  """Splits the items into equal calls of at most ``size`` (the last one padded by repeating
  item 0): ceil(total / size) calls of ceil(total / calls) items, so padding stays below one item
  per call instead of up to a whole call."""
  total = len(arrays[0])
  size = -(-total // -(-total // size)) if total else size
  for a in range(0, total, size):
    part = [x[a:a + size] for x in arrays]
    pad = size - len(part[0])
    if pad:
      part = [np.concatenate([x, np.repeat(x[:1], pad, axis=0)]) for x in part]
    yield a, min(size, total - a), part


# Slots per call of the prefix program. On CPU, calls of a few cache-sized rows ran faster than
# big ones (n = 256, M = 8, 2-core box, one process, interleaved: 2048 slots = 7 rows per call
# 9.6-10.6 s, 3072 10.1-10.2, 16384 11.0-11.3); accelerators want big calls.
CPU_SLOTS_PER_CALL = 2048
ACCELERATOR_SLOTS_PER_CALL = 16384


def default_slots_per_call() -> int:
  return CPU_SLOTS_PER_CALL if jax.default_backend() == "cpu" else ACCELERATOR_SLOTS_PER_CALL


def packed_calls(ranks: Sequence[int], rows: Sequence[int], n: int, max_m: int, layout: str,
                 num_buckets: int, slots_per_call: int):
  """The prefix-kernel calls of `ensemble_logp`: yields (group, items used, [item_b, item_j,
  item_ranks] padded to the call size). One compiled program per distinct (row_len, call size):
  `compiled_shapes` counts them. ``slots_per_call`` 0: `default_slots_per_call`."""
  slots_per_call = slots_per_call or default_slots_per_call()
  for group in pack_prefixes(ranks, n, layout, num_buckets):
    rb, jj, rr = np.meshgrid(np.array(rows, np.int32), np.arange(1, max_m, dtype=np.int32),
                             np.arange(len(group.ranks), dtype=np.int32), indexing="ij")
    item_b, item_j, item_r = rb.ravel(), jj.ravel(), group.ranks[rr.ravel()]
    per_call = min(max(1, slots_per_call // group.row_len), len(item_b))
    for _, count, part in _chunks([item_b, item_j, item_r], per_call):
      yield group, count, part


def compiled_shapes(ranks, rows, n, max_m, layout="pairs", num_buckets=16,
                    slots_per_call=0) -> set[tuple[int, ...]]:
  """(row_len, items per call, segments per row) of every call `ensemble_logp` makes: each one
  is a compilation (seconds on CPU, as much as the whole run at n = 256 with 16 shapes)."""
  return {(g.row_len,) + part[2].shape for g, _, part in
          packed_calls(ranks, rows, n, max_m, layout, num_buckets, slots_per_call)}


def ensemble_logp(model: model_lib.AOGPT, tokens, ids, sigma, base_logp, *, max_m: int,
                  seed: int = 0, ranks: Sequence[int] | None = None,
                  rows: Sequence[int] | None = None, layout: str = "pairs", num_buckets: int = 16,
                  slots_per_call: int = 0) -> np.ndarray:
  """float32 [B, n, max_m] log-probabilities: column 0 is ``base_logp`` [B, n] (order space),
  column j >= 1 the prefix forward of ordering j. Only ``ranks`` (default all) of ``rows``
  (default all) are computed; the other entries are NaN."""
  tokens = np.asarray(tokens, np.int32)
  b, n = tokens.shape
  out_BxNxM = np.full((b, n, max_m), np.nan, np.float32)
  out_BxNxM[:, :, 0] = np.asarray(base_logp, np.float32)
  ranks = list(range(n)) if ranks is None else list(ranks)
  rows = list(range(b)) if rows is None else list(rows)
  if max_m == 1 or not rows:
    return out_BxNxM
  args = (jnp.asarray(tokens), jnp.asarray(sigma, jnp.int32), jnp.asarray(ids), jnp.uint32(seed))
  run = model_jit.bind(packed_logp_jit(), model)
  # The adaLN tables depend on the weights only: projected once here, not in every call.
  tables = model_jit.call(_modulation_tables, model)
  # Every call is dispatched before the first result is read, so the host's work overlaps the
  # device's (the results are [I, G] floats).
  pending = [(count, b_I, j_I, r_IxG, run(*args, jnp.asarray(b_I), jnp.asarray(j_I),
                                          jnp.asarray(r_IxG), tables, row_len=group.row_len,
                                          masked=group.masked))
             for group, count, (b_I, j_I, r_IxG) in packed_calls(
                 ranks, rows, n, max_m, layout, num_buckets, slots_per_call)]
  # A long batch (large max_m) reports its progress every 30 s; short ones stay quiet.
  progress = metrics_lib.ProgressLog("  ensemble calls of this batch", len(pending), every=30.0)
  t0 = time.perf_counter()
  for k, (count, b_I, j_I, r_IxG, logp_IxG) in enumerate(pending):
    logp_IxG = np.asarray(logp_IxG)[:count]
    if time.perf_counter() - t0 > 30.0:
      progress.update(k + 1)
    b_I, j_I, r_IxG = b_I[:count], j_I[:count], r_IxG[:count]
    for g in range(r_IxG.shape[1]):
      ok_I = r_IxG[:, g] >= 0
      out_BxNxM[b_I[ok_I], r_IxG[ok_I, g], j_I[ok_I]] = logp_IxG[ok_I, g]
  return out_BxNxM


def naive_logp(model: model_lib.AOGPT, tokens, ids, sigma, *, max_m: int, seed: int = 0,
               ranks: Sequence[int] | None = None, js: Sequence[int] | None = None,
               path: str = "mask", items_per_call: int = 16) -> np.ndarray:
  """The reference estimator: [B, n, max_m] log p from one full forward per (block, i, j)
  (``path="mask"``: explicit rank-mask path; ``"gather"``: causal path). NaN where skipped."""
  tokens = np.asarray(tokens, np.int32)
  b, n = tokens.shape
  ranks = list(range(n)) if ranks is None else list(ranks)
  out_BxNxM = np.full((b, n, max_m), np.nan, np.float32)
  args = (jnp.asarray(tokens), jnp.asarray(sigma, jnp.int32), jnp.asarray(ids), jnp.uint32(seed))
  all_b, all_i, all_j = (x.ravel().astype(np.int32) for x in np.meshgrid(
      np.arange(b), np.array(ranks), np.array(list(range(max_m)) if js is None else js),
      indexing="ij"))
  for _, count, (b_I, i_I, j_I) in _chunks([all_b, all_i, all_j], items_per_call):
    logp_I = np.asarray(model_jit.call(naive_logp_program, model, *args, jnp.asarray(b_I),
                                       jnp.asarray(i_I), jnp.asarray(j_I), path=path))[:count]
    out_BxNxM[b_I[:count], i_I[:count], j_I[:count]] = logp_I
  return out_BxNxM


def ensemble_nll(logp: np.ndarray, ms: Sequence[int]) -> np.ndarray:
  """float64 [len(ms), B, n]: -log of the mean probability over the first M orderings."""
  lp_BxNxM = np.asarray(logp, np.float64)
  res = []
  for size in ms:                      # M of Eq. 4: average over the first M orderings
    top_BxNx1 = np.max(lp_BxNxM[..., :size], axis=-1, keepdims=True)
    lse_BxN = top_BxNx1[..., 0] + np.log(np.sum(np.exp(lp_BxNxM[..., :size] - top_BxNx1),
                                                axis=-1))
    res.append(-(lse_BxN - math.log(size)))
  return np.stack(res)


def ensemble_perplexity(model: model_lib.AOGPT, batches: Iterable[Mapping[str, Any]], *,
                        max_m: int = 64, seed: int = 0, layout: str = "pairs",
                        num_buckets: int = 16, slots_per_call: int = 0,
                        max_batches: int = 0) -> dict:
  """Ensemble perplexity for every M in ``m_values(max_m)`` (M = 1: the any-order NLL with
  the same seed, order index 0)."""
  ms = m_values(max_m)
  acc = ppl_lib.NLLSum(len(ms))
  for _, tokens, weight, ids in ppl_lib.eval_blocks(batches, model.cfg, max_batches):
    acc.count(weight)
    per_token, sigma = ppl_lib.token_nll(model, tokens, ids, order="uniform", seed=seed)
    add_batch(acc, model, tokens, ids, weight, np.asarray(sigma), -np.asarray(per_token), ms=ms,
              seed=seed, layout=layout, num_buckets=num_buckets, slots_per_call=slots_per_call)
  acc.reduce()
  return summarize(acc, ms, seed=seed, layout=layout)


def add_batch(acc: ppl_lib.NLLSum, model, tokens, ids, weight, sigma, base_logp, *, ms, seed,
              layout, num_buckets, slots_per_call) -> None:
  """Adds one batch's ensemble NLLs for every M in ``ms`` to ``acc`` (slot = index in ms)."""
  rows = [r for r in range(tokens.shape[0]) if np.any(weight[r] > 0)]
  logp = ensemble_logp(model, tokens, ids, sigma, base_logp, max_m=ms[-1], seed=seed, rows=rows,
                       layout=layout, num_buckets=num_buckets, slots_per_call=slots_per_call)
  logp[[r for r in range(tokens.shape[0]) if r not in rows]] = 0.0   # weight-0 rows: unused
  for k, nll in enumerate(ensemble_nll(logp, ms)):
    acc.add(ppl_lib.to_original(nll, sigma), weight, k)


def summarize(acc: ppl_lib.NLLSum, ms: Sequence[int], **settings) -> dict:
  means = acc.means()
  return dict(settings, m_values=list(ms), nll={str(k): float(v) for k, v in zip(ms, means)},
              ppl={str(k): math.exp(float(v)) for k, v in zip(ms, means)}, tokens=acc.tokens,
              blocks=acc.blocks, orderings=("j=0: base order (any-order order index 0); j>=1: "
                                            "argsort of uniform(fold_in(key(seed), ENSEMBLE_STREAM,"
                                            " block_id, i, j)) over the context ranks"))
