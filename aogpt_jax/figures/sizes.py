"""The sizes of ``python -m aogpt_jax.figures``: what each ``--size`` does to the figure configs.

* ``small`` / ``medium``: the paper's runs. ``small`` is configs/experiments/*.py as written (the
  released order-ablation recipe, GPT-2 Small, 20k steps of 0.5M tokens); ``medium`` is the same
  runs at the Medium preset with the paper's Medium learning rate.
* ``tiny``: the configs' ``:tiny`` argument (byte tokens, the 4-layer ``tiny`` preset, the Python
  standard library or ``--data.glob``) with the budget of `TINY_BUDGET`, meant for 2 CPU cores.
* ``micro``: a one-layer model for a handful of steps; seconds per figure. It only checks that
  the command works (the tests use it); its pictures show nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aogpt_jax import recipes

SIZES = ("micro", "tiny", "small", "medium")

# The --size=tiny budget, per figure (the runs a figure shares use the budget of the figure that
# owns them, e.g. fig3a's L2R line is fig2's run). Shorter blocks (32 bytes, 64 rows: the
# configs' 2,048 tokens per step) than the configs' ``:tiny`` (128), a larger lr, and rotary
# position embeddings (``model.rope``): with the paper's learned positions at 128 bytes the
# any-order loss stays near the unigram entropy for more than a thousand steps on 2 cores; the
# shorter blocks and rope each make it fall well below it within the budget (measured on the
# quickstart config: docs/figures.md, "Choosing the tiny scale").
TINY_COMMON: dict[str, Any] = {
    "seq_len": 32, "batch_size": 64, "optimizer.lr": 3e-3, "optimizer.warmup_steps": 50,
    "model.rope": True, "log_every": 25, "eval.batch_size": 64, "eval.train_max_blocks": 256,
    "checkpoint.keep": 1,
}
TINY_BUDGET: dict[str, dict[str, Any]] = {
    # figure: overrides (steps, evaluation and checkpoint cadence)
    "fig2": {"total_steps": 800, "eval_every": 100, "checkpoint_every": 200},
    "fig3a": {"total_steps": 800, "eval_every": 100, "checkpoint_every": 200},
    "fig3b": {"total_steps": 800, "eval_every": 100, "checkpoint_every": 200},
    "fig7": {"total_steps": 400, "eval_every": 100, "checkpoint_every": 200},
    "fig8": {"total_steps": 400, "eval_every": 100, "checkpoint_every": 200},
}

MICRO: dict[str, Any] = {
    "model.n_layer": 1, "model.n_embd": 32, "model.n_head": 2, "model.target_dim": 8,
    "model.block_size": 32, "seq_len": 16, "batch_size": 8, "total_steps": 4,
    "log_every": 1, "eval_every": 2, "checkpoint_every": 2, "optimizer.warmup_steps": 1,
    "eval.batch_size": 8, "eval.train_max_blocks": 8, "checkpoint.keep": 2,
}

MEDIUM: dict[str, Any] = {
    "model.preset": "medium", "optimizer.lr": recipes.PAPER_LR["medium"],
    "optimizer.min_lr_ratio": recipes.PUBLISHED_MIN_LR / recipes.PAPER_LR["medium"],
}


def run_overrides(size: str, figure: str) -> tuple[bool, dict[str, Any]]:
  """(whether the config file gets its ``tiny`` argument, the overrides applied after it) for a
  run owned by ``figure``."""
  if size == "micro":
    return True, dict(MICRO)
  if size == "tiny":
    return True, {**TINY_COMMON, **TINY_BUDGET.get(figure, TINY_BUDGET["fig2"])}
  if size == "small":
    return False, {}
  if size == "medium":
    return False, dict(MEDIUM)
  raise ValueError(f"--size: {size!r} is not a size; expected one of {', '.join(SIZES)}")


@dataclasses.dataclass(frozen=True)
class EnsembleSize:
  """Figure 4: context-order ensembles of M = 1, 2, 4, ... max_m over the first ``max_blocks``
  held-out blocks."""
  max_m: int
  max_blocks: int


ENSEMBLE = {"micro": EnsembleSize(2, 2), "tiny": EnsembleSize(8, 32),
            "small": EnsembleSize(8, 64), "medium": EnsembleSize(8, 64)}


@dataclasses.dataclass(frozen=True)
class TimingSize:
  """Figure 5: samplers timed at one model size (random weights: speed does not depend on
  them), ``batch`` samples of ``length`` tokens at each number of steps."""
  preset: str
  model: dict[str, Any]
  length: int
  batch: int
  steps: tuple[int, ...]
  repeats: int
  dtype: str = "float32"


TIMING = {
    "micro": TimingSize("tiny", {"n_layer": 1, "n_embd": 32, "n_head": 2, "target_dim": 8,
                                 "block_size": 32}, 16, 2, (2, 8), 1),
    "tiny": TimingSize("tiny", {}, 128, 8, (8, 16, 32, 64, 128), 3),
    "small": TimingSize("small", {}, 1024, 32, (64, 128, 256, 512, 1024), 3, "bfloat16"),
    "medium": TimingSize("medium", {}, 1024, 32, (64, 128, 256, 512, 1024), 3, "bfloat16"),
}


@dataclasses.dataclass(frozen=True)
class GenPPLSize:
  """The Table 1 analogue: ``num_samples`` samples of ``length`` tokens at each number of steps
  and each of the paper's three (top-p, temperature) settings."""
  length: int
  steps: tuple[int, ...]
  num_samples: int


GENPPL = {"micro": GenPPLSize(16, (2, 8), 2), "tiny": GenPPLSize(32, (4, 8, 16, 32), 16),
          "small": GenPPLSize(1024, (64, 128, 256, 512, 1024), 64),
          "medium": GenPPLSize(1024, (64, 128, 256, 512, 1024), 64)}
