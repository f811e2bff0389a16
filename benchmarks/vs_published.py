"""aogpt_jax against the published AO-GPT PyTorch code on the same work, side by side.

    python benchmarks/vs_published.py --published=DIR [--parts=train,sample,ensembles] [--repeats=2]

DIR is a checkout of the published repository scxue/AO-GPT-MDM (it has no licence: it is run
here, never copied into this project). Its ``model_AOGPT_generate.py`` hard-codes 1024 in three
step counts; the script copies DIR to a scratch folder and replaces them by
``self.config.block_size`` there (DIR is not touched), so the block size 256 used here works.

Sizes (both sides): 4 layers, width 256, 4 heads, n = 256, vocabulary 50304 (50257 valid),
batch 8. ``--device=cpu`` (default): fp32, PyTorch eager with 2 threads, JAX jitted on XLA:CPU.
``--device=gpu``: the first GPU, bf16 compute (the published side under
``torch.autocast("cuda", bfloat16)`` as its trainer runs, fused AdamW as its
``configure_optimizers`` picks on CUDA; ours with ``dtype=bfloat16``), fp32 parameters on both.
Compile time is reported apart. Each repeat runs the published half, then ours, each in its own
subprocess (`vs_published/published_side.py`, `vs_published/ours_side.py`); a ratio is the best
time of each side over all repeats (the machine is shared: compare ratios from one run). Writes
benchmarks/results/vs_published_<device>/<machine>.json (`benchmarks/common.py`'s schema) and
prints a Markdown table.

``ensembles``: context-order ensembles (Eq. 4) of one 256-token sequence at M = ``--max_m``
(default 8). The published estimator runs 1 + n (M - 1) = 1,793 full passes; by default
``published_side.py`` times ``--passes`` of them spread over the ranks and extrapolates linearly
(every pass is the same full-length forward; ``--passes=0`` times them all, ~5 minutes). Ours is
reported twice: warm, and its first call including compilation ("incl. compile" row).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402
NEEDED = ("model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm.py", "model_AOGPT_generate.py", "ema.py",
          "catsample.py")


def patched_copy(published: pathlib.Path) -> pathlib.Path:
  missing = [f for f in NEEDED if not (published / f).exists()]
  if missing:
    sys.exit(f"--published={published}: not a checkout of scxue/AO-GPT-MDM (missing {missing}). "
             f"Get one with git (or the search tool's fetch of scxue/AO-GPT-MDM, then "
             f"`git --git-dir=<its git dir> archive HEAD | tar -x -C DIR`).")
  out = pathlib.Path(tempfile.mkdtemp(prefix="aogpt_published_"))
  for f in published.glob("*.py"):
    shutil.copy(f, out / f.name)
  gen = out / "model_AOGPT_generate.py"
  text = gen.read_text()
  text, k = re.subn(r"int\(1024\*\(1-timesteps", "int(self.config.block_size*(1-timesteps", text)
  text, k2 = re.subn(r"int\(\(1024-len_input_ids\)", "int((self.config.block_size-len_input_ids)",
                     text)
  if (k, k2) != (2, 1):
    sys.exit(f"{published}/model_AOGPT_generate.py: expected the three hard-coded 1024s "
             f"(found {k} + {k2}); has the published code changed?")
  gen.write_text(text)
  return out


def side(script: str, part: str, extra: list[str], root: pathlib.Path = REPO,
         device: str = "cpu") -> dict:
  """Runs ``vs_published/SCRIPT PART EXTRA`` in a subprocess that imports aogpt_jax from
  ``root`` (benchmarks/profile/ours_ab.py passes an older revision's tree) on ``device`` (cpu | gpu);
  returns its JSON line."""
  env = dict(os.environ, JAX_PLATFORMS="cpu" if device == "cpu" else "cuda",
             TORCHDYNAMO_DISABLE="1",
             PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  extra = [*extra, f"--device={device}"]
  p = subprocess.run([sys.executable, str(HERE / "vs_published" / script), part, *extra],
                     capture_output=True, text=True, env=env, cwd=REPO)
  if p.returncode:
    sys.exit(f"{script} {part} failed:\n{p.stderr[-3000:]}")
  return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--published", required=True, help="a checkout of scxue/AO-GPT-MDM")
  ap.add_argument("--parts", default="train,sample,ensembles")
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--runs", type=int, default=3, help="timed runs per side per repeat")
  ap.add_argument("--steps", default="16,64,256")
  ap.add_argument("--top_p", default="1.0,0.95")
  ap.add_argument("--max_m", type=int, default=8, help="ensembles: orderings per token")
  ap.add_argument("--passes", type=int, default=24,
                  help="ensembles: published passes timed (0: all 1 + n (M - 1))")
  ap.add_argument("--device", default="cpu", choices=("cpu", "gpu"),
                  help="gpu: bf16 compute on the first GPU, both sides")
  ap.add_argument("--out", default="",
                  help="default: results/vs_published_<device>/<machine>.json")
  a = ap.parse_args()
  pub = patched_copy(pathlib.Path(a.published).expanduser().resolve())
  load_before = os.getloadavg()
  best: dict[str, dict[str, float]] = {}
  for rep in range(a.repeats):
    for part in a.parts.split(","):
      extra = [f"--runs={a.runs}"] + ([f"--steps={a.steps}", f"--top_p={a.top_p}"]
                                      if part == "sample" else [f"--max_m={a.max_m}"]
                                      if part == "ensembles" else [])
      pub_args = [f"--published={pub}"] + ([f"--passes={a.passes}"] if part == "ensembles" else [])
      for who, script, args in (("published", "published_side.py", pub_args),
                                ("ours", "ours_side.py", [])):
        for name, r in side(script, part, extra + args, device=a.device).items():
          t = r.get("step_s", r.get("wall_s"))
          row = best.setdefault(name, {})
          row[who] = min(row.get(who, float("inf")), t)
          if "first_incl_compile_s" in r:
            row["ours_first_call_s"] = min(row.get("ours_first_call_s", float("inf")),
                                           r["first_incl_compile_s"])
        print(f"repeat {rep + 1}/{a.repeats} {part} {who}: done", flush=True)
  shutil.rmtree(pub, ignore_errors=True)
  lines = ["| work | published (s) | aogpt_jax (s) | ours / published | speed-up |",
           "|---|---:|---:|---:|---:|"]
  for name, row in best.items():
    if "published" in row and "ours" in row:
      row["ratio"] = row["ours"] / row["published"]
      lines.append(f"| {name} | {row['published']:.4g} | {row['ours']:.4g} | {row['ratio']:.2f} "
                   f"| {1 / row['ratio']:.1f}x |")
      if name == "ensembles" and "ours_first_call_s" in row:
        first = row["ours_first_call_s"]
        lines.append(f"| ensembles, ours incl. compile | {row['published']:.4g} | {first:.4g} "
                     f"| {first / row['published']:.2f} | {row['published'] / first:.1f}x |")
    else:
      lines.append(f"| {name} | - | {row['ours']:.4g} | - | - |")
  print("\n".join(lines))
  accel = common.accelerator() if a.device == "gpu" else None
  common.write_result(
      f"vs_published_{a.device}", a,
      {"best_s": best, "repeats": a.repeats, "runs": a.runs, "device": a.device,
       "accelerator": accel, "load_avg_1_5_15_before": load_before,
       "load_avg_1_5_15_after": os.getloadavg()},
      out=a.out or None,
      device_info={"backend": a.device, "kind": accel or "cpu", "count": 1, "jax": None})


if __name__ == "__main__":
  main()
