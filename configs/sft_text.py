"""Supervised fine-tuning on prompt / response text (docs/post_training.md).

  python -m aogpt_jax.main --config=configs/sft_text.py:tiny --workdir=/tmp/sft \
      --config.train.init_from=/tmp/aogpt_quickstart        # CPU: the quickstart's model
  python -m aogpt_jax.main --config=configs/sft_text.py:tiny --workdir=/tmp/sft --mode=solve

The data is the ``pairs`` task (aogpt_jax/tasks/text_pairs.py): a JSONL file of
``{"prompt", "response"}`` lines (``task.options.path``) or a ``datasets`` dataset
(``task.options.dataset``), rows of ``task.options.length`` tokens (= ``seq_len``): the prompt,
the response, end-of-text padding that is scored. The prompt comes first in every order and is
not scored; the response is trained under the order mixture of pretraining.
``train.init_from=SPEC`` (a WORKDIR, ``gpt2:DIR``, ``causal:DIR``, a converted folder) starts
from pretrained weights whose model must match ``model.*`` field for field; left "" the run
starts from scratch.

Arguments: ``tiny``: the quickstart's model (byte tokens), ``examples/sft_tiny.jsonl`` (sums and
reversed words), 32-token rows, 300 steps. Without it: AO-GPT Small with the GPT-2 tokenizer,
1024-token rows; set ``task.options.path`` (or ``dataset``) and ``train.init_from``.
"""

import os

from aogpt_jax import recipes
from aogpt_jax import tasks

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                        "sft_tiny.jsonl")


def get_config(arg=None):
  """Every option of the ``pairs`` task is a key of ``task.options`` (``--config.task.options.
  truncate=true``, ``dataset=``, ...); ``data.tokenizer`` follows ``task.options.tokenizer`` (the
  run's tokenizer, recorded in config.json and read by --mode=sample / eval / solve)."""
  tokens = [t.strip() for t in (arg or "").split(",") if t.strip()]
  if tokens not in ([], ["tiny"]):
    raise ValueError(f"config argument {arg!r}: this config file takes only 'tiny'")
  if tokens:
    c = recipes.quickstart()
    options = {"path": EXAMPLES, "tokenizer": "byte", "length": 32}
    run = {"batch_size": 32, "total_steps": 300, "log_every": 50, "eval_every": 100,
           "checkpoint_every": 100, "optimizer.lr": 1e-3, "optimizer.warmup_steps": 20,
           "optimizer.ema_decay": 0.99, "task.heldout_count": 64, "solve.count": 64}
  else:
    c = recipes.paper("small")
    options = {"path": "", "tokenizer": "gpt2", "length": 1024}
    run = {"batch_size": 64, "microbatches": 4, "total_steps": 2000, "log_every": 20,
           "eval_every": 250, "checkpoint_every": 500, "optimizer.lr": 2e-5,
           "optimizer.warmup_steps": 100, "optimizer.min_lr_ratio": 0.1,
           "optimizer.ema_decay": 0.0, "task.heldout_count": 256, "solve.count": 256}
  c = recipes.apply(c, {
      "task.name": "pairs", "task.options": dict(tasks.base.defaults("pairs"), **options),
      "seq_len": options["length"],
      "model.loss_chunk": 0,        # a task scores only its answer (the chunked loss scores all)
      "optimizer.decay_steps": 0,
      # --mode=solve: greedy, the most confident position first, one token per step
      "sample.method": "adaptive", "sample.policy": "max_prob", "sample.greedy": True,
      "sample.steps": options["length"],
      **run})
  c.data.tokenizer = c.task.options.get_ref("tokenizer")   # one value: setting either sets both
  return c
