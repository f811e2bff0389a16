"""The figures that are computed rather than read from training metrics, each cached as a JSON
file so that a second call only draws:

* Figure 4 (`ensemble`): zero-shot perplexity of a trained AO-GPT against the context-order
  ensemble size M (`aogpt_jax.evaluation`, Eq. 4), with its L2R perplexity for reference, on the
  run's held-out split. Cached as OUT/eval/fig4.json (`evaluation.write_results`).
* Figure 5 (`timing`): wall time of one batch of samples against the number of steps T for the
  AO-GPT KV-cached sampler, the encoder-only MDM and AR decoding (`sampling.timing.compare`, the
  logic of benchmarks/sample_speed.py; random weights, since speed does not depend on them).
  Cached as OUT/timing.json.
* The Table 1 analogue (`genppl`): generative perplexity and unigram entropy of AO-GPT samples
  against T at the paper's three annealing settings (`evaluation.genppl.run_grid`), judged by a
  GPT-2 or by an L2R run (`L2RJudge`). Cached as OUT/genppl.json.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import platform
from typing import Any

from aogpt_jax.figures import sizes
from aogpt_jax.train import workdir as workdir_lib


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
  workdir_lib.write_json_atomic(cached, json.dumps(res, indent=2) + "\n")
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


class L2RJudge:
  """A judge for generative perplexity when no GPT-2 is given: a model of this codebase trained
  left to right on the same corpus (Figure 2's L2R run), scoring samples as GPT-2 does in
  `evaluation.genppl` (the first token is context; tokens 1..L-1 are scored)."""

  def __init__(self, m):
    self.m, self.cfg = m, m.cfg

  def token_nll(self, tokens, *, prepend_eot: bool = False, batch_size: int = 8,
                eot: int = 0):
    import numpy as np
    from aogpt_jax.evaluation import perplexity as ppl_lib
    del eot
    if prepend_eot:
      raise ValueError("the L2R judge scores tokens 1..L-1 (no end-of-text in front)")
    tokens = np.asarray(tokens)
    out = []
    for a in range(0, len(tokens), batch_size):
      chunk = tokens[a:a + batch_size]
      nll, _ = ppl_lib.token_nll(self.m, chunk, np.arange(a, a + len(chunk)), order="l2r")
      out.append(np.asarray(nll, np.float64)[:, 1:])     # L2R: order space = positions
    return np.concatenate(out)


def genppl(model_wd, judge_wd, judge_gpt2: str, cfg, out: str | pathlib.Path,
           ts: sizes.GenPPLSize) -> dict[str, Any]:
  """The Table 1 analogue's numbers (`evaluation.genppl.run_grid` rows): AO-GPT samples at the
  paper's three (top-p, temperature) settings and ``ts.steps``, scored by GPT-2 (``judge_gpt2``,
  a local folder) or else by the L2R run in ``judge_wd``; computed once."""
  out = pathlib.Path(out)
  cached = out / "genppl.json"   # not table1.json: that is the drawn figure's data
  want = {**dataclasses.asdict(ts), "steps": list(ts.steps), "judge": judge_gpt2 or "l2r run"}
  if cached.exists():
    res = json.loads(cached.read_text(encoding="utf-8"))
    if res.get("settings") == want:
      return res
  import jax
  import numpy as np
  from aogpt_jax import sampling
  from aogpt_jax.checkpoints import store
  from aogpt_jax.evaluation import genppl as genppl_lib
  if judge_gpt2 and cfg.data.tokenizer != "gpt2":
    raise ValueError(f"--judge: GPT-2 scores GPT-2 tokens, but the runs use data.tokenizer="
                     f"{cfg.data.tokenizer!r}; leave --judge out to use the L2R run as judge")
  m, _ = store.load_model(model_wd, which="ema")
  scorer = (genppl_lib.GPT2Scorer.from_pretrained(judge_gpt2) if judge_gpt2 else
            L2RJudge(store.load_model(judge_wd, which="ema")[0]))

  def sample_fn(*, num_samples, steps, top_p, temperature, seed):
    s = sampling.SampleSettings(length=ts.length, steps=steps, top_p=top_p,
                                temperature=temperature, order="random")
    return np.asarray(sampling.generate(m, jax.random.key(seed), s, batch=num_samples).tokens)

  rows = genppl_lib.run_grid(sample_fn, scorer, num_samples=ts.num_samples,
                             grid={"sampling": genppl_lib.GRID["sampling"],
                                   "steps": list(ts.steps)})
  res = {"settings": want, "rows": rows, "model": str(model_wd),
         "judge": judge_gpt2 or str(judge_wd),
         "produced_by": "aogpt_jax.figures (evaluation.genppl.run_grid)"}
  out.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json_atomic(cached, json.dumps(res, indent=2) + "\n")
  return res


def genppl_panels(res: dict[str, Any]) -> list[dict[str, Any]]:
  judge = "GPT-2" if res["settings"]["judge"] != "l2r run" else "the L2R run"
  panels = []
  for title, key, ylabel in (
      (f"generative perplexity (judge: {judge})", "gen_ppl", "perplexity (corpus)"),
      ("unigram entropy of the samples", "unigram_entropy", "nats (per-sample mean)")):
    lines = []
    for s in genppl_grid_settings(res["rows"]):
      pts = sorted((r["steps"], r[key]["corpus" if key == "gen_ppl" else "per_sample_mean"])
                   for r in res["rows"] if (r["top_p"], r["temperature"]) == s)
      lines.append({"label": f"top-p {s[0]}, temperature {s[1]}", "x": [p for p, _ in pts],
                    "y": [v for _, v in pts]})
    panels.append({"title": title, "xlabel": "steps T", "ylabel": ylabel, "xscale": "log2",
                   "lines": lines})
  return panels


def genppl_grid_settings(rows) -> list[tuple[float, float]]:
  out = []
  for r in rows:
    if (r["top_p"], r["temperature"]) not in out:
      out.append((r["top_p"], r["temperature"]))
  return out
