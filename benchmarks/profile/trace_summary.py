"""Where a profiled program's accelerator time goes, from a jax.profiler trace, without xprof.

    python benchmarks/profile/trace_summary.py DIR [--steps=3] [--top=15]

DIR: a ``jax.profiler.trace`` folder (``benchmarks/train_step.py --profile_dir=DIR`` writes one:
three train steps). Reads the newest ``*.xplane.pb`` under DIR with ``jax.profiler.ProfileData``
and sums the kernels on each accelerator's streams (the ``Stream`` lines of the
``/device:GPU:N`` planes; TPU planes' ``XLA Ops`` line) into groups by kernel name: matmuls
(cuBLAS / cuBLASLt / CUTLASS / nvjet / Triton GEMM), attention (cuDNN / flash), copies and
memsets, collectives, and everything else (XLA's elementwise and reduction fusions). Also the
busy time (the union of the kernels' intervals, so overlapping streams count once) and the idle
time of the traced span, both per step. Prints one JSON object; `train_step.py` adds it to its
result as ``profile``. CPU traces have no device plane: the summary says so (``device_planes``
0) instead of guessing.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re

# first match wins: the order matters (a Triton GEMM fusion is a matmul, not a fusion)
GROUPS = (
    ("matmul", re.compile(r"gemm|cublas|cutlass|nvjet|xmma|matmul|sm\d+_.*_tn|_nt_|_nn_|dot",
                          re.I)),
    ("attention", re.compile(r"cudnn|flash|fmha|sdpa|attention|splash", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|transpose", re.I)),
    ("collective", re.compile(r"nccl|all-reduce|all_reduce|all-gather|allgather|"
                              r"reduce-scatter|collective", re.I)),
)


def group_of(name: str) -> str:
  for label, pattern in GROUPS:
    if pattern.search(name):
      return label
  return "other"


def _union_ns(intervals: list[tuple[int, int]]) -> int:
  busy, end = 0, None
  for s, e in sorted(intervals):
    if end is None or s > end:
      busy += e - s
      end = e
    elif e > end:
      busy += e - end
      end = e
  return busy


def newest_trace(folder: str | pathlib.Path) -> pathlib.Path:
  found = sorted(pathlib.Path(folder).glob("**/*.xplane.pb"), key=lambda p: p.stat().st_mtime)
  if not found:
    raise FileNotFoundError(f"trace_summary: no *.xplane.pb under {folder} (expected a "
                            f"jax.profiler.trace folder)")
  return found[-1]


def summarize(folder: str | pathlib.Path, steps: int = 1, top: int = 15) -> dict:
  """The summary of the newest trace under `folder`, times in ms per step (``steps``: how many
  steps the trace holds, to divide by)."""
  from jax.profiler import ProfileData
  path = newest_trace(folder)
  data = ProfileData.from_file(str(path))
  per_name: collections.Counter = collections.Counter()
  calls: collections.Counter = collections.Counter()
  intervals: list[tuple[int, int]] = []
  planes = 0
  for plane in data.planes:
    if not re.match(r"/device:(GPU|TPU)", plane.name):
      continue
    planes += 1
    lines = list(plane.lines)
    kernel_lines = [ln for ln in lines if ln.name.startswith("Stream")]
    if not kernel_lines:                                 # TPU: the ops line holds the kernels
      kernel_lines = [ln for ln in lines if ln.name == "XLA Ops"]
    for line in kernel_lines:
      for ev in line.events:
        dur = float(ev.duration_ns)
        per_name[ev.name] += dur
        calls[ev.name] += 1
        intervals.append((int(ev.start_ns), int(ev.start_ns + dur)))
  out = {"trace": str(path), "device_planes": planes, "steps": steps}
  if not intervals:
    return out
  ms = 1e-6 / steps
  groups: collections.Counter = collections.Counter()
  for name, ns in per_name.items():
    groups[group_of(name)] += ns
  span = max(e for _, e in intervals) - min(s for s, _ in intervals)
  busy = _union_ns(intervals)
  out.update({
      "span_ms_per_step": span * ms, "busy_ms_per_step": busy * ms,
      "idle_ms_per_step": (span - busy) * ms,
      "kernel_ms_per_step": sum(per_name.values()) * ms,
      "kernels_per_step": sum(calls.values()) / steps,
      "groups_ms_per_step": {k: v * ms for k, v in groups.most_common()},
      "top_kernels": [{"name": name[:160], "group": group_of(name), "ms_per_step": ns * ms,
                       "calls_per_step": calls[name] / steps}
                      for name, ns in per_name.most_common(top)],
  })
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("folder", help="a jax.profiler.trace folder")
  p.add_argument("--steps", type=int, default=1, help="steps in the trace (times are per step)")
  p.add_argument("--top", type=int, default=15, help="kernels listed by total time")
  args = p.parse_args(argv)
  if args.steps < 1:
    p.error(f"--steps: {args.steps} is not a positive number of steps")
  print(json.dumps(summarize(args.folder, args.steps, args.top), indent=2))


if __name__ == "__main__":
  main()
