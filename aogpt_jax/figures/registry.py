"""What each figure is: the training runs it needs (config file + argument + overrides, from
configs/experiments/), the curves it draws from their metrics.jsonl, and the finding it tests.

A run is named ``FIGURE/VARIANT`` and lives in WORKDIR/FIGURE/VARIANT; a figure may draw a run
another figure owns (Figure 3a's L2R line is Figure 2's L2R run), which then trains once. Figures
4 and 5 and the Table 1 analogue are computed (`aogpt_jax.figures.extras`) rather than read from
training metrics.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run: ``python -m aogpt_jax.main --config=CONFIG:ARG[,tiny]`` plus overrides."""
  key: str                      # FIGURE/VARIANT (its folder under WORKDIR)
  config: str                   # path relative to the repository root
  arg: str                      # the config file's variant argument
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def owner(self) -> str:
    return self.key.split("/")[0]


@dataclasses.dataclass(frozen=True)
class Curve:
  """One line of a panel: ``metric`` of run ``run`` against the step."""
  run: str
  metric: str
  label: str


@dataclasses.dataclass(frozen=True)
class Panel:
  title: str
  ylabel: str
  curves: tuple[Curve, ...]


@dataclasses.dataclass(frozen=True)
class Figure:
  name: str
  title: str
  kind: str                     # curves (training metrics) | ensemble (Fig. 4) | timing (Fig. 5)
                                # | genppl (Table 1)
  runs: tuple[str, ...]         # run keys it needs trained
  finding: str                  # the paper's finding it tests
  panels: tuple[Panel, ...] = ()


def _variants(fig: str, config: str, names) -> dict[str, Run]:
  return {f"{fig}/{n}": Run(f"{fig}/{n}", f"configs/experiments/{config}", n) for n in names}


RUNS: dict[str, Run] = {
    **_variants("fig2", "fig2_l2r_vs_any_order.py", ("l2r", "any_order")),
    **_variants("fig3a", "fig3a_orders.py", ("fixed_random", "blockwise")),
    # fig3b's "uniform" variant is fig2's any-order run (the same config): drawn from there.
    **_variants("fig3b", "fig3b_mixture.py", ("mixture_10",)),
    **_variants("fig7", "fig7_target_injection.py", ("adaln", "sigma_gpt", "repeat", "per_block")),
    # fig8's 0.9999 (the published decay) is fig7's adaLN run (the same config): drawn from there.
    **_variants("fig8", "fig8_ema.py", ("0.99", "0.999", "none")),
}

NATS = "nats per token"
_INJECTION = {"adaln": "adaLN (AO-GPT)", "sigma_gpt": "input only (sigma-GPT)",
              "repeat": "repeat per block", "per_block": "separate per block"}
_EMA = {"fig8/0.99": "EMA 0.99", "fig8/0.999": "EMA 0.999", "fig7/adaln": "EMA 0.9999",
        "fig8/none": "no EMA"}

FIGURES: dict[str, Figure] = {f.name: f for f in (
    Figure(
        "fig2", "Figure 2: left-to-right vs any-order training", "curves",
        ("fig2/l2r", "fig2/any_order"),
        "Finding 1: L2R training converges faster (lower loss at every step) than any-order "
        "training of the same decoder.",
        (Panel("training loss (own order)", NATS,
               (Curve("fig2/l2r", "train/loss", "L2R"),
                Curve("fig2/any_order", "train/loss", "any-order"))),
         Panel("held-out loss (own order, EMA weights)", NATS,
               (Curve("fig2/l2r", "eval/loss_l2r", "L2R"),
                Curve("fig2/any_order", "eval/loss_random", "any-order"))))),
    Figure(
        "fig3a", "Figure 3a: L2R, block-wise and fixed random orders", "curves",
        ("fig2/l2r", "fig3a/blockwise", "fig3a/fixed_random"),
        "Finding 2: L2R < block-wise < one fixed random order (the more an order keeps "
        "neighbours together, the easier it is to learn).",
        (Panel("training loss (own order)", NATS,
               (Curve("fig2/l2r", "train/loss", "L2R"),
                Curve("fig3a/blockwise", "train/loss", "block-wise (16)"),
                Curve("fig3a/fixed_random", "train/loss", "fixed random"))),
         Panel("held-out loss (own order, EMA weights)", NATS,
               (Curve("fig2/l2r", "eval/loss_l2r", "L2R"),
                Curve("fig3a/blockwise", "eval/loss_train_order", "block-wise (16)"),
                Curve("fig3a/fixed_random", "eval/loss_train_order", "fixed random"))))),
    Figure(
        "fig3b", "Figure 3b: 10% L2R mixed into any-order training", "curves",
        ("fig3b/mixture_10", "fig2/any_order"),
        "Finding 3: mixing 10% L2R sequences lowers the L2R loss markedly and costs little "
        "any-order loss.",
        (Panel("held-out L2R loss", NATS,
               (Curve("fig3b/mixture_10", "eval/loss_l2r", "10% L2R mixture"),
                Curve("fig2/any_order", "eval/loss_l2r", "uniform orders"))),
         Panel("held-out any-order loss", NATS,
               (Curve("fig3b/mixture_10", "eval/loss_random", "10% L2R mixture"),
                Curve("fig2/any_order", "eval/loss_random", "uniform orders"))))),
    Figure(
        "fig4", "Figure 4: perplexity against context-order ensemble size M", "ensemble",
        ("fig3b/mixture_10",),
        "Finding 6: any-order perplexity falls as the ensemble size M grows; the L2R "
        "perplexity of the same model is drawn for reference."),
    Figure(
        "fig5", "Figure 5: generation time against the number of steps", "timing", (),
        "Findings 7 / 8.1: the KV-cached AO-GPT sampler's time is nearly flat in the number "
        "of steps T; the encoder-only MDM's grows linearly in T; AR decoding is one line."),
    Figure(
        "table1", "Table 1 analogue: generation quality against steps", "genppl",
        ("fig3b/mixture_10", "fig2/l2r"),
        "Generative perplexity of AO-GPT samples against the number of steps T at the three "
        "annealing settings (top-p / temperature 1.0/1.0, 0.95/0.9, 0.95/0.7), judged by GPT-2 "
        "Large when given (--judge) or else by the L2R run, always with the samples' unigram "
        "entropy (low perplexity with low entropy means repetitive samples)."),
    Figure(
        "fig7", "Figure 7: target-position injection", "curves",
        tuple(f"fig7/{v}" for v in _INJECTION),
        "adaLN in every block gives the lowest any-order loss of the four injections.",
        (Panel("held-out any-order loss", NATS,
               tuple(Curve(f"fig7/{v}", "eval/loss_random", lab)
                     for v, lab in _INJECTION.items())),
         Panel("held-out L2R loss", NATS,
               tuple(Curve(f"fig7/{v}", "eval/loss_l2r", lab)
                     for v, lab in _INJECTION.items())))),
    Figure(
        "fig8", "Figure 8: EMA of the weights", "curves",
        tuple(_EMA),
        "EMA weights evaluate lower than the live weights, the more so the longer the "
        "average (0.9999 best at the paper's scale).",
        (Panel("held-out any-order loss", NATS,
               tuple(Curve(run, "eval/loss_random", lab) for run, lab in _EMA.items())),
         Panel("held-out L2R loss", NATS,
               tuple(Curve(run, "eval/loss_l2r", lab) for run, lab in _EMA.items())))),
)}


def resolve_names(names: list[str]) -> list[str]:
  """Figure names from the command line (``all``, ``fig2``, ``2``, ``3a``), in paper order."""
  out = []
  for n in names:
    if n == "all":
      out += list(FIGURES)
      continue
    key = n if n in FIGURES else f"fig{n}" if f"fig{n}" in FIGURES else f"table{n}"
    if key not in FIGURES:
      raise ValueError(f"FIGURE: {n!r} is not a figure; expected all or one of "
                       f"{', '.join(FIGURES)}")
    out.append(key)
  return [f for f in FIGURES if f in out]


def runs_of(figures: list[str]) -> list[Run]:
  keys = []
  for f in figures:
    keys += [k for k in FIGURES[f].runs if k not in keys]
  return [RUNS[k] for k in keys]
