"""Training recipes: the shared base of every file in configs/.

* `paper(size, ...)`: the published AO-GPT recipe (docs/method.md, "Training recipe", and the
  released configs):
  AdamW(0.9, 0.95), weight decay 0.05, lr 6e-4 (Small) / 3e-4 (Medium), 2000 warmup steps,
  cosine to min_lr 6e-5 (both sizes, as released) over 500k steps, clip 1.0, 1024 x 1024 = 1M
  tokens per step, bf16 compute, EMA 0.9999, OpenWebText with the GPT-2 tokenizer; memory:
  chunked loss, every block rematerialised, 8 microbatches (docs/scaling.md).
* `ablation(...)`: the recipe of the paper's order ablations (released ``config_order/``):
  0.5M tokens per step for 20k steps, with the cosine still set for 500k steps.
* `tiny(cfg)`: the same run shrunk to CPU size (the byte-level ``tiny`` model on the Python
  standard library, a few hundred steps); what each config file's ``:tiny`` argument applies.
* `quickstart()`: the CPU quickstart.
* `a2o_gpt2_small()` / `a2o_tiny()`: adapting a left-to-right model (GPT-2 Small; the tiny
  ``configs/gpt2_small.py:tiny`` run) to every order (`adapt`).
* `task(name, options, ...)`: training on a puzzle task (configs/sudoku.py, configs/star_graph.py):
  AO-GPT on the given cells with a bidirectional prompt (`TASK_VARIANTS`: ``l2r``, the
  left-to-right baseline of the same size, and ``mdm``, the encoder-only MDM), at one
  accelerator's size or, with ``tiny``, a CPU's; `task_run`: the same recipe for a task named
  later (configs/task.py).
* `post_training(cfg, ...)`, `rl_group`, `dpo_group`: the loop and the ``rl`` / ``dpo`` settings
  of a post-training run on a task config (configs/rl_sudoku.py, configs/dpo_sudoku.py).
* `from_arg(arg, base, variants)`: parses a config file's ``:variant,tiny`` argument.
"""

from __future__ import annotations

from typing import Any, Callable

from ml_collections import config_dict

from aogpt_jax import config as config_lib
from aogpt_jax.model import aogpt as model_lib

PAPER_LR = {"small": 6e-4, "medium": 3e-4}
PUBLISHED_MIN_LR = 6e-5   # the released trainer's min_lr, for both sizes (no config overrides it)
AO_GPT_ORDER = ("mixture", {"p_l2r": 0.1})


def set_path(cfg: config_dict.ConfigDict, path: str, value: Any) -> None:
  """``set_path(cfg, "optimizer.lr", 1e-3)``; dict values become ConfigDicts."""
  *parents, leaf = path.split(".")
  node = cfg
  for p in parents:
    node = node[p]
  if leaf not in node:
    raise KeyError(f"{path}: not a config key")
  node[leaf] = config_dict.ConfigDict(value) if isinstance(value, dict) else value


def apply(cfg: config_dict.ConfigDict, overrides: dict[str, Any]) -> config_dict.ConfigDict:
  for path, value in overrides.items():
    set_path(cfg, path, value)
  return cfg


def paper(size: str = "small", *, target: str = "adaln",
          order: tuple[str, dict] = AO_GPT_ORDER) -> config_dict.ConfigDict:
  c = config_lib.default_config()
  apply(c, {
      "model.preset": size, "model.target": target, "model.dtype": "bfloat16",
      "model.loss_chunk": 1024,   # no [B, n, V] fp32 logits (5 GiB at 8 x 1024 tokens, Small)
      # Each block rematerialised from its input in the backward pass: with 16 x 1024 tokens per
      # device (8 microbatches of 128 rows on 8 devices) Small and Medium fit a 16 GB TPU v5e
      # core (docs/scaling.md); attention_impl=auto takes splash/blockwise on TPU.
      "model.remat": True, "model.remat_policy": "block",
      "order.name": order[0], "order.kwargs": dict(order[1]),
      "data.source": "openwebtext", "data.tokenizer": "gpt2",
      "seq_len": 1024, "batch_size": 1024, "microbatches": 8,   # 1M tokens per step
      "total_steps": 500_000, "log_every": 50, "eval_every": 2500, "checkpoint_every": 2500,
      "optimizer.lr": PAPER_LR[size], "optimizer.warmup_steps": 2000,
      "optimizer.decay_steps": 0, "optimizer.min_lr_ratio": PUBLISHED_MIN_LR / PAPER_LR[size],
      "optimizer.weight_decay": 0.05, "optimizer.grad_clip": 1.0, "optimizer.ema_decay": 0.9999,
      "eval.batch_size": 128, "eval.train_max_blocks": 1024,
      "checkpoint.keep": 3, "checkpoint.keep_every": 50_000,
  })
  return c


def sigma_gpt(size: str = "small") -> config_dict.ConfigDict:
  """The reproduced sigma-GPT baseline of the paper's Tables 4/5 (the published
  ``model_sigmaGPT.py``): `model.SIGMA_GPT_FIELDS` (target once at the input, LayerNorm, no
  QK-norm, tied head without bias, plain normal init), uniformly random orders and no EMA; the
  optimizer recipe is AO-GPT's. Figure 9 adds adaLN and EMA to it step by step."""
  c = paper(size, target="sigma_gpt", order=("uniform", {}))
  apply(c, {f"model.{k}": v for k, v in model_lib.SIGMA_GPT_FIELDS.items()})
  return apply(c, {"optimizer.ema_decay": 0.0})


def mdm(size: str = "small") -> config_dict.ConfigDict:
  """The encoder-only masked diffusion baseline at a paper size: the same blocks, data and recipe
  as AO-GPT, trained on the masked-diffusion ELBO; sampled and evaluated as an encoder."""
  return apply(paper(size, target="none"), {
      # sample.method and eval.model_kind follow the objective (config.follow_objective)
      "objective": "mdm",
  })


def ablation(**kw) -> config_dict.ConfigDict:
  """GPT-2 Small-sized ablation run: 512 x 1024 tokens per step for 20k steps; the cosine is
  set for 500k steps as in the released order-ablation configs."""
  return apply(paper("small", **kw), {
      "batch_size": 512, "microbatches": 4, "total_steps": 20_000,
      "optimizer.decay_steps": 500_000, "eval_every": 1000, "checkpoint_every": 1000,
      "checkpoint.keep_every": 10_000,
  })


def tiny(cfg: config_dict.ConfigDict) -> config_dict.ConfigDict:
  """Shrinks a run to CPU size, keeping its order, target injection and EMA."""
  return apply(cfg, {
      "model.preset": "tiny", "model.dtype": "float32", "model.remat": False,
      "data.source": "python_stdlib", "data.tokenizer": "byte",
      "seq_len": 128, "batch_size": 16, "microbatches": 1,
      "total_steps": 300, "log_every": 10, "eval_every": 100, "checkpoint_every": 100,
      "optimizer.lr": 2e-3, "optimizer.warmup_steps": 30, "optimizer.decay_steps": 0,
      "eval.batch_size": 32, "eval.train_max_blocks": 128,
      "eval.max_blocks": 256,   # --mode=eval: minutes on 2 cores (0 = the whole split)
      "checkpoint.keep": 2, "checkpoint.keep_every": 0,
  })


def quickstart() -> config_dict.ConfigDict:
  """AO-GPT (adaLN target conditioning, ~1M parameters, byte tokens) on the Python standard
  library, with the paper's order mixture (10% L2R rows): 1,800 steps on a CPU, about four
  minutes on 2 cores (``python benchmarks/quickstart.py``, docs/performance.md).

  Scaled so that a few CPU minutes show any-order generation: sequences of 32 bytes (64 per
  step, the same 2,048 tokens as `tiny`), because at 128 the any-order loss stays near the
  unigram entropy for more than a thousand steps while the model learns to find a token's
  neighbours by position; with 32 it falls well below it within a few hundred steps
  (docs/training.md). Rotary positions (``model.rope``: queries at their target's position) on
  top of the learned ones make it fall about three times sooner again. EMA 0.99: its averaging
  window (~100 steps) follows a short run. Sampling defaults to the trained length (32).
  """
  return apply(tiny(paper("small")), {
      "seq_len": 32, "batch_size": 64, "optimizer.lr": 3e-3, "model.rope": True,
      "total_steps": 1800, "log_every": 100, "eval_every": 600, "checkpoint_every": 600,
      "optimizer.warmup_steps": 50, "optimizer.ema_decay": 0.99,
      "eval.train_max_blocks": 512, "eval.max_blocks": 1024,   # 16k / 32k held-out tokens
      "sample.steps": 32,   # one position per step over the trained length
  })


# GPT-2 as an AO-GPT (checkpoints/from_gpt.py): its architecture field for field, and the
# target conditioning added as the identity.
GPT2_FIELDS = dict(norm="layernorm", bias=True, qk_norm=False, tie_embeddings=True,
                   head_bias=False, gelu="tanh")
IDENTITY_FIELDS = dict(zero_init_modulation=True, gate_offset=1.0, zero_init_target=True)


def adapt(cfg: config_dict.ConfigDict, init_from: str, *, steps: int, curriculum_steps: int,
          lr: float, warmup_steps: int) -> config_dict.ConfigDict:
  """Turns an AO-GPT run into the adaptation of a left-to-right model: start from ``init_from``
  (weights only), the identity target conditioning, an order curriculum from all L2R to the
  paper's 10% mixture over ``curriculum_steps``, a lower peak learning rate with a short
  warm-up (the weights are trained already; the new conditioning starts at zero)."""
  apply(cfg, {f"model.{k}": v for k, v in IDENTITY_FIELDS.items()})
  return apply(cfg, {
      "train.init_from": init_from, "total_steps": steps,
      "order.name": "curriculum",
      "order.kwargs": {"steps": curriculum_steps, "p_start": 1.0, "p_end": 0.1},
      "optimizer.lr": lr, "optimizer.warmup_steps": warmup_steps, "optimizer.decay_steps": 0,
      "optimizer.min_lr_ratio": 0.1,
  })


def a2o_gpt2_small() -> config_dict.ConfigDict:
  """GPT-2 Small (the Hugging Face ``openai-community/gpt2`` in the local cache) -> AO-GPT Small:
  GPT-2's architecture (`GPT2_FIELDS`, 1023-token blocks: GPT-2's 1024 positions minus START),
  0.5M tokens per step for 20k steps (10B tokens, 2% of the from-scratch recipe's 500B),
  peak lr 1e-4 after 500 warm-up steps, the curriculum over the first 5k steps."""
  c = apply(paper("small"), {f"model.{k}": v for k, v in GPT2_FIELDS.items()})
  apply(c, {"model.block_size": 1023, "seq_len": 1023, "batch_size": 512, "microbatches": 4,
            "eval_every": 1000, "checkpoint_every": 1000, "checkpoint.keep_every": 5000})
  return adapt(c, "gpt2:openai-community/gpt2", steps=20_000, curriculum_steps=5_000, lr=1e-4,
               warmup_steps=500)


L2R_TINY_WORKDIR = "/tmp/aogpt_l2r_tiny"


def a2o_tiny() -> config_dict.ConfigDict:
  """The CPU analogue: adapts the tiny left-to-right run of ``configs/gpt2_small.py:tiny``
  (trained first into `L2R_TINY_WORKDIR`, same model fields but ``target='none'``): 300 steps,
  the curriculum over the first 100, peak lr 1e-3 (the tiny recipe's 2e-3 halved) after 10
  warm-up steps."""
  return adapt(tiny(paper("small")), "l2r:" + L2R_TINY_WORKDIR, steps=300, curriculum_steps=100,
               lr=1e-3, warmup_steps=10)


def task(name: str, options: dict[str, Any], *, tiny_options: dict[str, Any],
         model: dict[str, Any], tiny_model: dict[str, Any], steps: int, tiny_steps: int,
         arg: str | None, module: str = "") -> config_dict.ConfigDict:
  """A run on the puzzle task ``name`` (aogpt_jax/tasks): AO-GPT with the paper's order mixture
  (10% left to right) over the cells after the givens, which come first in every order, are
  not scored and attend to each other both ways (``model.prompt_attention='bidirectional'``;
  the ``mdm`` variant: 'causal', the encoder being bidirectional already). ``arg``: a config
  file's ``:VARIANT,tiny`` (`TASK_VARIANTS`); ``tiny`` takes
  ``tiny_options`` / ``tiny_model`` / ``tiny_steps``, the CPU size, else ``options`` / ``model`` /
  ``steps``, the size for one accelerator. ``module``: the module of a task of one's own (a dotted
  name or a .py file; ``task.module``), imported first. Solving (``--mode=solve``) defaults to
  greedy adaptive decoding (``max_prob``), one cell per step."""
  from aogpt_jax import tasks  # pylint: disable=g-import-not-at-top
  small, variant = task_arg(arg)
  tasks.import_modules(module)
  t = tasks.make(name, **dict(options, **(tiny_options if small else {})))
  c = task_run(small, variant, length=t.length, model=tiny_model if small else model,
               steps=tiny_steps if small else steps)
  return apply(c, {"task.module": module, "task.name": name,
                   "task.options": tasks.base.options(t)})


def task_arg(arg: str | None, extra: tuple[str, ...] = ()) -> tuple[bool, str | None]:
  """A task config's ``:VARIANT,tiny`` argument: (tiny?, the variant of `TASK_VARIANTS` or None);
  ``extra``: more words the config file takes (and looks for itself)."""
  tokens = [t.strip() for t in (arg or "").split(",") if t.strip()]
  names = [t for t in tokens if t != "tiny" and t not in extra]
  if len(names) > 1 or (names and names[0] not in TASK_VARIANTS):
    raise ValueError(f"config argument {arg!r}: expected at most one of "
                     f"{', '.join(map(repr, sorted(TASK_VARIANTS)))}, optionally with 'tiny'"
                     + "".join(f" or {e!r}" for e in extra))
  return "tiny" in tokens, (names[0] if names else None)


def task_run(small: bool, variant: str | None = None, *, length: int = 0,
             model: dict[str, Any] | None = None, steps: int = 1000) -> config_dict.ConfigDict:
  """The task recipe of `task` without a task: ``length`` 0 leaves ``seq_len`` (and with it
  ``model.block_size``, ``sample.steps``) to follow the task named later (`config.follow_task`);
  ``model``: ``model.*`` fields over the ``tiny`` preset; ``small``: the CPU batch and EMA."""
  c = config_lib.default_config()
  apply(c, {"model.preset": "tiny", "model.block_size": length or None, "seq_len": length})
  apply(c, {f"model.{k}": v for k, v in (model or {}).items()})
  apply(c, {
      # the givens (edges, a question) attend both ways; the answer stays causal in the order
      # (docs/tasks.md, "Reasoning like the encoder"; the MDM variant keeps 'causal')
      "model.prompt_attention": "bidirectional",
      # every blank a query slot, the blanks attending to each other (model/blanks.py; decoded
      # by the adaptive sampler)
      "model.blank_block": True,
      "task.heldout_count": 256,
      "order.name": AO_GPT_ORDER[0], "order.kwargs": dict(AO_GPT_ORDER[1]),
      "batch_size": 64 if small else 256, "total_steps": steps,
      "log_every": 100, "eval_every": 1000, "checkpoint_every": 1000,
      "optimizer.lr": 1e-3, "optimizer.warmup_steps": 100, "optimizer.weight_decay": 0.05,
      "optimizer.ema_decay": 0.99 if small else 0.999,
      "eval.batch_size": 128, "checkpoint.keep": 2,
      "sample.method": "adaptive", "sample.policy": "max_prob", "sample.greedy": True,
      "sample.steps": length or None,
  })
  if variant:
    apply(c, TASK_VARIANTS[variant])
  return c


def config_file(path, arg: str | None = None) -> config_dict.ConfigDict:
  """``get_config(arg)`` (``get_config()`` when ``arg`` is None or "") of the config file at
  ``path``: how one config file builds on another (configs/rl_sudoku.py on configs/sudoku.py)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  full = pathlib.Path(path)
  spec = importlib.util.spec_from_file_location(f"_aogpt_config_{full.stem}", full)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def post_training(cfg: config_dict.ConfigDict, small: bool, *, mode: str, steps: int,
                  tiny_steps: int, tiny_init_from: str = "/tmp/sudoku") -> config_dict.ConfigDict:
  """The loop settings of a post-training run (``--mode=rl`` / ``dpo``, ``mode``) on a task run's
  config: ``total_steps`` updates, logs, evals, checkpoints, ``train.init_from`` (``small``: the
  WORKDIR the docs train first; else the user sets it) and ``train.for_mode``."""
  return apply(cfg, {
      "train.for_mode": mode,
      "train.init_from": tiny_init_from if small else "",
      "total_steps": tiny_steps if small else steps,
      "log_every": 10, "eval_every": 50 if small else 200,
      "checkpoint_every": 50 if small else 200,
      "task.heldout_count": 128 if small else 256,
  })


def rl_group(small: bool) -> dict[str, Any]:
  """The ``rl`` settings of a task's GRPO run (configs/rl_sudoku.py, configs/task.py): the
  reward ``solved`` (the verifier), 8 rollouts per prompt in a random order (the adaptive
  sampler's ``random`` policy, which every model decodes, ``model.blank_block`` included), one
  cell per step (``rl.steps`` 0: the task's length, `config.follow_task`)."""
  return {"rl.reward": "solved", "rl.group_size": 8, "rl.prompts": 8 if small else 32,
          "rl.lr": 1e-4 if small else 3e-5, "rl.steps": 0, "rl.order": "random",
          "rl.method": "adaptive", "rl.policy": "random", "rl.ema_decay": 0.9}


def dpo_group(small: bool) -> dict[str, Any]:
  """The ``dpo`` settings of a task's DPO run (configs/dpo_sudoku.py, configs/task.py): chosen =
  a training row, rejected = it with one or two answer cells changed, the exact left-to-right
  log-likelihood."""
  return {"dpo.pairs": 32 if small else 64, "dpo.beta": 0.1, "dpo.order": "l2r",
          "dpo.lr": 1e-4 if small else 3e-5, "dpo.max_changes": 2, "dpo.ema_decay": 0.9}


# The baselines of a task run (`task`): the same size, data and budget.
TASK_VARIANTS: dict[str, dict[str, Any]] = {
    # GPT-style: the cells after the givens left to right; solved in that order.
    "l2r": {"order.name": "l2r", "order.kwargs": {}, "sample.method": "diffusion",
            "sample.order": "l2r", "model.blank_block": False},
    # The encoder-only masked diffusion model (LLaDA / Dream / Kim et al.'s architecture).
    "mdm": {"objective": "mdm", "model.target": "none", "model.prompt_attention": "causal",
            "model.blank_block": False},
}


def from_arg(arg: str | None, base: Callable[[], config_dict.ConfigDict],
             variants: dict[str, dict[str, Any]] | None = None,
             default: str | None = None) -> config_dict.ConfigDict:
  """A config file's ``get_config(arg)``: ``arg`` is a comma-separated list holding at most
  one variant name (default ``default``) and optionally ``tiny``; the variant's overrides are
  applied after ``tiny`` so they survive it."""
  variants = variants or {}
  tokens = [t.strip() for t in (arg or "").split(",") if t.strip()]
  small = "tiny" in tokens
  names = [t for t in tokens if t != "tiny"]
  unknown = [t for t in names if t not in variants]
  if unknown or len(names) > 1:
    import difflib  # pylint: disable=g-import-not-at-top
    known = [*sorted(variants), "tiny"]
    expected = (f"one of {', '.join(map(repr, sorted(variants)))}, optionally with 'tiny' "
                f"(e.g. ':{sorted(variants)[0]},tiny')" if variants else "only 'tiny'")
    if unknown:
      close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.5)
      raise ValueError(f"config argument {arg!r}: unknown {unknown[0]!r}"
                       + (f" (did you mean {close[0]!r}?)" if close else "")
                       + f"; this config file takes {expected}")
    raise ValueError(f"config argument {arg!r}: {len(names)} variants given; this config file "
                     f"takes {expected}")
  cfg = base()
  if small:
    tiny(cfg)
  name = names[0] if names else default
  if name is not None:
    apply(cfg, variants[name])
  return cfg
