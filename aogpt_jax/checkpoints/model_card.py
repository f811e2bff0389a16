"""A Hugging Face Hub folder for one of our checkpoints: `convert export --hub-dir DIR`.

DIR gets ``model.safetensors`` + ``config.json`` (`convert.export_safetensors`) and a model card
``README.md``: the architecture (every ModelConfig field), the training recipe from the run's
``config.json`` and the evaluation tables the run wrote (WORKDIR/eval/*.md). Upload DIR as is
(``hf upload OWNER/REPO DIR``); ``--checkpoint=hf:/path/to/DIR`` (or
``hf:OWNER/REPO`` once it is in the local Hugging Face cache) reads it back.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any, Mapping

RECIPE_KEYS = ("objective", "order.name", "order.kwargs", "seq_len", "batch_size",
               "microbatches", "total_steps", "optimizer.lr", "optimizer.warmup_steps",
               "optimizer.decay_steps", "optimizer.min_lr_ratio", "optimizer.weight_decay",
               "optimizer.b1", "optimizer.b2", "optimizer.grad_clip", "optimizer.ema_decay",
               "data.source", "data.tokenizer", "seed")


def _get(d: Mapping[str, Any], dotted: str):
  for k in dotted.split("."):
    if not isinstance(d, Mapping) or k not in d:
      return None
    d = d[k]
  return d


def card(model_cfg, run: Mapping[str, Any] | None, evals: Mapping[str, str],
         loaded: Mapping[str, Any] | None = None) -> str:
  """The model card text (markdown with the Hub's YAML header)."""
  lines = ["---", "library_name: aogpt_jax", "tags:", "- any-order-gpt", "- masked-diffusion",
           "- jax", "---", "", "# AO-GPT checkpoint (aogpt_jax)", "",
           "An Any-Order GPT: a decoder-only transformer trained with the any-order autoregressive "
           "(masked diffusion) objective. Load it with "
           "`python -m aogpt_jax.main --mode=eval|sample|genppl --checkpoint=hf:OWNER/REPO` (from "
           "the local Hugging Face cache) or `--checkpoint=hf:/path/to/this/folder`.", ""]
  if loaded:
    lines += [f"Weights: `{loaded.get('weights', '?')}` at step {loaded.get('step', '?')}.", ""]
  lines += ["## Architecture", "", "| field | value |", "|---|---|"]
  lines += [f"| {k} | `{v}` |" for k, v in dataclasses.asdict(model_cfg).items()]
  lines += ["", "## Training recipe", ""]
  if run:
    lines += ["| setting | value |", "|---|---|"]
    lines += [f"| {k} | `{json.dumps(_get(run, k))}` |" for k in RECIPE_KEYS
              if _get(run, k) is not None]
  else:
    lines += ["Not recorded (no run config.json)."]
  lines += ["", "## Evaluation", ""]
  if evals:
    for name, table in sorted(evals.items()):
      lines += [f"### {name}", "", table.strip(), ""]
  else:
    lines += ["No evaluation was run (`--mode=eval` / `--mode=genppl` write WORKDIR/eval/).", ""]
  return "\n".join(lines).rstrip() + "\n"


def write(out_dir: str, model_cfg, workdir: str | None = None,
          loaded: Mapping[str, Any] | None = None) -> str:
  """Writes OUT_DIR/README.md from the run in ``workdir`` (its config.json and eval/*.md)."""
  run, evals = None, {}
  if workdir:
    path = os.path.join(workdir, "config.json")
    if os.path.exists(path):
      with open(path) as f:
        run = json.load(f)
    for md in sorted(glob.glob(os.path.join(workdir, "eval", "*.md"))):
      with open(md) as f:
        evals[os.path.splitext(os.path.basename(md))[0]] = f.read()
  path = os.path.join(out_dir, "README.md")
  with open(path, "w") as f:
    f.write(card(model_cfg, run, evals, loaded))
  return path
