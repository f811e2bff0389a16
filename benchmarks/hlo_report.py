"""What XLA makes of the train step, lever by lever, without running it: a CPU-side report that
shows the direction of a speed change between GPU runs.

  python benchmarks/hlo_report.py                              # AO-GPT Small and GPT-2 Small
  python benchmarks/hlo_report.py --configs=configs/quickstart.py --batch=4 --seq_len=128

For each config and each lever setting (``--levers``: a name and ``--config.*`` overrides, the
first being the recipe as it is), the trainer's own jitted step (`train.step.build`: optimizer,
EMA, accumulation, donation) is lowered for abstract inputs (nothing is initialised or run) and
compiled for this machine's backend, and the report reads from the compiled program: XLA's cost
analysis (FLOPs, bytes accessed), the memory analysis (temporaries, peak), and the optimized
HLO's size (instructions, fusions, custom calls, the ENTRY computation's top-level ops: roughly
the kernels a step launches). On CPU the fusion decisions are XLA:CPU's, not a GPU's: compare
levers with each other in one report, and take GPU times from ``benchmarks/train_step.py``.

Writes the `benchmarks/common.py` schema to benchmarks/results/hlo_report/<machine>.json
(``--out``), and a table (.md) beside it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # noqa: E402

# name -> --config.* overrides (the first: the recipe unchanged).
LEVERS = {
    "recipe": {},
    "no_remat": {"model.remat": False},
    "remat_dots": {"model.remat": True, "model.remat_policy": "dots"},
    "no_loss_chunk": {"model.loss_chunk": 0},
    "one_microbatch": {"microbatches": 1},
}
CONFIGS = ("configs/aogpt_small.py", "configs/gpt2_small.py")

_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*[^=]*?\s([\w\-]+)\(", re.M)


def hlo_counts(text: str) -> dict[str, int]:
  """Counts over an optimized HLO module's text: every instruction, the fusions and custom calls
  among them, and the ENTRY computation's own instructions (excluding parameters, constants,
  tuples and their elements: what runs as a kernel or a call, roughly)."""
  ops = _OP.findall(text)
  entry = text[text.find("\nENTRY"):] if "\nENTRY" in text else ""
  entry = entry[:entry.find("\n}")] if "\n}" in entry else entry
  free = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")
  top = [op for op in _OP.findall(entry) if op not in free]
  return {"instructions": len(ops), "fusions": ops.count("fusion"),
          "custom_calls": ops.count("custom-call"), "while_loops": ops.count("while"),
          "entry_ops": len(top), "entry_fusions": top.count("fusion")}


def report(config: str, overrides: dict, batch: int, seq_len: int) -> dict:
  """The compiled step's counts for one config and lever (module docstring)."""
  import jax
  from aogpt_jax import config as config_lib
  from aogpt_jax import recipes
  from aogpt_jax.train import flops as flops_lib
  from aogpt_jax.train import sharding as sharding_lib
  from aogpt_jax.train import step as train_lib

  path, _, arg = config.partition(":")
  sizes = {k: v for k, v in (("batch_size", batch), ("seq_len", seq_len)) if v}
  cfg = recipes.apply(recipes.config_file(path, arg), {**sizes, **overrides})
  if cfg.batch_size % cfg.microbatches:
    with cfg.unlocked():
      cfg.microbatches = 1
  mc = config_lib.resolve(cfg)
  mesh = sharding_lib.make_mesh(cfg)
  t = time.perf_counter()
  with jax.set_mesh(mesh):
    trainer = train_lib.build(cfg, mc, mesh)
    batch_struct = {"tokens": jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len), "int32",
                                                   sharding=sharding_lib.batch_sharding(mesh))}
    compiled = trainer.step.lower(trainer.abstract_state, batch_struct).compile()
  compile_s = time.perf_counter() - t
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  out = {"compile_s": round(compile_s, 2),
         "flops": float(cost.get("flops", -1)),
         "bytes_accessed": float(cost.get("bytes accessed", -1)),
         "model_flops": flops_lib.train_flops_per_step(mc, cfg.batch_size, cfg.seq_len,
                                                       cfg.microbatches),
         "memory": flops_lib.compiled_memory(compiled),
         "batch_size": int(cfg.batch_size), "seq_len": int(cfg.seq_len),
         "microbatches": int(cfg.microbatches),
         "model": {k: v for k, v in mc.to_dict().items()
                   if k in ("n_layer", "n_embd", "target", "dtype", "remat", "remat_policy",
                            "loss_chunk", "attention")}}
  out.update(hlo_counts(compiled.as_text()))
  return out


def table(rows: dict) -> str:
  lines = ["| config | lever | GFLOPs (XLA) | GB accessed | temporaries MiB | instructions | "
           "fusions | ENTRY ops | compile s |", "|---|---|---|---|---|---|---|---|---|"]
  for config, levers in rows.items():
    for name, r in levers.items():
      if "error" in r:
        lines.append(f"| {config} | {name} | {r['error']} | | | | | | |")
        continue
      lines.append(f"| {config} | {name} | {r['flops'] / 1e9:,.0f} | "
                   f"{r['bytes_accessed'] / 1e9:,.1f} | {r['memory']['temp_bytes'] / 2**20:,.0f} "
                   f"| {r['instructions']:,} | {r['fusions']:,} | {r['entry_ops']:,} | "
                   f"{r['compile_s']} |")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--configs", default=",".join(CONFIGS),
                  help="comma-separated config files (file.py[:arg])")
  ap.add_argument("--levers", default=",".join(LEVERS),
                  help=f"comma-separated names of {', '.join(LEVERS)}")
  ap.add_argument("--batch", type=int, default=16, help="rows per step (0: the config's)")
  ap.add_argument("--seq_len", type=int, default=1024, help="0: the config's")
  ap.add_argument("--out", default="", help="default: results/hlo_report/<machine>.json")
  a = ap.parse_args()
  configs = [c.strip() for c in a.configs.split(",") if c.strip()]
  levers = [n.strip() for n in a.levers.split(",") if n.strip()]
  if not configs:
    common.fail(ap, f"--configs: expected config files, got {a.configs!r}")
  if bad := [n for n in levers if n not in LEVERS] or not levers:
    common.fail(ap, f"--levers: expected names of {', '.join(LEVERS)}, got {a.levers!r}"
                + (f" ({', '.join(bad)} unknown)" if bad else ""))
  for c in configs:
    if not pathlib.Path(c.partition(":")[0]).is_file():
      common.fail(ap, f"--configs: no such file: {c.partition(':')[0]}")
  common.check_args(ap, a, nonnegative=("batch", "seq_len"))
  rows = {}
  for c in configs:
    rows[c] = {}
    for name in levers:
      try:
        rows[c][name] = report(c, LEVERS[name], a.batch, a.seq_len)
      except ValueError as e:   # a lever the config refuses (one line)
        rows[c][name] = {"error": str(e).splitlines()[0][:200]}
      print(f"{c} {name}: {json.dumps(rows[c][name])[:300]}", flush=True)
  text = table(rows)
  print(text)
  path = common.write_result("hlo_report", vars(a), {"reports": rows, "table": text},
                             out=a.out or None)
  pathlib.Path(path).with_suffix(".md").write_text(
      f"# Compiled train step, lever by lever ({common.machine()['slug']})\n\n"
      f"`python benchmarks/hlo_report.py {' '.join(sys.argv[1:])}`\n\n{text}\n")
  print(f"written to {path} and {pathlib.Path(path).with_suffix('.md')}")


if __name__ == "__main__":
  main()
