"""Hard 9x9 Sudoku, per difficulty bucket: AO-GPT and the encoder MDM trained on a hard mixture,
each decoded greedily and with the search, solved rates per guess-count bucket, one command.

    python benchmarks/hard_sudoku.py run --size=accel          # one GPU (accel_session.sh: PARTS=hard)
    python benchmarks/hard_sudoku.py run --size=cpu --steps=3000
    python benchmarks/hard_sudoku.py puzzles --out=/tmp/hard9.csv --per_bucket=100

``puzzles`` writes held-out 9x9 puzzles (grids of the task's held-out split, never trained on),
``--per_bucket`` of each guess-count bucket ``--buckets`` (`tasks.sudoku_grade`: minimal unique
puzzles, 17+ givens), as ``puzzle,solution`` CSV rows that ``--mode=solve`` reads
(``solve.puzzles=FILE``). ``run`` makes that file, trains ``configs/sudoku.py`` (``:tiny`` at
``--size=cpu``: the 4 x 128 model; else the 8 x 256 one) and its ``:mdm`` variant for ``--steps``
with ``--hard_frac`` of each batch minimal puzzles, and solves the file with each model greedily
(max_prob, ``solve.search_width=0``) and with the search (``--width`` beams, model-only), then
collects the solve summaries into benchmarks/results/hard_sudoku_SIZE/<machine>.{json,md}
(``hard_sudoku_SIZE_NAME/`` with ``--name``; or ``--out``). ``--models`` picks the models
(default ``aogpt,mdm``; ``aogpt_causal`` is the blank block with its blanks causal among
themselves, ``model.blank_attention=causal``). A run whose models were trained to ``--steps``
in ``--workdir`` reuses them; one stopped before (SIGTERM saves a checkpoint) resumes where it
stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

import common

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUCKETS = ("0", "1-4", "5-99")
STEPS = {"cpu": 3000, "accel": 2500}
# --models: name -> (the configs/sudoku.py variant word, extra --config.* overrides)
MODELS = {"aogpt": ("", ()), "mdm": ("mdm", ()),
          "aogpt_causal": ("", ("--config.model.blank_attention=causal",))}


def write_puzzles(path: str, per_bucket: int, buckets, seed: int = 0) -> dict:
  """Writes the graded held-out file; returns {bucket: rows}."""
  from aogpt_jax import tasks
  from aogpt_jax.tasks import sudoku
  rows, counts = [], {}
  for b in buckets:
    t = tasks.make("sudoku", size=9, min_givens=17, max_givens=30, difficulty=b)
    held = t.heldout(seed, per_bucket)
    counts[b] = len(held["tokens"])
    rows += [(sudoku.to_string(tok, prm), sudoku.to_string(tok))
             for tok, prm in zip(held["tokens"], held["prompt"])]
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w") as f:
    f.write("puzzle,solution\n" + "".join(f"{p},{s}\n" for p, s in rows))
  print(f"wrote {len(rows)} puzzles to {path} ({counts})", flush=True)
  return counts


def _main_cmd(config: str, workdir: str, *extra: str) -> list[str]:
  return [sys.executable, "-m", "aogpt_jax.main", f"--config={ROOT}/configs/{config}",
          f"--workdir={workdir}", *extra]


def run(args) -> dict:
  wd = pathlib.Path(args.workdir)
  wd.mkdir(parents=True, exist_ok=True)
  puzzles = str(wd / "hard9.csv")
  counts = write_puzzles(puzzles, args.per_bucket, args.buckets.split(","))
  tiny = ":tiny" if args.size == "cpu" else ""
  out = {"puzzles": {"file": puzzles, "per_bucket": counts}, "models": {}}
  for name in args.models.split(","):
    word, extra = MODELS[name]
    words = ",".join(w for w in (tiny[1:], word) if w)
    config = "sudoku.py" + (f":{words}" if words else "")
    run_dir = str(wd / name)
    train = ["--config.total_steps=" + str(args.steps),
             f"--config.task.options.hard_frac={args.hard_frac}", *extra]
    if args.size == "cpu":    # 9x9 at the CPU size: the tiny model, 9x9 grids
      train += ["--config.task.options.size=9", "--config.task.options.min_givens=30",
                "--config.task.options.max_givens=40", "--config.seq_len=81",
                "--config.model.block_size=81", "--config.sample.steps=81",
                "--config.model.position_init=grid:9,9,3,3"]
    # trained to the end: reused; stopped before it (a checkpoint below --steps): resumed
    if not (pathlib.Path(run_dir) / "checkpoints" / str(args.steps)).is_dir() or args.retrain:
      subprocess.run(_main_cmd(config, run_dir, *train), check=True)
    out["models"][name] = {"workdir": run_dir, "config": config, "overrides": train,
                           "decodings": {}}
    for dec, width in (("greedy max_prob", 0), (f"search W={args.width} (model-only)",
                                                 args.width)):
      stem = "greedy" if not width else f"search{width}"
      subprocess.run(_main_cmd(config, run_dir, *train, "--mode=solve",
                               f"--config.solve.puzzles={puzzles}", "--config.solve.count=0",
                               f"--config.solve.search_width={width}",
                               f"--config.solve.name={stem}"), check=True)
      solved = sorted((pathlib.Path(run_dir) / "solve").glob(f"{stem}*.json"),
                      key=os.path.getmtime)[-1]
      s = json.loads(solved.read_text())["summary"]
      out["models"][name]["decodings"][dec] = {
          "file": str(solved), "solved": s["solved"], "buckets": s.get("buckets", {}),
          "ms_per_puzzle": s["ms_per_puzzle"]}
  return out


def markdown(res: dict) -> str:
  buckets = list(res["puzzles"]["per_bucket"])
  lines = ["| model | decoding | all | " + " | ".join(f"{b} guesses" for b in buckets)
           + " | ms / puzzle |", "|---|---|---|" + "---|" * len(buckets) + "---|"]
  for name, m in res["models"].items():
    for dec, d in m["decodings"].items():
      cells = []
      for b in buckets:
        v = d["buckets"].get(b)
        cells.append(f"{v['count']}/{v['rows']} ({100 * v['rate']:.1f}%)" if v else "-")
      s = d["solved"]
      lines.append(f"| {name} | {dec} | {100 * s['rate']:.1f}% | " + " | ".join(cells)
                   + f" | {d['ms_per_puzzle']:.0f} |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = p.add_subparsers(dest="command", required=True)
  pz = sub.add_parser("puzzles", help="write the graded held-out puzzle file")
  pz.add_argument("--out", required=True)
  pz.add_argument("--per_bucket", type=int, default=100)
  pz.add_argument("--buckets", default=",".join(BUCKETS))
  r = sub.add_parser("run", help="train both models, solve the file, collect the table")
  r.add_argument("--size", choices=("cpu", "accel"), default="cpu")
  r.add_argument("--steps", type=int, default=0, help="training steps (0: the size's default)")
  r.add_argument("--hard_frac", type=float, default=0.25)
  r.add_argument("--per_bucket", type=int, default=100)
  r.add_argument("--buckets", default=",".join(BUCKETS))
  r.add_argument("--width", type=int, default=8)
  r.add_argument("--workdir", default="/tmp/aogpt_hard_sudoku")
  r.add_argument("--models", default="aogpt,mdm",
                 help=f"comma-separated names of {', '.join(MODELS)} (aogpt_causal: the blank "
                 "block with its blanks causal among themselves, Eso-LM(B)-like)")
  r.add_argument("--retrain", action="store_true")
  r.add_argument("--name", default="",
                 help="results go to benchmarks/results/hard_sudoku_SIZE_NAME/ (e.g. for --models)")
  r.add_argument("--out", default="")
  args = p.parse_args(argv)
  from aogpt_jax.tasks import sudoku_grade
  bad = [b for b in args.buckets.split(",") if b not in sudoku_grade.BUCKETS]
  if bad or not args.buckets.strip():
    common.fail(p, f"--buckets={args.buckets!r}: expected names among "
                f"{', '.join(sudoku_grade.BUCKETS)}")
  if args.per_bucket < 1:
    common.fail(p, f"--per_bucket={args.per_bucket}: expected an integer >= 1")
  if args.command == "puzzles":
    write_puzzles(args.out, args.per_bucket, args.buckets.split(","))
    return
  if args.steps < 0 or args.width < 1 or not 0 <= args.hard_frac <= 1:
    common.fail(p, f"--steps={args.steps} / --width={args.width} / --hard_frac="
                f"{args.hard_frac}: expected steps >= 0, width >= 1, hard_frac in [0, 1]")
  if [m for m in args.models.split(",") if m not in MODELS] or not args.models.strip():
    common.fail(p, f"--models={args.models!r}: expected names among {', '.join(MODELS)}")
  common.check_args(p, args)       # --name, --workdir, --out
  args.steps = args.steps or STEPS[args.size]
  res = run(args)
  common.write_with_markdown(f"hard_sudoku_{args.size}", args, res, markdown(res))


if __name__ == "__main__":
  main()
