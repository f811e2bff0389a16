"""Where the order matters: the same held-out puzzles solved by every decoding, one command.

    python benchmarks/order_matters.py                       # CPU size (configs/TASK.py:tiny)
    python benchmarks/order_matters.py --size=accel          # one accelerator's size

For each task (Sudoku, and path-finding in a star graph, where left to right fails), it trains
(or reuses, in --workdir) three models of one size with the same data and budget: AO-GPT
(configs/TASK.py: a bidirectional prompt and a query block over the blanks,
``model.blank_block``), the left-to-right baseline (``:l2r``) and the encoder-only MDM (``:mdm``).
Then it solves the same held-out puzzles, greedily, with:

* the L2R model, left to right;
* AO-GPT in L2R order, in a random order (the adaptive sampler's ``l2r`` and ``random``
  policies), and with every adaptive policy (max_prob, margin,
  entropy, confidence: one cell per step; threshold at several values: as many cells per step
  as are that sure);
* the encoder MDM in a random order and with the same adaptive policies (one full bidirectional
  forward per step, as LLaDA, Dream and Kim et al. decode).

Each decoding reports the solved rate with its 95% Wilson interval, cell accuracy, how early
decoding goes wrong (the first answer cell, the rank of the first wrong cell), the steps and the
wall time per puzzle (compilation excluded). It writes benchmarks/results/order_matters_SIZE/
<machine>.json and a PNG beside it (solved rate per decoding; solved rate against steps for
threshold), shown in docs/tasks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import pathlib
import sys
import time

import common

SIZES = {"cpu": "tiny", "accel": ""}
VARIANTS = (("aogpt", ""), ("l2r", "l2r"), ("mdm", "mdm"))
POLICIES = ("max_prob", "margin", "entropy", "confidence")
THRESHOLDS = (0.5, 0.7, 0.9, 0.99)


def config_of(task: str, arg: str):
  spec = importlib.util.spec_from_file_location(task, common.REPO / "configs" / f"{task}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


def train(task: str, size: str, variant: str, workdir: pathlib.Path, steps: int | None,
          overrides: dict | None = None) -> dict:
  """Trains (or resumes; a finished run is reused) one model; returns its time and losses.
  ``overrides``: dotted config keys set after the config's own (e.g. a smaller model)."""
  from aogpt_jax.train import loop
  arg = ",".join(a for a in (variant, SIZES[size]) if a)
  cfg = config_of(task, arg)
  if steps:
    cfg.total_steps = steps
  if overrides:
    from aogpt_jax import recipes
    recipes.apply(cfg, overrides)
  cfg.eval_every = cfg.total_steps
  t0 = time.perf_counter()
  last = loop.train(cfg, str(workdir))
  if last and "stopped_by" in last:   # a stop signal: the checkpoint is saved, no record
    raise SystemExit(f"stopped while training {workdir}; run the same command to resume")
  record = workdir / "order_matters_train.json"   # a reused run keeps its own training record
  if last:
    common.write_json(record, {
        "config": f"configs/{task}.py" + (f":{arg}" if arg else ""),
        "total_steps": int(cfg.total_steps), "train_s": time.perf_counter() - t0,
        "load_avg_1m_end": common.load_avg_1m(),
        **{k: v for k, v in last.items() if k.startswith("eval/")}})
  done = json.loads(record.read_text()) if record.exists() else {"train_s": None}
  return {**done, "reused": not last}


def train_curve(workdir: pathlib.Path) -> list[list[float]]:
  """[[step, training loss on the answer cells], ...] from the run's metrics.jsonl."""
  out = []
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    if "train/loss" in row:
      out.append([row["step"], row["train/loss"]])
  return out


def decodings(n: int) -> list[tuple[str, str, dict]]:
  """(label, model, SampleSettings fields) of every decoding, greedy, one cell per step unless
  threshold."""
  one = dict(steps=n, greedy=True)
  out = [("L2R model", "l2r", dict(method="diffusion", order="l2r", **one)),
         # fixed orders as adaptive policies: every AO-GPT decodes them, model.blank_block too
         ("AO-GPT, L2R order", "aogpt", dict(method="adaptive", policy="l2r", **one)),
         ("AO-GPT, random order", "aogpt", dict(method="adaptive", policy="random", **one))]
  out += [(f"AO-GPT, {p}", "aogpt", dict(method="adaptive", policy=p, **one)) for p in POLICIES]
  out += [(f"AO-GPT, threshold {t}", "aogpt", dict(method="adaptive", policy="threshold",
                                                    threshold=t, greedy=True))
          for t in THRESHOLDS]
  out += [("MDM, random order", "mdm", dict(method="encoder", order="random", **one))]
  out += [(f"MDM, {p}", "mdm", dict(method="adaptive", policy=p, **one)) for p in POLICIES]
  out += [(f"MDM, threshold {t}", "mdm", dict(method="adaptive", policy="threshold",
                                               threshold=t, greedy=True)) for t in THRESHOLDS]
  return out


def run_task(task_name: str, args) -> dict:
  import jax
  import aogpt_jax
  from aogpt_jax import tasks
  from aogpt_jax.evaluation import solve as solve_lib
  from aogpt_jax.sampling import SampleSettings
  runs, models = {}, {}
  for label, variant in VARIANTS:
    wd = pathlib.Path(args.workdir) / f"{task_name}-{args.size}-{label}"
    print(f"[{task_name}] training {label} in {wd}", flush=True)
    runs[label] = train(task_name, args.size, variant, wd, args.steps)
    print(f"[{task_name}] {label}: {runs[label]}", flush=True)
    models[label], cfg = aogpt_jax.load(str(wd))
    runs[label]["curve"] = train_curve(wd)
  task = tasks.make(cfg.task.name, **cfg.task.options.to_dict())
  puzzles = task.heldout(int(cfg.task.heldout_seed), args.puzzles)
  rows = []
  for label, model, fields in decodings(task.length):
    s = SampleSettings(length=task.length, **fields)
    res = solve_lib.solve(models[model], task, puzzles, s, key=jax.random.key(args.seed),
                          batch_size=args.batch_size)
    summ = res.summary
    row = {"decoding": label, "model": model, "settings": fields,
           **{k: summ[k] for k in ("solved", "cell_accuracy", "first_cell_accuracy",
                                   "first_3_right", "first_error_rank_median", "steps_mean",
                                   "ms_per_puzzle", "wall_s", "verifier_means")}}
    rows.append(row)
    print(f"[{task_name}] {label:28s} {solve_lib.summary_line(summ)}", flush=True)
  by = {r["decoding"]: r for r in rows}
  adaptive = [r for r in rows if r["model"] == "aogpt" and r["settings"]["method"] == "adaptive"]
  best = max(adaptive, key=lambda r: r["solved"]["rate"])
  rand = by["AO-GPT, random order"]["solved"]["rate"]
  mdm_best = max((r for r in rows if r["model"] == "mdm" and r["settings"]["method"] == "adaptive"),
                 key=lambda r: r["solved"]["rate"])
  findings = {
      "best_adaptive": best["decoding"], "best_adaptive_rate": best["solved"]["rate"],
      "mdm_best_adaptive": mdm_best["decoding"], "mdm_best_adaptive_rate": mdm_best["solved"]["rate"],
      "mdm_random_order_rate": by["MDM, random order"]["solved"]["rate"],
      "random_order_rate": rand, "l2r_model_rate": by["L2R model"]["solved"]["rate"],
      "best_over_random": best["solved"]["rate"] / rand if rand else None,
      "speed_aogpt_vs_mdm_max_prob_ms": [by["AO-GPT, max_prob"]["ms_per_puzzle"],
                                         by["MDM, max_prob"]["ms_per_puzzle"]],
  }
  return {"task": task.name, "options": task.options(), "length": task.length,
          "puzzles": args.puzzles, "heldout_seed": int(cfg.task.heldout_seed),
          "train": runs, "decodings": rows, "findings": findings}


def plot(results: dict, path: pathlib.Path, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = list(results)
  fig, axes = plt.subplots(len(names), 3, figsize=(18, 4.8 * len(names)), squeeze=False,
                           gridspec_kw={"width_ratios": [1.6, 1, 1]})
  colors = {"l2r": "tab:gray", "aogpt": "tab:blue", "mdm": "tab:orange"}
  for i, name in enumerate(names):
    res = results[name]
    rows = [r for r in res["decodings"] if "threshold" not in r["decoding"]]
    ax = axes[i, 0]
    y = range(len(rows))
    rate = [100 * r["solved"]["rate"] for r in rows]
    err = [[max(0.0, 100 * (r["solved"]["rate"] - r["solved"]["low"])) for r in rows],
           [max(0.0, 100 * (r["solved"]["high"] - r["solved"]["rate"])) for r in rows]]
    ax.barh(list(y), rate, xerr=err, color=[colors[r["model"]] for r in rows], capsize=3)
    ax.set_yticks(list(y), [r["decoding"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("held-out puzzles solved (%), 95% interval")
    opts = ", ".join(f"{k}={v}" for k, v in res["options"].items()
                     if k not in ("heldout_frac", "unique", "difficulty"))
    ax.set_title(f"{name} ({opts}; {res['puzzles']} puzzles), greedy")
    for yy, r, row in zip(y, rate, rows):
      ax.text(min(100 * row["solved"]["high"] + 1.5, 92), yy, f"{r:.0f}%", va="center",
              fontsize=8)
    ax = axes[i, 1]
    for model, label in (("aogpt", "AO-GPT"), ("mdm", "MDM")):
      pts = [r for r in res["decodings"] if r["model"] == model and "threshold" in r["decoding"]]
      one = [r for r in res["decodings"] if r["decoding"] == f"{label}, max_prob"]
      pts = sorted(pts + one, key=lambda r: r["steps_mean"])
      ax.plot([r["steps_mean"] for r in pts], [100 * r["solved"]["rate"] for r in pts], "o-",
              color=colors[model], label=f"{label}: threshold 0.5 .. 0.99, and max_prob")
    ax.set_xlabel("decoding steps per puzzle (mean)")
    ax.set_ylabel("solved (%)")
    ax.set_ylim(0, 102)
    ax.set_title("threshold decoding: solved against steps")
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[i, 2]
    for label, run in res["train"].items():
      curve = run.get("curve") or []
      if curve:
        ax.plot(*zip(*curve), color=colors[label],
                label={"aogpt": "AO-GPT (mixture)", "l2r": "L2R model",
                       "mdm": "MDM (ELBO bound)"}[label])
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss per answer token (nats)")
    ax.set_title("training curves")
    ax.legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  print(f"wrote {path}", flush=True)


def markdown(results: dict, machine: dict, out: dict) -> str:
  """One table per task: every decoding's solved rate (95% interval), cell accuracy, first
  answer cell right, steps and ms per puzzle."""
  lines = []
  for name, res in results.items():
    opts = ", ".join(f"{k}={v}" for k, v in res["options"].items())
    steps = ", ".join(f"{k} {v['total_steps']}" for k, v in res["train"].items())
    lines += [f"**{name}** ({opts}; {res['puzzles']} held-out puzzles, greedy; training steps: "
              f"{steps})",
              "", "| decoding | solved | 95% interval | cell accuracy | first answer cell right "
              "| steps | ms / puzzle |", "|---|---|---|---|---|---|---|"]
    for r in res["decodings"]:
      s = r["solved"]
      lines.append(f"| {r['decoding']} | {100 * s['rate']:.1f}% | {100 * s['low']:.1f}-"
                   f"{100 * s['high']:.1f}% | {100 * r['cell_accuracy']:.1f}% | "
                   f"{100 * r['first_cell_accuracy']:.1f}% | {r['steps_mean']:.1f} | "
                   f"{r['ms_per_puzzle']:.1f} |")
    lines.append("")
  total = out["total_s"] or out["wall_s"]
  loads = [r["load_avg_1m_end"] for res in results.values() for r in res["train"].values()
           if r.get("load_avg_1m_end") is not None]
  shared = (f"load average {min(loads):.1f}-{max(loads):.1f} at the end of each training run, "
            if loads else "")
  lines.append(f"{machine['cores']}-core {machine['cpu']} "
               f"{'with ' + machine['accelerator'] if machine.get('accelerator') else 'CPU'}; "
               f"{total / 60:.0f} min for training and solving ({shared}"
               f"{out['load_avg_1m_start']:.1f} when solving started).")
  return "\n".join(lines) + "\n"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", choices=sorted(SIZES), default="cpu")
  p.add_argument("--tasks", default="sudoku,star_graph")
  p.add_argument("--workdir", default="/tmp/aogpt_order_matters",
                 help="the trained models (reused when already trained)")
  p.add_argument("--puzzles", type=int, default=200, help="held-out puzzles per task")
  p.add_argument("--steps", type=int, default=0, help="training steps (0: the config's)")
  p.add_argument("--batch_size", type=int, default=100, help="puzzles per sampler batch")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="", help="the JSON (default: benchmarks/results/...)")
  args = p.parse_args(argv)
  logging.getLogger().setLevel(logging.WARNING)
  load0 = common.load_avg_1m()
  t0 = time.perf_counter()
  results = {name: run_task(name, args) for name in args.tasks.split(",")}
  wall = time.perf_counter() - t0
  bench = f"order_matters_{args.size}"
  machine = common.machine()
  runs = [r for res in results.values() for r in res["train"].values()]
  earlier = [r["train_s"] for r in runs if r["reused"]]     # trained by an earlier command
  out = {"tasks": results, "wall_s": wall, "load_avg_1m_start": load0,
         "load_avg_1m_end": common.load_avg_1m(), "reused_models": len(earlier),
         "train_s_total": (None if None in [r["train_s"] for r in runs]
                           else sum(r["train_s"] for r in runs)),
         # this command plus the training of the models it reused: the whole benchmark's time
         "total_s": None if None in earlier else wall + sum(earlier)}
  path = common.write_result(bench, args, out, out=args.out or None)
  path.with_suffix(".md").write_text(markdown(results, machine, out))
  total = out["total_s"] or wall
  plot(results, path.with_suffix(".png"),
       f"Where the order matters ({machine['slug']}; {total / 60:.0f} min training and solving)")
  for name, res in results.items():
    f = res["findings"]
    print(f"{name}: best adaptive {f['best_adaptive']} {100 * f['best_adaptive_rate']:.1f}% vs "
          f"random order {100 * f['random_order_rate']:.1f}% vs the L2R model "
          f"{100 * f['l2r_model_rate']:.1f}%; ms per puzzle AO-GPT / MDM (max_prob): "
          f"{f['speed_aogpt_vs_mdm_max_prob_ms'][0]:.1f} / "
          f"{f['speed_aogpt_vs_mdm_max_prob_ms'][1]:.1f}")
  print(f"this command: {wall / 60:.1f} min" + (
      f"; with the training of the {len(earlier)} models it reused: "
      f"{out['total_s'] / 60:.1f} min" if earlier and out["total_s"] else ""))


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu") if "--size=accel" not in sys.argv else None
  main()
