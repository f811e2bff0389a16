"""Evaluation entry point: zero-shot perplexities (L2R, any-order, context-order ensembles) of a
model over one or more datasets in one pass each, written as WORKDIR/eval/<name>.json (every
number and the settings that produced it) and <name>.md (the paper's Table 4 layout).

    from aogpt_jax import evaluation
    settings = evaluation.EvalSettings(num_orders=4, ensemble_max_m=8)
    results = evaluation.evaluate(model, {"wikitext2": batches_w2, "ptb": batches_ptb},
                                  settings, workdir=WORKDIR)
    # or, from a training workdir (EMA weights by default):
    results = evaluation.evaluate_workdir(
        WORKDIR, {"wikitext2": lambda: data.eval_batches(...)}, settings)

The encoder-only MDM baseline (`aogpt_jax.model.encoder`) is evaluated by the same driver with
``EvalSettings(model_kind="encoder")``: its L2R and any-order rows are exact NLLs for the same
orders (n forwards each), plus an ELBO row (K Monte Carlo t samples, 95% CI);
`report.markdown_comparison` puts several models' results in one table.

The pieces live in `aogpt_jax.evaluation`: perplexity (orders, weighting, float64 sums),
ensembles (Eq. 4 with prefixes only), encoder_nll (the encoder's exact order NLL and ELBO),
genppl + gpt2 (generative perplexity with a JAX GPT-2), report (the JSON and Markdown files).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np

from aogpt_jax.checkpoints import store
from aogpt_jax.evaluation import encoder_nll as enc_lib
from aogpt_jax.evaluation import ensembles as ens_lib
from aogpt_jax.evaluation import perplexity as ppl_lib
from aogpt_jax.evaluation import report
from aogpt_jax.evaluation.settings import EvalSettings
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.train import metrics as metrics_lib

Batches = Iterable[Mapping[str, Any]]
# EvalSettings lives in evaluation/settings.py so that config.py can read its fields without
# importing this module (which would close the cycle config -> evaluate -> checkpoint -> config).


def check_model(m: model_lib.AOGPT, s: EvalSettings) -> None:
  """Raises if ``s.model_kind`` does not fit the model (before anything compiles)."""
  if s.model_kind == "encoder":
    encoder_model.check_encoder(m.cfg, "eval.model_kind='encoder'")


def evaluate_dataset(m: model_lib.AOGPT, batches: Batches, s: EvalSettings,
                     name: str = "") -> dict:
  """One pass over ``batches``: every requested perplexity of one dataset."""
  check_model(m, s)
  # The encoder's L2R / any-order rows: exact NLL of the same orders, n forwards per order.
  token_nll = enc_lib.order_nll if s.model_kind == "encoder" else ppl_lib.token_nll
  l2r, anyo = ppl_lib.NLLSum(1), ppl_lib.NLLSum(s.num_orders)
  ms = ens_lib.m_values(s.ensemble_max_m) if s.ensemble_max_m else []
  ens = ppl_lib.NLLSum(len(ms))
  elbo = ppl_lib.NLLSum(s.elbo_samples if s.elbo else 1)
  t0 = time.perf_counter()
  total = len(batches) if hasattr(batches, "__len__") else None
  if s.max_batches:
    total = s.max_batches if total is None else min(total, s.max_batches)
  progress = metrics_lib.ProgressLog(f"eval {name} batches", total)
  for bi, tokens, weight, ids in ppl_lib.eval_blocks(batches, m.cfg, s.max_batches):
    for acc in (l2r, anyo, ens, elbo):
      acc.count(weight)
    if s.l2r:
      nll, order = token_nll(m, tokens, ids, order="l2r", seed=s.seed)
      l2r.add(ppl_lib.to_original(np.asarray(nll), np.asarray(order)), weight)
    base = None
    for k in range(s.num_orders if s.any_order else 0):
      nll, order = token_nll(m, tokens, ids, order=s.order, seed=s.seed, order_index=k,
                             order_kwargs=s.order_kwargs)
      anyo.add(ppl_lib.to_original(np.asarray(nll), np.asarray(order)), weight, k)
      if k == 0 and s.order == "uniform":
        base = (np.asarray(nll), np.asarray(order))
    if ms:
      if base is None:
        nll, order = ppl_lib.token_nll(m, tokens, ids, order="uniform", seed=s.seed)
        base = (np.asarray(nll), np.asarray(order))
      ens_lib.add_batch(ens, m, tokens, ids, weight, base[1], -base[0], ms=ms, seed=s.seed,
                        layout=s.ensemble_layout, num_buckets=s.ensemble_num_buckets,
                        slots_per_call=s.slots_per_call)
    if s.elbo:
      enc_lib.add_elbo_batch(elbo, m, tokens, ids, weight, seed=s.seed,
                             stratified=s.elbo_stratified)
    progress.update(bi + 1)
  out: dict[str, Any] = {}
  if s.l2r:
    l2r.reduce()
    out["l2r"] = ppl_lib.summarize(l2r.means(), l2r.tokens, l2r.blocks, order="l2r", seed=s.seed)
  if s.any_order:
    anyo.reduce()
    out["any_order"] = ppl_lib.summarize(anyo.means(), anyo.tokens, anyo.blocks, order=s.order,
                                         seed=s.seed)
  if ms:
    ens.reduce()
    out["ensemble"] = ens_lib.summarize(ens, ms, seed=s.seed, layout=s.ensemble_layout)
  if s.elbo:
    elbo.reduce()
    out["elbo"] = enc_lib.summarize_elbo(elbo, seed=s.seed, stratified=s.elbo_stratified)
  out["seconds"] = time.perf_counter() - t0
  return out


def cost_per_block(s: EvalSettings, n: int) -> float:
  """About how many full forwards of one block the settings cost (the estimate logged before an
  evaluation starts): 1 per L2R / any-order order (n for the encoder's exact rows), and for
  the ensembles (max_m - 1) orderings of every prefix, about n / 2 forwards each."""
  per_order = n if s.model_kind == "encoder" else 1
  forwards = per_order * (int(s.l2r) + (s.num_orders if s.any_order else 0))
  if s.ensemble_max_m > 1:
    forwards += 1 + (s.ensemble_max_m - 1) * n / 2
  if s.elbo:
    forwards += s.elbo_samples
  return float(forwards)


def block_length(batches) -> int | None:
  """The length of a dataset's blocks without consuming it: its ``seq_len`` (`data.eval_batches`)
  or, for a list of batches, the first one's; None when unknown."""
  n = getattr(batches, "seq_len", None)
  if n is None and isinstance(batches, (list, tuple)) and batches:
    n = np.shape(batches[0]["tokens"])[-1]
  return None if n is None else int(n)


def _log_cost(m: model_lib.AOGPT, datasets: Mapping[str, Any], s: EvalSettings) -> None:
  sizes = {}
  for name, b in datasets.items():
    n = len(b) if hasattr(b, "__len__") else None
    sizes[name] = min(n, s.max_batches) if n is not None and s.max_batches else n
  lengths = {block_length(b) for b in datasets.values()}
  n = lengths.pop() if len(lengths) == 1 and None not in lengths else None
  per_block = cost_per_block(s, n or m.cfg.block_size)    # unknown: at most model.block_size
  known = [v for v in sizes.values() if v is not None]
  logging.info("eval: %d dataset(s) %s; about %s full forwards per block of %s tokens%s",
               len(datasets), ", ".join(f"{k} ({v if v is not None else '?'} batches)"
                                        for k, v in sizes.items()),
               f"{per_block:,.0f}", n or f"at most {m.cfg.block_size}",
               "" if not s.ensemble_max_m else f" (ensembles up to M={s.ensemble_max_m})")
  if known and len(known) == len(sizes):
    logging.info("eval: about %s batch-forwards in all", f"{per_block * sum(known):,.0f}")


def evaluate(m: model_lib.AOGPT, datasets: Mapping[str, Batches | Callable[[], Batches]],
             settings: EvalSettings | None = None, *, workdir: str | None = None,
             name: str = "zero_shot", meta: Mapping[str, Any] | None = None) -> dict:
  """Evaluates every dataset (an iterable of batches, or a zero-argument callable giving one);
  with ``workdir`` writes WORKDIR/eval/<name>.json and .md (only on process 0; an existing
  ``name`` is kept and the new results get ``name-2``, ...) after every finished dataset, so an
  interrupted evaluation keeps what it finished (``"complete": false`` until the last one).
  ``results["files"]`` names the files written."""
  s = settings or EvalSettings()
  check_model(m, s)
  stem = report.result_stem(workdir, name) if workdir else None   # before any work
  results = {
      "name": name, "model_kind": s.model_kind, "settings": dataclasses.asdict(s),
      "unit": ("nll: mean negative log-likelihood per token in nats; ppl = exp(nll); tokens and "
               "blocks: what each row scored"),
      "model": m.cfg.to_dict(),
      "meta": dict(meta or {}), "jax": jax.__version__, "backend": jax.default_backend(),
      "processes": jax.process_count(),
      "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "complete": False, "datasets": {},
  }
  its = {k: (b() if callable(b) else b) for k, b in datasets.items()}
  _log_cost(m, its, s)
  for i, (ds_name, it) in enumerate(its.items()):
    results["datasets"][ds_name] = evaluate_dataset(m, it, s, ds_name)
    results["complete"] = i == len(its) - 1
    if workdir:
      results["files"] = list(report.write_results(workdir, name, results, stem=stem))
  return results


def evaluate_workdir(workdir: str, datasets: Mapping[str, Batches | Callable[[], Batches]],
                     settings: EvalSettings | None = None, *, which: str = "ema",
                     name: str = "zero_shot", meta: Mapping[str, Any] | None = None) -> dict:
  """Loads the ``which`` (default EMA) weights of a training workdir and runs `evaluate`;
  ``meta`` is added to the results' provenance."""
  m, run_cfg = store.load_model(workdir, which=which)
  return evaluate(m, datasets, settings, workdir=workdir, name=name,
                  meta={"workdir": os.path.abspath(workdir), **run_cfg.loaded.to_dict(),
                        **dict(meta or {})})
