"""Evaluation results as files and tables: WORKDIR/eval/<name>.json (every number and the
settings that produced it) and <name>.md (the paper's Table 4 layout: perplexity, with the mean
NLL in nats/token, the unit training logs, in parentheses; each column says how many blocks it
scored). Existing results are never overwritten (the new ones get <name>-2, <name>-3, ...);
files are written atomically."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax

from aogpt_jax.evaluation import ensembles as ens_lib
from aogpt_jax.train import workdir as workdir_lib


def result_stem(workdir: str, name: str) -> str:
  """The stem the results of ``name`` get in WORKDIR/eval/: ``name``, or ``name-2``, ... when
  earlier results hold it (results are never overwritten)."""
  workdir_lib.check_name(name, "eval.name")
  return workdir_lib.fresh_stem(os.path.join(workdir, "eval"), name, (".json", ".md"))


def write_results(workdir: str, name: str, results: Mapping[str, Any],
                  stem: str | None = None) -> tuple[str, str]:
  """WORKDIR/eval/<stem>.json (everything) and <stem>.md (the table), each written atomically;
  process 0 only. ``stem``: from `result_stem` (rewriting the same run's partial results as
  datasets finish); None: a fresh one for ``name``."""
  out = os.path.join(workdir, "eval")
  if stem is None:
    stem = result_stem(workdir, name)
  js, md = os.path.join(out, f"{stem}.json"), os.path.join(out, f"{stem}.md")
  if jax.process_index() == 0:
    os.makedirs(out, exist_ok=True)
    workdir_lib.write_json_atomic(js, json.dumps(results, indent=2))
    workdir_lib.write_json_atomic(md, markdown_table(results) + "\n")
  return js, md


def _fmt(summary: Mapping[str, Any] | None, key: str = "ppl") -> str:
  """``perplexity (nats/token)`` and any 95% CI of the perplexity in brackets."""
  if not summary:
    return "-"
  text = f"{summary[key]:.2f}"
  if key == "ppl" and "nll" in summary:
    text += f" ({summary['nll']:.3f})"
  if "ppl_ci95" in summary and key == "ppl":
    lo, hi = summary["ppl_ci95"]
    text += f" [{lo:.2f}, {hi:.2f}]"
  return text


def table_rows(results: Mapping[str, Any]) -> list[tuple[str, dict[str, str]]]:
  """(label, {dataset: cell}) per row of one results dict (perplexities; CIs in brackets)."""
  ds = results["datasets"]
  s = results["settings"]
  encoder = results.get("model_kind", s.get("model_kind", "aogpt")) == "encoder"
  cells = lambda key: {d: _fmt(ds[d].get(key)) for d in ds}
  rows = []
  if s.get("l2r"):
    rows.append(("L2R (exact, n forwards)" if encoder else "L2R", cells("l2r")))
  if s.get("any_order"):
    label = "Any-order exact NLL" if encoder else "Any-order"
    label += f" ({s['order']}, {s['num_orders']} order draw(s), seed {s['seed']}"
    label += (", n forwards" if encoder else "") + (", 95% CI)" if s["num_orders"] > 1 else ")")
    rows.append((label, cells("any_order")))
  if s.get("ensemble_max_m"):
    for mm in ens_lib.m_values(s["ensemble_max_m"]):
      rows.append((f"Ensemble M={mm}", {
          d: f"{ds[d]['ensemble']['ppl'][str(mm)]:.2f} ({ds[d]['ensemble']['nll'][str(mm)]:.3f})"
          if ds[d].get("ensemble") else "-" for d in ds}))
  if encoder and s.get("elbo_samples"):
    k = s["elbo_samples"]
    label = f"ELBO bound ({k} t-samples, seed {s['seed']}"
    label += (", stratified" if s.get("elbo_stratified") else "") + (", 95% CI)" if k > 1 else ")")
    rows.append((label, cells("elbo")))
  return rows


HEADER = "Method: perplexity (nats/token)"


def _blocks(dataset: Mapping[str, Any]) -> str:
  """``N blocks`` scored for a dataset's column header (eval.max_blocks caps N)."""
  for key in ("l2r", "any_order", "elbo"):
    if dataset.get(key) and "blocks" in dataset[key]:
      return f" ({int(dataset[key]['blocks'])} blocks)"
  return ""


def _table(columns: list[str], rows: list[tuple[str, Mapping[str, str]]],
           labels: Mapping[str, str] | None = None) -> str:
  labels = labels or {}
  lines = [f"| {HEADER} | " + " | ".join(labels.get(d, d) for d in columns) + " |",
           "|---" * (len(columns) + 1) + "|"]
  lines += [f"| {label} | " + " | ".join(c.get(d, "-") for d in columns) + " |"
            for label, c in rows]
  return "\n".join(lines)


def markdown_table(results: Mapping[str, Any]) -> str:
  """Table 4 layout: datasets as columns; L2R, any-order and ensemble-M rows (perplexity); for
  an encoder, exact L2R / any-order rows and the ELBO row."""
  ds = results["datasets"]
  return _table(list(ds), table_rows(results), {d: d + _blocks(ds[d]) for d in ds})


def markdown_comparison(results_by_model: Mapping[str, Mapping[str, Any]]) -> str:
  """Several models' results (e.g. ``{"AO-GPT": r1, "Encoder MDM": r2}``) in one table: the union
  of their datasets as columns, each row labelled ``"<model>: <row>"`` ("-" where missing)."""
  columns: list[str] = []
  rows = []
  for name, results in results_by_model.items():
    columns += [d for d in results["datasets"] if d not in columns]
    rows += [(f"{name}: {label}", c) for label, c in table_rows(results)]
  return _table(columns, rows)   # the models may have scored different blocks
