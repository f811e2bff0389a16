"""The paper's figures by one command::

    python -m aogpt_jax.figures all --size=tiny --workdir=/tmp/figures      # 2 CPU cores
    python -m aogpt_jax.figures fig3b --size=small --workdir=gs://...        # the paper's runs
    python -m aogpt_jax.figures all --size=tiny --workdir=DIR --dry-run      # runs and cost

Every run a figure needs trains (or resumes, with the trainer's own resume) in
WORKDIR/FIGURE/VARIANT; finished runs are not trained again, so a second call only draws.
Each figure is written as WORKDIR/FIGURE/FIGURE.png and .svg (matplotlib, ``pip install -e
.[plots]``), with the plotted numbers beside it as .md and .json.

  registry.py  the figures: their runs (configs/experiments/ + variant) and what they plot
  sizes.py     --size: micro (tests), tiny (CPU; the `TINY_BUDGET` table), small, medium
  runs.py      configs at a size, finished or not, estimated cost, training, metrics.jsonl
  extras.py    Figure 4 (ensemble perplexity against M), Figure 5 (sampling time against T) and
               the Table 1 analogue (generative perplexity and entropy against T)
  draw.py      the matplotlib figure, PNG/SVG, and the Markdown/JSON of the plotted numbers
  cli.py       the command
"""
