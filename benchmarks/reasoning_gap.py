"""The reasoning gap: which AO-GPT variant learns a constraint task as well as the encoder MDM of
the same size, one command.

    python benchmarks/reasoning_gap.py                          # CPU size (6x6 Sudoku)
    python benchmarks/reasoning_gap.py --tasks=sudoku9          # 9x9 at a CPU size
    python benchmarks/reasoning_gap.py --size=accel             # 9x9, the 8 x 256 model

Every variant trains on the same puzzles (the task's seeded stream) for the same steps as the
encoder MDM, from configs/TASK.py (``:tiny`` at CPU size) plus the variant's overrides:

* ``mdm``: the encoder-only MDM (bidirectional over every cell, [MASK] for the blanks);
* ``causal``: AO-GPT with the published causal attention over the prompt;
* ``bidirectional``: the prompt's rank-slots 0..m-1 attend both ways (`model.prompt_attention`,
  exact KV cache);
* ``bidirectional_target``: the block also holds rank-slot m (the last given, conditioned on the
  first answer cell): the ablation whose cache is exact only after the first step; it is decoded
  by `reference_decode` (one training forward per candidate and step);
* ``bidirectional_uniform``: ``bidirectional`` with uniform orders over the blanks (no 10% L2R
  rows);
* ``bidirectional_2x``: ``bidirectional`` trained for twice the steps (does the gap close or
  only shift?);
* ``bidirectional_r2l``: ``bidirectional`` with 40% of the rows right to left (`orders.mixture`'s
  ``p_r2l``): a star graph's path from the goal back.
* ``blanks``: ``bidirectional`` plus a query slot for every blank, the blanks attending to each
  other (`model.blank_block`, model/blanks.py: an MDM-style block over the blanks on top of the
  causal, cached written prefix; the task configs' default); decoded by the adaptive sampler
  only, so its random order is the ``random`` policy;
* ``blanks_r2l``: ``blanks`` with 40% of the rows right to left;
* ``l2r``: the L2R model (the config's ``:l2r``: left-to-right orders only), solved left to right
  (the adaptive sampler's ``l2r`` policy).

Tasks (``--tasks``): ``sudoku`` (6x6), ``sudoku9``, ``star_graph`` (the config's), and
``star_graph_small`` (2 arms of 3 nodes, 12 labels: a graph small enough for a CPU), ``sft``.

Each is solved greedily on the same held-out puzzles with adaptive order (max_prob, margin: one
cell per step) and in a random order, and reports the held-out loss per blank (AO-GPT: any order
and L2R; the MDM: its ELBO bound), the solved rate with its 95% Wilson interval, the training
time per step and the decoding time per puzzle (the prompt's bidirectional pass included). For
``bidirectional`` it also decodes max_prob with `reference_decode` and reports whether it matches
the cached sampler puzzle for puzzle. Writes benchmarks/results/reasoning_gap_SIZE[_TASKS]/
<machine>.{json,md,png} (docs/tasks.md shows them).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys
import time

import numpy as np

import common
import order_matters

SIZES = {"cpu": "tiny", "accel": ""}
# label -> (config file, config argument besides the size, overrides, description)
# the published one-pass chain: no query block over the blanks (the task configs' default has one)
CHAIN = {"model.blank_block": False}
VARIANTS = {
    "mdm": ("", "mdm", {}, "encoder MDM"),
    "l2r": ("", "l2r", {}, "L2R model (left-to-right orders only)"),
    "causal": ("", "", {"model.prompt_attention": "causal", **CHAIN}, "AO-GPT, causal prompt"),
    "bidirectional": ("", "", {"model.prompt_attention": "bidirectional", **CHAIN},
                      "AO-GPT, bidirectional prompt (slots 0..m-1, exact cache)"),
    "bidirectional_target": ("", "", {"model.prompt_attention": "bidirectional_target", **CHAIN},
                             "AO-GPT, bidirectional prompt + slot m (first target)"),
    "bidirectional_uniform": ("", "", {"model.prompt_attention": "bidirectional", **CHAIN,
                                       "order.kwargs": {"p_l2r": 0.0}},
                              "AO-GPT, bidirectional prompt, no L2R rows"),
    "bidirectional_2x": ("", "", {"model.prompt_attention": "bidirectional", **CHAIN,
                                  "steps_factor": 2},
                         "AO-GPT, bidirectional prompt, twice the steps"),
    "bidirectional_r2l": ("", "", {"model.prompt_attention": "bidirectional", **CHAIN,
                                   "order.kwargs": {"p_l2r": 0.1, "p_r2l": 0.4}},
                          "AO-GPT, bidirectional prompt, 40% right-to-left rows"),
    "blanks": ("", "", {"model.prompt_attention": "bidirectional", "model.blank_block": True},
               "AO-GPT, bidirectional prompt + a query block over the blanks"),
    "blanks_r2l": ("", "", {"model.prompt_attention": "bidirectional", "model.blank_block": True,
                            "order.kwargs": {"p_l2r": 0.1, "p_r2l": 0.4}},
                   "AO-GPT, blanks, 40% right-to-left rows"),
}
# task name -> (config file, task options overriding the config's, default variants)
TASKS = {
    "sudoku": ("sudoku", {}, "mdm,causal,bidirectional,bidirectional_target,bidirectional_uniform,"
               "bidirectional_2x,blanks"),
    "sudoku9": ("sudoku", {"size": 9, "min_givens": 30, "max_givens": 40},
                "mdm,bidirectional,blanks"),
    "star_graph": ("star_graph", {}, "mdm,causal,bidirectional,bidirectional_r2l,blanks"),
    # a graph small enough for a CPU: 2 arms of 3 nodes (an L2R model: about 1 in 2)
    "star_graph_small": ("star_graph", {"degree": 2, "path_len": 3, "num_nodes": 12},
                         "l2r,blanks,blanks_r2l"),
    "sft": ("sft_text", {}, "causal,bidirectional"),
}
POLICIES = ("max_prob", "margin")


def reference_decode(model, puzzles: dict, policy: str, *, seed: int = 0,
                     batch: int = 100) -> dict:
  """Greedy decoding, one cell per step, by the training forward alone: at every step, for every
  unwritten cell c, the model's logits for c given the prompt and the cells written so far are
  rank m of ``model(tokens, order, prompt_len)`` with c placed at rank m (m = cells known), i.e.
  exactly the computation the loss trains; the policy (``max_prob``, ``margin`` or ``random``: a
  seeded random order) picks the cell, which takes its argmax token. Returns {"tokens", "order",
  "wall_s"} (numpy). Slow (a forward per candidate and step) but needs no cache, so it decodes
  every `model.prompt_attention`, ``bidirectional_target`` included, and checks the cached
  samplers independently."""
  import jax
  import jax.numpy as jnp
  ref = np.asarray(puzzles["tokens"], np.int32)
  given = np.asarray(puzzles["prompt"], bool)
  r_total, n = ref.shape
  w = int(n - given.sum(1).min())                   # candidates per row: its blanks, padded

  @jax.jit
  def step_logits(tokens_BxN, known_BxN, rank_BxN, m_B, plen_B, cand_BxW):
    b = tokens_BxN.shape[0]
    # order of (row, candidate): the known cells by rank, the candidate at rank m, then the rest
    key_BxWxN = jnp.where(known_BxN[:, None, :], rank_BxN[:, None, :],
                          jnp.where(jnp.arange(n)[None, None, :] == cand_BxW[:, :, None],
                                    m_B[:, None, None], n + jnp.arange(n)[None, None, :]))
    order = jnp.argsort(key_BxWxN.reshape(b * w, n), axis=-1).astype(jnp.int32)
    logits = model(jnp.repeat(tokens_BxN, w, axis=0), order,
                   prompt_len=jnp.repeat(plen_B, w))
    at = jnp.repeat(m_B, w)
    return jnp.take_along_axis(logits, at[:, None, None], axis=1)[:, 0].reshape(b, w, -1)

  rng = np.random.default_rng(seed)
  out_t, out_o = [], []
  t0 = time.perf_counter()
  for s in range(0, r_total, batch):
    tok = np.where(given[s:s + batch], ref[s:s + batch], 0).astype(np.int32)
    known = given[s:s + batch].copy()
    b = len(tok)
    plen = known.sum(1).astype(np.int32)
    rank = np.full((b, n), n, np.int32)
    for i in range(b):
      rank[i, np.flatnonzero(known[i])] = np.arange(plen[i])
    m = plen.copy()
    prio = rng.random((b, n))
    while not known.all():
      cand = np.full((b, w), n, np.int32)       # n: padding (never chosen)
      for i in range(b):
        free = np.flatnonzero(~known[i])
        cand[i, :len(free)] = free
      logits = np.asarray(step_logits(jnp.asarray(tok), jnp.asarray(known), jnp.asarray(rank),
                                      jnp.asarray(np.minimum(m, n - 1)), jnp.asarray(plen),
                                      jnp.asarray(np.minimum(cand, n - 1))), np.float64)
      probs = np.exp(logits - logits.max(-1, keepdims=True))
      probs /= probs.sum(-1, keepdims=True)
      top2 = np.sort(probs, axis=-1)[..., -2:]
      score = {"max_prob": top2[..., 1], "margin": top2[..., 1] - top2[..., 0],
               "random": -np.take_along_axis(prio, np.minimum(cand, n - 1), axis=1)}[policy]
      score = np.where(cand < n, score, -np.inf)
      for i in np.flatnonzero(~known.all(axis=1)):
        j = int(np.argmax(score[i]))
        c = int(cand[i, j])
        tok[i, c] = int(np.argmax(logits[i, j]))
        known[i, c], rank[i, c] = True, m[i]
        m[i] += 1
    out_t.append(tok)
    out_o.append(np.argsort(rank, axis=1).astype(np.int32))
  return {"tokens": np.concatenate(out_t), "order": np.concatenate(out_o),
          "wall_s": time.perf_counter() - t0}


def variant_config(task_key: str, size: str, label: str, steps: int):
  file, opts, _ = TASKS[task_key]
  _, variant, overrides, _ = VARIANTS[label]
  from aogpt_jax import recipes
  arg = ",".join(a for a in (variant, SIZES[size]) if a)
  cfg = order_matters.config_of(file, arg)
  if opts:
    from aogpt_jax import tasks
    merged = dict(cfg.task.options.to_dict(), **opts)
    t = tasks.make(cfg.task.name, **merged)
    recipes.apply(cfg, {"task.options": t.options(), "seq_len": t.length,
                        "model.block_size": t.length, "sample.steps": t.length})
    if "grid" in (cfg.model.get("position_init") or ""):
      from aogpt_jax.tasks.sudoku import BOXES
      cfg.model.position_init = f"grid:{t.size},{t.size},{BOXES[t.size][0]},{BOXES[t.size][1]}"
  if steps:
    cfg.total_steps = steps
  overrides = dict(overrides)
  cfg.total_steps = int(cfg.total_steps) * int(overrides.pop("steps_factor", 1))
  recipes.apply(cfg, overrides)
  cfg.eval_every = cfg.total_steps
  return cfg, f"configs/{file}.py" + (f":{arg}" if arg else "")


def train(cfg, spec: str, workdir: pathlib.Path) -> dict:
  """Trains (or reuses a finished run in ``workdir``); returns its record."""
  from aogpt_jax.train import loop
  record = workdir / "reasoning_gap_train.json"
  t0 = time.perf_counter()
  last = loop.train(cfg, str(workdir))
  if last and "stopped_by" in last:   # a stop signal: the checkpoint is saved, no record
    raise SystemExit(f"stopped while training {workdir}; run the same command to resume")
  if last:
    common.write_json(record, {
        "config": spec, "prompt_attention": cfg.model.prompt_attention,
        "blank_block": bool(cfg.model.get("blank_block", False)),
        "order": cfg.order.to_dict(),
        "total_steps": int(cfg.total_steps), "train_s": time.perf_counter() - t0,
        "load_avg_1m_end": common.load_avg_1m(),
        **{k: v for k, v in last.items() if k.startswith("eval/")}})
  done = json.loads(record.read_text()) if record.exists() else {"train_s": None}
  return {**done, "reused": not last, "curve": order_matters.train_curve(workdir),
          "step_ms": step_ms(workdir)}


def step_ms(workdir: pathlib.Path) -> float | None:
  """Median training step time (ms) from the run's progress lines (compilation excluded)."""
  rates = []
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    if row.get("train/steps_per_sec"):
      rates.append(1000.0 / row["train/steps_per_sec"])
  return float(np.median(rates[1:] if len(rates) > 1 else rates)) if rates else None


def solve_row(label: str, decoding: str, summ: dict, extra: dict | None = None) -> dict:
  return {"variant": label, "decoding": decoding,
          **{k: summ[k] for k in ("solved", "cell_accuracy", "first_cell_accuracy",
                                  "steps_mean", "ms_per_puzzle", "wall_s")}, **(extra or {})}


def solve_variant(task_key: str, label: str, model, task, puzzles: dict, args) -> list[dict]:
  """The rows of one trained variant: adaptive max_prob and margin (greedy, one cell per step)
  and a random order; ``bidirectional_target`` by `reference_decode` (no cached sampler);
  ``bidirectional``'s max_prob also by `reference_decode`, to compare grid for grid."""
  import jax
  from aogpt_jax.evaluation import solve as solve_lib
  from aogpt_jax.sampling import SampleSettings
  n = task.length
  one = dict(steps=n, greedy=True, length=n)
  rows = []
  if label == "bidirectional_target":
    for policy in POLICIES + ("random",):
      dec = reference_decode(model, puzzles, policy, seed=args.seed)
      summ = solve_lib.score(task, puzzles, dec["tokens"], dec["order"],
                             n - puzzles["prompt"].sum(1), dec["wall_s"],
                             SampleSettings(method="adaptive", policy=policy, **one)).summary
      rows.append(solve_row(label, f"{policy} (reference)" if policy != "random"
                            else "random order (reference)", summ))
      print(f"[{task_key}] {label:22s} {rows[-1]['decoding']:24s} "
            f"{solve_lib.summary_line(summ)}", flush=True)
    return rows
  decodings = [(p, dict(method="adaptive", policy=p, **one)) for p in POLICIES]
  if label == "l2r":                                 # trained on left-to-right orders only
    decodings = [("L2R order", dict(method="adaptive", policy="l2r", **one))]
  elif VARIANTS[label][2].get("model.blank_block"):    # decoded by the adaptive sampler only
    decodings.append(("random order", dict(method="adaptive", policy="random", **one)))
  else:
    decodings.append(("random order", dict(method="encoder" if label == "mdm" else "diffusion",
                                           order="random", **one)))
  for name, fields in decodings:
    res = solve_lib.solve(model, task, puzzles, SampleSettings(**fields),
                          key=jax.random.key(args.seed), batch_size=args.batch_size)
    extra = {}
    if label == "bidirectional" and name == "max_prob" and args.reference_check:
      dec = reference_decode(model, puzzles, "max_prob", seed=args.seed)
      same = np.all(dec["tokens"] == np.array([r["output"] for r in res.rows]), axis=1)
      extra = {"reference_same_grids": int(same.sum()),
               "reference_solved": int(np.sum(task.verify(dec["tokens"], puzzles)["solved"]))}
    rows.append(solve_row(label, name, res.summary, extra))
    print(f"[{task_key}] {label:22s} {name:24s} {solve_lib.summary_line(res.summary)}"
          + (f" | reference decoding: {extra}" if extra else ""), flush=True)
  return rows


def run_task(task_key: str, args) -> dict:
  import aogpt_jax
  from aogpt_jax import tasks
  labels = (args.variants or TASKS[task_key][2]).split(",")
  runs, rows = {}, []
  task = puzzles = None
  for label in labels:
    cfg, spec = variant_config(task_key, args.size, label, args.steps)
    wd = pathlib.Path(args.workdir) / f"{task_key}-{args.size}-{label}"
    print(f"[{task_key}] training {label} ({spec}) in {wd}", flush=True)
    runs[label] = train(cfg, spec, wd)
    runs[label]["description"] = VARIANTS[label][3]
    print(f"[{task_key}] {label}: " + ", ".join(
        f"{k} {v:.4f}" for k, v in runs[label].items() if k.startswith("eval/")), flush=True)
    model, cfg = aogpt_jax.load(str(wd))
    if task is None:
      task = tasks.make(cfg.task.name, **cfg.task.options.to_dict())
      puzzles = task.heldout(int(cfg.task.heldout_seed), args.puzzles)
    saved = wd / "reasoning_gap_solved.json"     # this run's rows, kept for a rerun
    key = {"puzzles": len(puzzles["tokens"]), "heldout_seed": int(cfg.task.heldout_seed),
           "seed": args.seed}
    if saved.exists() and json.loads(saved.read_text())["key"] == key:
      mine = json.loads(saved.read_text())["rows"]
      print(f"[{task_key}] {label}: the solved rows of {saved}", flush=True)
    else:
      mine = solve_variant(task_key, label, model, task, puzzles, args)
      common.write_json(saved, {"key": key, "rows": mine})
    rows += mine
  return {"task": task.name, "options": task.options(), "length": task.length,
          "puzzles": len(puzzles["tokens"]), "train": runs, "decodings": rows,
          "findings": findings(runs, rows)}


def decode_speed(task_key: str, size: str, puzzles: int, repeats: int, seed: int) -> dict:
  """Decoding time per puzzle of the cached AO-GPT (``bidirectional`` and ``blanks``) against the
  encoder MDM,
  both adaptive max_prob, greedy, one cell per step, on the same held-out puzzles. The time does
  not depend on the weights (the steps are the blanks), so untrained models of the trained
  variants' configs serve, and the comparison reaches sizes a CPU cannot train in the budget.
  Best of ``repeats`` interleaved runs; the bidirectional prompt's prefill pass is included."""
  import jax
  from flax import nnx
  from aogpt_jax import config as config_lib
  from aogpt_jax import tasks
  from aogpt_jax.evaluation import solve as solve_lib
  from aogpt_jax.model import aogpt as model_lib
  from aogpt_jax.model import encoder as encoder_model
  from aogpt_jax.sampling import SampleSettings
  models, task = {}, None
  for label in ("bidirectional", "blanks", "mdm"):
    cfg, _ = variant_config(task_key, size, label, 0)
    mc = config_lib.resolve(cfg)
    make = encoder_model.make_encoder if label == "mdm" else model_lib.AOGPT
    models[label] = make(mc, rngs=nnx.Rngs(0))
    task = tasks.make(cfg.task.name, **cfg.task.options.to_dict())
  pz = task.heldout(0, puzzles)
  s = SampleSettings(length=task.length, method="adaptive", policy="max_prob", greedy=True,
                     steps=task.length)
  best = {label: float("inf") for label in models}
  for _ in range(repeats):
    for label, model in models.items():
      res = solve_lib.solve(model, task, pz, s, key=jax.random.key(seed), batch_size=puzzles)
      best[label] = min(best[label], res.summary["ms_per_puzzle"])
  return {"task": task.name, "options": task.options(), "length": task.length,
          "puzzles": puzzles, "repeats": repeats, "ms_per_puzzle": best,
          "mdm_over_aogpt": best["mdm"] / best["bidirectional"],
          "mdm_over_blanks": best["mdm"] / best["blanks"],
          "load_avg_1m": common.load_avg_1m()}


def findings(runs: dict, rows: list[dict]) -> dict:
  best = {}
  for r in rows:
    v = r["variant"]
    if r["decoding"] != "random order" and "random" not in r["decoding"]:
      if v not in best or r["solved"]["rate"] > best[v]["rate"]:
        best[v] = {"rate": r["solved"]["rate"], "decoding": r["decoding"],
                   "ms_per_puzzle": r["ms_per_puzzle"]}
  rand = {r["variant"]: r["solved"]["rate"] for r in rows if "random" in r["decoding"]}
  loss = {v: run.get("eval/elbo", run.get("eval/loss_random")) for v, run in runs.items()}
  out = {"best_adaptive": best, "random_order": rand, "heldout_loss_per_blank": loss}
  if "mdm" in loss and loss["mdm"]:
    out["loss_over_mdm"] = {v: (loss[v] / loss["mdm"] if loss[v] else None) for v in loss}
  return out


def loss_cell(run: dict) -> str:
  if "eval/elbo" in run:
    return f"{run['eval/elbo']:.3f} (ELBO)"
  parts = [f"{run[k]:.3f}" for k in ("eval/loss_random", "eval/loss_l2r") if k in run]
  return " / ".join(parts) if parts else "-"


def markdown(results: dict, machine: dict, out: dict) -> str:
  lines = []
  for name, res in results.items():
    opts = ", ".join(f"{k}={v}" for k, v in res["options"].items())
    steps = {v: r["total_steps"] for v, r in res["train"].items()}
    lines += [f"**{name}** ({opts}; {res['puzzles']} held-out puzzles, greedy; "
              f"{', '.join(f'{k} {v}' for k, v in steps.items())} training steps)", "",
              "| variant | held-out loss / blank (any order / L2R) | train ms / step | "
              "decoding | solved | 95% interval | cell accuracy | ms / puzzle |",
              "|---|---|---|---|---|---|---|---|"]
    for r in res["decodings"]:
      run, s = res["train"][r["variant"]], r["solved"]
      ms = f"{run['step_ms']:.0f}" if run.get("step_ms") else "-"
      ref = (f" (reference decoding: same grid for {r['reference_same_grids']}/{res['puzzles']})"
             if "reference_same_grids" in r else "")
      lines.append(f"| {run['description']} | {loss_cell(run)} | {ms} | {r['decoding']}{ref} | "
                   f"{100 * s['rate']:.1f}% | {100 * s['low']:.1f}-{100 * s['high']:.1f}% | "
                   f"{100 * r['cell_accuracy']:.1f}% | {r['ms_per_puzzle']:.1f} |")
    lines.append("")
  if out.get("decode_speed"):
    lines += ["**Decoding speed** (adaptive max_prob, greedy, one cell per step; untrained models "
              "of the same configs, best of interleaved repeats; AO-GPT's time includes the "
              "prompt's bidirectional prefill)", "",
              "| task | cells | AO-GPT bidirectional (KV cache) ms / puzzle | AO-GPT blanks (KV "
              "cache) ms / puzzle | encoder MDM ms / puzzle | MDM / bidirectional | MDM / blanks |",
              "|---|---|---|---|---|---|---|"]
    for key, sp in out["decode_speed"].items():
      ms = sp["ms_per_puzzle"]
      blank = (("", "") if "blanks" not in ms else
               (f"{ms['blanks']:.1f}", f"{sp['mdm_over_blanks']:.2f}x"))
      lines.append(f"| {key} ({sp['puzzles']} puzzles, load {sp['load_avg_1m']:.1f}) | "
                   f"{sp['length']} | {ms['bidirectional']:.1f} | {blank[0]} | {ms['mdm']:.1f} | "
                   f"{sp['mdm_over_aogpt']:.2f}x | {blank[1]} |")
    lines.append("")
  loads = [r["load_avg_1m_end"] for res in results.values() for r in res["train"].values()
           if r.get("load_avg_1m_end") is not None]
  total = out["total_s"] or out["wall_s"]
  lines.append(f"{machine['cores']}-core {machine['cpu']} "
               f"{'with ' + machine['accelerator'] if machine.get('accelerator') else 'CPU'}; "
               f"{total / 60:.0f} min for "
               f"{'training and solving' if results else 'the decoding-speed comparison'}"
               + (f" (load average {min(loads):.1f}-{max(loads):.1f} at the end of each training "
                  f"run)" if loads else "") + ".")
  return "\n".join(lines) + "\n"


def plot(results: dict, path: pathlib.Path, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = list(results)
  fig, axes = plt.subplots(len(names), 2, figsize=(15, 0.5 + 4.8 * len(names)), squeeze=False,
                           gridspec_kw={"width_ratios": [1.5, 1]})
  palette = {"mdm": "tab:orange", "causal": "tab:gray", "bidirectional": "tab:blue",
             "bidirectional_target": "tab:green", "bidirectional_uniform": "tab:purple",
             "bidirectional_r2l": "tab:red", "bidirectional_2x": "tab:cyan", "blanks": "black",
             "blanks_r2l": "tab:brown", "l2r": "tab:olive"}
  for i, name in enumerate(names):
    res = results[name]
    rows = res["decodings"]
    ax = axes[i, 0]
    y = list(range(len(rows)))
    rate = [100 * r["solved"]["rate"] for r in rows]
    err = [[max(0.0, 100 * (r["solved"]["rate"] - r["solved"]["low"])) for r in rows],
           [max(0.0, 100 * (r["solved"]["high"] - r["solved"]["rate"])) for r in rows]]
    ax.barh(y, rate, xerr=err, color=[palette.get(r["variant"], "k") for r in rows], capsize=3)
    ax.set_yticks(y, [f"{r['variant']}: {r['decoding']}" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 114)
    ax.set_xlabel("held-out puzzles solved (%), 95% interval")
    ax.set_title(f"{name} ({res['puzzles']} held-out puzzles, greedy)")
    for yy, rr, row in zip(y, rate, rows):
      ax.text(100 * row["solved"]["high"] + 1.0, yy, f"{rr:.1f}%", va="center", fontsize=8)
    ax = axes[i, 1]
    for label, run in res["train"].items():
      if run.get("curve"):
        ax.plot(*zip(*run["curve"]), color=palette.get(label, "k"), label=run["description"])
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss per blank (nats; MDM: ELBO)")
    ax.set_yscale("log")
    ax.set_title("training curves")
    ax.legend(fontsize=7)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  print(f"wrote {path}", flush=True)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", choices=sorted(SIZES), default="cpu")
  p.add_argument("--tasks", default="sudoku", help=f"comma-separated, of {sorted(TASKS)}")
  p.add_argument("--variants", default="", help=f"comma-separated, of {sorted(VARIANTS)} "
                 f"(default: the task's list)")
  p.add_argument("--workdir", default="/tmp/aogpt_reasoning_gap",
                 help="the trained models (reused when already trained)")
  p.add_argument("--puzzles", type=int, default=200, help="held-out puzzles per task")
  p.add_argument("--steps", type=int, default=0, help="training steps (0: the config's)")
  p.add_argument("--batch_size", type=int, default=100, help="puzzles per sampler batch")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--speed_repeats", type=int, default=3,
                 help="interleaved repeats of the 6x6 and 9x9 decoding-speed comparison (0: none)")
  p.add_argument("--speed_only", action="store_true", help="only the decoding-speed comparison")
  p.add_argument("--reference_check", type=int, default=1,
                 help="1: also decode bidirectional max_prob by the training forward alone "
                      "(reference_decode; slow at 9x9) and compare grid for grid; 0: skip it")
  p.add_argument("--out", default="", help="the JSON (default: benchmarks/results/...)")
  args = p.parse_args(argv)
  common.check_args(p, args, positive=("puzzles", "batch_size"),
                    nonnegative=("steps", "speed_repeats"))
  if args.variants and not [v for v in args.variants.split(",") if v.strip()]:
    common.fail(p, f"--variants={args.variants!r}: names no variant; expected some of "
                   f"{', '.join(sorted(VARIANTS))} (or leave it out: the task's default)")
  for key in args.tasks.split(","):
    if key not in TASKS:
      p.error(f"--tasks: unknown task {key!r}; known: {', '.join(sorted(TASKS))}")
  for v in filter(None, args.variants.split(",")):
    if v not in VARIANTS:
      p.error(f"--variants: unknown variant {v!r}; known: {', '.join(sorted(VARIANTS))}")
  logging.getLogger().setLevel(logging.WARNING)
  load0 = common.load_avg_1m()
  t0 = time.perf_counter()
  results = {key: run_task(key, args) for key in args.tasks.split(",") if not args.speed_only}
  speed = {}
  for key in ("sudoku", "sudoku9"):
    if args.speed_repeats:
      speed[key] = decode_speed(key, args.size, args.batch_size, args.speed_repeats, args.seed)
      print(f"decoding speed {key}: {json.dumps(speed[key])}", flush=True)
  wall = time.perf_counter() - t0
  bench = f"reasoning_gap_{args.size}" + ("" if args.tasks == "sudoku" else
                                          "_" + args.tasks.replace(",", "_"))
  machine = common.machine()
  runs = [r for res in results.values() for r in res["train"].values()]
  earlier = [r["train_s"] for r in runs if r["reused"]]
  out = {"tasks": results, "decode_speed": speed, "wall_s": wall, "load_avg_1m_start": load0,
         "load_avg_1m_end": common.load_avg_1m(), "reused_models": len(earlier),
         "total_s": None if None in earlier else wall + sum(earlier)}
  if args.speed_only:
    bench = f"reasoning_gap_speed_{args.size}"
  path = common.write_result(bench, args, out, out=args.out or None)
  path.with_suffix(".md").write_text(markdown(results, machine, out))
  total = out["total_s"] or wall
  if results:
    plot(results, path.with_suffix(".png"),
         f"The reasoning gap ({machine['slug']}; {total / 60:.0f} min training and solving)")
  for name, res in results.items():
    print(f"{name}: {json.dumps(res['findings'])}")


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu") if "--size=accel" not in sys.argv else None
  main()
