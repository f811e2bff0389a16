"""``--mode=sample``'s writer: samples a config's ``sample`` group and writes WORKDIR/samples/."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import jax
import ml_collections
import numpy as np

from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax.model.aogpt import AOGPT
from aogpt_jax.sampling.config import config_prompt, settings_from_config
from aogpt_jax.sampling.sampler import PLANLESS_METHODS, plan, prepare, sample_batch
from aogpt_jax.train import metrics as metrics_lib
from aogpt_jax.train import workdir as workdir_lib


def write_samples(model: AOGPT, config: ml_collections.ConfigDict, workdir: str, tokenizer, *,
                  step: int | None = None, loaded: dict | None = None,
                  data: dict | None = None, trained_length: int | None = None) -> str:
  """Samples ``config.sample`` (or ``config`` itself if it is the group) and writes
  WORKDIR/samples/NAME.jsonl (one JSON line per sample: index, tokens, text, order) and
  NAME.json (the settings, the plan, timings, and ``loaded``: which checkpoint, step and weights
  made them; ``data``: the data source, tokenizer and sequence length). A NAME with a '/' is
  refused before sampling. An existing NAME is never overwritten: the new files get NAME-2, NAME-3, ...
  Everything is validated before compiling; one compiled sampler serves every batch. Returns
  the .jsonl path. ``trained_length``: the run's ``seq_len``, the default ``sample.length``
  (else ``model.block_size``)."""
  c = config.sample if "sample" in config else config
  if c.name:
    workdir_lib.check_name(c.name, "sample.name")
  cfg = model.cfg
  s = settings_from_config(c, cfg, trained_length)
  s.validate(cfg)
  if trained_length and s.length > int(trained_length):
    logging.warning("sample.length=%d: positions >= %d (the run's seq_len) were never trained; "
                    "the samples past them are extrapolation", s.length, int(trained_length))
  for f in ("num_samples", "batch_size"):
    if int(c[f]) < 1:
      raise ValueError(f"sample.{f}: must be >= 1, got {c[f]}")
  base = config_prompt(c, tokenizer, s.length, cfg.valid_vocab_size)
  key = jax.random.key(int(c.seed))
  num, bs = int(c.num_samples), int(c.batch_size)
  bs = min(bs, num)
  prompt = None if base is None else tuple(np.repeat(a, bs, axis=0) for a in base)
  # Every batch has bs rows (the last one padded with samples num.. that are not written), so
  # one compiled sampler serves the whole run.
  batches = [prepare(cfg, key, s, prompt=prompt, batch=bs, sample_offset=off)
             for off in range(0, num, bs)]
  plans = ([None] * len(batches) if s.method in PLANLESS_METHODS
           else plan(batches, method=s.method))
  out_dir = os.path.join(workdir, "samples")
  # An unwritable workdir fails before sampling; the folder itself appears with the files.
  checkpoint_lib.check_writable(out_dir, "--workdir", keep=False)
  t0 = time.perf_counter()
  progress = metrics_lib.ProgressLog("sample batches", len(batches))
  outs = []
  for i, (p, pl) in enumerate(zip(batches, plans)):
    outs.append(jax.block_until_ready(sample_batch(model, p, pl, s)))
    progress.update(i + 1)
  seconds = time.perf_counter() - t0
  queries = "_all" if s.draft_queries == "all" else ""
  steps = ("" if s.method == "ar" else f"_K{s.draft}{queries}_{s.order}"
           if s.method == "speculative" else f"_T{s.num_steps}_{s.schedule}_{s.count_mode}")
  rule = "" if s.top_p_rule == "published" or s.top_p == 1 else s.top_p_rule
  name = c.name or (f"{s.method}{steps}_p{s.top_p:g}{rule}_t{s.temperature:g}_seed{int(c.seed)}")
  stem = workdir_lib.fresh_stem(out_dir, name, (".jsonl", ".json"))
  path = os.path.join(out_dir, stem + ".jsonl")
  os.makedirs(out_dir, exist_ok=True)
  with open(path, "x") as f:
    for off, o in zip(range(0, num, bs), outs):
      for i, (toks, order) in enumerate(zip(o.tokens[:num - off], o.order[:num - off])):
        f.write(json.dumps({"index": off + i, "tokens": toks.tolist(),
                            "text": tokenizer.decode(toks.tolist()),
                            "order": order.tolist()}) + "\n")
  meta = {"settings": {k: (v.tolist() if isinstance(v, np.ndarray) else v)
                       for k, v in dataclasses.asdict(s).items()} | {"steps": s.num_steps},
          "config": c.to_dict(), "checkpoint_step": step, "loaded": loaded, "data": data,
          "model": cfg.to_dict(),
          "num_samples": num, "seconds_incl_compile": round(seconds, 3),
          "tokens_per_s_incl_compile": round(num * s.length / seconds, 1),
          "plan": None if plans[0] is None else plans[0].stats()}
  if s.method == "speculative":
    passes = np.concatenate([o.passes[:num - off] for off, o in zip(range(0, num, bs), outs)])
    meta["passes_per_token"] = round(float(passes.sum() / max(1, sum(
        int((~b.prompt_mask[:num - off]).sum()) for off, b in zip(range(0, num, bs), batches)))), 4)
  with open(os.path.join(out_dir, stem + ".json"), "x") as f:
    json.dump(meta, f, indent=1)
  return path
