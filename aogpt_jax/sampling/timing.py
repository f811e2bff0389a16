"""Wall time of the samplers at one size, timed fairly on a shared machine (the paper's Figure 5).

Used by `benchmarks/sample_speed.py` (sweeps, JSON) and `colabs/sampling.ipynb` (one small run,
plot). Every configuration is compiled ahead of time (``lower().compile()``, timed apart) and run
once to warm up; the timed runs are interleaved round by round (every configuration once per
round), so load drift hits all of them alike; the best and the median are kept.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import jax
import numpy as np

from aogpt_jax.sampling import sampler


def build(m, method: str, steps: int, *, length: int, batch: int, seed: int = 0,
          count_mode: str = "deterministic", schedule: str = "linear", order: str = "random"):
  """Compiles one configuration and warms it up; returns (row, run). ``m``: the AO-GPT, or the
  `aogpt_jax.model.encoder` encoder for ``method='encoder'``."""
  s = sampler.SampleSettings(length=length, steps=steps, method=method, count_mode=count_mode,
                             schedule=schedule, order=order)
  p = sampler.prepare(m.cfg, jax.random.key(seed), s, batch=batch)
  pl = None if method == "ar" else sampler.plan([p], method=method)[0]
  t0 = time.perf_counter()
  run = sampler.compile_sampler(m, p, pl, s)
  row = {"method": method, "steps": steps if method != "ar" else length,
         "compile_s": round(time.perf_counter() - t0, 3)}
  if pl is not None:
    st = pl.stats()
    row.update(scan_steps=st["scan_steps"], query_slots=st["query_slots"])
    if method not in sampler.FULL_FORWARD_METHODS:     # their forwards cover all n positions
      row.update(block_slots=st["block_slots"], padding_waste=round(st["padding_waste"], 4))
  jax.block_until_ready(run()[0])                   # warm-up
  return row, run


def time_interleaved(built: Sequence, *, repeats: int, tokens: int) -> None:
  """Times every (row, run) of ``built`` ``repeats`` times, interleaved; adds run_s (best),
  run_s_median and tokens_per_s (``tokens`` per run / best time) to each row."""
  times = [[] for _ in built]
  for _ in range(repeats):
    for i, (_, run) in enumerate(built):
      t0 = time.perf_counter()
      jax.block_until_ready(run()[0])
      times[i].append(time.perf_counter() - t0)
  for (row, _), t in zip(built, times):
    row.update(run_s=round(min(t), 5), run_s_median=round(float(np.median(t)), 5),
               tokens_per_s=round(tokens / min(t), 1))


def compare(m, encoder=None, *, length: int, batch: int, steps: Sequence[int],
            methods: Sequence[str] = ("diffusion", "ar", "encoder"), repeats: int = 5,
            full_forward_max_steps: int = 1 << 30, log: Callable[[dict], None] | None = None,
            **settings) -> list[dict]:
  """Times ``methods`` (AR once: it does not depend on T; the others at every T in ``steps``)
  on ``batch`` samples of ``length`` tokens; returns one row per configuration, the diffusion
  rows with ``vs_ar_time_ratio`` and ``<method>_over_diffusion_speedup`` (how many times faster
  the KV-cached sampler is than each full-forward one at the same T). ``encoder``: the
  `aogpt_jax.model.encoder` model for ``'encoder'``;
  ``settings``: seed, count_mode, schedule, order;
  ``log`` gets each row once compiled."""
  unknown = sorted(set(methods) - set(sampler.METHODS))
  if unknown:
    raise ValueError(f"methods: unknown {unknown}; known: {sampler.METHODS}")
  if "encoder" in methods and encoder is None:
    raise ValueError("methods has 'encoder' but no encoder model was given "
                     "(model.encoder.make_encoder)")
  kw = dict(length=length, batch=batch, **settings)
  built = []
  if "ar" in methods:
    built.append(build(m, "ar", length, **kw))
  for t in steps:
    for method in methods:
      if method == "ar" or (method in sampler.FULL_FORWARD_METHODS
                            and t > full_forward_max_steps):
        continue
      built.append(build(encoder if method == "encoder" else m, method, t, **kw))
      if log:
        log(built[-1][0])
  time_interleaved(built, repeats=repeats, tokens=batch * length)
  rows = [row for row, _ in built]
  ar = next((r for r in rows if r["method"] == "ar"), None)
  for r in rows:
    if r["method"] == "diffusion":
      if ar:
        r["vs_ar_time_ratio"] = round(r["run_s"] / ar["run_s"], 3)
      for other in sampler.FULL_FORWARD_METHODS:
        o = next((e for e in rows if e["method"] == other and e["steps"] == r["steps"]), None)
        if o:   # how many times faster the AO-GPT KV sampler is than the full-forward sampler
          r[f"{other}_over_diffusion_speedup"] = round(o["run_s"] / r["run_s"], 2)
  return rows
