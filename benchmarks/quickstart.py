"""Runs the CPU quickstart end to end and compares its held-out loss with the unigram entropy.

    python benchmarks/quickstart.py [--out=PATH] [--keep=DIR] [-- --config.x=y]

Trains ``configs/quickstart.py`` from scratch in a fresh temporary workdir through the real
command line (``python -m aogpt_jax.main``), measures the wall time of the whole command
(start-up, data preparation, compilation, training, evaluation, checkpoints), reads the last
held-out evaluation from metrics.jsonl, and computes, in nats per token:

* the unigram entropy of the training stream,
* the unigram cross-entropy of the evaluated held-out blocks under the training unigram
  distribution (what the best context-free model scores on exactly those blocks),

then prints one JSON object and writes it (`benchmarks/common.py`'s schema) to ``--out``
(default benchmarks/results/quickstart/<machine>.json). Any argument after ``--`` is passed on
to the training command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from aogpt_jax import data as data_lib  # noqa: E402
from ml_collections import config_dict  # noqa: E402

import common  # noqa: E402


def unigram(cfg) -> dict[str, float]:
  train = data_lib.token_stream(cfg.data, "train")
  counts = np.bincount(train, minlength=cfg.model.vocab_size).astype(np.float64)
  p = counts / counts.sum()
  nz = p[p > 0]
  blocks = np.concatenate([b["tokens"][b["weight"] > 0] for b in data_lib.eval_batches(
      cfg.data, split=cfg.eval.split, seq_len=cfg.seq_len,
      global_batch_size=cfg.eval.batch_size or cfg.batch_size,
      max_blocks=cfg.eval.train_max_blocks)])
  held = blocks.reshape(-1)
  with np.errstate(divide="ignore"):
    cross = float(-np.mean(np.log(p[held])))
  return {"train_unigram_entropy": float(-(nz * np.log(nz)).sum()),
          "heldout_unigram_cross_entropy": cross, "heldout_tokens_scored": int(held.size)}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="", help="default: results/quickstart/<machine>.json")
  ap.add_argument("--keep", default="", help="train in this new folder and keep it (to sample "
                  "from the measured run); default: a temporary folder, removed")
  ap.add_argument("overrides", nargs="*", help="--config.x=y passed to the training command")
  args = ap.parse_args()
  if args.keep and os.path.exists(args.keep):
    sys.exit(f"--keep={args.keep}: exists; the measured run must start from scratch")

  with (contextlib.nullcontext(args.keep) if args.keep else
        tempfile.TemporaryDirectory(prefix="aogpt_quickstart_")) as workdir:
    cmd = [sys.executable, "-m", "aogpt_jax.main", "--config=configs/quickstart.py",
           f"--workdir={workdir}", *args.overrides]
    load_before = os.getloadavg()
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
      sys.exit(proc.stdout[-3000:] + proc.stderr[-3000:])
    lines = [json.loads(x) for x in
             (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    # The run's own resolved config (overrides included) says what was scored.
    cfg = config_dict.ConfigDict(json.loads((pathlib.Path(workdir) / "config.json").read_text()))
  args.keep = "<kept folder>" if args.keep else ""   # the JSON names no local path
  evals = [x for x in lines if "eval/loss_l2r" in x]
  train = [x for x in lines if "train/tokens_per_sec" in x]
  result = {
      "command": " ".join(["python -m aogpt_jax.main --config=configs/quickstart.py",
                           "--workdir=<fresh>", *args.overrides]),
      "wall_s": round(wall, 1),
      "final_step": evals[-1]["step"],
      "heldout_loss_l2r": evals[-1]["eval/loss_l2r"],
      "heldout_loss_any_order": evals[-1]["eval/loss_random"],
      "heldout_evals": [{k: x[k] for k in ("step", "eval/loss_l2r", "eval/loss_random")}
                        for x in evals],
      "median_train_tokens_per_s": float(np.median([x["train/tokens_per_sec"] for x in train])),
      **unigram(cfg),
      "machine": {"cpu": common.cpu_model(), "cores": os.cpu_count(),
                  "loadavg_before": [round(x, 2) for x in load_before],
                  "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
      "units": "nats per token",
  }
  print(json.dumps(result, indent=2))
  common.write_result("quickstart", args, result, out=args.out or None)


if __name__ == "__main__":
  main()
