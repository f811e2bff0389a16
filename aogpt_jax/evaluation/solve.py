"""Solving a task's puzzles with any sampler: ``--mode=solve`` and its Python API.

Every puzzle's given cells are the prompt; the sampler (``sample.*``: diffusion in any order, ar,
speculative, adaptive with any policy; the encoder baseline's encoder and adaptive samplers)
fills in the rest; the task's verifier checks the result::

    from aogpt_jax import tasks
    from aogpt_jax.evaluation import solve
    task = tasks.make("sudoku", size=4)
    puzzles = task.heldout(seed=0, count=64)
    res = solve.solve(model, task, puzzles, SampleSettings(length=task.length, method="adaptive",
                      policy="margin", steps=task.length), key=jax.random.key(0))
    res.summary["solved"]          # {"rate", "low", "high" (95% Wilson interval), "count", ...}
    res.rows[0]                    # one puzzle: output, order, steps, solved, cell_accuracy, ...

`solve` returns one row per puzzle and a summary: solved rate with its 95% interval, cell
accuracy, and how early decoding goes wrong (the first answer cell's accuracy, the rank of the
first wrong cell), with the sampler's steps and wall time. `write` stores them as
WORKDIR/solve/NAME.jsonl (one JSON row per puzzle), NAME.json (summary and provenance) and NAME.md,
never overwriting (NAME-2, ...).

Shape suffixes: B puzzles of a batch, N cells per row.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import Any

import jax
import numpy as np

from aogpt_jax.sampling import sampler as sampler_lib
from aogpt_jax.sampling import search as search_lib
from aogpt_jax.tasks import base as tasks_base
from aogpt_jax.train import workdir as workdir_lib

EARLY_CELLS = (1, 3, 10)   # "the first k answer cells all right" rates in the summary


@dataclasses.dataclass
class SolveResult:
  rows: list[dict[str, Any]]
  summary: dict[str, Any]


def wilson(successes: int, total: int, z: float = 1.959964) -> tuple[float, float]:
  """The 95% Wilson score interval of a proportion (sensible at 0 and at ``total``)."""
  if total <= 0:
    return 0.0, 1.0
  p = successes / total
  den = 1.0 + z * z / total
  mid = (p + z * z / (2 * total)) / den
  half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / den
  return max(0.0, mid - half), min(1.0, mid + half)


def check_puzzles(task, puzzles: dict, settings: sampler_lib.SampleSettings) -> None:
  """One-line errors before anything compiles: the rows fit the task and the settings."""
  tokens, prompt = np.asarray(puzzles["tokens"]), np.asarray(puzzles["prompt"])
  if tokens.ndim != 2 or tokens.shape != prompt.shape or tokens.shape[1] != task.length:
    raise ValueError(f"solve.puzzles: expected tokens and prompt of shape [rows, {task.length}] "
                     f"(task {task.name!r}), got {tokens.shape} and {prompt.shape}")
  if not len(tokens):
    raise ValueError("solve.puzzles: no puzzles")
  if settings.length != task.length:
    raise ValueError(f"sample.length: task {task.name!r} rows are {task.length} tokens, got "
                     f"{settings.length}")
  if tokens.min() < 0 or tokens.max() >= task.vocab_size:
    raise ValueError(f"solve.puzzles: tokens outside the task's vocabulary [0, "
                     f"{task.vocab_size})")
  full = np.asarray(prompt, bool).all(axis=1)
  if full.all():
    raise ValueError(f"solve.puzzles: every cell of the {len(full)} puzzles is given (no blank "
                     f"anywhere); expected puzzles with cells to fill")
  if full.any():
    logging.warning("solve.puzzles: %d of the %d puzzles have no blank (row %d first); they "
                    "count as solved as given", int(full.sum()), len(full),
                    int(np.argmax(full)))


def _steps(out: sampler_lib.Samples) -> np.ndarray:
  """Model steps each row took: adaptive (its own count), speculative (passes), the others (the
  steps that wrote something: `Samples.step_of_rank`, or the encoder's plan)."""
  if out.passes is not None:
    return np.asarray(out.passes, np.int64)
  if out.step_of_rank is not None:
    return np.asarray(out.step_of_rank).max(axis=1).astype(np.int64) + 1
  m, k = np.asarray(out.plan.m), np.asarray(out.plan.k)     # the encoder's plan: its passes
  return np.array([len(np.unique(m[:, b][k[:, b] > 0])) for b in range(m.shape[1])])


def batched(puzzles: dict, batch_size: int, decode, warm: bool = True):
  """Runs ``decode(prompt_tokens, prompt_mask, start) -> dict of [B, ...] arrays`` over the
  puzzles in batches of one shape (the last wraps around); ``warm``: the first batch once
  untimed first. Returns (each array concatenated to the puzzles' rows, wall seconds)."""
  ref_RxN = np.asarray(puzzles["tokens"], np.int32)
  given_RxN = np.asarray(puzzles["prompt"], bool)
  rows_total = len(ref_RxN)
  bs = max(1, min(int(batch_size), rows_total))
  parts, wall = {}, 0.0
  for start in range(0, rows_total, bs):
    idx = np.arange(start, start + bs) % rows_total       # the last batch wraps (one shape)
    args = (np.where(given_RxN[idx], ref_RxN[idx], 0), given_RxN[idx], start)
    if warm and start == 0:
      decode(*args)
    t0 = time.perf_counter()
    out = decode(*args)
    wall += time.perf_counter() - t0
    keep = min(bs, rows_total - start)
    for k, v in out.items():
      parts.setdefault(k, []).append(np.asarray(v)[:keep])
  return {k: np.concatenate(v) for k, v in parts.items()}, wall


def solve(model, task, puzzles: dict, settings: sampler_lib.SampleSettings, *,
          key: jax.Array | None = None, batch_size: int = 64, warm: bool = True) -> SolveResult:
  """Solves every puzzle (``{"tokens", "prompt"}``, [R, n]: the reference solution and the given
  cells) with ``settings``; row i uses the sampling key ``fold_in(key, i)``, so the result does
  not depend on ``batch_size``. ``warm``: the first batch is run once untimed first, so the
  reported wall time excludes compilation."""
  check_puzzles(task, puzzles, settings)
  settings.validate(model.cfg)
  key = jax.random.key(0) if key is None else sampler_lib.as_key(key)

  def decode(tokens, mask, start):
    out = jax.block_until_ready(sampler_lib.generate(model, key, settings, prompt=(tokens, mask),
                                                     sample_offset=start))
    return {"tokens": out.tokens, "order": out.order, "steps": _steps(out)}
  out, wall = batched(puzzles, batch_size, decode, warm)
  return score(task, puzzles, out["tokens"], out["order"], out["steps"], wall, settings)


def solve_search(model, task, puzzles: dict, settings: sampler_lib.SampleSettings,
                 search: search_lib.SearchSettings, *, batch_size: int = 64,
                 warm: bool = True) -> SolveResult:
  """Solves every puzzle with the search decoding (`sampling.search`; ``settings`` only names
  the run's sampler and length); ``summary["search"]`` holds its settings, its label (model-only
  or checker) and the rows evaluated per puzzle."""
  check_puzzles(task, puzzles, settings)
  search.validate()
  legal, accept = getattr(task, "legal", None), getattr(task, "valid", None)

  def decode(tokens, mask, start):
    r = search_lib.search(model, tokens, mask, search, vocab=task.vocab_size, legal=legal,
                          accept=accept)
    return {"tokens": r.tokens, "order": r.order, "forwards": r.forwards, "steps": r.steps}
  out, wall = batched(puzzles, batch_size, decode, warm)
  result = score(task, puzzles, out["tokens"], out["order"], out["steps"], wall, settings)
  fw = out["forwards"]
  result.summary["search"] = {**dataclasses.asdict(search), "label": search.label,
                              "rows_per_puzzle": float(fw.mean())}
  for row, f in zip(result.rows, fw):
    row["search_rows"] = int(f)
  return result


def score(task, puzzles: dict, out_RxN, order_RxN, steps_R, wall: float,
          settings: sampler_lib.SampleSettings) -> SolveResult:
  """`solve`'s result for outputs decoded elsewhere (``out_RxN`` and the ``order_RxN`` they were
  written in, ``steps_R`` steps each, ``wall`` seconds in all): the task's verdict and the same
  rows and summary (e.g. a slow reference decoder's, benchmarks/reasoning_gap.py)."""
  ref_RxN = np.asarray(puzzles["tokens"], np.int32)
  given_RxN = np.asarray(puzzles["prompt"], bool)
  verdict = tasks_base.verify(task, np.asarray(out_RxN), {"tokens": ref_RxN, "prompt": given_RxN},
                             "the model's outputs")
  return _result(task, ref_RxN, given_RxN, np.asarray(out_RxN), np.asarray(order_RxN),
                 np.asarray(steps_R), verdict, wall, settings)


def early_errors(out_RxN, ref_RxN, given_RxN, order_RxN) -> tuple[np.ndarray, np.ndarray]:
  """(correct [R, A] of the answer cells in the order they were written, A = the most answer
  cells of any row, False past a row's own; first wrong answer rank [R], -1 if none)."""
  m_R = given_RxN.sum(axis=1)
  right_RxN = np.take_along_axis(out_RxN == ref_RxN, order_RxN, axis=1)
  a = int(given_RxN.shape[1] - m_R.min())
  cols = m_R[:, None] + np.arange(a)[None, :]
  inside = cols < given_RxN.shape[1]
  correct = np.where(inside, np.take_along_axis(right_RxN, np.minimum(cols, given_RxN.shape[1]
                                                                      - 1), axis=1), False)
  wrong = inside & ~correct
  if not a:       # every cell given (a solved puzzle): no answer cell to get wrong
    return correct, np.full(len(m_R), -1)
  first = np.where(wrong.any(axis=1), wrong.argmax(axis=1), -1)
  return correct, first


def _result(task, ref_RxN, given_RxN, out_RxN, order_RxN, steps_R, verdict, wall,
            settings) -> SolveResult:
  rows_total = len(ref_RxN)
  solved_R = np.asarray(verdict["solved"], bool)
  cell_R = np.asarray(verdict["cell_accuracy"], np.float64)
  correct, first_R = early_errors(out_RxN, ref_RxN, given_RxN, order_RxN)
  m_R = given_RxN.sum(axis=1)
  rows = []
  for i in range(rows_total):
    row = {"index": i, "output": out_RxN[i].tolist(), "order": order_RxN[i].tolist(),
           "given": np.flatnonzero(given_RxN[i]).tolist(), "reference": ref_RxN[i].tolist(),
           "steps": int(steps_R[i]), "first_error_rank": int(first_R[i]),
           "rendered": task.render(out_RxN[i], given_RxN[i])}
    for k, v in verdict.items():
      v = np.asarray(v)[i]
      row[k] = v.item() if hasattr(v, "item") else v
    rows.append(row)
  solved = int(solved_R.sum())
  low, high = wilson(solved, rows_total)
  answer = (given_RxN.shape[1] - m_R)
  early = {}
  for k in EARLY_CELLS:
    ok = correct[:, :k].all(axis=1) & (answer >= k)
    early[f"first_{k}_right"] = float(ok.mean())
  errs = first_R[first_R >= 0]
  summary = {
      "task": task.name, "task_options": tasks_base.options(task), "rows": rows_total,
      "solved": {"count": solved, "rate": solved / rows_total, "low": low, "high": high,
                 "interval": "95% Wilson"},
      "cell_accuracy": float(cell_R.mean()),
      "first_cell_accuracy": float(correct[:, 0].mean()) if correct.shape[1] else 1.0,
      **early,
      "first_error_rank_median": float(np.median(errs)) if len(errs) else None,
      "rows_without_error": int((first_R < 0).sum()),
      "steps_mean": float(np.mean(steps_R)), "steps_max": int(np.max(steps_R)),
      "givens_mean": float(m_R.mean()),
      "wall_s": wall, "ms_per_puzzle": 1000.0 * wall / rows_total,
      "settings": dataclasses.asdict(settings) | {"order": str(settings.order)},
  }
  extra = {k: float(np.mean(np.asarray(v, np.float64))) for k, v in verdict.items()
           if k not in ("solved", "cell_accuracy")}
  summary["verifier_means"] = extra
  if callable(getattr(task, "grade", None)):
    summary["buckets"] = by_bucket(task, ref_RxN, given_RxN, solved_R, rows)
  return SolveResult(rows, summary)


def by_bucket(task, ref_RxN, given_RxN, solved_R, rows=None) -> dict:
  """Solved rates by difficulty bucket (a task with ``grade``: Sudoku's guess count,
  `tasks.sudoku_grade`), buckets in the grader's order; each row gets its ``guesses``."""
  from aogpt_jax.tasks import sudoku_grade
  g_R = np.asarray(task.grade({"tokens": ref_RxN, "prompt": given_RxN}))
  names = np.array(sudoku_grade.buckets(g_R))
  for i, row in enumerate(rows or []):
    row["guesses"] = int(g_R[i])
  out = {}
  for b in sudoku_grade.BUCKETS:
    sel = names == b
    if sel.any():
      k, n = int(solved_R[sel].sum()), int(sel.sum())
      low, high = wilson(k, n)
      out[b] = {"count": k, "rows": n, "rate": k / n, "low": low, "high": high}
  return out


def summary_line(summary: dict) -> str:
  s = summary["solved"]
  return (f"solved {s['count']}/{summary['rows']} ({100 * s['rate']:.1f}%, 95% interval "
          f"{100 * s['low']:.1f}-{100 * s['high']:.1f}%), cell accuracy "
          f"{100 * summary['cell_accuracy']:.1f}%, first answer cell right "
          f"{100 * summary['first_cell_accuracy']:.1f}%, {summary['steps_mean']:.1f} steps and "
          f"{summary['ms_per_puzzle']:.1f} ms per puzzle" + bucket_text(summary)
          + (f"; {summary['search']['label']}, {summary['search']['rows_per_puzzle']:.0f} "
             f"rows per puzzle" if summary.get("search") else ""))


def bucket_text(summary: dict) -> str:
  """"; by guesses: 0 98/100, 1-4 3/5" (empty without buckets)."""
  b = summary.get("buckets")
  if not b:
    return ""
  return "; solved by guesses: " + ", ".join(f"{k} {v['count']}/{v['rows']}" for k, v in b.items())


def markdown(summary: dict, provenance: dict) -> str:
  s = summary["solved"]
  lines = [f"# Solve: {summary['task']} ({summary['rows']} puzzles)", "",
           "| solved | 95% interval | cell accuracy | first answer cell right | "
           "first error rank (median) | steps (mean) | ms / puzzle |",
           "|---|---|---|---|---|---|---|",
           f"| {s['count']}/{summary['rows']} ({100 * s['rate']:.1f}%) | "
           f"{100 * s['low']:.1f}-{100 * s['high']:.1f}% | {100 * summary['cell_accuracy']:.1f}% "
           f"| {100 * summary['first_cell_accuracy']:.1f}% | "
           f"{summary['first_error_rank_median']} | {summary['steps_mean']:.1f} | "
           f"{summary['ms_per_puzzle']:.1f} |", ""]
  if summary.get("buckets"):
    lines += ["| guesses (`tasks.sudoku_grade`) | solved | 95% interval |", "|---|---|---|"]
    lines += [f"| {k} | {v['count']}/{v['rows']} ({100 * v['rate']:.1f}%) | "
              f"{100 * v['low']:.1f}-{100 * v['high']:.1f}% |" for k, v in
              summary["buckets"].items()] + [""]
  lines += [
           (f"Search decoding: **{summary['search']['label']}** (`sampling.search`), "
            f"{summary['search']['rows_per_puzzle']:.0f} rows evaluated per puzzle"
            if summary.get("search") else
            f"Sampler: `{json.dumps(summary['settings'], sort_keys=True)}`"), "",
           f"Task: `{summary['task']}` `{json.dumps(summary['task_options'], sort_keys=True, default=str)}`",
           "",
           f"Model: `{json.dumps(provenance, sort_keys=True, default=str)}`", ""]
  return "\n".join(lines)


def write(result: SolveResult, workdir: str, name: str, provenance: dict) -> str:
  """WORKDIR/solve/NAME.{jsonl,json,md} (NAME-2, ... if taken); returns the .jsonl path."""
  folder = os.path.join(workdir, "solve")
  os.makedirs(folder, exist_ok=True)
  stem = os.path.join(folder, workdir_lib.fresh_stem(folder, name, (".jsonl", ".json", ".md")))
  # every body made first: a value JSON cannot hold fails before any file is written
  bodies = {".jsonl": "".join(json.dumps(tasks_base.plain(r)) + "\n" for r in result.rows),
            ".json": json.dumps(tasks_base.plain({"summary": result.summary,
                                                  "provenance": provenance,
                                                  "rows_file": stem + ".jsonl"}),
                                indent=1, default=str),
            ".md": markdown(result.summary, provenance)}
  for suffix, body in bodies.items():
    workdir_lib.write_json_atomic(stem + suffix, body)
  return stem + ".jsonl"
