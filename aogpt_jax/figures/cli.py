"""``python -m aogpt_jax.figures FIGURE... --size=tiny --workdir=DIR``: trains (or resumes) every
run the figures need, then draws them. See aogpt_jax/figures/__init__.py and docs/figures.md."""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import pathlib
import platform
import shlex
import sys
import time
from typing import Any

from aogpt_jax.figures import draw
from aogpt_jax.figures import extras
from aogpt_jax.figures import registry
from aogpt_jax.figures import runs as runs_lib
from aogpt_jax.figures import sizes


UNIGRAM = "unigram entropy of the held-out blocks"


def parse(argv: list[str]) -> tuple[argparse.Namespace, dict[str, str]]:
  ap = argparse.ArgumentParser(
      prog="python -m aogpt_jax.figures",
      description="Runs (or resumes) every variant of the paper's figures under "
                  "WORKDIR/FIGURE/VARIANT and draws them as PNG + SVG, with the plotted numbers "
                  "beside them as Markdown and JSON. Extra --data.KEY=VALUE flags set data.* of "
                  "every run (--data.glob=... trains on your text files).",
      epilog=f"figures: all, {', '.join(registry.FIGURES)} (or 2, 3a, ...)")
  ap.add_argument("figures", nargs="+", metavar="FIGURE")
  ap.add_argument("--size", default="tiny", choices=sizes.SIZES,
                  help="tiny: 2 CPU cores; small/medium: the paper's runs (accelerators); "
                       "micro: seconds, for tests (shows nothing)")
  ap.add_argument("--workdir", required=True, help="runs go to WORKDIR/FIGURE/VARIANT")
  ap.add_argument("--out", default="",
                  help="folder of the pictures and tables (default: WORKDIR/FIGURE)")
  ap.add_argument("--judge", default="",
                  help="table1: a local GPT-2 (Large) folder or hf:OWNER/REPO from the local "
                       "cache to score the samples (GPT-2-tokenized runs only); default: the "
                       "L2R run fig2/l2r judges")
  ap.add_argument("--dry-run", action="store_true",
                  help="list the runs, their state and estimated cost; train nothing")
  ap.add_argument("--verbose", action="store_true", help="show tracebacks on errors")
  args, rest = ap.parse_known_args(argv)
  data = {}
  for a in rest:
    if not a.startswith("--data.") or "=" not in a:
      ap.error(f"unrecognized argument {a!r} (only --data.KEY=VALUE passes through)")
    k, v = a[len("--data."):].split("=", 1)
    data[k] = v
  return args, data


def _command(argv: list[str]) -> str:
  return "python -m aogpt_jax.figures " + " ".join(shlex.quote(a) for a in argv)


def _machine() -> str:
  return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores"


def plan(args, data: dict[str, str]
         ) -> tuple[list[str], list[tuple[registry.Run, Any, pathlib.Path]]]:
  """The figures asked for and (run, config, run folder) of every run they need."""
  names = registry.resolve_names(args.figures)
  work = pathlib.Path(args.workdir)
  planned = []
  for run in registry.runs_of(names):
    cfg = runs_lib.run_config(run, args.size, data)
    planned.append((run, cfg, work / run.key))
  return names, planned


def _state(cfg, wd: pathlib.Path) -> str:
  if runs_lib.is_finished(wd, cfg):
    return "finished"
  steps = [r["step"] for r in runs_lib.read_metrics(wd)]
  return f"partial (logged to step {max(steps)})" if steps else "new"


def dry_run(args, names, planned) -> None:
  total = 0.0
  print(f"figures: {', '.join(names)} at --size={args.size} in {args.workdir}")
  for run, cfg, wd in planned:
    c = runs_lib.cost(cfg)
    state = _state(cfg, wd)
    if state != "finished":
      total += c["seconds"]
    print(f"  run {run.key:22s} {state:28s} {runs_lib.format_cost(c)}")
  for n in names:
    if n == "table1":
      g = sizes.GENPPL[args.size]
      print(f"  table1: {g.num_samples} samples x {g.length} tokens of fig3b/mixture_10 at T in "
            f"{list(g.steps)} and 3 annealing settings, judged by "
            f"{args.judge or 'the L2R run fig2/l2r'}")
    if n == "fig4":
      es = sizes.ENSEMBLE[args.size]
      print(f"  fig4: ensembles M = 1..{es.max_m} of {registry.FIGURES['fig4'].runs[0]} over "
            f"{es.max_blocks} held-out blocks")
    if n == "fig5":
      ts = sizes.TIMING[args.size]
      print(f"  fig5: samplers timed at preset {ts.preset}, {ts.batch} x {ts.length} tokens, "
            f"T in {list(ts.steps)}, best of {ts.repeats}")
  when = f"{total / 60:.1f} min" if total < 3 * 3600 else f"{total / 3600:.1f} h"
  print(f"training still to do: ~{when} (estimate; Figures 4, 5 and table1 add minutes at "
        f"tiny size)")


def figure_data(name: str, args, planned, argv) -> dict[str, Any]:
  spec = registry.FIGURES[name]
  work = pathlib.Path(args.workdir)
  by_key = {run.key: (cfg, wd) for run, cfg, wd in planned}
  if spec.kind == "curves":
    panels = []
    unigram = runs_lib.unigram_entropy(by_key[spec.runs[0]][0])
    for p in spec.panels:
      lines = []
      for c in p.curves:
        x, y = runs_lib.series(by_key[c.run][1], c.metric)
        lines.append({"label": c.label, "run": c.run, "metric": c.metric, "x": x, "y": y})
      xs = [x for line in lines for x in line["x"]]
      if xs:
        lines.append({"label": UNIGRAM, "x": [min(xs), max(xs)], "y": [unigram] * 2,
                      "style": ":"})
      panels.append({"title": p.title, "xlabel": "step", "ylabel": p.ylabel, "lines": lines})
  elif spec.kind == "ensemble":
    cfg, wd = by_key[spec.runs[0]]
    res = extras.ensemble(wd, cfg, work / name, sizes.ENSEMBLE[args.size])
    panels = extras.ensemble_panels(res)
  elif spec.kind == "genppl":
    (cfg, wd), (_, judge_wd) = by_key[spec.runs[0]], by_key[spec.runs[1]]
    res = extras.genppl(wd, judge_wd, args.judge, cfg, work / name, sizes.GENPPL[args.size])
    panels = extras.genppl_panels(res)
  elif spec.kind == "timing":
    panels = extras.timing_panels(extras.timing(work / name, sizes.TIMING[args.size]))
  else:
    raise AssertionError(spec.kind)
  return {"name": name, "title": spec.title, "finding": spec.finding, "size": args.size,
          "runs": {k: str(by_key[k][1]) for k in spec.runs},
          "produced_by": _command(argv), "machine": _machine(),
          "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "panels": panels}


def run(argv: list[str]) -> dict[str, dict[str, Any]]:
  """The command; returns {figure: written paths (png, svg, md, json) and ``figure``}."""
  args, data = parse(argv)
  try:
    names, planned = plan(args, data)
    if args.dry_run:
      dry_run(args, names, planned)
      return {}
    draw.check_matplotlib()
    for i, (run, cfg, wd) in enumerate(planned, 1):
      if runs_lib.is_finished(wd, cfg):
        print(f"[{i}/{len(planned)}] {run.key}: finished, not trained again", flush=True)
        continue
      print(f"[{i}/{len(planned)}] {run.key}: training ({_state(cfg, wd)}; "
            f"{runs_lib.format_cost(runs_lib.cost(cfg))}) in {wd}", flush=True)
      t = time.perf_counter()
      runs_lib.train(cfg, wd)
      print(f"[{i}/{len(planned)}] {run.key}: done in {time.perf_counter() - t:.0f} s",
            flush=True)
    written = {}
    for name in names:
      out = pathlib.Path(args.out) if args.out else pathlib.Path(args.workdir) / name
      written[name] = draw.write(figure_data(name, args, planned, argv), out)
      print(f"{name}: {written[name]['png']} (+ .svg, .md, .json)", flush=True)
    return written
  except (ValueError, OSError, RuntimeError, KeyError) as e:
    if args.verbose:
      raise
    from aogpt_jax.main import one_line
    raise SystemExit(f"aogpt_jax.figures: {one_line(e)}") from None


def main(argv: list[str] | None = None) -> None:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
  for lib in ("orbax", "absl", "grain", "jax"):
    logging.getLogger(lib).setLevel(logging.WARNING)
  run(sys.argv[1:] if argv is None else argv)
