"""Collects the JSON files `gpu_suite.sh` wrote into one ``OUT_DIR/gpu_suite.json``
(`benchmarks/common.py`'s schema) and prints a README-ready Markdown table (one row per measured
number, the machine named). ``--publish`` also writes it to
benchmarks/results/gpu_suite/<machine>.json (the suite does so unless it is a dry run).

  python benchmarks/gpu_suite_report.py OUT_DIR [--publish]
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402


def _load(path: pathlib.Path):
  """A result file's measurements: its ``results`` in common.py's schema, else the object."""
  try:
    r = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  if isinstance(r, dict) and set(common.SCHEMA_KEYS) <= set(r):
    return r["results"]
  return r


def _gib(b) -> str:
  return "n/a" if b is None else f"{b / 2**30:.2f} GiB"


def rows(d: pathlib.Path) -> tuple[list[tuple[str, str]], dict]:
  """(measurement, result) pairs and the raw results, from the files in ``d``."""
  out, raw = [], {}
  for f in sorted(d.glob("train_*.json")):
    r = _load(f)
    if not r:
      continue
    raw[f.stem] = r
    size, attn = f.stem.split("_", 2)[1:]
    sim = _load(d / f"scale_sim_{size}.json")
    sim_peak = (sim or {}).get("rows", [{}])[0].get("peak_bytes")
    mfu = "n/a (CPU)" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    out.append((f"train step {size}, attention {attn}, {r['batch_size']} x {r['seq_len']} on "
                f"{r['devices']} device(s)",
                f"{r['step_s_median'] * 1e3:.1f} ms/step, {r['tokens_per_s']:.0f} tokens/s, MFU "
                f"{mfu}"))
    xm = r.get("xla_memory") or {}
    out.append((f"memory per device, train step {size} ({attn})",
                f"measured peak {_gib(r.get('measured_peak_bytes'))}; XLA estimate on this "
                f"device {_gib(xm.get('peak_bytes'))}; scale_sim (XLA:CPU, attention xla) "
                f"{_gib(sim_peak)}"))
    prof = r.get("profile") or {}
    if prof.get("groups_ms_per_step"):
      groups = ", ".join(f"{k} {v:.1f}" for k, v in prof["groups_ms_per_step"].items())
      out.append((f"where the train step's time goes, {size} ({attn}; profile of 3 steps)",
                  f"busy {prof['busy_ms_per_step']:.1f} ms, idle "
                  f"{prof['idle_ms_per_step']:.1f} ms per step; kernels (ms): {groups}; "
                  f"{prof['kernels_per_step']:.0f} kernels per step"))
    elif prof.get("error"):
      out.append((f"profile of the train step, {size} ({attn})", f"failed: {prof['error']}"))
  s = _load(d / "sample_speed.json")
  if s:
    raw["sample_speed"] = s
    ar = next((x for x in s["rows"] if x["method"] == "ar"), None)
    for x in s["rows"]:
      if x["method"] != "diffusion":
        continue
      enc = x.get("encoder_over_diffusion_speedup")
      out.append((f"sampler {s['preset']}, n = {s['length']}, batch {s['batch']}, T = "
                  f"{x['steps']}",
                  f"{x['run_s']:.3f} s ({x['tokens_per_s']:.0f} tokens/s); encoder MDM / ours "
                  f"= {enc if enc is not None else 'n/a'}x; ours / AR = "
                  f"{x.get('vs_ar_time_ratio', 'n/a')}"
                  + (f" (AR {ar['run_s']:.3f} s)" if ar else "")))
  e = _load(d / "eval_cost.json")
  if e:
    raw["eval_cost"] = e
    out.append((f"ensemble cost {e['preset']}, n = {e['n']}, M = {e['max_m']}, "
                f"{e['ranks_scored']} ranks",
                f"{e['fast']['wall_s']:.2f} s (naive published-style "
                f"{e['naive']['wall_s']:.2f} s, {e['speedup_wall']:.1f}x)"))
  return out, raw


def main(argv) -> None:
  args = [a for a in argv[1:] if a != "--publish"]
  if len(args) != 1 or args[0] in ("-h", "--help"):
    print("usage: gpu_suite_report.py OUT_DIR [--publish]\n\n" + __doc__)
    sys.exit(0 if args and args[0] in ("-h", "--help") else 2)
  d = pathlib.Path(args[0])
  table, raw = rows(d)
  if not table:
    sys.exit(f"gpu_suite_report: no results in {d}")
  machine = next((f"{r.get('device_kind') or r.get('machine', {}).get('device')}"
                  for r in raw.values() if isinstance(r, dict)), "unknown")
  results = {"machine": machine, "rows": table, "raw": raw}
  kw = dict(device_info=None, commit_sha=True)
  common.write_result("gpu_suite", {"out_dir": str(d)}, results, out=d / "gpu_suite.json", **kw)
  if "--publish" in argv:
    common.write_result("gpu_suite", {"out_dir": str(d)}, results, **kw)
  print(f"\nMachine: {machine} (benchmarks/gpu_suite.sh; JSON: {d / 'gpu_suite.json'})\n")
  print("| measurement | result |\n|---|---|")
  for k, v in table:
    print(f"| {k} | {v} |")


if __name__ == "__main__":
  main(sys.argv)
