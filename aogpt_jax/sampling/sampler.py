"""Sampling from an AO-GPT (or the encoder-only MDM baseline): settings, validation and the
compiled samplers (the ``sample`` config group is in `sampling.config`, ``--mode=sample``'s writer
in `sampling.write`).

Four samplers share one plan (order, schedule, counts), one token-sampling routine and one key
scheme (`sampling.tokens`):

* ``diffusion``: the KV-cached masked-diffusion sampler of an AO-GPT (`sampling.diffusion`): one
  `jax.lax.scan` over steps with the parallel-generation mask; O(n) slot-passes.
* ``ar``: plain left-to-right decoding of an AO-GPT with a KV cache (`sampling.ar`).
* ``uncached``: the same plan and model as ``diffusion`` but a full uncached forward over the
  whole sequence at every step (the test oracle; an AO-GPT with an encoder's cost profile).
* ``speculative``: exact any-order speculative decoding (`sampling.speculative`): one pass per
  round verifies the K-1 tokens drafted by the previous pass with the causal chain and carries
  the parallel (Figure 10) draft queries of the next round; distributed exactly as T = n (one
  token per step) in the same order, in fewer passes than tokens. ``draft`` = K or "auto";
  ``steps`` / ``schedule`` / ``count_mode`` are unused.
* ``adaptive``: adaptive order (`sampling.adaptive`): each step queries the still-masked
  positions (or ``candidates`` of them) in one cached pass, a ``policy`` scores them and the step
  commits the best ones (as many as ``steps`` / ``schedule`` / ``count_mode`` say, or every one
  above ``threshold``); ``Samples.order`` is the chosen order, ``Samples.step_of_rank`` the step
  of each rank. On the encoder MDM (``model.target='none'``) the same step runs on one full
  bidirectional forward per step (`sampling.encoder.sample_adaptive_encoder`).
* ``encoder``: the encoder-only masked-diffusion model of `aogpt_jax.model.encoder` (bidirectional,
  [MASK] tokens; `sampling.encoder`): the standard MDM reverse process, one full forward per
  step. Needs a model built with `encoder_model.make_encoder`.

Usage::

    from aogpt_jax.sampling import sampler
    from aogpt_jax.sampling import prompts
    s = sampler.SampleSettings(length=256, steps=64, top_p=0.95, temperature=0.9)
    out = sampler.generate(model, jax.random.key(0), s, batch=8)
    out.tokens                                       # int32 [8, 256]
    p = prompts.infill_prompt([[72, 105]], [[46]], 256, model.cfg.valid_vocab_size)
    out = sampler.generate(model, jax.random.key(1), s, prompt=p)

All checks (settings, prompt positions and tokens) run before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.model import jit as model_jit
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT, ModelConfig
from aogpt_jax.model.layers import check_choice
from aogpt_jax.sampling import adaptive as adaptive_lib
from aogpt_jax.sampling import ar as ar_lib
from aogpt_jax.sampling import diffusion, prompts, schedules
from aogpt_jax.sampling import encoder as encoder_lib
from aogpt_jax.sampling import speculative as spec_lib
from aogpt_jax.sampling import tokens as tokens_lib
from aogpt_jax.sampling.state import Draw, Passes, PassShape

METHODS = ("diffusion", "ar", "uncached", "encoder", "speculative", "adaptive")
# Methods without a step plan (one compiled loop over positions / rounds / adaptive steps).
PLANLESS_METHODS = ("ar", "speculative", "adaptive")
# Below this, logits / temperature overflow float64 for ordinary logits (and the draw is argmax
# anyway); infinity would give every token the same probability. greedy=True is the argmax.
MIN_TEMPERATURE = 1e-6
# Methods that run one full (uncached) forward per step: one pass per step, no block choice.
FULL_FORWARD_METHODS = ("uncached", "encoder")
# Methods that record each drawn token's log-probabilities (`generate(..., return_logp=True)`).
LOGP_METHODS = ("diffusion", "uncached", "ar", "adaptive")


def uses_steps(method: str, policy: str = "max_prob") -> bool:
  """Whether ``sample.steps`` changes what ``method`` does: ar, speculative and the adaptive
  ``threshold`` policy choose their own number of steps and ignore it."""
  return method not in PLANLESS_METHODS or (method == "adaptive" and policy != "threshold")


@dataclasses.dataclass(frozen=True)
class SampleSettings:
  length: int
  steps: int | None = None              # T, 1..length; None: length (one position per step)
  schedule: str = "linear"              # linear | cosine
  count_mode: str = "deterministic"     # deterministic | stochastic (Lemma 4.1)
  order: Any = "random"                 # order name (random, l2r, ...) or int [n] / [B, n]
  temperature: float = 1.0
  top_p: float = 1.0
  top_p_rule: str = "published"        # published (released code) | nucleus (Holtzman)
  greedy: bool = False                  # argmax instead of sampling (temperature/top_p unused)
  method: str = "diffusion"             # diffusion | ar | uncached | encoder | speculative |
                                        # adaptive
  draft: Any = "auto"                   # speculative: drafts per round, int >= 1 or "auto"
  draft_queries: str = "taper"          # speculative: taper | all (draft queries per slot)
  policy: str = "max_prob"              # adaptive: a registered policy (sampling.adaptive)
  candidates: Any = None                # adaptive: None (every masked position) or C >= 1
  threshold: float = 0.9                # adaptive, policy="threshold": commit max prob >= this
  policy_temperature: float = 0.0       # adaptive: tau > 0 draws the positions from
                                        # softmax(scores / tau) (sampling.adaptive)
  order_head: bool = False              # adaptive: the model's order head re-scores the
                                        # policy's top-k (`model.order_head`)

  @property
  def num_steps(self) -> int:
    """T: ``steps``, or ``length`` when ``steps`` is None (the default)."""
    return self.length if self.steps is None else self.steps

  def validate(self, cfg: ModelConfig) -> None:
    """Raises ValueError naming the bad setting."""
    if self.method not in METHODS:
      raise ValueError(f"sample.method: must be one of {METHODS}, got {self.method!r}")
    if self.method == "encoder":
      encoder_model.check_encoder(cfg, "sample.method='encoder'")
    if cfg.blank_block and (self.method != "adaptive" or self.candidates is not None):
      what = (f"sample.method={self.method!r}" if self.method != "adaptive"
              else f"sample.candidates={self.candidates!r}")
      raise ValueError(f"{what}: a model with model.blank_block=True predicts from a query "
                       f"block over every blank; sample it with sample.method='adaptive' and "
                       f"every masked position a candidate (candidates=None; policy='random' "
                       f"for a random order)")
    for name in ("length", "steps"):
      v = getattr(self, name)
      if name == "steps" and v is None:
        continue
      if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"sample.{name}: must be an int, got {type(v).__name__} {v!r}")
    for name in ("temperature", "top_p"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"sample.{name}: must be a number, got {type(v).__name__} {v!r}")
    if not 1 <= self.length <= cfg.block_size:
      raise ValueError(f"sample.length: must be in [1, model.block_size={cfg.block_size}], "
                       f"got {self.length}")
    if self.method == "speculative":
      d = self.draft
      if not (d == "auto" or (isinstance(d, numbers.Integral) and not isinstance(d, bool)
                              and 1 <= d <= self.length)):
        raise ValueError(f"sample.draft: must be 'auto' or an integer in [1, length="
                         f"{self.length}], got {d!r}")
      check_choice("sample.draft_queries", self.draft_queries, spec_lib.QUERY_PLANS)
      if self.greedy:
        raise ValueError("sample.greedy: not supported with sample.method='speculative' "
                         "(greedy decoding is deterministic; use method='ar' or 'diffusion')")
    if self.method == "adaptive":
      if encoder_model.is_encoder(cfg):      # the encoder's adaptive sampler needs [MASK]
        encoder_model.encoder_config(cfg)
      adaptive_lib.check_settings(self.policy, self.candidates, self.threshold,
                                  self.policy_temperature)
    elif self.policy_temperature != 0:
      raise ValueError(f"sample.policy_temperature: a stochastic order policy is for "
                       f"sample.method='adaptive', got {self.policy_temperature!r} with "
                       f"method={self.method!r}")
    if self.order_head:
      check_order_head(self, encoder_model.is_encoder(cfg))
    if uses_steps(self.method, self.policy) and not 1 <= self.num_steps <= self.length:
      raise ValueError(f"sample.steps: must be in [1, length={self.length}], got {self.steps}")
    check_choice("sample.schedule", self.schedule, schedules.SCHEDULES)
    check_choice("sample.count_mode", self.count_mode, schedules.COUNT_MODES)
    if not (isinstance(self.temperature, numbers.Real) and math.isfinite(self.temperature)
            and self.temperature >= MIN_TEMPERATURE):
      raise ValueError(f"sample.temperature: must be a finite number >= {MIN_TEMPERATURE} "
                       f"(greedy=True for argmax decoding), got {self.temperature!r}")
    if not (isinstance(self.top_p, numbers.Real) and 0 < self.top_p <= 1):
      raise ValueError(f"sample.top_p: must be in (0, 1], got {self.top_p}")
    if self.top_p_rule not in tokens_lib.TOP_P_RULES:
      raise ValueError(f"sample.top_p_rule: must be one of {tokens_lib.TOP_P_RULES}, "
                       f"got {self.top_p_rule!r}")


@dataclasses.dataclass
class Prepared:
  """A validated batch and its host-side plan inputs (numpy)."""
  tokens0: np.ndarray        # int32 [B, n]: prompt tokens in place, 0 elsewhere
  prompt_mask: np.ndarray    # bool [B, n]
  prompt_len: np.ndarray     # int32 [B]
  order: np.ndarray          # int32 [B, n]: prompt positions first
  counts: np.ndarray         # int32 [B, T]: reveals per step
  tok_keys: jax.Array        # [B] token-stream keys
  adapt_keys: jax.Array | None = None   # adaptive: [B] keys of the candidate / policy draws
  blank_block: bool = False  # the model's ``blank_block`` (the adaptive sampler's catch-up)


@functools.partial(jax.jit, static_argnames=("batch", "length", "order"))
def _draw(key, offset, *, batch: int, length: int, order: str | None):
  """Per-sample streams (one compiled call): token keys, base orders (if ``order`` names a
  distribution), count keys."""
  keys = tokens_lib.sample_keys(key, batch, offset)
  base = None
  if order is not None:
    okeys = tokens_lib.stream(keys, tokens_lib.ORDER_STREAM)
    base = jax.vmap(lambda k: orders_lib.sample(order, k, 1, length)[0])(okeys)
  return (tokens_lib.stream(keys, tokens_lib.TOKEN_STREAM), base,
          tokens_lib.stream(keys, tokens_lib.COUNT_STREAM))


@functools.partial(jax.jit, static_argnames=("batch",))
def _adapt_keys(key, offset, *, batch: int):
  """Per-sample keys of the adaptive sampler's own draws (candidates, random policies)."""
  return tokens_lib.stream(tokens_lib.sample_keys(key, batch, offset), tokens_lib.POLICY_STREAM)


@dataclasses.dataclass
class Samples:
  tokens: np.ndarray         # int32 [B, n]
  order: np.ndarray          # int32 [B, n]
  plan: schedules.StepPlan | None
  logits: np.ndarray | None  # debug: [passes, B, Q, V] (diffusion, uncached, encoder) or
                             # [steps, B, V] (ar); speculative: its trace dict
  passes: np.ndarray | None = None   # speculative: model passes each row needed (no prefill);
                                     # adaptive: steps each row took
  # return_logp=True (LOGP_METHODS), float32 [B, n] in RANK layout (as ``order``), 0 at the
  # prompt's ranks: the log-probability of each written token under the distribution it was
  # drawn from (temperature, top-p; 0 when greedy) ...
  logp: np.ndarray | None = None
  # ... and under the model's own (temperature 1, top-p 1): what `posttrain.likelihood.
  # sequence_logp` recomputes from (tokens, order, step_of_rank, prompt).
  model_logp: np.ndarray | None = None
  # int32 [B, n]: the step (0, 1, ... over the steps that write something) that wrote each
  # rank, -1 at the prompt's ranks (diffusion, uncached, ar, adaptive; None for the others).
  step_of_rank: np.ndarray | None = None
  # adaptive with return_logp=True, float32 [B, n] rank layout: the log-probability of the
  # choice of each rank's position (the stochastic policy's Plackett-Luce draw,
  # `posttrain.likelihood.order_logp`); 0 at the prompt and for a deterministic policy.
  order_logp: np.ndarray | None = None


def planned_step_of_rank(counts: np.ndarray, prompt_len: np.ndarray) -> np.ndarray:
  """int32 [B, n] (n = prompt + generated positions of every row): -1 at the prompt's ranks, then
  the index of the step that wrote each rank, counting only the steps that write something
  (``counts`` int [B, T] reveals per step, the diffusion plan's)."""
  counts_BxT, plen_B = np.asarray(counts, np.int64), np.asarray(prompt_len, np.int64)
  n = int(plen_B[0] + counts_BxT[0].sum())
  out_BxN = np.full((counts_BxT.shape[0], n), -1, np.int32)
  for b, row in enumerate(counts_BxT):
    nz = row[row > 0]
    out_BxN[b, plen_B[b]:] = np.repeat(np.arange(len(nz)), nz)
  return out_BxN


def as_key(key) -> jax.Array:
  """``key`` as one typed PRNG key: ``jax.random.key(seed)`` as it is, a legacy
  ``jax.random.PRNGKey(seed)`` (uint32[2]) wrapped into the same key; otherwise a ValueError."""
  if isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.shape:
      raise ValueError(f"key: one key expected, got an array of keys of shape {key.shape}")
    return key
  if isinstance(key, (jax.Array, np.ndarray)) and key.dtype == np.uint32 and key.shape == (2,):
    return jax.random.wrap_key_data(key)
  what = (f"an array of {key.dtype}{list(key.shape)}" if hasattr(key, "dtype") else
          f"{type(key).__name__} {key!r:.40}")
  raise ValueError(f"key: expected jax.random.key(seed) or jax.random.PRNGKey(seed), got {what}")


def prepare(cfg: ModelConfig, key: jax.Array, s: SampleSettings, *, prompt=None,
            batch: int | None = None, sample_offset: int = 0) -> Prepared:
  """Validates everything and draws orders and reveal counts (no model call, no compile)."""
  s.validate(cfg)
  key = as_key(key)
  n = s.length
  if prompt is None:
    if batch is None or batch < 1:
      raise ValueError(f"sample.batch_size: need a batch size >= 1 without a prompt, got {batch}")
    prompt = prompts.empty_prompt(batch, n)
  ptok, pmask = prompts.validate_prompt(*prompt, n, cfg.valid_vocab_size)
  if batch is not None and batch != ptok.shape[0]:
    raise ValueError(f"sample: batch {batch} differs from the prompt's {ptok.shape[0]} rows")
  b = ptok.shape[0]
  plen = pmask.sum(axis=1).astype(np.int32)
  if cfg.prompt_attention == "bidirectional_target" and plen.any():
    raise ValueError("model.prompt_attention='bidirectional_target': its prompt block holds the "
                     "first answer position, so no sampler can reuse it; sample with a prompt "
                     "from a model with 'causal' or 'bidirectional'")
  if s.method == "ar":
    prefix = np.arange(n)[None, :] < plen[:, None]
    if (pmask != prefix).any():
      row = int(np.argmax((pmask != prefix).any(axis=1)))
      raise ValueError(f"sample.method='ar' takes prefix prompts only; prompt row {row} is not "
                       f"a prefix")
  spec = "l2r" if s.method == "ar" else prompts.check_order(s.order, b, n)
  if s.method == "speculative":
    tok_keys, base, _ = _draw(key, jnp.int32(sample_offset), batch=b, length=n,
                              order=spec if isinstance(spec, str) else None)
    order = prompts.build_orders(pmask, np.asarray(base) if base is not None else spec)
    return Prepared(ptok, pmask, plen, order, np.ones((b, 1), np.int32), tok_keys)
  tok_keys, base, count_keys = _draw(key, jnp.int32(sample_offset), batch=b, length=n,
                                     order=spec if isinstance(spec, str) else None)
  if s.method == "ar":
    order = np.broadcast_to(np.arange(n, dtype=np.int32), (b, n)).copy()
    return Prepared(ptok, pmask, plen, order, np.ones((b, 1), np.int32), tok_keys)
  order = prompts.build_orders(pmask, np.asarray(base) if base is not None else spec)
  t = schedules.noise_schedule(s.schedule, s.num_steps)
  if s.count_mode == "deterministic":
    counts = schedules.deterministic_counts(n - plen, t)
  else:
    counts = schedules.stochastic_counts(count_keys, n - plen, t)
  if s.method == "adaptive":
    # The prompt first, the rest filled in as the policy chooses; steps that reveal nothing
    # change nothing, so each row's counts are compacted (its steps run back to back).
    order = prompts.build_orders(pmask, np.broadcast_to(np.arange(n, dtype=np.int32), (b, n)))
    nz = counts > 0
    counts = np.take_along_axis(counts, np.argsort(~nz, axis=1, kind="stable"), axis=1)
    if s.candidates is not None and s.policy != "threshold" and counts.max() > s.candidates:
      raise ValueError(f"sample.candidates: {s.candidates} is fewer than the {counts.max()} "
                       f"positions a step commits at steps={s.num_steps}; take candidates >= "
                       f"{counts.max()} or more steps")
    return Prepared(ptok, pmask, plen, order, counts, tok_keys,
                    _adapt_keys(key, jnp.int32(sample_offset), batch=b), bool(cfg.blank_block))
  return Prepared(ptok, pmask, plen, order, counts, tok_keys)


def plan(batches: Sequence[Prepared], *, block: int | None = None, pass_overhead: float = 4.0,
         method: str = "diffusion") -> list[schedules.StepPlan]:
  """Step plans with common static sizes (passes, block, queries, prefill), so every batch of a
  run uses one compiled sampler. ``block`` None: chosen by `schedules.choose_block` (the
  samples do not depend on it, only the speed); for the ``uncached`` and ``encoder`` methods,
  which run one full forward per step, one pass per step (a given ``block`` splits wider steps
  over several full forwards: the same samples, only slower)."""
  if block is None:
    work = [schedules.step_work(p.counts, p.prompt_len) for p in batches]
    full = method in FULL_FORWARD_METHODS
    block = (schedules.choose_block(work, pass_overhead) if not full else
             int(max(1, *(np.max(k + c, initial=1) for k, c in work))))
  first = [schedules.plan_steps(p.counts, p.prompt_len, block=block) for p in batches]
  mins = dict(min_passes=max(f.steps for f in first), min_queries=max(f.queries for f in first),
              min_prefill=max(f.prefill for f in first))
  return [schedules.plan_steps(p.counts, p.prompt_len, block=block, **mins) for p in batches]


def check_order_head(s: SampleSettings, encoder: bool = False, key: str = "sample") -> None:
  """One-line errors for an order head's decoding: the AO-GPT adaptive sampler, a policy whose
  scores it re-scores (not ``threshold``: its counts are not the scores'), and, for a stochastic
  head, one cell per step (a step's later choices would fall outside its top-k)."""
  if s.method != "adaptive" or encoder:
    raise ValueError(f"{key}.order_head: re-scores the AO-GPT adaptive sampler's candidates; "
                     f"expected {key}.method='adaptive' and an AO-GPT model, got method="
                     f"{s.method!r}{' on an encoder model' if encoder else ''}")
  if s.policy == "threshold":
    raise ValueError(f"{key}.order_head: the threshold policy commits by probability, not score; "
                     f"expected another {key}.policy (max_prob, margin, ...), got 'threshold'")
  if s.policy_temperature > 0 and s.num_steps != s.length:
    raise ValueError(f"{key}.steps: a stochastic order head draws one cell per step among its "
                     f"top-k; expected steps = length = {s.length}, got {s.num_steps}")


def adaptive_shape(p: Prepared, s: SampleSettings, *, block: int | None = None,
                   cached: bool = True, encoder: bool = False) -> adaptive_lib.AdaptiveShape:
  """The static sizes of the adaptive sampler for this batch: Q query slots (every masked
  position of the shortest prompt's row, or ``candidates``), catch-up slots for the widest step
  (``block``: slots per pass, at least Q + that; the samples do not depend on it). ``encoder``:
  the encoder's sampler (one full forward per step: no catch-up, prefill or ``block``)."""
  n = s.length
  q = n - int(p.prompt_len.min())
  q = max(1, q if s.candidates is None else min(q, int(s.candidates)))
  widest = q if s.policy == "threshold" else int(min(q, p.counts.max(initial=1)))
  # catch-up: the ranks a step commits after the first (whose slot is its query), or all of
  # them for model.blank_block (its queries see each other: `adaptive.sample_adaptive`)
  catchup = 0 if encoder else max(0, widest - (0 if p.blank_block else 1))
  if encoder and block is not None:
    raise ValueError(f"block: the encoder's adaptive sampler runs one full forward per step and "
                     f"has no slots per pass to set; leave it None, got {block}")
  if block is not None:
    if block < q + catchup:
      raise ValueError(f"block: the adaptive sampler needs at least {q + catchup} slots per pass "
                       f"({q} queries + {catchup} catch-up), got {block}")
    catchup = block - q
  # threshold: at least one commit per step and row
  max_steps = n - int(p.prompt_len.min()) if s.policy == "threshold" else int(p.counts.shape[1])
  return adaptive_lib.AdaptiveShape(
      queries=q, catchup=catchup, prefill=0 if encoder else int(p.prompt_len.max(initial=0)),
      max_steps=max(1, min(max_steps, n)), candidates=int(s.candidates or 0),
      policy=str(s.policy), threshold=float(s.threshold), cached=cached,
      policy_temperature=float(s.policy_temperature),
      phase_min=0 if encoder else adaptive_lib.PHASE_MIN_QUERIES, order_head=bool(s.order_head))


def _with_record(toks, logits, rec_BxNxK, order):
  """(tokens, logits) as before, or (tokens, (logits, the record in rank layout [K, B, n]))."""
  if rec_BxNxK is None:
    return toks, logits
  return toks, (logits, jnp.moveaxis(orders_lib.permute(rec_BxNxK, order), -1, 0))


@model_jit.jit("kind", "shape", "draw", "draft", "queries")
def sampler_program(model, order, tokens0, prompt_len, tok_keys, passes: Passes | None, *,
                    kind: str, shape: PassShape | None, draw: Draw, draft, queries=None):
  """Every sampler behind one jit: ``kind`` (sample.method) picks it; ``shape`` (planned
  methods), ``draw`` and ``draft`` (speculative) are static. With ``draw.logp`` (LOGP_METHODS)
  the second output is (logits, log-probabilities [2, B, n] in rank layout; adaptive: [3, B, n],
  the third the order's))."""
  if kind == "ar":
    return _with_record(*ar_lib.sample_ar(model, tokens0, prompt_len, tok_keys, shape.prefill,
                                          draw, shape.block), order)
  if kind == "speculative":
    toks, npasses, trace = spec_lib.sample_speculative(
        model, order, tokens0, prompt_len, tok_keys, draft=draft, temperature=draw.temperature,
        top_p=draw.top_p, top_p_rule=draw.top_p_rule, queries=queries, debug=draw.debug)
    return toks, (npasses, trace)
  if kind == "adaptive":      # the encoder MDM's (target 'none') or the AO-GPT's
    fn = (encoder_lib.sample_adaptive_encoder if encoder_model.is_encoder(model.cfg)
          else adaptive_lib.sample_adaptive)
    toks, order, steps, step_of_rank, logits, rec_BxNx3 = fn(
        model, order, tokens0, prompt_len, tok_keys, *passes, shape=shape, draw=draw)
    return _with_record(toks, (order, steps, step_of_rank, logits), rec_BxNx3, order)
  if kind == "diffusion":
    return _with_record(*diffusion.sample_cached(model, order, tokens0, prompt_len, tok_keys,
                                                 passes, shape, draw), order)
  if kind == "uncached":
    return _with_record(*diffusion.sample_uncached(model, order, tokens0, prompt_len, tok_keys,
                                                   passes, shape.queries, draw), order)
  fn = {"encoder": encoder_lib.sample_encoder}[kind]
  return fn(model, order, tokens0, tok_keys, passes, shape.queries, draw)


def program_args(p: Prepared, pl: schedules.StepPlan | None, s: SampleSettings, debug: bool,
                 adaptive: adaptive_lib.AdaptiveShape | None = None, encoder: bool = False,
                 return_logp: bool = False, prompt_blocked: bool = False):
  """The sampler program's arguments and static keywords (``encoder``: the model is the encoder
  MDM, `encoder_model.is_encoder`, which sizes the adaptive sampler without a cache;
  ``prompt_blocked``: the model attends to a prompt bidirectionally, `aogpt.prompt_block`)."""
  draw = Draw(temperature=float(s.temperature), top_p=float(s.top_p),
              top_p_rule=str(s.top_p_rule), greedy=bool(s.greedy), debug=bool(debug),
              logp=bool(return_logp))
  shape, passes, draft, queries = None, None, None, None
  if s.method == "ar":
    # steps from the shortest prefix; a bidirectional prompt's prefill covers the longest
    shape = PassShape(block=int(p.prompt_len.max(initial=0)) if prompt_blocked else 1,
                      queries=1, prefill=int(p.prompt_len.min()))
  elif s.method == "speculative":
    draft = s.draft if s.draft == "auto" else int(s.draft)
    queries = str(s.draft_queries)
  elif s.method == "adaptive":
    shape = adaptive or adaptive_shape(p, s, encoder=encoder)
    passes = (jnp.asarray(p.counts), p.adapt_keys)
  else:
    shape, passes = pl.shape(), pl.passes()
  args = (jnp.asarray(p.order), jnp.asarray(p.tokens0),
          jnp.asarray(p.prompt_len), p.tok_keys, passes)
  return args, dict(kind=s.method, shape=shape, draw=draw, draft=draft, queries=queries)


def compile_sampler(model: AOGPT, p: Prepared, pl: schedules.StepPlan | None,
                    s: SampleSettings, debug: bool = False,
                    adaptive: adaptive_lib.AdaptiveShape | None = None):
  """Ahead-of-time compiles the sampler for this batch shape; returns ``run() -> (tokens,
  logits)`` (for benchmarks: compile time apart from run time)."""
  args, kw = program_args(p, pl, s, debug, adaptive, encoder_model.is_encoder(model.cfg),
                          prompt_blocked=model.cfg.prompt_attention != "causal")
  with tokens_lib.exact_sampling():
    return model_jit.compile_ahead(sampler_program, model, *args, **kw)


def check_return_logp(s: SampleSettings, return_logp: bool, cfg: ModelConfig | None = None):
  if return_logp and s.method not in LOGP_METHODS:
    raise ValueError(f"return_logp: recorded for sample.method in {LOGP_METHODS}, got "
                     f"{s.method!r}")
  if return_logp and cfg is not None and encoder_model.is_encoder(cfg):
    raise ValueError("return_logp: recorded for the AO-GPT decoder; the encoder MDM "
                     "(model.target='none') has no exact likelihood of its rollouts")


def sample_batch(model: AOGPT, p: Prepared, pl: schedules.StepPlan | None, s: SampleSettings,
                 *, debug: bool = False, adaptive: adaptive_lib.AdaptiveShape | None = None,
                 return_logp: bool = False) -> Samples:
  """``adaptive``: the adaptive sampler's static sizes (None: `adaptive_shape` of ``p``).
  ``return_logp``: fill `Samples.logp` and ``model_logp`` (LOGP_METHODS)."""
  check_return_logp(s, return_logp, model.cfg)
  args, kw = program_args(p, pl, s, debug, adaptive, encoder_model.is_encoder(model.cfg),
                          return_logp, prompt_blocked=model.cfg.prompt_attention != "causal")
  with tokens_lib.exact_sampling():
    toks, logits = model_jit.call(sampler_program, model, *args, **kw)
  if s.method == "adaptive":
    lp = [None] * 3
    if return_logp:
      logits, lp = logits
      lp = np.asarray(lp)
    order, steps, step_of_rank, logits = logits
    return Samples(np.asarray(toks), np.asarray(order), None,
                   None if logits is None else np.asarray(logits), np.asarray(steps),
                   logp=lp[0], model_logp=lp[1], step_of_rank=np.asarray(step_of_rank),
                   order_logp=lp[2])
  if s.method == "speculative":
    passes, trace = logits
    trace = None if trace is None else {k: np.asarray(v) for k, v in trace.items()}
    return Samples(np.asarray(toks), p.order, pl, trace, np.asarray(passes))
  lp = None
  if return_logp:
    logits, lp = logits
    lp = np.asarray(lp)
  if s.method == "ar":
    step_of_rank = np.where(np.arange(s.length)[None, :] < p.prompt_len[:, None], -1,
                            np.arange(s.length)[None, :] - p.prompt_len[:, None])
  else:
    step_of_rank = planned_step_of_rank(p.counts, p.prompt_len)
  return Samples(np.asarray(toks), p.order, pl, None if logits is None else np.asarray(logits),
                 logp=None if lp is None else lp[0], model_logp=None if lp is None else lp[1],
                 step_of_rank=step_of_rank.astype(np.int32)
                 if s.method in LOGP_METHODS else None)


def generate(model: AOGPT, key: jax.Array, s: SampleSettings, *, prompt=None,
             batch: int | None = None, sample_offset: int = 0, block: int | None = None,
             debug: bool = False, reference: bool = False, return_logp: bool = False) -> Samples:
  """Samples one batch. ``prompt`` = (tokens int[B, n], mask bool[B, n]) (see
  `sampling.prompts`); row b uses the key ``fold_in(key, sample_offset + b)``. ``block``: slots
  per forward pass (None: chosen by a cost model; the samples do not depend on it). ``debug``
  returns every pass's query logits. ``reference`` (adaptive only): the uncached reference, a
  full explicit-mask forward per step (the test oracle; the same samples). ``return_logp``
  (LOGP_METHODS, the AO-GPT decoder): also record every drawn token's log-probability, under
  the distribution drawn from and the model's own (`Samples.logp`, ``model_logp``; a
  log-softmax per query, plus a second top-p cut-off when top-p < 1), with ``step_of_rank``:
  the rollout's exact likelihood, as `posttrain.likelihood.sequence_logp` recomputes it;
  adaptive: also ``order_logp``, the stochastic policy's choices (`likelihood.order_logp`)."""
  check_return_logp(s, return_logp, model.cfg)
  p = prepare(model.cfg, key, s, prompt=prompt, batch=batch, sample_offset=sample_offset)
  if s.method == "adaptive":
    encoder = encoder_model.is_encoder(model.cfg)
    if reference and encoder:
      raise ValueError("generate: reference=True is the AO-GPT adaptive sampler's uncached twin; "
                       "the encoder's adaptive sampler has no cache (leave reference=False)")
    shape = adaptive_shape(p, s, block=block, cached=not reference, encoder=encoder)
    return sample_batch(model, p, None, s, debug=debug, adaptive=shape, return_logp=return_logp)
  if reference:
    raise ValueError("generate: reference=True is for sample.method='adaptive' (the uncached "
                     "twin of 'diffusion' is method='uncached')")
  pl = None if s.method in PLANLESS_METHODS else plan([p], block=block, method=s.method)[0]
  return sample_batch(model, p, pl, s, debug=debug, return_logp=return_logp)
