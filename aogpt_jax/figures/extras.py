"""The figures that are computed rather than read from training metrics, each cached as a JSON
file so that a second call only draws:

* Figure 4 (`ensemble`): zero-shot perplexity of a trained AO-GPT against the context-order
  ensemble size M (`aogpt_jax.evaluation`, Eq. 4), with its L2R perplexity for reference, on the
  run's held-out split. Cached as OUT/eval/fig4.json (`evaluation.write_results`).
* Figure 5 (`timing`): wall time of one batch of samples against the number of steps T for the
  AO-GPT KV-cached sampler, the encoder-only MDM and AR decoding (`sampling.timing.compare`, the
  logic of benchmarks/sample_speed.py; random weights, since speed does not depend on them).
  Cached as OUT/timing.json.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import platform
from typing import Any

from aogpt_jax.figures import sizes


def ensemble(run_workdir: str | pathlib.Path, cfg, out: str | pathlib.Path,
             es: sizes.EnsembleSize) -> dict[str, Any]:
  """Figure 4's numbers (`evaluation.evaluate` results), computed once."""
  out = pathlib.Path(out)
  cached = out / "eval" / "fig4.json"
  if cached.exists():
    res = json.loads(cached.read_text(encoding="utf-8"))
    if (res["settings"]["ensemble_max_m"] == es.max_m
        and res["meta"].get("max_blocks") == es.max_blocks):
      return res
  import jax
  from aogpt_jax import data as data_lib
  from aogpt_jax import evaluation
  from aogpt_jax.checkpoints import store
  m, run_cfg = store.load_model(run_workdir, which="ema")
  settings = evaluation.EvalSettings(l2r=True, any_order=True, ensemble_max_m=es.max_m,
                                     seed=cfg.eval.seed)
  bs = cfg.eval.batch_size or cfg.batch_size

  def batches():
    return data_lib.eval_batches(cfg.data, split=cfg.eval.split, seq_len=cfg.seq_len,
                                 global_batch_size=bs, process_index=jax.process_index(),
                                 process_count=jax.process_count(), max_blocks=es.max_blocks)

  return evaluation.evaluate(
      m, {"heldout": batches}, settings, workdir=str(out), name="fig4",
      meta={"run": str(run_workdir), "max_blocks": es.max_blocks, "split": cfg.eval.split,
            **run_cfg.loaded.to_dict()})


def ensemble_panels(res: dict[str, Any]) -> list[dict[str, Any]]:
  d = res["datasets"]["heldout"]
  ms = [int(m) for m in d["ensemble"]["m_values"]]
  return [{"title": f"held-out perplexity ({d['l2r']['blocks']:.0f} blocks)",
           "xlabel": "ensemble size M", "ylabel": "perplexity", "xscale": "log2",
           "lines": [
               {"label": "any-order, context-order ensemble (Eq. 4)", "x": ms,
                "y": [d["ensemble"]["ppl"][str(m)] for m in ms]},
               {"label": "L2R (reference)", "x": ms, "y": [d["l2r"]["ppl"]] * len(ms),
                "style": "--"}]}]


def timing(out: str | pathlib.Path, ts: sizes.TimingSize) -> dict[str, Any]:
  """Figure 5's numbers (`sampling.timing.compare` rows), measured once."""
  out = pathlib.Path(out)
  cached = out / "timing.json"
  want = dataclasses.asdict(ts)
  want["steps"] = list(want["steps"])
  if cached.exists():
    res = json.loads(cached.read_text(encoding="utf-8"))
    if res.get("settings") == want:
      return res
  import jax
  from flax import nnx
  from aogpt_jax.model import aogpt as model_lib
  from aogpt_jax.model import encoder as mdm
  from aogpt_jax.sampling import timing as timing_lib
  mc = model_lib.preset(ts.preset, dtype=ts.dtype, **ts.model)
  m = model_lib.AOGPT(mc, rngs=nnx.Rngs(0))
  enc = mdm.make_encoder(mc, rngs=nnx.Rngs(0))
  rows = timing_lib.compare(m, enc, length=ts.length, batch=ts.batch, steps=list(ts.steps),
                            methods=("diffusion", "ar", "encoder"), repeats=ts.repeats)
  res = {"settings": want, "rows": rows, "backend": jax.default_backend(),
         "device": jax.devices()[0].device_kind, "machine": platform.processor() or
         platform.machine(),
         "produced_by": "aogpt_jax.figures (sampling.timing.compare, random weights)"}
  out.mkdir(parents=True, exist_ok=True)
  tmp = cached.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
  tmp.replace(cached)
  return res


LABELS = {"diffusion": "AO-GPT, KV-cached sampler", "encoder": "encoder-only MDM",
          "ar": "AR decoding (KV cache)"}


def timing_panels(res: dict[str, Any]) -> list[dict[str, Any]]:
  rows, steps = res["rows"], res["settings"]["steps"]
  lines = []
  for method in ("diffusion", "encoder"):
    pts = sorted((r["steps"], r["run_s"]) for r in rows if r["method"] == method)
    lines.append({"label": LABELS[method], "x": [s for s, _ in pts], "y": [t for _, t in pts]})
  ar = [r["run_s"] for r in rows if r["method"] == "ar"]
  if ar:
    lines.append({"label": LABELS["ar"], "x": list(steps), "y": [ar[0]] * len(steps),
                  "style": "--"})
  s = res["settings"]
  return [{"title": f"{s['batch']} samples x {s['length']} tokens ({res['backend']})",
           "xlabel": "steps T", "ylabel": "seconds per batch (best of "
           f"{s['repeats']})", "xscale": "log2", "lines": lines}]
