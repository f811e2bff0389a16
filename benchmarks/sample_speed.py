"""Sampling speed versus number of steps (the paper's Figure 5 axes): wall time and tokens/s.

Compares, at the same size (one preset), batch and length, in one run:
(a) ``diffusion``: the AO-GPT KV-cached masked-diffusion sampler;
(b) ``ar``: left-to-right AR decoding of the same AO-GPT with a KV cache (independent of T);
(c) ``encoder``: the real encoder-only MDM baseline (`aogpt_jax.model.encoder`: the same blocks with
    bidirectional attention and [MASK] tokens, no target conditioning), sampled by the standard
    reverse process, one full forward over the whole sequence per step (`sampling.encoder`);
(d) ``uncached`` (optional, ``--methods=...,uncached``): the AO-GPT with a full uncached forward
    per step (the test oracle of (a); an AO-GPT with an encoder's cost profile).
All share the plan (order, schedule, counts) and the token draw (timing: `sampling.timing`,
also used by colabs/sampling.ipynb). Compile time is measured apart
(ahead-of-time ``lower().compile()``); run time is the best of ``--repeats`` timed runs after
one warm-up, the runs of all configurations interleaved round by round (fair on a shared
machine). Random weights (speed does not depend on them). Runs on CPU or GPU (sizes by flag).

    python benchmarks/sample_speed.py                                # tiny, batch 8, n=256, CPU
    python benchmarks/sample_speed.py --preset=small --batch=32 --length=1024 \
        --steps=64,128,256,512,1024 --dtype=bfloat16                 # on a GPU

Prints JSON and writes it (`benchmarks/common.py`'s schema) to --out (default
benchmarks/results/sample_speed_<preset>/<machine>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flax import nnx  # noqa: E402

from aogpt_jax.model import encoder as mdm  # noqa: E402
from aogpt_jax.model import aogpt as model_lib  # noqa: E402
from aogpt_jax.sampling import sampler  # noqa: E402
from aogpt_jax.sampling import timing  # noqa: E402

import common  # noqa: E402


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--preset", default="tiny", choices=sorted(model_lib.PRESETS))
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--length", type=int, default=256)
  ap.add_argument("--steps", default="16,32,64,128,256")
  ap.add_argument("--methods", default="diffusion,ar,encoder",
                  help="comma list of diffusion, ar, encoder, uncached")
  ap.add_argument("--encoder_max_steps", type=int, default=1 << 30,
                  help="skip encoder/uncached above this many steps (they cost T full passes)")
  ap.add_argument("--count_mode", default="deterministic")
  ap.add_argument("--schedule", default="linear")
  ap.add_argument("--order", default="random")
  ap.add_argument("--dtype", default="float32", help="model compute dtype (bfloat16 on GPU)")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)

  cfg = model_lib.preset(args.preset, dtype=args.dtype)
  if args.length > cfg.block_size:
    ap.error(f"--length {args.length} exceeds the preset's block_size {cfg.block_size}")
  m = model_lib.AOGPT(cfg, rngs=nnx.Rngs(0))
  methods = args.methods.split(",")
  unknown = sorted(set(methods) - set(sampler.METHODS))
  if unknown:
    ap.error(f"--methods: unknown {unknown}; known: {sampler.METHODS}")
  enc = mdm.make_encoder(cfg, rngs=nnx.Rngs(0)) if "encoder" in methods else None
  rows = timing.compare(
      m, enc, length=args.length, batch=args.batch,
      steps=[int(x) for x in args.steps.split(",")], methods=methods, repeats=args.repeats,
      full_forward_max_steps=args.encoder_max_steps, seed=args.seed,
      count_mode=args.count_mode, schedule=args.schedule, order=args.order,
      log=lambda row: print(json.dumps(row), flush=True))
  params = {"aogpt": model_lib.count_params(m)}
  if enc is not None:
    params["encoder"] = model_lib.count_params(enc)
  result = {"benchmark": "sample_speed", "preset": args.preset,
            "params": params,
            "batch": args.batch, "length": args.length, "dtype": args.dtype,
            "count_mode": args.count_mode, "schedule": args.schedule, "order": args.order,
            "repeats": args.repeats, "rows": rows}
  print(json.dumps(result))
  common.write_result(f"sample_speed_{args.preset}", args, result, out=args.out or None)
  return result


if __name__ == "__main__":
  main()
