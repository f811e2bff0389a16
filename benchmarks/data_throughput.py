"""Data throughput: preparation (tokens/s, per core) and streaming prepared data (tokens/s).

    python benchmarks/data_throughput.py                       # defaults: GPT-2 Small feeding
    python benchmarks/data_throughput.py --global_batch=512 --seq_len=1024 --worker_counts=0,4

Preparation: the first ``--prepare_mb`` MB of the Python standard library's source (real text,
mostly code), written as a text_files corpus, prepared end to end (read, tokenize, pack, write
array_record) with 1 and with ``--num_proc`` processes, for each tokenizer in ``--tokenizers``.
Streaming: ``--stream_mb`` MB of random printable bytes prepared with the byte tokenizer (records
are uint16, exactly as GPT-2's, so the reading cost per token is the same), then ``train_iterator``
global batches of ``--global_batch`` x ``--seq_len`` drawn in a single process (process_count=1),
for each worker count. Runs on any machine (CPU work only); sizes are flags. Prints JSON and
writes it (`benchmarks/common.py`'s schema) to --out (default
benchmarks/results/data_throughput/<machine>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

# Light imports only: tokenizer worker processes re-import this script (spawn).
from aogpt_jax.data import build, config, stdlib_source  # noqa: E402

import common  # noqa: E402  (no JAX at import)


def stdlib_corpus(out: pathlib.Path, mb: float) -> int:
  """Writes the first ``mb`` MB of stdlib files into one jsonl; returns its bytes."""
  total, rows = 0, []
  for _, raw in stdlib_source.read_rows("train"):
    rows.append(json.dumps({"text": raw.decode("utf-8")}))
    total += len(raw)
    if total >= mb * 2**20:
      break
  out.write_text("\n".join(rows) + "\n")
  return total


def bench_prepare(work: pathlib.Path, args) -> list[dict]:
  corpus = work / "stdlib.jsonl"
  nbytes = stdlib_corpus(corpus, args.prepare_mb)
  results = []
  for tok in args.tokenizers.split(","):
    for procs in sorted({1, args.num_proc}):
      cfg = config.resolve({}, source="text_files", glob=str(corpus), tokenizer=tok,
                           validation_fraction=0.0, cache_dir=str(work / f"prep-{tok}-{procs}"))
      t0 = time.perf_counter()
      meta = build.prepare_split(cfg, "train", block_size=args.seq_len, num_proc=procs,
                                   progress=False, log=lambda s: None)
      dt = time.perf_counter() - t0
      results.append({"tokenizer": tok, "num_proc": procs, "text_mb": round(nbytes / 2**20, 2),
                      "tokens": meta["stream_tokens"], "seconds": round(dt, 3),
                      "tokens_per_s": round(meta["stream_tokens"] / dt),
                      "tokens_per_s_per_core": round(meta["stream_tokens"] / dt / procs),
                      "mb_text_per_s": round(nbytes / 2**20 / dt, 2)})
      print(json.dumps(results[-1]), flush=True)
  return results


def bench_stream(work: pathlib.Path, args) -> list[dict]:
  from aogpt_jax.data import pipeline
  txt = work / "random"
  txt.mkdir(exist_ok=True)
  rng = np.random.default_rng(0)
  for i in range(max(1, int(args.stream_mb))):
    (txt / f"{i:04d}.txt").write_bytes(rng.integers(32, 127, 2**20, dtype=np.uint8).tobytes())
  cfg = config.resolve({}, source="text_files", glob=str(txt / "*.txt"), tokenizer="byte",
                       validation_fraction=0.0, cache_dir=str(work / "stream"),
                       read_threads=args.read_threads, prefetch=args.prefetch)
  meta = build.prepare_split(cfg, "train", block_size=args.seq_len, num_proc=1,
                               progress=False, log=lambda s: None)
  results = []
  for workers in [int(w) for w in args.worker_counts.split(",")]:
    wcfg = config.resolve(cfg, worker_count=workers)
    it = pipeline.train_iterator(wcfg, seq_len=args.seq_len, global_batch_size=args.global_batch,
                                 seed=0)
    for _ in range(args.warmup):
      next(it)
    t0 = time.perf_counter()
    checksum = 0
    for _ in range(args.batches):
      checksum += int(next(it)["tokens"][:, 0].sum())  # touch every batch
    dt = time.perf_counter() - t0
    if hasattr(it, "close"):
      it.close()
    tokens = args.batches * args.global_batch * args.seq_len
    results.append({"worker_count": workers, "read_threads": args.read_threads,
                    "prefetch": args.prefetch, "global_batch": args.global_batch,
                    "seq_len": args.seq_len, "blocks_on_disk": meta["num_blocks"],
                    "batches": args.batches, "seconds": round(dt, 3),
                    "tokens_per_s": round(tokens / dt),
                    "batches_per_s": round(args.batches / dt, 2)})
    print(json.dumps(results[-1]), flush=True)
  return results


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--tokenizers", default="gpt2,byte")
  p.add_argument("--prepare_mb", type=float, default=16.0)
  p.add_argument("--num_proc", type=int, default=os.cpu_count() or 1)
  p.add_argument("--stream_mb", type=float, default=64.0)
  p.add_argument("--seq_len", type=int, default=1024)
  p.add_argument("--global_batch", type=int, default=512)
  p.add_argument("--batches", type=int, default=100)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--worker_counts", default="0")
  p.add_argument("--read_threads", type=int, default=4)
  p.add_argument("--prefetch", type=int, default=4)
  p.add_argument("--skip_prepare", action="store_true")
  p.add_argument("--out", default="", help="default: results/data_throughput/<machine>.json")
  args = p.parse_args()
  if any(int(w) > 0 for w in args.worker_counts.split(",")):
    from absl import flags
    flags.FLAGS.mark_as_parsed()  # grain worker processes read absl flags
  with tempfile.TemporaryDirectory() as tmp:
    work = pathlib.Path(tmp)
    prep = [] if args.skip_prepare else bench_prepare(work, args)
    stream = bench_stream(work, args)
  report = {"benchmark": "data_throughput", "machine": {
      "cpu": common.cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
      "load_average_1m_at_end": common.load_avg_1m()},
      "prepare": prep, "stream": stream, "stream_target_tokens_per_s": 2_000_000}
  print(json.dumps(report, indent=1))
  common.write_result("data_throughput", args, report, out=args.out or None,
                      device_info=None)   # CPU work only: no JAX device involved


if __name__ == "__main__":
  main()
