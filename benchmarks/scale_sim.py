"""Per-device memory, collectives and compile time of the train step, the sampler and the
ensemble evaluator on simulated meshes (programs: `scale_programs.py`).

Compiles ahead of time for abstract (ShapeDtypeStruct) inputs on fake CPU devices, so no
parameter is ever allocated; each mesh runs in its own process because the fake device count
(XLA_FLAGS=--xla_force_host_platform_device_count=N) is fixed at JAX start-up.

  python benchmarks/scale_sim.py                          # Small and Medium, 5 meshes, 3 programs
  python benchmarks/scale_sim.py --sizes=small --meshes=8:data --programs=train --depth=full
  python benchmarks/scale_sim.py --sizes=qwen2.5-0.5b --meshes=1:single --seq_len=2048 \
      --per_device=8 --programs=train,sample     # a converted Qwen2.5-0.5B (configs/a2o_qwen.py)
  python benchmarks/scale_sim.py --sizes=small --meshes=8:fsdp \
      --variants='[{"attention_impl": "xla"}, {"attention_impl": "blockwise"}]'

By default every program is compiled at 1 and 2 layers and the memory and collectives are
extrapolated linearly to the model's depth (layers are unrolled, so each adds the same
parameters, saved activations and collectives); `--depth=full` compiles the real depth.
Reports XLA's memory analysis per device (arguments, outputs, temporaries), the collectives in
the compiled HLO with their result bytes, the compile time, and whether arguments + temporaries
fit an 80 GB H100 and a 16 GB TPU v5e core. Memory is XLA:CPU's estimate: the GPU/TPU compilers
schedule and fuse differently, so treat it as an estimate, not a measurement. Prints a Markdown
table and writes the rows (`benchmarks/common.py`'s schema) to ``--out`` (default
benchmarks/results/<--name, default scale_sim>/<machine>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from scale_programs import H100, PROGRAMS, V5E, compile_program  # noqa: E402
import common  # noqa: E402

# mesh name -> (data, fsdp, tensor)
MESHES = {"8:data": (8, 1, 1), "8:fsdp": (1, 8, 1), "2x4:data+tensor": (2, 1, 4),
          "64:fsdp": (1, 64, 1), "256:data+fsdp": (4, 64, 1), "1:single": (1, 1, 1)}
DEPTH = {"small": 12, "medium": 24, "qwen2.5-0.5b": 24}


def compile_step(size, data, fsdp, tensor, per_device, seq_len, overrides=None) -> dict:
  """The train step on one mesh (in this process: needs data*fsdp*tensor devices)."""
  return compile_program("train", size, data, fsdp, tensor, per_device, seq_len, overrides)


def extrapolate(r1: dict, r2: dict, layers: int) -> dict:
  """Measurements at ``layers`` from compiles at 1 and 2 layers: every byte count and every
  collective count/bytes grows linearly with the (unrolled) layers, r1 + (L - 1) * (r2 - r1)."""
  lin = lambda a, b: max(int(round(a + (layers - 1) * (b - a))), 0)
  out = dict(r2)
  for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes"):
    out[k] = lin(r1[k], r2[k])
  coll = {}
  for kind in set(r1["collectives"]) | set(r2["collectives"]):
    a = r1["collectives"].get(kind, {"count": 0, "bytes": 0})
    b = r2["collectives"].get(kind, {"count": 0, "bytes": 0})
    coll[kind] = {"count": lin(a["count"], b["count"]), "bytes": lin(a["bytes"], b["bytes"])}
  out["collectives"] = coll
  out["n_layer"] = layers
  out["compiled"] = f"L=1,2 -> {layers} (linear)"
  out["compile_s"] = r2["compile_s"]
  out["collective_sources_compiled"] = "L=2"
  out["fits_h100_80gb"], out["fits_tpu_v5e_16gb"] = (out["peak_bytes"] <= H100,
                                                     out["peak_bytes"] <= V5E)
  return out


def run_child(size, mesh, per_device, seq_len, overrides, programs, depths, extra) -> list:
  """Compiles ``programs`` x ``depths`` (n_layer values; None = the size's own) for one mesh in
  a fresh process with that many fake devices; returns the result rows."""
  data, fsdp, tensor = mesh
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      f" --xla_force_host_platform_device_count={data * fsdp * tensor}")
  env["JAX_PLATFORMS"] = "cpu"
  cmd = [sys.executable, __file__, f"--one={size}:{data}:{fsdp}:{tensor}",
         f"--per_device={per_device}", f"--seq_len={seq_len}",
         f"--overrides={json.dumps(overrides)}", f"--programs={','.join(programs)}",
         f"--depth={','.join(str(d or 0) for d in depths)}", f"--extra={json.dumps(extra)}"]
  p = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if p.returncode:
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
    return [{"program": prog, "size": size, "mesh": dict(zip(("data", "fsdp", "tensor"), mesh)),
             "overrides": overrides, "error": err} for prog in programs]
  return json.loads(p.stdout.strip().splitlines()[-1])


def child(a) -> list:
  size, *m = a.one.split(":")
  overrides, extra = json.loads(a.overrides), json.loads(a.extra)
  rows = []
  for prog in a.programs.split(","):
    for d in (int(x) for x in a.depth.split(",")):
      ov = {**overrides, "n_layer": d} if d else overrides
      r = compile_program(prog, size, *map(int, m), a.per_device, a.seq_len, ov, **extra)
      r["overrides"] = overrides
      r["compiled"] = f"L={r['n_layer']}"
      rows.append(r)
  return rows


def gib(x):
  return f"{x / 2**30:.2f}"


def table(rows) -> str:
  lines = ["| program | model | mesh (data,fsdp,tensor) | settings | compiled | args GiB | "
           "temps GiB | peak GiB | H100 80GB | v5e 16GB | compile s | collectives (count, GiB) |",
           "|" + "---|" * 12]
  for r in rows:
    m = r["mesh"]
    ms = f"{m['data']},{m['fsdp']},{m['tensor']}"
    settings = " ".join(f"{k}={v}" for k, v in sorted(r.get("overrides", {}).items())) or "-"
    head = f"| {r.get('program', 'train')} | {r['size']} | {ms} | {settings} |"
    if "error" in r:
      lines.append(f"{head} error: {r['error'][:80]} |" + " |" * 7)
      continue
    coll = ", ".join(f"{k} {v['count']}x {gib(v['bytes'])}" for k, v in
                     sorted(r["collectives"].items()))
    lines.append(f"{head} {r.get('compiled', '-')} | {gib(r['argument_bytes'])} | "
                 f"{gib(r['temp_bytes'])} | {gib(r['peak_bytes'])} | "
                 f"{'fits' if r['fits_h100_80gb'] else 'NO'} | "
                 f"{'fits' if r['fits_tpu_v5e_16gb'] else 'NO'} | {r['compile_s']} | "
                 f"{coll or 'none'} |")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--sizes", default="small,medium")
  ap.add_argument("--meshes", default=",".join(m for m in MESHES if m != "1:single"))
  ap.add_argument("--programs", default=",".join(PROGRAMS),
                  help=f"comma list of {PROGRAMS}")
  ap.add_argument("--depth", default="extrapolate",
                  help="extrapolate: compile 1 and 2 layers, extrapolate linearly to the "
                       "model's depth (minutes on 2 cores); full: the real depth (Small ~2-6 min "
                       "per program and mesh on 2 cores); or comma list of n_layer values")
  ap.add_argument("--per_device", type=int, default=16, help="published: 16 x 1024 per GPU")
  ap.add_argument("--seq_len", type=int, default=1024)
  ap.add_argument("--sample_per_device", type=int, default=4,
                  help="sampler rows per data-parallel rank (8 ranks: batch 32)")
  ap.add_argument("--sample_steps", type=int, default=256)
  ap.add_argument("--sample_top_p", type=float, default=1.0)
  ap.add_argument("--ensemble_per_device", type=int, default=16,
                  help="ensemble prefixes per data-parallel rank and call (16 x 1024 slots: the "
                       "evaluator's default slots_per_call)")
  ap.add_argument("--overrides", default='{"attention_impl": "blockwise"}',
                  help="JSON of ModelConfig fields (default: blockwise attention, the XLA "
                       "stand-in for a flash kernel, whose memory XLA:CPU cannot show)")
  ap.add_argument("--variants", default="[{}]",
                  help='JSON list of ModelConfig overrides, each merged over --overrides and '
                       'compiled for every size and mesh, e.g. \'[{"attention_impl": "xla"}, '
                       '{"attention_impl": "blockwise"}]\'')
  ap.add_argument("--one", default="", help="internal: SIZE:DATA:FSDP:TENSOR in this process")
  ap.add_argument("--extra", default="{}", help="internal")
  ap.add_argument("--out", default="", help="default: results/<name>/<machine>.json")
  ap.add_argument("--name", default="scale_sim",
                  help="the result's benchmark name (e.g. scale_sim_attention for a --variants "
                       "study), so studies of different settings keep separate files")
  a = ap.parse_args()
  if a.one:
    print(json.dumps(child(a)))
    return
  overrides = json.loads(a.overrides)
  variants = json.loads(a.variants)
  if not (isinstance(variants, list) and all(isinstance(v, dict) for v in variants)):
    sys.exit(f"--variants: expected a JSON list of objects, got {a.variants!r}")
  programs = a.programs.split(",")
  for p in programs:
    if p not in PROGRAMS:
      sys.exit(f"--programs: unknown program {p!r}; known: {list(PROGRAMS)}")
  extra = {"sample_per_device": a.sample_per_device, "sample_steps": a.sample_steps,
           "sample_top_p": a.sample_top_p, "ensemble_per_device": a.ensemble_per_device}
  rows = []
  for size in a.sizes.split(","):
    for name in a.meshes.split(","):
      if name not in MESHES:
        sys.exit(f"--meshes: unknown mesh {name!r}; known: {list(MESHES)}")
      for variant in variants:
        ov = {**overrides, **variant}
        if a.depth == "extrapolate":
          got = run_child(size, MESHES[name], a.per_device, a.seq_len, ov, programs, [1, 2],
                          extra)
          done = [g if "error" in g else extrapolate(g, h, DEPTH.get(size, g["n_layer"]))
                  for g, h in zip(got[::2], got[1::2])] if len(got) == 2 * len(programs) else got
        else:
          depths = [None] if a.depth == "full" else [int(x) for x in a.depth.split(",")]
          done = run_child(size, MESHES[name], a.per_device, a.seq_len, ov, programs, depths,
                           extra)
        for r in done:
          print(json.dumps(r), flush=True)
        rows += done
  print(table(rows))
  import jax  # pylint: disable=import-outside-toplevel
  common.write_result(
      a.name, a, {"rows": rows, "note": "XLA:CPU memory analysis, fake devices"},
      out=a.out or None,
      device_info={"backend": "cpu", "kind": "fake XLA:CPU devices (one process per mesh)",
                   "count": None, "jax": jax.__version__})


if __name__ == "__main__":
  main()
