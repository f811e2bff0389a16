"""Noise schedules, reveal counts and the static step plan of the diffusion sampler.

A schedule is ``t_0 = 1 > t_1 > ... > t_T = 0``: the fraction of the positions to generate
that are still masked after step i. Two ways to turn it into reveal counts (per sample):

* ``stochastic`` (Lemma 4.1): every masked position is revealed at step i with probability
  ``(t_{i-1} - t_i) / t_{i-1}``. Equivalently (what is implemented) every position draws its
  reveal step independently with ``P(step = i) = t_{i-1} - t_i``; the counts are then a
  multinomial and are decided before the model runs, so the model is evaluated only at the
  revealed positions.
* ``deterministic``: ``floor(m (1 - t_i))`` positions revealed in total by step i (m = number
  of positions to generate), at least one new per step (as the released AO-GPT code does).

Steps that reveal nothing change nothing (no model call can alter the sample), so the plan
skips them: a row with m < T positions or zero-count stochastic steps finishes early and idles
in trailing no-op passes.

`plan_steps` turns counts into the slot layout used by the KV-cached scan (see
`aogpt_jax.sampling.diffusion`): at a step with frontier m (m tokens known) and k reveals the
forward block holds k *query* slots and the *catch-up* slots computed..m-1 (tokens sampled at
the previous step whose keys/values are not in the cache yet). The block size S is one static
number for the whole run, chosen by `choose_block` to minimise a cost model (padding against
pass count); a step wider than S is split over several passes (exact: all queries of a step
see the same context). The samples do not depend on S: only the speed does.

Shape suffixes of local arrays (``counts_BxT`` = [B, T]): B rows, T steps, L longest
generation, P passes.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.model.layers import check_choice
from aogpt_jax.sampling.state import Passes, PassShape

SCHEDULES = ("linear", "cosine")
COUNT_MODES = ("deterministic", "stochastic")


def noise_schedule(name: str, steps: int) -> np.ndarray:
  """float64 ``t[0..T]`` with ``t[0] = 1``, ``t[T] = 0``, strictly decreasing."""
  check_choice("sample.schedule", name, SCHEDULES)
  if steps < 1:
    raise ValueError(f"sample.steps: must be >= 1, got {steps}")
  s = np.arange(steps + 1, dtype=np.float64) / steps
  t = 1.0 - s if name == "linear" else np.cos(0.5 * math.pi * s)
  t[0], t[-1] = 1.0, 0.0
  return t


def deterministic_counts(num_gen: np.ndarray, t: np.ndarray) -> np.ndarray:
  """int32 [B, T]: new reveals per step, ``floor(m (1 - t_i))`` in total by step i, at least
  one new per step while positions remain (rows with m < T reveal one per step then idle).

  For T <= m every step reveals at least one: for i < T, t_i > 0 so floor(m (1 - t_i)) <= m - 1,
  and the forced totals satisfy total_i <= i <= m - 1, leaving the last step at least one."""
  m_B = np.asarray(num_gen, np.int64)
  steps = len(t) - 1
  out_BxT = np.zeros((m_B.shape[0], steps), np.int64)
  prev_B = np.zeros_like(m_B)
  for i in range(1, steps + 1):
    # The 1e-9 absorbs rounding (1 - t_i = i/T is not exact in binary floating point).
    total_B = np.floor(m_B * (1.0 - t[i]) + 1e-9).astype(np.int64) if i < steps else m_B
    total_B = np.minimum(np.maximum(total_B, prev_B + 1), m_B)
    out_BxT[:, i - 1] = total_B - prev_B
    prev_B = total_B
  return out_BxT.astype(np.int32)


def stochastic_counts(keys: jax.Array, num_gen: np.ndarray, t: np.ndarray) -> np.ndarray:
  """int32 [B, T]: per-row multinomial reveal counts (Lemma 4.1) from per-row keys. Every
  position draws u = 1 - U in (0, 1] (U ~ U[0, 1)) and is revealed at step
  ``i = 1 + #{j >= 1: t_j >= u}``, i.e. with probability t_{i-1} - t_i."""
  steps = len(t) - 1
  num_gen = np.asarray(num_gen, np.int64)
  length = int(max(np.max(num_gen, initial=0), 1))
  u_BxL = 1.0 - np.asarray(
      jax.vmap(lambda k: jax.random.uniform(k, (length,), jnp.float32))(keys), np.float64)
  step_BxL = np.searchsorted(-t[1:], -u_BxL, side="right")   # #{j: t_j >= u}, t decreasing
  valid_BxL = np.arange(length)[None, :] < num_gen[:, None]
  out_BxT = np.zeros((len(num_gen), steps), np.int64)
  rows_BxL = np.broadcast_to(np.arange(len(num_gen))[:, None], step_BxL.shape)
  np.add.at(out_BxT, (rows_BxL[valid_BxL], step_BxL[valid_BxL]), 1)
  return out_BxT.astype(np.int32)


@dataclasses.dataclass
class StepPlan:
  """Per-pass, per-row slot bookkeeping (int32 [P, B]; one scan iteration per pass) and the
  static block sizes. A step whose catch-up + query slots exceed the block is split over several
  passes (queries of one step all see the same context, so splitting them is exact).

  m:      frontier of the pass's step (number of known tokens: prompt + revealed).
  q0:     index, within its step, of the pass's first query (its target is sigma_{m+q0+1}).
  k:      query slots in the pass (targets order[m+q0 .. m+q0+k-1]).
  cstart: first catch-up rank-slot of the pass; ccount: how many (cstart..cstart+ccount-1).
  """
  m: np.ndarray
  q0: np.ndarray
  k: np.ndarray
  cstart: np.ndarray
  ccount: np.ndarray
  block: int          # S: slots per forward pass (queries + catch-up, padded)
  queries: int        # Q: query slots whose logits are taken (the first Q of the block)
  prefill: int        # slots in the prefill pass (max prompt length; 0: no prefill)

  @property
  def steps(self) -> int:
    return int(self.m.shape[0])

  def xs(self) -> tuple[np.ndarray, ...]:
    return self.m, self.q0, self.k, self.cstart, self.ccount

  def passes(self) -> Passes:
    """The scan inputs of the samplers (device arrays)."""
    return Passes(*(jnp.asarray(a) for a in self.xs()))

  def shape(self) -> PassShape:
    return PassShape(block=self.block, queries=self.queries, prefill=self.prefill)

  def stats(self) -> dict:
    """Padding waste: the fraction of computed slot-passes that are padding."""
    used = int(np.sum(self.k + self.ccount))
    total = self.steps * self.m.shape[1] * self.block
    return {"scan_steps": self.steps, "block_slots": self.block, "query_slots": self.queries,
            "prefill_slots": self.prefill, "useful_slot_passes": used,
            "total_slot_passes": total, "padding_waste": 1.0 - used / max(total, 1)}


def step_work(counts: np.ndarray, prompt_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(queries, catch-up slots) per step, int64 [B, T]: a step with k > 0 reveals k positions
  and first computes the slots of the previous step's tokens but the one its query 0 commits."""
  counts_BxT = np.asarray(counts, np.int64)
  m_B = np.asarray(prompt_len, np.int64).copy()
  computed_B = m_B.copy()
  catch_BxT = np.zeros_like(counts_BxT)
  for i in range(counts_BxT.shape[1]):
    active_B = counts_BxT[:, i] > 0
    catch_BxT[:, i] = np.where(active_B, m_B - computed_B, 0)
    computed_B = np.where(active_B, m_B + 1, computed_B)  # catch-up done; query 0 commits m
    m_B = m_B + counts_BxT[:, i]
  return counts_BxT, catch_BxT


def choose_block(works: list[tuple[np.ndarray, np.ndarray]], pass_overhead: float = 4.0) -> int:
  """The block size S minimising the modelled cost sum over batches of
  passes(S) * (S + pass_overhead), where passes(S) = max over rows of sum_i ceil(w_i / S) and
  w_i = slots of step i; ``pass_overhead`` is the fixed cost of a pass in slot-equivalents
  (about 4 for the tiny model on CPU: a pass of S slots costs ~(S + 4) single-slot units)."""
  widths = [k + c for k, c in works]
  s_max = int(max(1, *(np.max(w, initial=1) for w in widths)))
  best, best_cost = s_max, np.inf
  for s in range(1, s_max + 1):
    cost = sum(np.max(np.sum(-(-w // s), axis=1), initial=0) for w in widths) * (s + pass_overhead)
    if cost < best_cost - 1e-9:
      best, best_cost = s, cost
  return best


def plan_steps(counts: np.ndarray, prompt_len: np.ndarray, *, block: int | None = None,
               min_passes: int = 0, min_queries: int = 1, min_prefill: int = 0) -> StepPlan:
  """Splits every row's steps into passes of at most ``block`` slots (default: the largest
  step, i.e. one pass per step): catch-up slots first, then the queries; a pass never holds
  two steps. Rows with fewer passes idle (k = ccount = 0) at the end. ``min_*`` let several
  batches share one compiled scan."""
  queries_BxT, catch_BxT = step_work(counts, prompt_len)
  width_BxT = queries_BxT + catch_BxT
  block = int(block or max(1, np.max(width_BxT, initial=1)))
  plen_B = np.asarray(prompt_len, np.int64)
  rows = []
  for b in range(queries_BxT.shape[0]):
    row, m, computed = [], int(plen_B[b]), int(plen_B[b])
    for i in range(queries_BxT.shape[1]):
      k, c = int(queries_BxT[b, i]), int(catch_BxT[b, i])
      if k == 0:
        continue
      for start in range(0, k + c, block):
        end = min(start + block, k + c)
        cc = max(0, min(end, c) - start)              # catch-up items in [start, end)
        q_first = max(start, c) - c
        row.append((m, q_first, end - start - cc, computed + min(start, c), cc))
      computed, m = m + 1, m + k
    rows.append(row)
  passes = max(min_passes, max(len(r) for r in rows), 1)
  arr_5xPxB = np.zeros((5, passes, len(rows)), np.int64)
  for b, row in enumerate(rows):
    for i, item in enumerate(row):
      arr_5xPxB[:, i, b] = item
    arr_5xPxB[0, len(row):, b] = plen_B[b] + np.sum(queries_BxT[b])   # idle: frontier at the end
  return StepPlan(*(a.astype(np.int32) for a in arr_5xPxB), block=block,
                  queries=int(max(min_queries, np.max(arr_5xPxB[2], initial=1))),
                  prefill=int(max(min_prefill, np.max(plen_B, initial=0))))
