"""Forward+backward step time of AO-GPT (adaLN) vs the plain GPT (`none`) at equal size.

One run measures, interleaved so machine noise hits both alike:
  adaln/gather, none/gather, adaln/mask, none/mask
and reports ms per step, tokens/s and the ratios the model issue targets
(adaLN / none <= 1.15 on the gather path; gather at least as fast as mask).

  python benchmarks/model_step.py                     # tiny preset, CPU
  python benchmarks/model_step.py --preset=small --seq_len=1024 --batch=8 --dtype=bfloat16  # GPU

Prints JSON and writes it (`benchmarks/common.py`'s schema) to --out (default
benchmarks/results/model_step_<preset>_n<seq_len>/<machine>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from aogpt_jax.model import aogpt as model  # noqa: E402
from aogpt_jax.model import orders  # noqa: E402

import common  # noqa: E402


def make_step(cfg: model.ModelConfig, batch: int, seq_len: int):
  m = model.AOGPT(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(m)

  @jax.jit
  def step(params, tokens, key):
    order = orders.sample("mixture", key, batch, seq_len, p_l2r=0.1)
    if cfg.target == "none":
      order = orders.sample("l2r", key, batch, seq_len)

    def f(p):
      return model.loss(nnx.merge(graphdef, p), tokens, order)[0]

    loss, grads = jax.value_and_grad(f)(params)
    return loss, grads

  return step, params


def time_step(step, params, tokens, iters: int) -> list[float]:
  times = []
  for i in range(iters):
    t0 = time.perf_counter()
    loss, grads = step(params, tokens, jax.random.key(i))
    jax.block_until_ready((loss, grads))
    times.append(time.perf_counter() - t0)
  return times


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--preset", default="tiny")
  ap.add_argument("--seq_len", type=int, default=256)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--attention_impl", default="auto")
  ap.add_argument("--iters", type=int, default=10)
  ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the variants")
  ap.add_argument("--paths", default="gather,mask")
  ap.add_argument("--out", default="")
  args = ap.parse_args()

  variants = [(t, p) for p in args.paths.split(",") for t in ("adaln", "none")]
  steps, compile_s = {}, {}
  tokens = jax.random.randint(jax.random.key(0), (args.batch, args.seq_len), 0, 256,
                              dtype=jnp.int32)
  for target, path in variants:
    cfg = model.preset(args.preset, target=target, attention=path, dtype=args.dtype,
                       attention_impl=args.attention_impl,
                       block_size=max(args.seq_len, model.PRESETS[args.preset].block_size))
    step, params = make_step(cfg, args.batch, args.seq_len)
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, tokens, jax.random.key(0)))
    compile_s[f"{target}/{path}"] = time.perf_counter() - t0
    steps[f"{target}/{path}"] = (step, params)

  samples = {k: [] for k in steps}
  for _ in range(args.rounds):
    for k, (step, params) in steps.items():
      samples[k] += time_step(step, params, tokens, args.iters)

  tokens_per_step = args.batch * args.seq_len
  results = {}
  for k, ts in samples.items():
    med = statistics.median(ts)
    results[k] = {"ms_per_step": 1e3 * med, "tokens_per_s": tokens_per_step / med,
                  "compile_s": compile_s[k]}
  ratios = {}
  for p in args.paths.split(","):
    ratios[f"adaln_over_none/{p}"] = (results[f"adaln/{p}"]["ms_per_step"] /
                                      results[f"none/{p}"]["ms_per_step"])
  if "mask" in args.paths and "gather" in args.paths:
    for t in ("adaln", "none"):
      ratios[f"gather_over_mask/{t}"] = (results[f"{t}/gather"]["ms_per_step"] /
                                         results[f"{t}/mask"]["ms_per_step"])
  report = {"benchmark": "model_step", "jax": jax.__version__,
            "preset": args.preset, "seq_len": args.seq_len, "batch": args.batch,
            "dtype": args.dtype, "iters_per_variant": args.iters * args.rounds,
            "results": results, "ratios": ratios}
  print(json.dumps(report, indent=2))
  common.write_result(f"model_step_{args.preset}_n{args.seq_len}", args, report,
                      out=args.out or None)


if __name__ == "__main__":
  main()
