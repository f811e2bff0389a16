"""Star graphs over seeds: one recipe of `configs/star_graph.py` trained with each seed (its
weights and training graphs), each run solving the same held-out graphs greedily; the solved
rate per seed with its 95% interval, their mean and minimum, one command.

    python benchmarks/star_graph.py --variant=tiny,parents --steps=6000 --seeds=0,1,2 \\
        --set="order.kwargs={'p_l2r': 0.0}" --name=no_l2r
    python benchmarks/star_graph.py --variant=mdm,tiny,parents --steps=1500 --name=mdm

``--variant`` is the config's argument (``tiny``, ``parents``, ``l2r``, ``mdm``); ``--set`` adds
``--config.KEY=VALUE`` overrides (repeat it). Each seed trains in ``--workdir``/seed<N> (a run
that finished is reused) and solves ``--count`` held-out graphs (`--mode=solve`, the config's
decoding). Writes benchmarks/results/star_graph[_NAME]/<machine>.{json,md} (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

import common

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _cmd(args, workdir: pathlib.Path, seed: int, *extra: str) -> list[str]:
  return [sys.executable, "-m", "aogpt_jax.main",
          f"--config={ROOT}/configs/star_graph.py:{args.variant}", f"--workdir={workdir}",
          f"--config.seed={seed}", f"--config.total_steps={args.steps}",
          f"--config.checkpoint_every={args.steps}", "--config.eval_every=0",
          *[f"--config.{kv}" for kv in args.set], *extra]


def run_seed(args, seed: int) -> dict:
  wd = pathlib.Path(args.workdir) / f"seed{seed}"
  done = wd / "checkpoints" / str(args.steps)
  t0 = time.perf_counter()
  if not done.is_dir():
    subprocess.run(_cmd(args, wd, seed), check=True)
  train_s = time.perf_counter() - t0
  name = f"bench{args.count}"
  subprocess.run(_cmd(args, wd, seed, "--mode=solve", f"--config.solve.count={args.count}",
                      f"--config.solve.name={name}"), check=True)
  summary = json.loads(sorted((wd / "solve").glob(f"{name}*.json"),
                              key=lambda p: p.stat().st_mtime)[-1].read_text())["summary"]
  print(f"seed {seed}: solved {summary['solved']['count']}/{summary['rows']} "
        f"({100 * summary['solved']['rate']:.1f}%)", flush=True)
  return {"seed": seed, "workdir": str(wd), "train_s": train_s if train_s > 1 else None,
          "solved": summary["solved"], "cell_accuracy": summary["cell_accuracy"],
          "first_step_correct": summary.get("verifier_means", {}).get("first_step_correct")}


def markdown(res: dict) -> str:
  lines = [f"`configs/star_graph.py:{res['variant']}`, {res['steps']} steps"
           + (f", {' '.join('--config.' + s for s in res['set'])}" if res["set"] else "")
           + f"; {res['count']} held-out graphs, greedy", "",
           "| seed | solved (95% interval) | node after the start right | cell accuracy |",
           "|---|---|---|---|"]
  for r in res["seeds"]:
    s = r["solved"]
    first = r["first_step_correct"]
    lines.append(f"| {r['seed']} | {s['count']}/{res['count']} ({100 * s['rate']:.1f}%, "
                 f"{100 * s['low']:.1f}-{100 * s['high']:.1f}%) | "
                 + ("-" if first is None else f"{100 * first:.1f}%")
                 + f" | {100 * r['cell_accuracy']:.1f}% |")
  lines.append(f"| mean / min | {100 * res['mean']:.1f}% / {100 * res['min']:.1f}% | | |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--variant", default="tiny,parents", help="configs/star_graph.py's argument")
  ap.add_argument("--steps", type=int, default=1500)
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                  help="a --config.KEY=VALUE override (repeat)")
  ap.add_argument("--count", type=int, default=200, help="held-out graphs")
  ap.add_argument("--workdir", default="/tmp/aogpt_star_graph")
  ap.add_argument("--name", default="", help="results go to benchmarks/results/star_graph_NAME/")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  common.check_args(ap, args, positive=("steps", "count"))
  try:
    seeds = [int(s) for s in args.seeds.split(",")]
  except ValueError:
    common.fail(ap, f"--seeds={args.seeds!r}: expected comma-separated integers")
  bad = [kv for kv in args.set if "=" not in kv]
  if bad:
    common.fail(ap, f"--set={bad[0]!r}: expected KEY=VALUE (a --config.KEY override)")
  rows = [run_seed(args, s) for s in seeds]
  rates = [r["solved"]["rate"] for r in rows]
  res = {"variant": args.variant, "steps": args.steps, "set": args.set, "count": args.count,
         "seeds": rows, "mean": sum(rates) / len(rates), "min": min(rates)}
  common.write_with_markdown("star_graph", args, res, markdown(res))


if __name__ == "__main__":
  main()
