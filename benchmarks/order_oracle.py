"""How far an order head could raise greedy decoding, and what imitating the oracle learns.

    python benchmarks/order_oracle.py                     # 6x6, the CPU (about 20 minutes)

The model is `benchmarks/post_training.py`'s starting model (`configs/sudoku.py:tiny`, 250
steps; trained in --workdir or reused). Greedy max_prob decoding fails on a puzzle at the first
cell it writes wrong. The *oracle* (`posttrain.head_imitation`) knows the answer and takes, each
step, the best of max_prob's top k candidates whose most likely digit is right: the share it
solves is reachable by an order head over that top k with greedy digits (those choices exist;
the oracle does not look ahead, so better ones may solve more).
Three puzzle sets, the grids of the last two minimal puzzles (about 10 givens, unique):

* ``search``: the held-out puzzles that naked and hidden singles cannot solve (the 177 among
  200,000 of post_training.py);
* ``heldout_minimal``: held-out grids, never trained on;
* ``train_minimal``: training grids, puzzles the imitation never saw.

A parameterless probe asks whether the model's own confidence one step later tells a wrong
choice from a right one: of the top ``--top_k``, the candidate whose next state leaves the free
cells surest (``choose="lookahead"``). Then, per seed, a new head over the top ``--top_k`` is
trained by DAgger against the oracle on ``--puzzles`` minimal training puzzles
(`head_imitation.train`) and each set is decoded with it greedily (the adaptive sampler with
``sample.order_head=True``). Writes
benchmarks/results/order_oracle/<machine>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import numpy as np

import common
import post_training

SETS = ("search", "heldout_minimal", "train_minimal")
LABELS = {"search": "held out, need a guess", "heldout_minimal": "held-out grids, minimal",
          "train_minimal": "training grids, minimal (unseen)"}


def _ints(ap, key: str, text: str) -> tuple[int, ...]:
  try:
    vals = tuple(int(v) for v in text.split(",") if v.strip())
  except ValueError:
    vals = ()
  if not vals or min(vals) < 0:
    common.fail(ap, f"--{key}={text!r}: expected comma-separated integers >= 0")
  return vals


def minimal_puzzles(task, count: int, seed: int, held: bool) -> dict:
  """``count`` minimal unique puzzles (about 10 givens at 6x6) of held-out or training grids."""
  from aogpt_jax.tasks import base, sudoku_grade
  rng = base.seeds(0x0AC1, seed, int(held))
  grids = task._grids(rng, count, held=held)   # noqa: SLF001 - the task's own grid split
  return {"tokens": grids.astype(np.int32),
          "prompt": np.array([sudoku_grade.minimal_prompt(g + 1, rng) for g in grids])}


def rate(solved) -> dict:
  from aogpt_jax.evaluation import solve as solve_lib
  s = np.asarray(solved, bool)
  lo, hi = solve_lib.wilson(int(s.sum()), len(s))
  return {"count": int(s.sum()), "total": len(s), "rate": float(s.mean()), "low": lo, "high": hi}


def greedy(model, task, puzzles, head: bool) -> dict:
  """The adaptive sampler's greedy max_prob decoding, with the model's order head or not."""
  import jax
  from aogpt_jax.evaluation import solve as solve_lib
  from aogpt_jax.sampling import SampleSettings
  s = SampleSettings(length=task.length, method="adaptive", policy="max_prob", steps=task.length,
                     greedy=True, order_head=head)
  sv = solve_lib.solve(model, task, puzzles, s, key=jax.random.key(0),
                       batch_size=len(puzzles["tokens"]), warm=False).summary["solved"]
  return {"count": int(sv["count"]), "total": len(puzzles["tokens"]), "rate": float(sv["rate"]),
          "low": float(sv["low"]), "high": float(sv["high"])}


def run(args) -> dict:
  import aogpt_jax
  from aogpt_jax import tasks
  from aogpt_jax.model import order_head as order_head_lib
  from aogpt_jax.posttrain import head_imitation as hi
  cfg = post_training.SIZES[args.size]
  start, train = post_training.start_run(cfg, args)
  model, run_cfg = aogpt_jax.load(str(start))
  task = tasks.make(run_cfg.task.name, **run_cfg.task.options.to_dict())
  sets = {"search": post_training.search_puzzles(task, 0, args.search_pool),
          "heldout_minimal": minimal_puzzles(task, args.count, 0, held=True),
          "train_minimal": minimal_puzzles(task, args.count, 0, held=False)}
  sets = {k: v for k, v in sets.items() if v is not None}
  res = {"start": str(start), "train": train,
         "sets": {k: len(v["tokens"]) for k, v in sets.items()},
         "top_k": args.top_k, "oracle": {}, "heuristic": {}, "seeds": []}
  for name, p in sets.items():
    res["heuristic"][name] = greedy(model, task, p, head=False)
    print(f"[{name}] max_prob greedy: {res['heuristic'][name]['count']}/{len(p['tokens'])}",
          flush=True)
  t0 = time.perf_counter()
  for k in args.ks:
    res["oracle"][str(k)] = {name: rate(hi.rollout(model, p["tokens"], p["prompt"], top_k=k,
                                                   choose="oracle", keep_states=False).solved)
                             for name, p in sets.items()}
    print(f"oracle over the top {k}: " + ", ".join(
        f"{n} {100 * r['rate']:.1f}%" for n, r in res["oracle"][str(k)].items()), flush=True)
  res["oracle_s"] = time.perf_counter() - t0
  t0 = time.perf_counter()
  res["lookahead"] = {name: rate(hi.rollout(model, p["tokens"], p["prompt"], top_k=args.top_k,
                                            choose="lookahead", keep_states=False).solved)
                      for name, p in sets.items()}
  res["lookahead_s"] = time.perf_counter() - t0
  print(f"one-step lookahead over the top {args.top_k}: " + ", ".join(
      f"{n} {100 * r['rate']:.1f}%" for n, r in res["lookahead"].items()), flush=True)
  settings = hi.ImitationSettings(rounds=args.rounds, epochs=args.epochs)
  for seed in args.seeds:
    t0 = time.perf_counter()
    m, _ = aogpt_jax.load(str(start))
    order_head_lib.attach(m, top_k=args.top_k, seed=seed)
    tr = tasks.make(run_cfg.task.name, **{**run_cfg.task.options.to_dict(), "hard_frac": 1.0})
    batches = [tr.train_batch(1000 + seed, i, 512) for i in range(-(-args.puzzles // 512))]
    puzzles = {k: np.concatenate([b[k] for b in batches])[:args.puzzles] for k in batches[0]}
    rounds = hi.train(m, puzzles["tokens"], puzzles["prompt"], settings, seed=seed)
    row = {"seed": seed, "rounds": rounds, "train_s": time.perf_counter() - t0,
           "head": {name: greedy(m, task, p, head=True) for name, p in sets.items()}}
    res["seeds"].append(row)
    print(f"seed {seed}: the imitated head, greedy: " + ", ".join(
        f"{n} {100 * r['rate']:.1f}%" for n, r in row["head"].items()), flush=True)
  res["settings"] = dataclasses.asdict(settings)
  return res


def pct(r: dict, interval: bool = True) -> str:
  s = f"{r['count']}/{r['total']} ({100 * r['rate']:.1f}%"
  return s + (f", {100 * r['low']:.1f}-{100 * r['high']:.1f}%)" if interval else ")")


def markdown(res: dict) -> str:
  names = [n for n in SETS if n in res["sets"]]
  sizes = "; ".join(f"{res['sets'][n]} {LABELS[n]}" for n in names)
  lines = [f"Solved with greedy digits, per set ({sizes}; the model: "
           f"`{res['train'].get('config', 'configs/sudoku.py:tiny')}`, "
           f"{res['train'].get('total_steps')} steps).", "",
           "| decoding | " + " | ".join(LABELS[n] for n in names) + " |",
           "|---|" + "---|" * len(names),
           "| max_prob | " + " | ".join(pct(res["heuristic"][n]) for n in names) + " |"]
  for k, row in res["oracle"].items():
    lines.append(f"| oracle over max_prob's top {k} | "
                 + " | ".join(pct(row[n], False) for n in names) + " |")
  lines.append(f"| one-step lookahead over max_prob's top {res['top_k']} (the surest next "
               f"state) | " + " | ".join(pct(res["lookahead"][n]) for n in names) + " |")
  for s in res["seeds"]:
    lines.append(f"| head over the top {res['top_k']}, imitating the oracle, seed {s['seed']} | "
                 + " | ".join(pct(s["head"][n]) for n in names) + " |")
  return "\n".join(lines) + "\n"


def plot(res: dict, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = [n for n in SETS if n in res["sets"]]
  ks = [int(k) for k in res["oracle"]]
  fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), sharey=True)
  for ax, n in zip(np.atleast_1d(axes), names):
    ax.plot(ks, [100 * res["oracle"][str(k)][n]["rate"] for k in ks], "o-", color="tab:green",
            label="oracle over the top k (reachable)")
    h = res["heuristic"][n]
    ax.axhline(100 * h["rate"], color="tab:blue", label="max_prob")
    ax.axhspan(100 * h["low"], 100 * h["high"], color="tab:blue", alpha=0.12)
    la = res["lookahead"][n]
    ax.plot([res["top_k"]], [100 * la["rate"]], "s", color="tab:purple", ms=7,
            label="one-step lookahead (no training)")
    for i, s in enumerate(res["seeds"]):
      ax.plot([res["top_k"]], [100 * s["head"][n]["rate"]], "x", color="tab:red", ms=8,
              label="imitated head (per seed)" if i == 0 else None)
    ax.set_title(f"{LABELS[n]} ({res['sets'][n]})", fontsize=9)
    ax.set_xlabel("k (max_prob's top k)")
    ax.set_xticks(ks)
    ax.grid(alpha=0.3)
  np.atleast_1d(axes)[0].set_ylabel("solved, greedy digits (%)")
  handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
  fig.suptitle("What an order head could reach (the oracle) and what imitating it reached",
               fontsize=10)
  fig.tight_layout(rect=(0, 0.07, 1, 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--size", choices=sorted(post_training.SIZES), default="cpu",
                  help="post_training.py's size: its starting model")
  ap.add_argument("--workdir", default="/tmp/aogpt_post_training",
                  help="the starting model's run (post_training.py's; reused when trained)")
  ap.add_argument("--ks", default="1,2,3,5,8", help="the oracle's top k, comma-separated")
  ap.add_argument("--top_k", type=int, default=post_training.TOP_K, help="the imitated head's")
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--puzzles", type=int, default=2048, help="imitation's training puzzles")
  ap.add_argument("--rounds", type=int, default=2, help="DAgger rounds")
  ap.add_argument("--epochs", type=int, default=10, help="epochs per round")
  ap.add_argument("--count", type=int, default=1024, help="puzzles of each minimal set")
  ap.add_argument("--search_pool", type=int, default=200_000,
                  help="held-out puzzles searched for ones that need a guess (0: no such set)")
  ap.add_argument("--name", default="")
  ap.add_argument("--out", default="")
  ap.add_argument("--redraw", default="", metavar="JSON",
                  help="only write a finished result's Markdown and PNG again, from its JSON")
  args = ap.parse_args(argv)
  if args.redraw:
    path = pathlib.Path(args.redraw)
    res = json.loads(path.read_text())["results"]
    path.with_suffix(".md").write_text(markdown(res))
    plot(res, path.with_suffix(".png"))
    print(f"wrote {path.with_suffix('.md')} and {path.with_suffix('.png')}", flush=True)
    return
  common.check_args(ap, args, positive=("top_k", "puzzles", "rounds", "epochs", "count"),
                    nonnegative=("search_pool",))
  args.ks = _ints(ap, "ks", args.ks)
  args.seeds = _ints(ap, "seeds", args.seeds)
  if min(args.ks) < 1:
    common.fail(ap, f"--ks={args.ks}: expected integers >= 1")
  res = run(args)
  path = common.write_with_markdown("order_oracle", args, res, markdown(res))
  plot(res, path.with_suffix(".png"))
  print(f"wrote {path.with_suffix('.png')}", flush=True)


if __name__ == "__main__":
  main()
