"""Step time and XLA's temporaries of the loss gradient under each rematerialisation policy
(``model.remat`` / ``model.remat_policy``) on this machine.

  python benchmarks/remat_cost.py                        # the tiny preset, 16 x 256, fp32, CPU
  python benchmarks/remat_cost.py --preset=small --batch=8 --seq_len=1024 --dtype=bfloat16

Compiles ``jit(value_and_grad(loss))`` once per setting (no remat, then each policy of
`blocks.REMAT_POLICIES`), reads XLA's memory analysis (temporaries) and times the compiled
programs interleaved, best of ``--repeats``; the result (`benchmarks/common.py` schema) goes to
benchmarks/results/remat_cost/<machine>.json. Remat trades recomputation for memory: the ratio
column is the step time over the no-remat one.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--preset", default="tiny")
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--seq_len", type=int, default=256)
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--overrides", default="{}", help="JSON of ModelConfig fields")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--out", default="", help="default: results/remat_cost/<machine>.json")
  a = ap.parse_args()

  import jax
  import jax.numpy as jnp
  from flax import nnx

  from aogpt_jax.model import aogpt as model_lib
  from aogpt_jax.model import blocks, objectives, orders

  try:
    overrides = json.loads(a.overrides)
  except json.JSONDecodeError as e:
    sys.exit(f"--overrides: expected a JSON object of ModelConfig fields ({e})")
  settings = {"none": {"remat": False}}
  settings.update({p: {"remat": True, "remat_policy": p} for p in blocks.REMAT_POLICIES})
  k1, k2 = jax.random.split(jax.random.key(0))
  base = model_lib.preset(a.preset, dtype=a.dtype, **overrides)
  tokens = jax.random.randint(k1, (a.batch, a.seq_len), 0, base.valid_vocab_size, jnp.int32)
  order = orders.sample("mixture", k2, a.batch, a.seq_len, p_l2r=0.1)
  fns, results = {}, {}
  for name, kw in settings.items():
    mc = base.replace(**kw)
    gd, params = nnx.split(model_lib.AOGPT(mc, rngs=nnx.Rngs(0)), nnx.Param)
    params = nnx.to_pure_dict(params)
    f = jax.jit(lambda p, t, o, gd=gd: jax.value_and_grad(objectives.merged_loss, has_aux=True)(
        p, gd, t, o, None, None, "ao"))
    compiled = f.lower(params, tokens, order).compile()
    results[name] = {"temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes)}
    fns[name] = lambda c=compiled, p=params: c(p, tokens, order)
    fns[name]()   # warm up
  best = common.best_of(fns, a.repeats, sync=jax.block_until_ready)
  for name, s in best.items():
    results[name].update(step_s=round(s, 4), vs_no_remat=round(s / best["none"], 3))
  print("| remat_policy | step s | vs no remat | temporaries MiB |\n|---|---|---|---|")
  for name, r in results.items():
    print(f"| {name} | {r['step_s']} | {r['vs_no_remat']}x | {r['temp_bytes'] / 2**20:.1f} |")
  common.write_result("remat_cost", a, {"settings": results}, out=a.out or None)


if __name__ == "__main__":
  main()
