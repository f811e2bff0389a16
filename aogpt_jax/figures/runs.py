"""The training runs of the figures: their configs at a size, whether they are finished, their
cost, training (or resuming) them in this process, and reading their metrics back."""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

from aogpt_jax import config as config_lib
from aogpt_jax import recipes
from aogpt_jax.figures import registry
from aogpt_jax.figures import sizes

REPO = pathlib.Path(__file__).resolve().parents[2]

# Wall-time estimate of --dry-run at the CPU sizes: tokens per second of the ``tiny`` preset on
# the project's 2-core CPU box (benchmarks/results/quickstart: 7348 tokens/s at 128-token blocks,
# the machine shared). The estimate scales it by model FLOPs per token.
CPU_TINY_TOKENS_PER_S = 7348.0
# Accelerator estimate at --size=small/medium: an H100's dense bf16 peak at 40% MFU.
ACCEL_FLOPS_PER_S = 989e12 * 0.4


def load_config_file(path: str, arg: str):
  """``get_config(arg)`` of a config file of the repository (configs/...)."""
  full = REPO / path
  if not full.is_file():
    raise FileNotFoundError(f"{path}: config file not found under {REPO} (the figures need the "
                            f"repository's configs/ folder: run from a source checkout)")
  return recipes.config_file(full, arg)


def run_config(run: registry.Run, size: str, data: dict[str, Any] | None = None):
  """The run's config at ``size``; ``data``: ``data.*`` overrides (``glob`` switches the source
  to ``text_files``)."""
  tiny, overrides = sizes.run_overrides(size, run.owner)
  cfg = load_config_file(run.config, f"{run.arg},tiny" if tiny else run.arg)
  recipes.apply(cfg, {**overrides, **run.overrides})
  data = dict(data or {})
  if data.get("glob"):
    data.setdefault("source", "text_files")
  for k, v in data.items():
    if k not in cfg.data:
      raise ValueError(f"--data.{k}: not a data config key; keys: {', '.join(sorted(cfg.data))}")
    cfg.data[k] = _typed(f"--data.{k}", v, cfg.data[k])
  config_lib.check_keys(cfg)
  return cfg


def _typed(flag: str, value: str, like: Any) -> Any:
  """``value`` (command-line text) as the type of the config's current value ``like``."""
  if isinstance(like, bool):
    if value.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"{flag}={value}: expected true or false")
    return value.lower() in ("true", "1")
  if isinstance(like, (int, float)):
    try:
      return type(like)(value)
    except ValueError:
      raise ValueError(f"{flag}={value}: expected a {type(like).__name__}") from None
  return value


def read_metrics(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
  """The rows of WORKDIR/metrics.jsonl (a torn last line is skipped)."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  rows = []
  if path.exists():
    for line in path.read_text(encoding="utf-8").splitlines():
      try:
        rows.append(json.loads(line))
      except ValueError:
        continue
  return rows


def is_finished(workdir: str | pathlib.Path, cfg) -> bool:
  """The run reached ``total_steps`` and evaluated there (the trainer's last act before its final
  checkpoint), and its config.json is the config asked for."""
  workdir = pathlib.Path(workdir)
  if not any(r.get("step") == cfg.total_steps and any(k.startswith("eval/") for k in r)
             for r in read_metrics(workdir)):
    return False
  return (workdir / "checkpoints" / str(cfg.total_steps)).exists()


def check_same_run(workdir: str | pathlib.Path, cfg) -> None:
  """Refuses to resume a run folder made with another size or config (nothing is overwritten)."""
  path = pathlib.Path(workdir) / "config.json"
  if not path.exists():
    return
  old = json.loads(path.read_text(encoding="utf-8"))
  new = config_lib.resolved_dict(cfg, config_lib.resolve(cfg))   # as the trainer writes it
  diff = sorted(k for k in ("seq_len", "batch_size", "total_steps", "model", "order",
                            "optimizer", "objective") if old.get(k) != new.get(k))
  if diff:
    raise ValueError(f"--workdir: {workdir} holds a run with another config ({', '.join(diff)} "
                     f"differ; another --size?); use a new --workdir")


def cost(cfg) -> dict[str, float]:
  """Steps, tokens, model FLOPs (`train.flops`) and an estimated wall time of a run."""
  from aogpt_jax.train import flops as flops_lib
  mc = config_lib.resolve(cfg)
  flops = cfg.total_steps * flops_lib.train_flops_per_step(mc, cfg.batch_size, cfg.seq_len,
                                                             cfg.microbatches)
  tokens = cfg.total_steps * cfg.batch_size * cfg.seq_len
  if cfg.model.preset == "tiny":
    from aogpt_jax.model import aogpt as model_lib
    ref = flops_lib.train_flops_per_step(model_lib.preset("tiny"), 16, 128) / (16 * 128)
    seconds = flops / (ref * CPU_TINY_TOKENS_PER_S)
    where = "2 CPU cores"
  else:
    seconds = flops / ACCEL_FLOPS_PER_S
    where = "one H100 at 40% MFU"
  return {"steps": cfg.total_steps, "tokens": tokens, "flops": flops, "seconds": seconds,
          "where": where}


def format_cost(c: dict[str, Any]) -> str:
  t = c["seconds"]
  when = f"{t / 60:.1f} min" if t < 3 * 3600 else f"{t / 3600:.1f} h"
  return (f"{c['steps']} steps, {c['tokens'] / 1e6:.3g}M tokens, {c['flops']:.3g} FLOPs, "
          f"~{when} on {c['where']}")


def train(cfg, workdir: str | pathlib.Path) -> dict[str, float]:
  """Trains or resumes the run in ``workdir`` (the trainer's own resume) in this process."""
  from aogpt_jax.train import loop as train_loop
  check_same_run(workdir, cfg)
  out = train_loop.train(cfg, str(workdir))
  if not is_finished(workdir, cfg):
    raise RuntimeError(f"{workdir}: training stopped before total_steps={cfg.total_steps} "
                       f"(interrupted?); run the command again to resume it")
  return out


def unigram_entropy(cfg) -> float:
  """Entropy (nats) of the token frequencies of the held-out blocks the trainer scores (the first
  ``eval.train_max_blocks`` of ``eval.split``): the lowest loss a model that ignores every other
  token could reach on them. A loss curve that stays at it has learned nothing of context."""
  import numpy as np
  from aogpt_jax import data as data_lib
  counts = np.zeros(0, np.int64)
  for b in data_lib.eval_batches(cfg.data, split=cfg.eval.split, seq_len=cfg.seq_len,
                                 global_batch_size=cfg.eval.batch_size or cfg.batch_size,
                                 max_blocks=cfg.eval.train_max_blocks):
    toks = np.asarray(b["tokens"])[np.asarray(b["weight"]) > 0].ravel()
    c = np.bincount(toks)
    counts = np.pad(counts, (0, max(0, len(c) - len(counts))))
    counts[:len(c)] += c
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


def series(workdir: str | pathlib.Path, metric: str) -> tuple[list[int], list[float]]:
  """(steps, values) of ``metric`` in the run's metrics.jsonl, in step order."""
  pts = sorted((r["step"], float(r[metric])) for r in read_metrics(workdir) if metric in r)
  pts = [(s, v) for s, v in pts if math.isfinite(v)]
  return [s for s, _ in pts], [v for _, v in pts]
