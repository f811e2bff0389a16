"""Does a left-to-right start help any-order learning? L2R pretraining then adaptation against
AO-GPT from scratch at the same total steps and tokens, on the CPU corpus.

    python benchmarks/a2o_adaptation.py [--pretrain_steps=400 --adapt_steps=400] [--out=PATH]

Three runs through the real command line (``python -m aogpt_jax.main``), each in a fresh
temporary workdir, all at the tiny CPU size on the Python standard library (byte tokens):

1. ``configs/gpt2_small.py:tiny`` (left-to-right only, ``model.target=none``) for
   ``--pretrain_steps``;
2. ``configs/a2o_gpt2_small.py:tiny`` started from run 1 (``train.init_from=l2r:WORKDIR``: the
   same model with identity target conditioning) for ``--adapt_steps``, its order curriculum
   going from all L2R to the 10% mixture over the first ``--curriculum_frac`` of them;
3. ``configs/aogpt_small.py:tiny`` (AO-GPT from scratch, the 10% mixture) for
   ``--pretrain_steps + --adapt_steps``: the same total steps and tokens as 1 + 2.

Every ``--eval_every`` steps each run scores the held-out blocks (EMA weights) under the L2R order
and under uniformly random orders (the any-order loss), nats per token. The JSON
(benchmarks/common.py schema, default results/a2o_adaptation/<machine>.json) holds both curves
against total steps (the adaptation run's steps counted after the pretraining's) and the final
losses; ``--png`` (default beside the JSON) plots them. Any argument after ``--`` is passed to
all three training commands.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402


def run(config: str, workdir: str, steps: int, eval_every: int, extra: list[str]) -> dict:
  cmd = [sys.executable, "-m", "aogpt_jax.main", f"--config={config}", f"--workdir={workdir}",
         f"--config.total_steps={steps}", f"--config.eval_every={eval_every}",
         f"--config.checkpoint_every={steps}", *extra]
  t = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
  wall = time.perf_counter() - t
  if proc.returncode != 0:
    sys.exit(" ".join(cmd) + "\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
  lines = [json.loads(x) for x in
           (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  evals = [{"step": x["step"], "any_order": x["eval/loss_random"], "l2r": x["eval/loss_l2r"]}
           for x in lines if "eval/loss_random" in x]
  shown = [a if not a.startswith("--workdir=") else "--workdir=WORKDIR" for a in cmd[1:]]
  return {"command": "python " + " ".join(shown), "wall_s": round(wall, 1), "evals": evals}


def plot(result: dict, path: pathlib.Path, machine: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
  pre = result["pretrain_steps"]
  arms = (("L2R pretraining, then adaptation", "a2o", "C0"),
          ("AO-GPT from scratch", "scratch", "C1"))
  for ax, key, title in zip(axes, ("any_order", "l2r"),
                            ("held-out any-order loss (uniform orders)", "held-out L2R loss")):
    for label, arm, color in arms:
      pts = result["curves"][arm]
      ax.plot([p["step"] for p in pts], [p[key] for p in pts], "o-", ms=3, color=color,
              label=label)
    ax.axvline(pre, color="gray", ls="--", lw=1)
    ax.text(pre, ax.get_ylim()[1], " convert + adapt", va="top", fontsize=8, color="gray")
    ax.set_xlabel("training steps (same tokens per step in every run)")
    ax.set_ylabel("nats / token")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(f"benchmarks/a2o_adaptation.py: tiny model, Python stdlib bytes ({machine})",
               fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--pretrain_steps", type=int, default=400)
  ap.add_argument("--adapt_steps", type=int, default=400)
  ap.add_argument("--curriculum_frac", type=float, default=1 / 3,
                  help="the curriculum reaches the 10%% mixture after this part of adaptation")
  ap.add_argument("--eval_every", type=int, default=50)
  ap.add_argument("--out", default="", help="default: results/a2o_adaptation/<machine>.json")
  ap.add_argument("--png", default="", help="default: the JSON's path with .png")
  ap.add_argument("overrides", nargs="*", help="--config.x=y passed to every training command")
  args = ap.parse_args()
  total = args.pretrain_steps + args.adapt_steps
  curriculum = max(1, round(args.curriculum_frac * args.adapt_steps))
  load_before = os.getloadavg()
  with tempfile.TemporaryDirectory(prefix="aogpt_a2o_") as root:
    l2r_dir, a2o_dir, scratch_dir = (os.path.join(root, n) for n in ("l2r", "a2o", "scratch"))
    l2r = run("configs/gpt2_small.py:tiny", l2r_dir, args.pretrain_steps, args.eval_every,
              args.overrides)
    a2o = run("configs/a2o_gpt2_small.py:tiny", a2o_dir, args.adapt_steps, args.eval_every,
              [f"--config.train.init_from=l2r:{l2r_dir}",
               f"--config.order.kwargs.steps={curriculum}", *args.overrides])
    a2o["command"] = a2o["command"].replace(l2r_dir, "L2R_WORKDIR")
    scratch = run("configs/aogpt_small.py:tiny", scratch_dir, total, args.eval_every,
                  args.overrides)
  shifted = [dict(p, step=p["step"] + args.pretrain_steps) for p in a2o["evals"]]
  final = {"a2o": shifted[-1], "scratch": scratch["evals"][-1]}
  results = {
      "pretrain_steps": args.pretrain_steps, "adapt_steps": args.adapt_steps,
      "total_steps": total, "curriculum_steps": curriculum,
      "curves": {"a2o": l2r["evals"] + shifted, "scratch": scratch["evals"]},
      "final": final,
      "final_any_order_gain_nats": round(final["scratch"]["any_order"]
                                         - final["a2o"]["any_order"], 4),
      "final_l2r_gain_nats": round(final["scratch"]["l2r"] - final["a2o"]["l2r"], 4),
      "runs": {"l2r_pretrain": {k: l2r[k] for k in ("command", "wall_s")},
               "adapt": {k: a2o[k] for k in ("command", "wall_s")},
               "scratch": {k: scratch[k] for k in ("command", "wall_s")}},
      "load_avg_1m_before": round(load_before[0], 2),
      "unit": "held-out nats per token (EMA weights); any_order = uniformly random orders",
  }
  path = common.write_result("a2o_adaptation", vars(args), results, out=args.out or None)
  png = pathlib.Path(args.png) if args.png else pathlib.Path(path).with_suffix(".png")
  plot(results, png, common.machine()["slug"])
  print(json.dumps({"final": final, "json": str(path), "png": str(png)}, indent=1))


if __name__ == "__main__":
  main()
