"""Before/after of any change to aogpt_jax: our half of `benchmarks/vs_published.py`
(`vs_published/ours_side.py`, same sizes: 4 layers, width 256, 4 heads, n = 256, vocabulary
50304, batch 8, fp32, CPU) run on the package of git revision ``--old`` and on the working
tree, alternately, each run in its own subprocess; per row the best time per side over all
repeats, new / old of the bests, and new / old within each repeat (adjacent runs: robust to a
load that drifts). Needs git (the old tree is `git archive`d into a scratch folder).

    python benchmarks/profile/ours_ab.py --old=f748e15 [--parts=sample] [--repeats=3] [--steps=16,256]
    python benchmarks/profile/ours_ab.py --old=f748e15 --parts=sample_hlo [--steps=16,256]

``--parts=sample_hlo`` times nothing: it compiles the sampler program of each row on both trees
and prints, per row, whether the optimised HLO is the same (source locations aside) or which op
counts moved: the first check of a sampling-speed change on a loaded machine, free of noise.

Writes the JSON (`benchmarks/common.py`'s schema) to ``--out`` (default
benchmarks/results/ours_ab/<machine>.json).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import common  # noqa: E402
from vs_published import REPO, side  # noqa: E402


def old_tree(rev: str) -> pathlib.Path:
  out = pathlib.Path(tempfile.mkdtemp(prefix="aogpt_old_"))
  arch = subprocess.run(["git", "archive", rev, "aogpt_jax"], cwd=REPO, capture_output=True)
  if arch.returncode:
    sys.exit(f"--old={rev}: git archive failed: {arch.stderr.decode().strip()}")
  subprocess.run(["tar", "-x", "-C", str(out)], input=arch.stdout, check=True)
  return out


def compare_programs(old: pathlib.Path, steps: str, top_p: str) -> None:
  """``--parts=sample_hlo``: per row, the same compiled program on both trees, or what moved."""
  extra = [f"--steps={steps}", f"--top_p={top_p}"]
  progs = {who: side("ours_side.py", "sample_hlo", extra, root)
           for who, root in (("old", old), ("new", REPO))}
  for name, new in progs["new"].items():
    prev = progs["old"][name]
    if prev["hlo_sha256"] == new["hlo_sha256"]:
      print(f"{name}: the same program")
      continue
    moved = [f"  {k}: {prev['ops'].get(k, 0)} -> {new['ops'].get(k, 0)}"
             for k in sorted(set(prev["ops"]) | set(new["ops"]))
             if prev["ops"].get(k, 0) != new["ops"].get(k, 0)]
    print(f"{name}: programs differ" + (", op counts (old -> new):" if moved else
                                        " (the same op counts)"))
    print("\n".join(moved))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--old", required=True, help="git revision to compare the working tree with")
  ap.add_argument("--parts", default="sample")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--runs", type=int, default=2, help="timed runs per side per repeat")
  ap.add_argument("--steps", default="16,64,256")
  ap.add_argument("--top_p", default="1.0")
  ap.add_argument("--out", default="", help="default: results/ours_ab/<machine>.json")
  a = ap.parse_args()
  old = old_tree(a.old)
  if a.parts == "sample_hlo":
    compare_programs(old, a.steps, a.top_p)
    shutil.rmtree(old, ignore_errors=True)
    return
  load_before = os.getloadavg()
  best: dict[str, dict] = {}
  for rep in range(a.repeats):
    for part in a.parts.split(","):
      extra = [f"--runs={a.runs}"] + ([f"--steps={a.steps}", f"--top_p={a.top_p}"]
                                      if part == "sample" else [])
      this: dict[str, dict[str, float]] = {}
      for who, root in (("old", old), ("new", REPO)):
        for name, r in side("ours_side.py", part, extra, root).items():
          this.setdefault(name, {})[who] = r.get("step_s", r.get("wall_s"))
      for name, t in this.items():   # the load drifts: new / old of adjacent runs, per repeat
        row = best.setdefault(name, {"paired": []})
        row["paired"].append(round(t["new"] / t["old"], 3))
        for who in ("old", "new"):
          row[who] = min(row.get(who, float("inf")), t[who])
      print(f"repeat {rep + 1}/{a.repeats} {part}: done", flush=True)
  shutil.rmtree(old, ignore_errors=True)
  print(f"| work | {a.old} (s) | working tree (s) | new / old (best) | new / old per repeat |\n"
        "|---|---:|---:|---:|---|")
  for name, row in best.items():
    row["new_over_old"] = row["new"] / row["old"]
    print(f"| {name} | {row['old']:.3f} | {row['new']:.3f} | {row['new_over_old']:.2f} "
          f"| {' '.join(f'{x:.2f}' for x in sorted(row['paired']))} |")
  commit = common.commit()
  common.write_result(
      "ours_ab", a, {"best_s": best, "old": a.old, "new": f"{commit} (working tree)",
                     "repeats": a.repeats, "runs": a.runs,
                     "load_avg_1_5_15_before": load_before,
                     "load_avg_1_5_15_after": os.getloadavg()},
      out=a.out or None, device_info={"backend": "cpu", "kind": "cpu", "count": None, "jax": None})


if __name__ == "__main__":
  main()
