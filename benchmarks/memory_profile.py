"""What holds the memory of the compiled AO-GPT loss gradient: XLA's temporaries and the largest
buffers live at the peak, with the jax operation and source line that made each.

Compiles ``jax.grad`` of the training loss (`objectives.merged_loss`) for abstract parameters
(nothing is allocated) on XLA:CPU with XLA's dumps on (``--xla_dump_to`` through
``compile(compiler_options=...)``), reads the heap simulator's live ranges at the peak from the
``*-live-range.txt`` dump, and maps every buffer to its HLO instruction (shape, ``op_name``)
and to the innermost ``aogpt_jax`` source line of its stack frame::

  python benchmarks/memory_profile.py                                      # Small, 8 x 1024, bf16
  python benchmarks/memory_profile.py --overrides='{"remat_policy": "none", "loss_chunk": 0}'
  python benchmarks/memory_profile.py --layers=2 --top=30 --dump=/tmp/grad_dump   # keep the dump

Prints the memory analysis (arguments, outputs, temporaries) and the top buffers at the peak,
and writes them (`benchmarks/common.py` schema) to ``--out`` (default
benchmarks/results/memory_profile/<machine>.json). Memory is XLA:CPU's estimate (GPU/TPU compilers fuse and
schedule differently). docs/scaling.md ("What holds the memory") reads its output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import re
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402

_PEAK = re.compile(r"^\s*Live ranges at (\d+) \(peak\):")
_LIVE = re.compile(r"^\s+([^\s:]+?)(\{[0-9,]*\})?: (\d+) bytes")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\(")
_OPNAME = re.compile(r'op_name="([^"]*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")


def _table(text: str, header: str) -> dict[int, str]:
  """One of the module's stack-frame tables (``FileNames``, ``FileLocations``, ...): id -> line."""
  out, on = {}, False
  for line in text.splitlines():
    if line.strip() == header:
      on = True
      continue
    if on:
      m = re.match(r"^(\d+) (.*)$", line)
      if not m:
        break
      out[int(m.group(1))] = m.group(2)
  return out


def source_lines(hlo_text: str, frame: int, project: str = "aogpt_jax") -> list[str]:
  """``file:line function`` of a stack frame and its parents (innermost first), project files
  only (the whole chain when none is in the project)."""
  files = {k: v.strip('"') for k, v in _table(hlo_text, "FileNames").items()}
  funcs = {k: v.strip('"') for k, v in _table(hlo_text, "FunctionNames").items()}
  locs = _table(hlo_text, "FileLocations")
  frames = _table(hlo_text, "StackFrames")
  chain, seen = [], set()
  while frame in frames and frame not in seen:
    seen.add(frame)
    f = dict(re.findall(r"(\w+)=(\d+)", frames[frame]))
    loc = dict(re.findall(r"(\w+)=(\d+)", locs.get(int(f.get("file_location_id", 0)), "")))
    path = files.get(int(loc.get("file_name_id", 0)), "?")
    if project in path:
      path = path[path.index(project):]
    chain.append(f"{path}:{loc.get('line', '?')} {funcs.get(int(loc.get('function_name_id', 0)), '?')}")
    frame = int(f.get("parent_frame_id", 0))
  own = [c for c in chain if c.startswith(project)]
  return own or chain


def instructions(hlo_text: str) -> dict[str, dict]:
  """name -> {"shape", "opcode", "op_name", "source"} of every instruction of the HLO text."""
  out = {}
  for line in hlo_text.splitlines():
    m = _INSTR.match(line)
    if not m:
      continue
    op = _OPNAME.search(line)
    fr = _FRAME.search(line)
    out[m.group(1)] = {"shape": m.group(2)[:120], "opcode": m.group(3),
                       "op_name": op.group(1) if op else "", "frame": int(fr.group(1)) if fr else 0}
  return out


def peak_buffers(live_range_text: str) -> tuple[int, list[tuple[str, int]]]:
  """(peak time, [(buffer name, bytes)] largest first) from XLA's ``*-live-range.txt``."""
  t, rows, on = -1, [], False
  for line in live_range_text.splitlines():
    m = _PEAK.match(line)
    if m:
      t, on = int(m.group(1)), True
      continue
    if on:
      b = _LIVE.match(line)
      if not b:
        break
      rows.append((b.group(1) + (b.group(2) or ""), int(b.group(3))))
  return t, sorted(rows, key=lambda r: -r[1])


def read_dump(dump_dir: str | pathlib.Path, top: int = 20) -> dict:
  """The top buffers at the peak of the (one) module dumped to ``dump_dir``, each with its HLO
  instruction's shape, opcode, jax op_name and project source lines."""
  d = pathlib.Path(dump_dir)
  lr = sorted(d.glob("*after_optimizations-live-range.txt"))
  hlo = sorted(d.glob("*after_optimizations.txt"))
  if not lr or not hlo:
    raise FileNotFoundError(f"{d}: no XLA live-range / after_optimizations dump")
  text = hlo[-1].read_text()
  instr = instructions(text)
  t, rows = peak_buffers(lr[-1].read_text())
  out = []
  for name, nbytes in rows[:top]:
    i = instr.get(name.split("{")[0], {})
    out.append({"buffer": name, "bytes": nbytes, "shape": i.get("shape", "?"),
                "opcode": i.get("opcode", "?"), "op_name": i.get("op_name", ""),
                "source": source_lines(text, i["frame"])[:3] if i.get("frame") else []})
  return {"peak_time": t, "live_bytes": sum(b for _, b in rows), "live_buffers": len(rows),
          "top": out}


def grad_lowered(size: str, batch: int, seq_len: int, overrides: dict):
  """``jit(grad(merged_loss))`` lowered for abstract parameters, tokens and orders."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from aogpt_jax.model import aogpt as model_lib
  from aogpt_jax.model import objectives

  mc = model_lib.preset(size, **overrides)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: model_lib.AOGPT(mc, rngs=nnx.Rngs(0))),
                               nnx.Param)
  params = nnx.to_pure_dict(params)

  def grad(p, tokens, order):
    return jax.grad(objectives.merged_loss, has_aux=True)(p, graphdef, tokens, order, None,
                                                          None, "ao")
  tok = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
  return jax.jit(grad).lower(params, tok, tok), mc


@contextlib.contextmanager
def _no_persistent_cache():
  """Compiles for real: a hit in JAX's persistent compilation cache (JAX_COMPILATION_CACHE_DIR,
  the tests set one) writes no dump, and the dump options are not part of the cache key."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache as cc
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  cc.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
    cc.reset_cache()


def profile(size: str = "small", batch: int = 8, seq_len: int = 1024, overrides=None,
            top: int = 20, dump: str | None = None) -> dict:
  """Compiles the loss gradient with XLA's dumps and returns its memory analysis and the top
  buffers at the peak (`read_dump`)."""
  from aogpt_jax.train import flops as flops_lib

  lowered, mc = grad_lowered(size, batch, seq_len, dict(overrides or {}))
  with tempfile.TemporaryDirectory() as tmp:
    where = dump or tmp
    t0 = time.perf_counter()
    with _no_persistent_cache():
      compiled = lowered.compile(compiler_options={"xla_dump_to": where,
                                                   "xla_dump_hlo_as_text": True})
    secs = time.perf_counter() - t0
    peak = read_dump(where, top)
  return {**flops_lib.compiled_memory(compiled), "compile_s": round(secs, 2),
          "n_layer": mc.n_layer, **peak}


def report(r: dict) -> str:
  g = lambda b: f"{b / 2**30:.2f} GiB"   # noqa: E731
  lines = [f"arguments {g(r['argument_bytes'])}, outputs {g(r['output_bytes'])}, "
           f"temporaries {g(r['temp_bytes'])} (n_layer={r['n_layer']}, compile "
           f"{r['compile_s']} s); live at the peak (t={r['peak_time']}): "
           f"{g(r['live_bytes'])} in {r['live_buffers']} buffers, the largest:"]
  for b in r["top"]:
    src = b["source"][0] if b["source"] else "-"
    lines.append(f"  {b['bytes'] / 2**20:9.1f} MiB  {b['shape'][:48]:48s} {b['opcode']:14s} "
                 f"{b['op_name'][-70:]}  [{src}]")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--size", default="small", help="model preset (tiny, small, medium)")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq_len", type=int, default=1024)
  ap.add_argument("--dtype", default="bfloat16", help="compute dtype")
  ap.add_argument("--layers", type=int, default=0, help="n_layer (0: the preset's)")
  ap.add_argument("--overrides", default="{}", help="JSON of ModelConfig fields")
  ap.add_argument("--top", type=int, default=20)
  ap.add_argument("--dump", default="", help="keep XLA's dump in this folder (default: a temp)")
  ap.add_argument("--out", default="", help="default: results/memory_profile/<machine>.json")
  a = ap.parse_args()
  try:
    ov = json.loads(a.overrides)
  except json.JSONDecodeError as e:
    sys.exit(f"--overrides: expected a JSON object of ModelConfig fields, got {a.overrides!r} ({e})")
  ov = {"dtype": a.dtype, **({"n_layer": a.layers} if a.layers else {}), **ov}
  r = profile(a.size, a.batch, a.seq_len, ov, a.top, a.dump or None)
  print(report(r))
  common.write_result("memory_profile", a, {**r, "model_overrides": ov,
                                            "note": "XLA:CPU memory analysis, abstract inputs"},
                      out=a.out or None,
                      device_info={"backend": "cpu", "kind": "XLA:CPU (compile only)",
                                   "count": None, "jax": __import__("jax").__version__})


if __name__ == "__main__":
  main()
