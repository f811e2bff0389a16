"""Cost of the context-order ensemble estimator versus the naive reference.

The naive reference is the published algorithm: one full-length forward per (block, rank i,
ordering j) keeping logit row i (here batched, on the causal gather path, the faster of the two
paths). The fast estimator runs only the i + 1 prefix slots and the head of the last one
(aogpt_jax/evaluation/ensembles.py). Both compute the same (block, i, j) entries; the script
checks they agree and reports wall time (compilation excluded, reported apart), analytic model
FLOPs for the executed shapes, and XLA's own FLOP count of the compiled programs.

    python benchmarks/eval_cost.py                       # CPU: tiny model, n = 256, M = 8
    python benchmarks/eval_cost.py --preset=small --n=1024 --blocks=1 --rank_stride=16   # GPU

Prints JSON and writes it (`benchmarks/common.py`'s schema) to --out (default
benchmarks/results/eval_cost/<machine>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from aogpt_jax.model import aogpt as model_lib  # noqa: E402
from aogpt_jax.evaluation import ensembles as ens  # noqa: E402
from aogpt_jax.evaluation import perplexity as ppl  # noqa: E402


def slot_flops(cfg: model_lib.ModelConfig, keys: int) -> float:
  """Forward FLOPs of one slot through the block stack attending to ``keys`` keys."""
  d, h = cfg.n_embd, cfg.mlp_ratio * cfg.n_embd
  per_layer = 2 * (3 * d * d + d * d + 2 * d * h) + 4 * d * keys
  if cfg.target == "adaln":
    per_layer += 2 * cfg.target_dim * 6 * d
  return cfg.n_layer * per_layer


def head_flops(cfg: model_lib.ModelConfig) -> float:
  extra = 2 * cfg.target_dim * 2 * cfg.n_embd if cfg.target == "adaln" else 0
  return 2 * cfg.n_embd * cfg.vocab_size + extra


def fast_flops(cfg, n, ranks, max_m, blocks, layout, num_buckets) -> float:
  total = 0.0
  for g in ens.pack_prefixes(ranks, n, layout, num_buckets):
    rows = len(g.ranks) * (max_m - 1) * blocks
    total += rows * (g.row_len * slot_flops(cfg, g.row_len) + g.ranks.shape[1] * head_flops(cfg))
  return total


def naive_flops(cfg, n, ranks, max_m, blocks) -> float:
  return len(ranks) * (max_m - 1) * blocks * n * (slot_flops(cfg, n) + head_flops(cfg))


def xla_flops(fn, *args, **kw) -> float:
  try:
    cost = fn.lower(*args, **kw).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", float("nan")))
  except Exception:  # pylint: disable=broad-except
    return float("nan")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--preset", default="tiny")
  ap.add_argument("--n", type=int, default=256)
  ap.add_argument("--max_m", type=int, default=8)
  ap.add_argument("--blocks", type=int, default=1, help="sequences scored")
  ap.add_argument("--rank_stride", type=int, default=1, help="score ranks 0, s, 2s, ...")
  ap.add_argument("--layout", default="buckets", choices=ens.LAYOUTS)
  ap.add_argument("--num_buckets", type=int, default=16)
  ap.add_argument("--slots_per_call", type=int, default=0,
                  help="0: the evaluator's default for the backend")
  ap.add_argument("--naive_items_per_call", type=int, default=32)
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--repeats", type=int, default=3,
                  help="timed runs of each (interleaved); the minimum is reported")
  ap.add_argument("--out", default="")
  a = ap.parse_args()

  cfg = model_lib.preset(a.preset, block_size=max(a.n, model_lib.PRESETS[a.preset].block_size),
                         dtype=a.dtype)
  m = model_lib.AOGPT(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.valid_vocab_size, (a.blocks, a.n)).astype(np.int32)
  ids = ppl.block_ids({"tokens": tokens})
  ranks = list(range(0, a.n, a.rank_stride))
  per_token, sigma = ppl.token_nll(m, tokens, ids, seed=0)
  base, sigma = -np.asarray(per_token), np.asarray(sigma)
  fast_kw = dict(max_m=a.max_m, ranks=ranks, layout=a.layout, num_buckets=a.num_buckets,
                 slots_per_call=a.slots_per_call)

  t0 = time.perf_counter()
  ens.ensemble_logp(m, tokens, ids, sigma, base, **fast_kw)          # compiles every shape
  fast_first = time.perf_counter() - t0
  t0 = time.perf_counter()
  ens.naive_logp(m, tokens[:1], ids[:1], sigma[:1], max_m=1, ranks=ranks[:1], path="gather",
                 items_per_call=a.naive_items_per_call)              # compiles the one shape
  naive_compile = time.perf_counter() - t0
  fast_times, naive_times, fast_cpu, naive_cpu = [], [], [], []
  for _ in range(a.repeats):             # interleaved, so both see the same machine load
    t0, c0 = time.perf_counter(), time.process_time()
    fast = ens.ensemble_logp(m, tokens, ids, sigma, base, **fast_kw)
    fast_times.append(time.perf_counter() - t0)
    fast_cpu.append(time.process_time() - c0)
    t0, c0 = time.perf_counter(), time.process_time()
    naive = ens.naive_logp(m, tokens, ids, sigma, max_m=a.max_m, ranks=ranks,
                           js=range(1, a.max_m), path="gather",
                           items_per_call=a.naive_items_per_call)
    naive_times.append(time.perf_counter() - t0)
    naive_cpu.append(time.process_time() - c0)
  fast_s, naive_s = min(fast_times), min(naive_times)

  sel = np.zeros(a.n, bool)
  sel[ranks] = True
  naive[:, :, 0] = base
  diff = float(np.max(np.abs(fast[:, sel, 1:] - naive[:, sel, 1:])))
  ms = ens.m_values(a.max_m)
  nll_fast = ens.ensemble_nll(fast[:, sel], ms).mean(axis=(1, 2))
  nll_naive = ens.ensemble_nll(naive[:, sel], ms).mean(axis=(1, 2))

  graphdef, params = nnx.split(m)
  g0 = ens.pack_prefixes(ranks, a.n, a.layout, a.num_buckets)
  xla_fast = 0.0
  for g in g0:
    items = len(g.ranks) * (a.max_m - 1) * a.blocks
    per_call = min(max(1, (a.slots_per_call or ens.default_slots_per_call()) // g.row_len), items)
    calls = -(-items // per_call)
    z = jnp.zeros((per_call,), jnp.int32)
    xla_fast += calls * xla_flops(ens.packed_logp_any, graphdef, params, jnp.asarray(tokens),
                                  jnp.asarray(sigma), jnp.asarray(ids), jnp.uint32(0), z, z,
                                  jnp.asarray(g.ranks[:1].repeat(per_call, 0)),
                                  row_len=g.row_len, masked=g.masked)
  z = jnp.zeros((a.naive_items_per_call,), jnp.int32)
  naive_calls = -(-len(ranks) * (a.max_m - 1) * a.blocks // a.naive_items_per_call)
  xla_naive = naive_calls * xla_flops(ens.naive_logp_program, graphdef, params,
                                      jnp.asarray(tokens),
                                      jnp.asarray(sigma), jnp.asarray(ids), jnp.uint32(0), z, z,
                                      z, path="gather")

  f_fast = fast_flops(cfg, a.n, ranks, a.max_m, a.blocks, a.layout, a.num_buckets)
  f_naive = naive_flops(cfg, a.n, ranks, a.max_m, a.blocks)
  res = {
      "benchmark": "eval_cost", "preset": a.preset, "n": a.n, "max_m": a.max_m,
      "blocks": a.blocks, "ranks_scored": len(ranks), "rank_stride": a.rank_stride,
      "layout": a.layout, "dtype": a.dtype,
      "fast": {"wall_s": fast_s, "wall_s_runs": fast_times, "cpu_s": min(fast_cpu),
               "first_call_s_incl_compile": fast_first,
               "model_flops": f_fast, "xla_flops": xla_fast},
      "naive": {"wall_s": naive_s, "wall_s_runs": naive_times, "cpu_s": min(naive_cpu),
                "compile_s": naive_compile,
                "model_flops": f_naive,
                "xla_flops": xla_naive,
                "note": "both: orderings j = 1..M-1 only (j = 0 is the shared base forward)"},
      "speedup_wall": naive_s / fast_s, "speedup_cpu_time": min(naive_cpu) / min(fast_cpu),
      "speedup_wall_median_of_paired_runs": float(np.median(np.array(naive_times) /
                                                            np.array(fast_times))), "speedup_model_flops": f_naive / f_fast,
      "speedup_xla_flops": xla_naive / xla_fast if xla_fast else float("nan"),
      "max_abs_logp_diff": diff,
      "mean_nll_by_m": {str(k): [float(x), float(y)] for k, x, y in zip(ms, nll_fast, nll_naive)},
  }
  print(json.dumps(res, indent=2))
  common.write_result("eval_cost", a, res, out=a.out or None)


if __name__ == "__main__":
  main()
