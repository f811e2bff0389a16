"""Search decoding: a beam over (cell, token) choices that can give a choice up (``solve.search``).

Greedy adaptive decoding (max_prob) writes the cell the model is surest of and never takes it
back: one wrong cell and the puzzle is lost. The search keeps ``width`` partial answers per
puzzle (beams). Each step, every beam's pass scores every blank (one forward at the beam's cut:
the written cells causal in their order, every blank a query, the blank block's training
layout, `model.blanks.blank_slots`; the encoder MDM: one masked forward), takes the blank with the
largest top probability (max_prob's cell) and branches on its ``branch`` most likely tokens; of
the ``width * branch`` children the ``width`` with the largest cumulative log-probability stay
(a grid reached twice keeps its best score). A branch whose probability collapses falls out of
the beam: that is how a cell is taken back. Each beam's cumulative log-probability is EXACTLY
``sum(sequence_logp)`` of its rollout (its order, one cell a step:
`posttrain.likelihood.sequence_logp`; tested).

After every blank is written, ``rescore`` picks the answer among the finished beams: ``"logp"``
the largest cumulative log-probability; ``"pll"`` (the default) the largest pseudo-log-
likelihood ``sum_i log p(x_i | every other cell)`` over the answer cells (`pseudo_logp`: one
more pass per answer cell and beam), the model's own check of a finished grid. On held-out 6x6
puzzles that singles cannot solve, the beam holds the right grid far more often than its
cumulative log-probability ranks it first, and the pseudo-likelihood finds it
(docs/tasks.md, `benchmarks/search_frontier.py`).

Two modes, never mixed in a table:

* **model-only** (``checker=False``): the model's probabilities alone rank the beams.
* **checker in the loop** (``checker=True``): the task's rules prune every token that breaks them
  given the cells written so far (`Task.legal`: Sudoku's row / column / box rule), and the answer
  is the best-scoring beam the task's verifier accepts (else the best beam). Labelled "checker" in
  every output.

``width=1, branch=1`` is greedy max_prob (tested token for token against the adaptive sampler).
Cost: a step is one pass over ``width`` rows per puzzle; ``forwards`` counts the rows evaluated
(a row = one forward of one partial answer; the pseudo-likelihood adds a row per answer cell
and finished beam). For a blank-block AO-GPT the beams keep a KV cache each (`_BlankCache`): a
child starts from its parent's cache (gathered per branch inside the step's program), so a step
runs one catch-up slot (the cell the beam wrote last) and the beam's blanks as queries, not the
whole row; tested equal to the uncached reference (``cached=False``, beams, answers and scores).
The encoder MDM has nothing to cache: every pass is over the whole row. The pseudo-likelihood
rescoring runs uncached for both.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.model import blanks as blanks_lib
from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.model import jit as model_jit
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT, NO_TARGET, prompt_block


RESCORE = ("pll", "logp")
PLL_CHUNK = 2048     # most rows per pseudo-likelihood pass (powers of two: few shapes)


@dataclasses.dataclass(frozen=True)
class SearchSettings:
  width: int = 8          # beams kept per puzzle
  branch: int = 2         # tokens tried at a step's cell
  checker: bool = False   # the task's rules prune illegal tokens (labelled "checker")
  rescore: str = "pll"    # the final pick: "pll" (pseudo-likelihood) or "logp" (cumulative)

  def validate(self, where: str = "solve") -> None:
    for key, lo in (("width", 1), ("branch", 1)):
      v = getattr(self, key)
      if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{where}.search_{key}: must be an integer >= {lo}, got {v!r}")
    if not isinstance(self.checker, bool):
      raise ValueError(f"{where}.search_checker: must be True or False, got {self.checker!r}")
    if self.rescore not in RESCORE:
      raise ValueError(f"{where}.search_rescore: must be one of {', '.join(RESCORE)}, got "
                       f"{self.rescore!r}")

  @property
  def label(self) -> str:
    mode = "checker" if self.checker else "model-only"
    return f"search width {self.width} branch {self.branch}, {self.rescore} ({mode})"


@dataclasses.dataclass
class SearchResult:
  tokens: np.ndarray       # int32 [P, n] the answers
  order: np.ndarray        # int32 [P, n] prompt first (ascending), then the written order
  logp: np.ndarray         # float64 [P] cumulative log-probability of each answer
  forwards: np.ndarray     # int64 [P] rows evaluated per puzzle (partial answers scored)
  steps: np.ndarray        # int64 [P] steps (cells written)
  beams: np.ndarray        # int32 [P, W, n] every final beam (best first), for rescoring
  beam_logp: np.ndarray    # float64 [P, W] their cumulative log-probabilities (-inf: none)
  beam_score: np.ndarray   # float64 [P, W] what ranked them (``rescore``)


def check_model(model: AOGPT) -> None:
  if not (model.cfg.blank_block or encoder_model.is_encoder(model.cfg)):
    raise ValueError("solve.search_width: search decoding needs a blank-block AO-GPT "
                     "(model.blank_block=True, the task configs' default) or the encoder MDM; "
                     "this model is neither (set solve.search_width=0 for the sampler)")


def blank_pass(model: AOGPT, tokens, order, cut, plen):
  """(logits [R, n, V] float32, `AOGPT.head_features` [R, n, d]) of every position's query
  (original order) at each row's cut (the first ``cut`` ranks of ``order`` written; the blank
  block's training layout, `model.blanks.blank_slots`). Traceable."""
  tok, pos, tgt, mask = blanks_lib.blank_slots(tokens, order, cut,
                                               prompt_block(model.cfg, plen),
                                               causal=model.cfg.blank_attention == "causal")
  h, _ = model.hidden_slots(tok, pos, tgt, mask=mask)
  logits, feats = model.head_and_features(h, tgt)
  inv = jnp.argsort(order, axis=-1)[:, :, None]     # position -> rank
  return (jnp.take_along_axis(logits.astype(jnp.float32), inv, axis=1),
          jnp.take_along_axis(feats.astype(jnp.float32), inv, axis=1))


@model_jit.jit()
def _logp_blank(model: AOGPT, tokens, order, cut, plen):
  """float32 [R, n, V]: log-probabilities of every position's token (original order) at each
  row's cut (`blank_pass`'s logits; the features are not computed)."""
  return jax.nn.log_softmax(blank_pass(model, tokens, order, cut, plen)[0], axis=-1)


@model_jit.jit()
def _logp_encoder(model: AOGPT, tokens, masked):
  n = tokens.shape[1]
  pos = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), tokens.shape)
  lg = encoder_model.masked_logits(model, tokens, masked, pos)
  return jax.nn.log_softmax(lg.astype(jnp.float32), axis=-1)


@model_jit.jit("cache_len")
def _prefill_blank(model: AOGPT, tokens, order, plen, cache_len: int):
  """The KV cache [R, ..., cache_len, ...] of the blank-block search with each row's prompt
  (ranks 0..plen-1, a bidirectional prompt as one block) written at indices = ranks."""
  r_count, n = tokens.shape
  cache = model.init_cache(r_count, cache_len)
  rank = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (r_count, n))
  tok, pos, tgt, write, mask = blanks_lib.written_cache_slots(
      order, tokens, rank, rank < plen[:, None],
      orders_lib.block_limit(rank, prompt_block(model.cfg, plen)), cache_len)
  _, cache = model.hidden_slots(tok, pos, tgt, mask=mask, cache=cache, write_index=write)
  return cache


@model_jit.jit()
def _cached_blank(model: AOGPT, cache, src, tokens, order, cut, prev, plen, cand, valid):
  """One cached step of the blank-block search for R rows: each row's cache is first row
  ``src`` of ``cache`` (its parent beam's), then the rank ``cut - 1`` a row committed
  last step (``prev``) is a causal catch-up slot at its cache index, and the row's blanks
  ``cand`` [R, Q] (``valid``; the rest padding) as queries in the scratch region n..n+Q-1,
  seeing the written slots and each other (``model.blank_attention``). Returns float32 [R, n,
  V] log-probabilities in position space (-inf where no query ran) and the cache."""
  r_count, n = tokens.shape
  q = cand.shape[1]
  cache = jax.tree.map(lambda x: x[src], cache)   # a child starts from its parent's cache
  cache_len = cache[0][0].shape[2]
  kk = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
  block = prompt_block(model.cfg, plen)
  crank = jnp.maximum(cut - 1, 0)[:, None]
  ctok, cpos, ctgt, cwrite, cmask = blanks_lib.written_cache_slots(
      order, tokens, crank, prev[:, None], orders_lib.block_limit(crank, block), cache_len)
  targets = jnp.where(valid, cand, NO_TARGET)
  qtok, qpos, qtgt = blanks_lib.blank_queries(targets)
  seen = jnp.broadcast_to(valid[:, None, :], (r_count, q, q))
  if model.cfg.blank_attention == "causal":       # the blanks at positions up to its own
    seen = seen & orders_lib.mask_from_ranks(cand, cand)
  scratch = jnp.broadcast_to(n + jnp.arange(q, dtype=jnp.int32), (r_count, q))
  seen_k = jnp.pad(seen, ((0, 0), (0, 0), (n, cache_len - n - q)))
  qmask = (((kk < cut[:, None, None]) | seen_k) & valid[..., None]) | (
      kk == scratch[..., None])
  hidden, cache = model.hidden_slots(
      jnp.concatenate([qtok, ctok], 1), jnp.concatenate([qpos, cpos], 1),
      jnp.concatenate([qtgt, ctgt], 1), mask=jnp.concatenate([qmask, cmask], 1), cache=cache,
      write_index=jnp.concatenate([scratch, cwrite], 1))
  lp = jax.nn.log_softmax(model.head(hidden[:, :q], qtgt).astype(jnp.float32), axis=-1)
  out = jnp.full((r_count, n, lp.shape[-1]), -jnp.inf, jnp.float32)
  rows = jnp.arange(r_count)[:, None]
  return out.at[rows, cand].set(jnp.where(valid[..., None], lp, -jnp.inf)), cache


class _BlankCache:
  """The cached search's state for a blank-block AO-GPT: one KV cache row per beam (the written
  slots at indices = ranks, then a scratch region for the queries), gathered per branch: a
  child starts from its parent's cache and adds one catch-up slot. Each step runs the beams'
  blanks only, on the fewest query slots of ``PHASES`` that hold every row's blanks."""

  def __init__(self, model: AOGPT, tokens, order, plen):
    self.n = tokens.shape[1]
    self.q0 = max(int(self.n - plen.min()), 1)
    self.phases = sorted({max(1, -(-self.q0 // (2 ** i))) for i in range(8)})
    self.prefill = model_jit.bind(_prefill_blank, model)
    self.step_fn = model_jit.bind(_cached_blank, model)
    self.cache = self.prefill(jnp.asarray(tokens), jnp.asarray(order),
                              jnp.asarray(plen, jnp.int32), cache_len=self.n + self.q0)
    self.prev = np.zeros(len(tokens), bool)
    self.src = np.arange(len(tokens), dtype=np.int32)

  def logp(self, tokens, order, k, plen, written) -> np.ndarray:
    blank = ~written
    q = next(p for p in self.phases if p >= int(blank.sum(1).max(initial=1)))
    ar = np.arange(self.n)
    cand = np.argsort(np.where(blank, ar, self.n + ar), axis=1, kind="stable")[:, :q]
    valid = np.take_along_axis(blank, cand, 1)
    lp, self.cache = self.step_fn(self.cache, jnp.asarray(self.src), jnp.asarray(tokens),
                                  jnp.asarray(order),
                                  jnp.asarray(k, jnp.int32), jnp.asarray(self.prev),
                                  jnp.asarray(plen, jnp.int32),
                                  jnp.asarray(cand.astype(np.int32)), jnp.asarray(valid))
    return np.asarray(lp)

  def branch(self, src: np.ndarray, advanced: np.ndarray) -> None:
    """The children's caches: row i becomes its parent ``src[i]``'s (gathered inside the next
    step's program); ``advanced``: the child wrote a cell (its catch-up slot runs next step)."""
    self.src = np.asarray(src, np.int32)
    self.prev = np.asarray(advanced, bool)


def _node_logp(fn, encoder: bool, tokens, order, k, plen, written):
  if encoder:
    return np.asarray(fn(jnp.asarray(tokens), jnp.asarray(~written)))
  return np.asarray(fn(jnp.asarray(tokens), jnp.asarray(order), jnp.asarray(k, jnp.int32),
                       jnp.asarray(plen, jnp.int32)))


def search(model: AOGPT, tokens, prompt, settings: SearchSettings, *, vocab: int,
           legal=None, accept=None, cached: bool = True) -> SearchResult:
  """Search-decodes the puzzles ``tokens`` (int [P, n]: the givens where ``prompt`` [P, n] is
  True, anything elsewhere) with ``settings`` (module docstring). ``vocab``: the task's token
  count (tokens >= it are never written). ``legal(tokens [R, n], written [R, n]) -> bool [R, n,
  vocab]`` (checker mode: the task's rule); ``accept(tokens [R, n]) -> bool [R]`` (checker mode:
  the verifier). ``cached`` (a blank-block AO-GPT): a KV cache per beam, gathered per branch
  (`_BlankCache`); False: every pass over the whole row (the reference; the MDM always)."""
  settings.validate()
  check_model(model)
  if settings.checker and (legal is None or accept is None):
    raise ValueError("solve.search_checker: this task has no rule checker (Task.legal and "
                     "Task.valid); expected solve.search_checker=False")
  encoder = encoder_model.is_encoder(model.cfg)
  fn = model_jit.bind(_logp_encoder if encoder else _logp_blank, model)
  prompt = np.asarray(prompt, bool)
  p_count, n = prompt.shape
  w, b = settings.width, settings.branch
  plen = prompt.sum(1)
  base_order = np.argsort(np.where(prompt, np.arange(n), n + np.arange(n)), axis=1, kind="stable")
  # beams [P, W]: tokens, written mask, order, cut, score, alive
  tok = np.repeat(np.where(prompt, tokens, 0)[:, None], w, 1).astype(np.int32)
  wr = np.repeat(prompt[:, None], w, 1)
  order = np.repeat(base_order[:, None], w, 1).astype(np.int32)
  k = np.repeat(plen[:, None], w, 1).astype(np.int32)
  score = np.full((p_count, w), -np.inf)
  score[:, 0] = 0.0
  flat = lambda a: a.reshape(p_count * w, *a.shape[2:])       # noqa: E731
  kv = (_BlankCache(model, flat(tok), flat(order), np.repeat(plen, w))
        if cached and not encoder else None)
  forwards = np.zeros(p_count, np.int64)
  steps = (n - plen).astype(np.int64)
  for _ in range(int(steps.max(initial=0))):
    active = (k < n) & np.isfinite(score)                        # [P, W]
    if not active.any():
      break
    forwards += active.sum(1)
    if kv is not None:
      lp = kv.logp(flat(tok), flat(order), flat(k), np.repeat(plen, w), flat(wr))
    else:
      lp = _node_logp(fn, encoder, flat(tok), flat(order), flat(k), np.repeat(plen, w),
                      flat(wr))
    lp = lp[:, :, :vocab].astype(np.float64).reshape(p_count, w, n, vocab)
    if settings.checker:
      ok = legal(flat(tok), flat(wr)).reshape(p_count, w, n, vocab)
      lp = np.where(ok, lp, -np.inf)
    lp = np.where(wr[..., None], -np.inf, lp)
    top = lp.max(-1)                                             # [P, W, n]
    cell = np.argmax(top, -1)                                    # max_prob's cell (lowest tie)
    cell_lp = np.take_along_axis(lp, cell[..., None, None], 2)[:, :, 0]     # [P, W, V]
    digits = np.argsort(-cell_lp, -1, kind="stable")[..., :b]    # [P, W, B]
    child = score[..., None] + np.take_along_axis(cell_lp, digits, -1)
    dead = (~wr & ~np.isfinite(top)).any(-1)     # a blank no legal token fits: a dead end
    child = np.where((active & ~dead)[..., None], child, -np.inf)
    # a finished beam (or a dead one) carries itself over once, as branch 0
    done = ~active & np.isfinite(score)
    child[..., 0] = np.where(done, score, child[..., 0])
    flat_child = child.reshape(p_count, w * b)
    ranked = np.argsort(-flat_child, -1, kind="stable")
    new = [np.zeros_like(a) for a in (tok, wr, order, k)]
    new_score = np.full((p_count, w), -np.inf)
    src_row = np.repeat(np.arange(p_count)[:, None] * w, w, 1)   # a child's parent beam row
    advanced = np.zeros((p_count, w), bool)
    for p in range(p_count):
      kept, seen = 0, set()
      for j in ranked[p]:
        s = flat_child[p, j]
        if kept == w or not np.isfinite(s):
          break
        src, br = divmod(int(j), b)
        t, m, o, kk = tok[p, src].copy(), wr[p, src].copy(), order[p, src].copy(), k[p, src]
        if active[p, src]:
          c, d = int(cell[p, src]), int(digits[p, src, br])
          t[c], m[c] = d, True
          r = int(np.flatnonzero(o == c)[0])       # move cell c to rank kk
          o = np.insert(np.delete(o, r), kk, c)
          kk += 1
        key = (t.tobytes(), m.tobytes())
        if key in seen:
          continue
        seen.add(key)
        new[0][p, kept], new[1][p, kept], new[2][p, kept], new[3][p, kept] = t, m, o, kk
        new_score[p, kept] = s
        src_row[p, kept], advanced[p, kept] = p * w + src, bool(active[p, src])
        kept += 1
      for a, src_a in zip(new, (tok, wr, order, k)):
        a[p, kept:] = src_a[p, 0]
    tok, wr, order, k = new
    score = new_score
    if kv is not None:
      kv.branch(src_row.reshape(-1), advanced.reshape(-1))
  if settings.rescore == "pll" and w > 1:
    alive = np.isfinite(score)
    pl = pseudo_logp(fn, encoder, tok.reshape(p_count * w, n), np.repeat(prompt, w, 0),
                     alive.reshape(-1)).reshape(p_count, w)
    forwards += alive.sum(1) * (n - plen)
    score_pick = np.where(alive, pl, -np.inf)
  else:
    score_pick = score
  best = np.argmax(score_pick, 1)
  if settings.checker:
    ok = accept(tok.reshape(p_count * w, n)).reshape(p_count, w) & np.isfinite(score)
    best = np.where(ok.any(1), np.argmax(np.where(ok, score_pick, -np.inf), 1), best)
  pick = lambda a: a[np.arange(p_count), best]                   # noqa: E731
  rank = np.argsort(-score_pick, 1, kind="stable")
  return SearchResult(tokens=pick(tok), order=pick(order), logp=pick(score),
                      forwards=forwards, steps=steps,
                      beams=np.take_along_axis(tok, rank[:, :, None], 1),
                      beam_logp=np.take_along_axis(score, rank, 1),
                      beam_score=np.take_along_axis(score_pick, rank, 1))


def pseudo_logp(fn, encoder: bool, tokens, prompt, rows=None) -> np.ndarray:
  """float64 [R]: ``sum_i log p(x_i | every other cell)`` over each row's non-prompt cells (the
  model's own check of a finished answer: a cell that breaks a rule is unlikely given the rest).
  AO-GPT: the cell is the last blank, the rest written (prompt first, then ascending positions);
  the encoder MDM: the cell alone masked. ``fn``: the bound `_logp_blank` / `_logp_encoder`;
  ``rows`` bool [R]: score only these (others 0)."""
  tokens, prompt = np.asarray(tokens, np.int32), np.asarray(prompt, bool)
  r_count, n = tokens.shape
  use = np.ones(r_count, bool) if rows is None else np.asarray(rows, bool)
  r_idx, c_idx = np.nonzero(~prompt & use[:, None])
  out = np.zeros(r_count)
  ar = np.arange(n)
  chunk = min(PLL_CHUNK, 1 << max(len(r_idx) - 1, 0).bit_length())   # a power of two
  for s in range(0, len(r_idx), chunk):
    ri, ci = r_idx[s:s + chunk], c_idx[s:s + chunk]
    pad = chunk - len(ri)
    ri_p, ci_p = np.pad(ri, (0, pad), mode="edge"), np.pad(ci, (0, pad), mode="edge")
    tok = tokens[ri_p]
    key = np.where(prompt[ri_p], ar, n + ar)
    key[np.arange(chunk), ci_p] = 3 * n
    order = np.argsort(key, 1, kind="stable").astype(np.int32)
    written = np.ones((chunk, n), bool)
    written[np.arange(chunk), ci_p] = False
    lp = _node_logp(fn, encoder, tok, order, np.full(chunk, n - 1), prompt[ri_p].sum(1),
                    written)
    got = lp[np.arange(chunk), ci_p, tok[np.arange(chunk), ci_p]][:len(ri)]
    np.add.at(out, ri, got.astype(np.float64))
  return out
