"""Evaluation: the public API, and its pieces.

    from aogpt_jax import evaluation
    settings = evaluation.EvalSettings(num_orders=4, ensemble_max_m=8)
    results = evaluation.evaluate(model, {"heldout": lambda: batches}, settings, workdir=WORKDIR)
    results = evaluation.evaluate_workdir(WORKDIR, {"heldout": lambda: batches}, settings)

  zero_shot.py    `evaluate`: L2R, any-order and ensemble perplexities over datasets, one pass each
  report.py       WORKDIR/eval/<name>.json and .md (the paper's Table 4 layout)
  settings.py     EvalSettings and the ``eval`` config group
  perplexity.py   per-order NLLs: orders, weighting, float64 sums
  ensembles.py    context-order ensembles (Eq. 4) with prefixes only
  encoder_nll.py  the encoder-only MDM's exact order NLL and ELBO
  genppl.py       generative perplexity over a sampling grid, scored by `gpt2.py` (a JAX GPT-2)
  lmeval.py       the lm-evaluation-harness adapter (``python -m aogpt_jax.evaluation.lmeval``)

Names are imported on first use.
"""

from aogpt_jax import lazy_exports

_EXPORTS = {
    "EvalSettings": "settings", "evaluate": "zero_shot", "evaluate_dataset": "zero_shot",
    "evaluate_workdir": "zero_shot", "write_results": "report", "markdown_table": "report",
    "markdown_comparison": "report",
}
_MODULES = ("zero_shot", "report", "settings", "perplexity", "ensembles", "encoder_nll",
            "genppl", "gpt2", "lmeval")

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, _MODULES)
