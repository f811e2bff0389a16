"""Per-device memory, collectives and compile time of the real train step on simulated meshes.

Compiles `train.build(...).step` ahead of time for abstract (ShapeDtypeStruct) state on fake CPU
devices, so no parameter is ever allocated; each mesh runs in its own process because the fake
device count (XLA_FLAGS=--xla_force_host_platform_device_count=N) is fixed at JAX start-up.

  python benchmarks/scale_sim.py                          # Small and Medium, all meshes
  python benchmarks/scale_sim.py --sizes=small --meshes=8:data
  python benchmarks/scale_sim.py --sizes=small --meshes=8:fsdp \
      --variants='[{"attention_impl": "xla"}, {"attention_impl": "blockwise"}]'
  python benchmarks/scale_sim.py --one=small:8:1:1 --json  # one mesh (data:fsdp:tensor), child

Reports XLA's memory analysis per device (arguments, outputs, temporaries), the collectives in
the compiled HLO with their result bytes, the compile time, and whether arguments + temporaries
fit an 80 GB H100 and a 16 GB TPU v5e core. Memory is XLA:CPU's estimate: the GPU/TPU compilers
schedule and fuse differently, so treat it as an estimate, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

# mesh name -> (data, fsdp, tensor)
MESHES = {"8:data": (8, 1, 1), "8:fsdp": (1, 8, 1), "2x4:data+tensor": (2, 1, 4),
          "64:fsdp": (1, 64, 1), "256:data+fsdp": (4, 64, 1)}
H100, V5E = 80e9, 16e9
_COLL = re.compile(r"\s(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                   r"(?:-start)?\(")
_ARR = re.compile(r"(bf16|f32|f16|s32|u32|pred|s8|u8|f64|s64)\[([0-9,]*)\]")
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1,
          "f64": 8, "s64": 8}


def collectives(hlo: str) -> dict[str, dict[str, int]]:
  """{kind: {"count": c, "bytes": result bytes summed}} over the compiled HLO text."""
  out: dict[str, dict[str, int]] = {}
  for line in hlo.splitlines():
    m = _COLL.search(line)
    if not m or " = " not in line:
      continue
    # The result type sits between the first " = " and the opcode (tuples may hold comments).
    rtype = line[line.index(" = ") + 3:m.start()]
    nbytes = 0
    for dt, dims in _ARR.findall(rtype):
      size = 1
      for d in filter(None, dims.split(",")):
        size *= int(d)
      nbytes += size * _BYTES[dt]
    e = out.setdefault(m.group(1), {"count": 0, "bytes": 0})
    e["count"] += 1
    e["bytes"] += nbytes
  return out


def compile_step(size: str, data: int, fsdp: int, tensor: int, per_device: int, seq_len: int,
                 overrides: dict | None = None) -> dict:
  """Lowers and compiles the train step for one mesh; returns the measurements."""
  import jax
  import jax.numpy as jnp

  from aogpt_jax import model as model_lib
  from aogpt_jax import recipes
  from aogpt_jax import sharding as sharding_lib
  from aogpt_jax import train as train_lib

  n_dev = data * fsdp * tensor
  cfg = recipes.paper(size) if size in ("small", "medium") else recipes.paper("small")
  dp = data * fsdp
  recipes.apply(cfg, {"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor,
                      "batch_size": per_device * dp, "microbatches": 1, "seq_len": seq_len})
  mc = (model_lib.preset(size) if size != "tiny" else model_lib.preset("tiny"))
  mc = mc.replace(dtype="bfloat16", block_size=max(seq_len, mc.block_size),
                  **(overrides or {}))
  mesh = sharding_lib.make_mesh(cfg, jax.devices()[:n_dev])
  t0 = time.perf_counter()
  trainer = train_lib.build(cfg, mc, mesh)
  batch = {"tokens": jax.ShapeDtypeStruct((cfg.batch_size, seq_len), jnp.int32,
                                          sharding=sharding_lib.batch_sharding(mesh))}
  lowered = trainer.step.lower(trainer.abstract_state, batch)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  mem = compiled.memory_analysis()
  args, outs, temps = (int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes),
                       int(mem.temp_size_in_bytes))
  alias = int(getattr(mem, "alias_size_in_bytes", 0))
  # The state is donated: outputs alias arguments, so the peak is about args + temps.
  peak = args + temps + max(outs - alias, 0)
  return {"size": size, "mesh": {"data": data, "fsdp": fsdp, "tensor": tensor},
          "devices": n_dev, "per_device_batch": per_device, "seq_len": seq_len,
          "overrides": overrides or {},
          "argument_bytes": args, "output_bytes": outs, "alias_bytes": alias,
          "temp_bytes": temps, "peak_bytes": peak,
          "fits_h100_80gb": peak <= H100, "fits_tpu_v5e_16gb": peak <= V5E,
          "lower_s": round(t1 - t0, 2), "compile_s": round(t2 - t1, 2),
          "collectives": collectives(compiled.as_text())}


def run_child(size, mesh, per_device, seq_len, overrides) -> dict:
  data, fsdp, tensor = mesh
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      f" --xla_force_host_platform_device_count={data * fsdp * tensor}")
  env["JAX_PLATFORMS"] = "cpu"
  cmd = [sys.executable, __file__, f"--one={size}:{data}:{fsdp}:{tensor}",
         f"--per_device={per_device}", f"--seq_len={seq_len}",
         f"--overrides={json.dumps(overrides)}"]
  p = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if p.returncode:
    return {"size": size, "mesh": dict(zip(("data", "fsdp", "tensor"), mesh)),
            "error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"}
  return json.loads(p.stdout.strip().splitlines()[-1])


def gib(x):
  return f"{x / 2**30:.2f}"


def table(rows) -> str:
  lines = ["| model | mesh (data,fsdp,tensor) | settings | args GiB | temps GiB | peak GiB | "
           "H100 80GB | v5e 16GB | compile s | collectives (count, GiB) |", "|" + "---|" * 10]
  for r in rows:
    m = r["mesh"]
    ms = f"{m['data']},{m['fsdp']},{m['tensor']}"
    settings = " ".join(f"{k}={v}" for k, v in sorted(r.get("overrides", {}).items())) or "-"
    if "error" in r:
      lines.append(f"| {r['size']} | {ms} | {settings} | error: {r['error'][:80]} |" + " |" * 6)
      continue
    coll = ", ".join(f"{k} {v['count']}x {gib(v['bytes'])}" for k, v in
                     sorted(r["collectives"].items()))
    lines.append(f"| {r['size']} | {ms} | {settings} | {gib(r['argument_bytes'])} | {gib(r['temp_bytes'])} | "
                 f"{gib(r['peak_bytes'])} | {'fits' if r['fits_h100_80gb'] else 'NO'} | "
                 f"{'fits' if r['fits_tpu_v5e_16gb'] else 'NO'} | {r['compile_s']} | "
                 f"{coll or 'none'} |")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--sizes", default="small,medium")
  ap.add_argument("--meshes", default=",".join(MESHES))
  ap.add_argument("--per_device", type=int, default=16, help="published: 16 x 1024 per GPU")
  ap.add_argument("--seq_len", type=int, default=1024)
  ap.add_argument("--overrides", default="{}", help="JSON of ModelConfig fields")
  ap.add_argument("--variants", default="[{}]",
                  help='JSON list of ModelConfig overrides, each merged over --overrides and '
                       'compiled for every size and mesh, e.g. \'[{"attention_impl": "xla"}, '
                       '{"attention_impl": "blockwise"}]\'')
  ap.add_argument("--one", default="", help="internal: SIZE:DATA:FSDP:TENSOR in this process")
  ap.add_argument("--out", default="")
  a = ap.parse_args()
  overrides = json.loads(a.overrides)
  if a.one:
    size, *m = a.one.split(":")
    print(json.dumps(compile_step(size, *map(int, m), a.per_device, a.seq_len, overrides)))
    return
  variants = json.loads(a.variants)
  if not (isinstance(variants, list) and all(isinstance(v, dict) for v in variants)):
    sys.exit(f"--variants: expected a JSON list of objects, got {a.variants!r}")
  rows = []
  for size in a.sizes.split(","):
    for name in a.meshes.split(","):
      if name not in MESHES:
        sys.exit(f"--meshes: unknown mesh {name!r}; known: {list(MESHES)}")
      for variant in variants:
        r = run_child(size, MESHES[name], a.per_device, a.seq_len, {**overrides, **variant})
        print(json.dumps(r), flush=True)
        rows.append(r)
  print(table(rows))
  out = pathlib.Path(a.out or f"benchmarks/results/scale_sim_{a.sizes.replace(',', '_')}.json")
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({"rows": rows, "note": "XLA:CPU memory analysis, fake devices"},
                            indent=1))


if __name__ == "__main__":
  main()
