"""The GRPO loop's speed at CPU size, and what each of its levers buys, measured in one run.

    python benchmarks/grpo_speed.py                 # every variant, 8 updates each
    python benchmarks/grpo_speed.py --variants=default,before --updates=12

Trains (or reuses, in --workdir) benchmarks/post_training.py's CPU-size starting model (6x6
Sudoku, the 4 x 128 model with the query block over the blanks, 250 steps), then builds one
GRPO trainer per variant with that size's settings (8 puzzles x 8 rollouts, a random order, one
cell per step, tokens at T = 1, exact likelihood) and runs the variants' updates in turns (one
update of each per round, so that a drifting load hits all alike; every variant sees the same
prompts and rollout keys). Variants:

* ``default``: as the code runs: the folded likelihood passes (`likelihood.blank_scan`: two
  steps a pass), the on-policy gradient of a batch's first update (`objective.on_policy_loss`),
  the sampler's query phases (`AdaptiveShape.phases`);
* ``full_objective``: the clipped objective in full (``on_policy_gradient=False``);
* ``unfolded``: one step a likelihood pass (`likelihood.FOLD_STEPS` off);
* ``one_phase``: the sampler with Q query slots at every step (no phases);
* ``before``: all three off (the loop as it was before them);
* ``mean_field``, ``elbo``: the estimated likelihoods (d1's, 4 random masks), for scale.

Reports per variant the medians over the compiled updates (all but the first) of seconds per
update, of its rollouts and of its gradient update, rollouts per second, the first update's
seconds (compiling) and the compilations after the first update (0 expected). Writes
benchmarks/results/grpo_speed_cpu/<machine>.json and a Markdown table beside it
(docs/post_training.md, "Compilation and speed").
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import time

import common
import post_training

VARIANTS = {
    "default": dict(settings={}, fold=True, phases=True),
    "full_objective": dict(settings={"on_policy_gradient": False}, fold=True, phases=True),
    "unfolded": dict(settings={}, fold=False, phases=True),
    "one_phase": dict(settings={}, fold=True, phases=False),
    "before": dict(settings={"on_policy_gradient": False}, fold=False, phases=False),
    "mean_field": dict(settings=dict(post_training.RUNS["mean_field"]), fold=True, phases=True),
    "elbo": dict(settings=dict(post_training.RUNS["elbo"]), fold=True, phases=True),
}


@contextlib.contextmanager
def levers(fold: bool, phases: bool):
  """The code's module switches for one variant's update (read when a program is traced, and by
  the sampler's sizes at each batch), restored afterwards."""
  from aogpt_jax.posttrain import likelihood
  from aogpt_jax.sampling import adaptive
  old = likelihood.FOLD_STEPS, adaptive.PHASE_MIN_QUERIES
  likelihood.FOLD_STEPS = fold
  adaptive.PHASE_MIN_QUERIES = old[1] if phases else 0
  try:
    yield
  finally:
    likelihood.FOLD_STEPS, adaptive.PHASE_MIN_QUERIES = old


def median(xs):
  import numpy as np
  return float(np.median(xs)) if xs else float("nan")


def markdown(res: dict, machine: dict) -> str:
  lines = [f"GRPO at CPU size: {res['rollouts']} rollouts an update (6x6 Sudoku, 4 x 128 model "
           f"with the blank block, random order, one cell per step); medians over "
           f"{res['updates'] - 1} compiled updates.", "",
           "| variant | s per update | rollouts (s) | gradient update (s) | rollouts/s | "
           "first update (s) | compiles after the first |", "|---|---|---|---|---|---|---|"]
  for name, r in res["variants"].items():
    lines.append(f"| {name} | {r['sec_per_update']:.2f} | {r['rollout_sec']:.2f} | "
                 f"{r['update_sec']:.2f} | {r['rollouts_per_sec']:.0f} | "
                 f"{r['first_update_sec']:.1f} | {r['compiles_after_first']} |")
  lines += ["", f"{machine['cores']}-core {machine['cpu']}; load average "
            f"{res['load_avg_1m_start']:.1f} at the start, {res['load_avg_1m_end']:.1f} at the "
            f"end."]
  return "\n".join(lines) + "\n"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default="/tmp/aogpt_post_training",
                 help="where the starting model is trained or reused (post_training.py's)")
  p.add_argument("--variants", default=",".join(VARIANTS),
                 help="comma-separated, of " + ", ".join(VARIANTS))
  p.add_argument("--updates", type=int, default=8, help="updates per variant (the first compiles)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="", help="the JSON (default: benchmarks/results/...)")
  args = p.parse_args(argv)
  common.check_args(p, args)
  names = [v for v in args.variants.split(",") if v]
  bad = [v for v in names if v not in VARIANTS]
  if bad or not names:
    sys.exit(f"--variants: expected names of {', '.join(VARIANTS)}, got {args.variants!r}")
  if args.updates < 2:
    sys.exit(f"--updates: at least 2 (the first compiles), got {args.updates}")

  import jax
  import aogpt_jax
  from aogpt_jax import tasks
  from aogpt_jax.posttrain import grpo
  from aogpt_jax.model.jit import Compiles

  cfg = dict(post_training.SIZES["cpu"])
  load0, t0 = common.load_avg_1m(), time.perf_counter()
  wd, _ = post_training.start_run(cfg, argparse.Namespace(workdir=args.workdir, size="cpu"))
  sampler = post_training.SAMPLERS[cfg["sampler"]][0]
  trainers = {}
  for name in names:
    model, run_cfg = aogpt_jax.load(str(wd))
    task = tasks.make(run_cfg.task.name, **run_cfg.task.options.to_dict())
    v = VARIANTS[name]
    settings = grpo.GRPOSettings(group_size=cfg["group"], lr=cfg["lr"], steps=task.length,
                                 reward=cfg["reward"], **{**sampler, **v["settings"]})
    with levers(v["fold"], v["phases"]):
      trainers[name] = grpo.GRPO(model, settings, task=task)
  rows = {name: [] for name in names}
  for u in range(args.updates):
    for name in names:
      tr, v = trainers[name], VARIANTS[name]
      prompts = tr.task_prompts(seed=args.seed, index=u, count=cfg["prompts"])
      with levers(v["fold"], v["phases"]), Compiles() as c:
        t = time.perf_counter()
        m = tr.step(jax.random.fold_in(jax.random.key(args.seed), u), prompts)
        wall = time.perf_counter() - t
      rows[name].append({**m, "wall_s": wall, "compiles": c.count})
      print(f"[{name}] update {u + 1}: {wall:.2f} s (rollouts {m['rollout_sec']:.2f} s, "
            f"update {m['update_sec']:.2f} s)", flush=True)
  out = {}
  for name, rs in rows.items():
    rest = rs[1:]
    out[name] = {"sec_per_update": median([r["rollout_sec"] + r["update_sec"] for r in rest]),
                 "rollout_sec": median([r["rollout_sec"] for r in rest]),
                 "update_sec": median([r["update_sec"] for r in rest]),
                 "rollouts_per_sec": median([r["rollouts_per_sec"] for r in rest]),
                 "first_update_sec": rs[0]["rollout_sec"] + rs[0]["update_sec"],
                 "compiles_after_first": int(sum(r["compiles"] for r in rest)),
                 "settings": VARIANTS[name]["settings"], "fold": VARIANTS[name]["fold"],
                 "phases": VARIANTS[name]["phases"],
                 "curve": [{k: r[k] for k in ("rollout_sec", "update_sec", "wall_s", "compiles",
                                              "reward")} for r in rs]}
  res = {"rollouts": cfg["prompts"] * cfg["group"], "updates": args.updates,
         "start_model": str(wd), "variants": out, "load_avg_1m_start": load0,
         "load_avg_1m_end": common.load_avg_1m(), "wall_s": time.perf_counter() - t0}
  path = common.write_result("grpo_speed_cpu", args, res, out=args.out or None)
  md = markdown(res, common.machine())
  pathlib.Path(path).with_suffix(".md").write_text(md)
  print(md)
  return res


if __name__ == "__main__":
  main()
