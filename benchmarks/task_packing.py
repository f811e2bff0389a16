"""Task training throughput by batch and packing: puzzles per second of the trainer's own step
(`benchmarks/train_step.py` on the task's rows and prompt masks) for each ``--batches`` x
``--packs`` setting, each in its own process, one table.

    python benchmarks/task_packing.py                                     # 9x9 Sudoku, 8 x 256: a GPU
    python benchmarks/task_packing.py --config=configs/sudoku.py:tiny --batches=64 --packs=1,4,16

``model.pack = K`` runs K puzzles as one attention row with a block-diagonal mask
(model/packing.py): the same losses and gradients, fewer and longer rows. The puzzles per
second of a larger batch are the other lever, shown beside it. Every setting's JSON goes to
WORKDIR; the table and the settings to benchmarks/results/task_packing[_NAME]/<machine>.{json,md}
(or ``--out``). ``--deadline`` (seconds) stops before a setting that would start after it.
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


def _ints(ap, key: str, text: str) -> list[int]:
  try:
    vals = [int(v) for v in text.split(",") if v.strip()]
  except ValueError:
    vals = []
  if not vals or min(vals) < 1:
    common.fail(ap, f"--{key}={text!r}: expected comma-separated integers >= 1")
  return vals


def markdown(res: dict) -> str:
  ref = min((r for r in res["rows"] if r["pack"] == 1 and "rows_per_s" in r),
            key=lambda r: r["batch"], default=None)
  lines = [f"`{res['config']}`" + (f" {' '.join(res['set'])}" if res["set"] else "")
           + f", {res['steps']} timed steps each", "",
           "| batch | pack | step ms | puzzles / s | vs the smallest unpacked batch |",
           "|---|---|---|---|---|"]
  for r in res["rows"]:
    if "rows_per_s" not in r:
      lines.append(f"| {r['batch']} | {r['pack']} | - | - | {r['error']} |")
      continue
    ratio = f"{r['rows_per_s'] / ref['rows_per_s']:.2f}x" if ref else "-"
    lines.append(f"| {r['batch']} | {r['pack']} | {1000 * r['step_s']:.1f} | "
                 f"{r['rows_per_s']:,.0f} | {ratio} |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--config", default="configs/sudoku.py", help="a task config (file.py[:arg])")
  ap.add_argument("--batches", default="256,1024")
  ap.add_argument("--packs", default="1,4")
  ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                  help="a --config.KEY=VALUE override for every setting (repeat)")
  ap.add_argument("--steps", type=int, default=10, help="timed steps per setting")
  ap.add_argument("--deadline", type=float, default=0, help="seconds (0: none)")
  ap.add_argument("--workdir", default="/tmp/aogpt_task_packing")
  ap.add_argument("--name", default="")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  common.check_args(ap, args, positive=("steps",), nonnegative=("deadline",))
  batches, packs = _ints(ap, "batches", args.batches), _ints(ap, "packs", args.packs)
  bad = [kv for kv in args.set if "=" not in kv]
  if bad:
    common.fail(ap, f"--set={bad[0]!r}: expected KEY=VALUE (a --config.KEY override)")
  for b in batches:
    if any(b % k for k in packs):
      common.fail(ap, f"--batches={b}: every pack in --packs={args.packs} must divide it")
  wd = pathlib.Path(args.workdir)
  wd.mkdir(parents=True, exist_ok=True)
  t0, rows = time.monotonic(), []
  for b in batches:
    for k in packs:
      row = {"batch": b, "pack": k}
      rows.append(row)
      if args.deadline and time.monotonic() - t0 > args.deadline:
        row["error"] = "not run: past the deadline"
        continue
      out = wd / f"b{b}_k{k}.json"
      cmd = [sys.executable, str(ROOT / "benchmarks" / "train_step.py"),
             f"--config={ROOT / args.config}" if not pathlib.Path(args.config).is_absolute()
             else f"--config={args.config}",
             f"--config.batch_size={b}", f"--config.model.pack={k}",
             *[f"--config.{kv}" for kv in args.set], f"--steps={args.steps}", "--warmup=2",
             f"--out={out}"]
      left = args.deadline - (time.monotonic() - t0) if args.deadline else None
      try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
      except subprocess.TimeoutExpired:
        row["error"] = "stopped at the deadline"
        continue
      if proc.returncode:
        row["error"] = (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]
        print(f"batch {b}, pack {k}: {row['error']}", flush=True)
        continue
      r = json.loads(out.read_text())["results"]
      row.update(step_s=r["step_s_median"], rows_per_s=r["rows_per_s"],
                 tokens_per_s=r["tokens_per_s"], compile_s=r["compile_s"],
                 peak_bytes=(r.get("xla_memory") or {}).get("peak_bytes"))
      print(f"batch {b}, pack {k}: {1000 * row['step_s']:.1f} ms a step, "
            f"{row['rows_per_s']:,.0f} puzzles/s", flush=True)
  res = {"config": args.config, "set": args.set, "steps": args.steps, "rows": rows}
  common.write_with_markdown("task_packing", args, res, markdown(res))


if __name__ == "__main__":
  main()
