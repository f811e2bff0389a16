"""Search decoding against greedy and best-of-K, AO-GPT beside the encoder MDM: the solved rate
against the rows evaluated and the wall time per puzzle, one run.

    python benchmarks/search_frontier.py                    # trains both 6x6 models if needed
    python benchmarks/search_frontier.py --aogpt=RUN --mdm=RUN --out=/tmp/frontier.json

Puzzles: the held-out 6x6 puzzles of ``configs/sudoku.py:tiny``'s task that naked and hidden
singles cannot solve (among the first ``--pool`` held-out puzzles, as benchmarks/post_training.py
selects them), and ``--all`` held-out puzzles of the same task (mostly singles). Decodings, each
for both models: greedy max_prob (search width 1), best-of-K (K rollouts of the adaptive
max_prob sampler at temperature 1, the one of largest exact log-likelihood kept; AO-GPT only:
the MDM has no exact likelihood), the search model-only (widths ``--widths``, 2 tokens a branch,
finished beams ranked by pseudo-likelihood) and the search with Sudoku's rules in the loop
("checker", labelled apart). Each row: solved with its 95% Wilson interval, rows evaluated per
puzzle (a row = one forward of one partial answer) and wall ms per puzzle (compilation
excluded: each decoding runs once untimed first). Writes benchmarks/results/search_frontier_cpu/
<machine>.{json,md,png} (or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

import common

ROOT = pathlib.Path(__file__).resolve().parent.parent


def train(config: str, workdir: str) -> None:
  if os.path.isdir(os.path.join(workdir, "checkpoints")):
    return
  print(f"training {config} into {workdir}", flush=True)
  subprocess.run([sys.executable, "-m", "aogpt_jax.main", f"--config={ROOT}/{config}",
                  f"--workdir={workdir}"], check=True)


def best_of_k(model, task, rows, k: int, seed: int = 0):
  """(answers [P, n], rows evaluated per puzzle): K sampled rollouts per puzzle (adaptive
  max_prob, temperature 1), the one of the largest exact log-likelihood kept."""
  import jax
  from aogpt_jax.sampling import sampler
  n = task.length
  tok, prm = rows["tokens"], rows["prompt"]
  s = sampler.SampleSettings(length=n, method="adaptive", steps=n, policy="max_prob",
                             temperature=1.0)
  rep_t, rep_p = np.repeat(tok, k, 0), np.repeat(prm, k, 0)
  out = sampler.generate(model, jax.random.key(seed), s,
                         prompt=(np.where(rep_p, rep_t, 0), rep_p), return_logp=True)
  lp = np.asarray(out.model_logp).sum(1).reshape(-1, k)
  best = lp.argmax(1)
  answers = np.asarray(out.tokens).reshape(-1, k, n)[np.arange(len(tok)), best]
  return answers, float(k * (~prm).sum(1).mean())


def run_decoding(name, fn, task, rows):
  from aogpt_jax.evaluation import solve as solve_lib
  fn()                                       # compile, untimed
  t0 = time.perf_counter()
  answers, per_puzzle = fn()
  wall = time.perf_counter() - t0
  ok = np.asarray(task.verify(answers, rows)["solved"], bool)
  low, high = solve_lib.wilson(int(ok.sum()), len(ok))
  res = {"decoding": name, "solved": int(ok.sum()), "puzzles": len(ok), "rate": float(ok.mean()),
         "low": low, "high": high, "rows_per_puzzle": per_puzzle,
         "ms_per_puzzle": 1000 * wall / len(ok)}
  print(f"  {name}: {res['solved']}/{len(ok)} ({100 * res['rate']:.1f}%, "
        f"{100 * low:.1f}-{100 * high:.1f}%), {per_puzzle:.0f} rows, "
        f"{res['ms_per_puzzle']:.0f} ms per puzzle", flush=True)
  return res


def frontier(model, task, rows, widths, ks, checker_widths, *, mdm: bool):
  from aogpt_jax.sampling import search
  out = []

  def srch(w, b, checker=False):
    st = search.SearchSettings(width=w, branch=b, checker=checker)

    def fn():
      r = search.search(model, np.where(rows["prompt"], rows["tokens"], 0), rows["prompt"], st,
                        vocab=task.vocab_size, legal=task.legal, accept=task.valid)
      return r.tokens, float(r.forwards.mean())
    return fn

  out.append(run_decoding("greedy max_prob", srch(1, 1), task, rows))
  if not mdm:
    for k in ks:
      out.append(run_decoding(f"best-of-{k} (exact logp)",
                              lambda k=k: best_of_k(model, task, rows, k), task, rows))
  for w in widths:
    out.append(run_decoding(f"search W={w} (model-only)", srch(w, 2), task, rows))
  for w in checker_widths:
    out.append(run_decoding(f"search W={w} (checker)", srch(w, 2, True), task, rows))
  return out


def markdown(res: dict) -> str:
  lines = []
  for set_name, models in res["sets"].items():
    lines += [f"**{set_name}** ({models['puzzles']} puzzles)", "",
              "| model | decoding | solved | 95% interval | rows / puzzle | ms / puzzle |",
              "|---|---|---|---|---|---|"]
    for model_name in ("aogpt", "mdm"):
      for r in models.get(model_name, []):
        lines.append(f"| {model_name} | {r['decoding']} | {r['solved']}/{r['puzzles']} "
                     f"({100 * r['rate']:.1f}%) | {100 * r['low']:.1f}-{100 * r['high']:.1f}% | "
                     f"{r['rows_per_puzzle']:.0f} | {r['ms_per_puzzle']:.0f} |")
    lines.append("")
  return "\n".join(lines)


def plot(res: dict, path: pathlib.Path) -> None:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib not installed: no PNG", flush=True)
    return
  sets = list(res["sets"])
  fig, axes = plt.subplots(1, len(sets), figsize=(6.5 * len(sets), 4.5), squeeze=False)
  for ax, set_name in zip(axes[0], sets):
    for model_name, color in (("aogpt", "C0"), ("mdm", "C3")):
      rows = res["sets"][set_name].get(model_name, [])
      for kind, marker, style in (("model-only", "o", "-"), ("checker", "s", ":")):
        pts = [r for r in rows if kind in r["decoding"] or (
            kind == "model-only" and r["decoding"].startswith("greedy"))]
        if pts:
          ax.plot([r["ms_per_puzzle"] for r in pts], [100 * r["rate"] for r in pts], style,
                  marker=marker, color=color, label=f"{model_name} search ({kind})")
      bok = [r for r in rows if r["decoding"].startswith("best-of")]
      if bok:
        ax.plot([r["ms_per_puzzle"] for r in bok], [100 * r["rate"] for r in bok], "--",
                marker="^", color=color, alpha=0.6, label=f"{model_name} best-of-K")
    ax.set_xscale("log")
    ax.set_xlabel("wall ms per puzzle (log)")
    ax.set_ylabel("solved %")
    ax.set_title(f"{set_name} ({res['sets'][set_name]['puzzles']} puzzles)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("6x6 Sudoku: search decoding vs greedy and best-of-K, AO-GPT and the encoder "
               "MDM (one run)", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  print(f"wrote {path}", flush=True)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--aogpt", default="", help="a trained configs/sudoku.py:tiny run")
  p.add_argument("--mdm", default="", help="a trained configs/sudoku.py:tiny,mdm run")
  p.add_argument("--workdir", default="/tmp/aogpt_search_frontier",
                 help="where the two runs are trained when --aogpt / --mdm are not given")
  p.add_argument("--pool", type=int, default=200_000,
                 help="held-out puzzles searched for ones that need a guess")
  p.add_argument("--all", type=int, default=200, help="held-out puzzles of every difficulty")
  p.add_argument("--widths", default="2,4,8,16")
  p.add_argument("--ks", default="4,16")
  p.add_argument("--checker_widths", default="1,4")
  p.add_argument("--out", default="", help="JSON path (default benchmarks/results/"
                 "search_frontier_cpu/<machine>.json)")
  args = p.parse_args(argv)
  ints = lambda s, key: [int(x) for x in s.split(",") if x.strip()]   # noqa: E731
  widths, ks, cws = ints(args.widths, "widths"), ints(args.ks, "ks"), ints(args.checker_widths,
                                                                          "checker_widths")
  for key, vals in (("--widths", widths), ("--ks", ks), ("--checker_widths", cws)):
    if any(v < 1 for v in vals):
      p.error(f"{key}={getattr(args, key[2:])!r}: expected integers >= 1")
  if args.pool < 1 or args.all < 0:
    p.error(f"--pool={args.pool} / --all={args.all}: expected --pool >= 1 and --all >= 0")
  if os.path.isfile(args.workdir):
    p.error(f"--workdir={args.workdir!r} is a file; expected a folder")
  aogpt_dir = args.aogpt or os.path.join(args.workdir, "aogpt")
  mdm_dir = args.mdm or os.path.join(args.workdir, "mdm")
  if not args.aogpt:
    train("configs/sudoku.py:tiny", aogpt_dir)
  if not args.mdm:
    train("configs/sudoku.py:tiny,mdm", mdm_dir)

  import aogpt_jax
  from aogpt_jax import tasks
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  import post_training
  models = {}
  for name, d in (("aogpt", aogpt_dir), ("mdm", mdm_dir)):
    models[name], cfg = aogpt_jax.load(d)
  task = tasks.make(cfg.task.name, **cfg.task.options.to_dict())
  hseed = int(cfg.task.heldout_seed)
  hard = post_training.search_puzzles(task, hseed, args.pool)
  sets = {"held-out puzzles that need a guess": hard}
  if args.all:
    sets["held-out puzzles, every difficulty"] = task.heldout(hseed, args.all)
  res = {"task": {"name": task.name, "options": task.options(), "heldout_seed": hseed},
         "runs": {"aogpt": aogpt_dir, "mdm": mdm_dir}, "sets": {}}
  for set_name, rows in sets.items():
    if rows is None:
      continue
    print(f"{set_name}: {len(rows['tokens'])} puzzles", flush=True)
    res["sets"][set_name] = {"puzzles": len(rows["tokens"])}
    for name, m in models.items():
      print(f" {name}", flush=True)
      res["sets"][set_name][name] = frontier(m, task, rows, widths, ks, cws, mdm=name == "mdm")
  path = common.write_result("search_frontier_cpu", args, res, out=args.out or None)
  md = markdown(res)
  path.with_suffix(".md").write_text(md)
  print(md)
  plot(res, path.with_suffix(".png"))


if __name__ == "__main__":
  main()
