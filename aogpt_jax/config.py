"""Run configuration: every key a run accepts, its checks, and the model it describes.

`default_config()` is the schema: a config file may only set keys that exist here (and the
command line can only override keys that exist in the file's config). `resolve(cfg)` checks
every key and value BEFORE anything is compiled, raising a `ConfigError` that names the key,
and returns the `ModelConfig` the run trains. The mesh-dependent checks (device count, batch
divisibility) live in `aogpt_jax.train.sharding`, which needs the devices.

Top-level keys::

    seed, total_steps, batch_size (global, in sequences), microbatches (gradient accumulation),
    seq_len, log_every, eval_every, checkpoint_every
    model.*       preset + any ModelConfig field (None = the preset's value); the vocabulary is
                  derived from data.tokenizer (valid ids = tokenizer.vocab_size, padded to 64)
    order.*       name (a distribution in aogpt_jax.model.orders) + kwargs for it
    train.*       init_from: start a new run from these weights (a --checkpoint SPEC)
    optimizer.*   AdamW, warmup + cosine schedule, clipping, EMA
    mesh.*        (data, fsdp, tensor) sizes, -1 = all remaining devices; rules: logical -> mesh
    data.*        source, tokenizer, cache_dir
    task.*        a puzzle task (aogpt_jax.tasks) instead of text: module (a task of one's own),
                  name, options, held-out set
    eval.*        evaluation: held-out eval during training and --mode=eval
                  (aogpt_jax/evaluation/settings.py, eval_config)
    sample.*      --mode=sample (aogpt_jax/sampling/sampler.py, sample_config)
    rl.*          --mode=rl: GRPO (aogpt_jax/posttrain/settings.py, rl_config)
    genppl.*      --mode=genppl
    checkpoint.*  retention and async saving
    distributed.* jax.distributed.initialize() options (multi-host)

The ``eval``, ``sample`` and ``rl`` groups are registered by the modules that own them
(`aogpt_jax.config_groups`), so this module imports no sampler or evaluation code.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
from typing import Any

import jax
from ml_collections import config_dict

from aogpt_jax import config_groups
from aogpt_jax.data import config as data_config
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import layers as layers_lib
from aogpt_jax.model import objectives as objectives_lib
from aogpt_jax.model import orders as orders_lib

MESH_AXES = ("data", "fsdp", "tensor")
LOGICAL_AXES = ("vocab", "embed", "qkv", "heads", "mlp", "cond", "mod", "norm", "head_dim")
_FIELD_TYPES = {int: int, float: float, bool: bool, str: str}
# Derived from the tokenizer unless set explicitly.
_DERIVED_MODEL_FIELDS = ("vocab_size", "valid_vocab_size")


class ConfigError(ValueError):
  """A bad configuration value; the message starts with the offending key."""


def default_config() -> config_dict.ConfigDict:
  """The full schema with CPU-sized defaults (the quickstart overrides only a few of them)."""
  c = config_dict.ConfigDict()
  c.seed = 0
  c.total_steps = 1000
  c.batch_size = 32             # global batch, in sequences
  c.microbatches = 1            # gradient accumulation: the batch is split into this many parts
  c.seq_len = 256
  c.objective = "ao"            # ao: any-order AR (AO-GPT / sigma-GPT / GPT) | mdm: encoder-only
                                # masked diffusion baseline (model/encoder.py; order.* unused);
                                # aogpt_jax/model/objectives.py. sample.method and eval.model_kind
                                # follow from it when left "" (follow_objective)
  c.log_every = 10
  c.eval_every = 250            # 0 = only at the end
  c.checkpoint_every = 250      # 0 = only at the end (and on SIGTERM)

  c.model = config_dict.ConfigDict({"preset": "tiny"})
  for f in dataclasses.fields(model_lib.ModelConfig):
    c.model[f.name] = config_dict.placeholder(_FIELD_TYPES[type(f.default)])

  # train.init_from: a --checkpoint SPEC (gpt2:DIR, l2r:WORKDIR, a converted folder, a WORKDIR,
  # ...) whose weights a NEW run starts from (optimizer, EMA and step start fresh; a run that
  # resumes from its own checkpoint ignores it). Its model must match model.* field for field.
  # train.for_mode: "" or the mode a post-training config is for ("rl", "dpo"; set by
  # recipes.post_training): --mode=train on it is one line, not a run from scratch.
  # train.remat: "" (model.remat / model.remat_policy as set) or "auto": chosen on the device
  # from the compiled step's memory estimate (train.loop.choose_remat: off when the step fits
  # the device's memory with a margin, else the saving policy that recomputes least), recorded
  # in config.json and the checkpoints as model.remat / model.remat_policy.
  c.train = config_dict.ConfigDict(dict(init_from="", for_mode="", remat=""))

  c.order = config_dict.ConfigDict({"name": "mixture",
                                    "kwargs": config_dict.ConfigDict({"p_l2r": 0.1})})

  c.optimizer = config_dict.ConfigDict(dict(
      lr=6e-4,               # peak learning rate
      b1=0.9, b2=0.95, eps=1e-8,
      weight_decay=0.05,     # only on parameters with ndim >= 2 (matrices and embeddings)
      warmup_steps=100,      # linear warmup to lr
      decay_steps=0,         # cosine from warmup_steps to here (0 = total_steps)
      min_lr_ratio=0.1,      # the cosine ends at lr * min_lr_ratio
      grad_clip=1.0,         # global-norm clipping (0 = off)
      ema_decay=0.9999,      # 0 or None = no EMA; warm-up min(decay, (1+k)/(10+k))
  ))

  c.mesh = config_dict.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  # Logical parameter axis -> mesh axes ("" = replicated, "a,b" = over both). ``mod`` (adaLN)
  # stays replicated: its rows are computed once per target position and gathered per slot, so
  # splitting its columns over tensor made every layer all-gather a [B, n, 6d] activation.
  c.mesh.rules = config_dict.ConfigDict(dict(
      vocab="tensor", embed="fsdp", qkv="tensor", heads="tensor", mlp="tensor",
      cond="", mod="", norm="", head_dim=""))

  c.data = data_config.default_config()   # fields: aogpt_jax/data/config.py

  # task.name: train on a puzzle task (aogpt_jax/tasks: sudoku, star_graph, ...) instead of
  # data.source. Each row is one puzzle and its solution; the given cells (the prompt) come first
  # in every order and only the rest is scored (prompt-conditioned training); the vocabulary is
  # the task's and seq_len must be its row length. --mode=solve solves its held-out puzzles.
  c.task = config_dict.ConfigDict(dict(
      module="",                     # a module of one's own that registers the task, imported
                                     # first: a dotted name or a .py file (comma-separated: more)
      name="",                       # "" = text from data.*
      options=config_dict.ConfigDict({}),   # the task's options (tasks.make(name, **options))
      heldout_seed=0,                # the held-out puzzles: task.heldout(heldout_seed, count)
      heldout_count=256,             # held-out puzzles scored by the eval during training
  ))

  for name, group in config_groups.groups().items():   # eval.*, sample.*: their owners' defaults
    c[name] = group
  c.genppl = genppl_group()                 # --mode=genppl (samples from the sample group)
  c.solve = solve_group()                   # --mode=solve (a task's puzzles, the sample group)

  c.checkpoint = config_dict.ConfigDict(dict(
      keep=3,                # keep the last N checkpoints ...
      keep_every=0,          # ... plus every checkpoint whose step is a multiple of this (0 = none)
      async_save=True,
  ))

  c.distributed = config_dict.ConfigDict(dict(
      enabled=False,         # also on when the environment sets AOGPT_DISTRIBUTED=1
      coordinator_address="",  # "" = auto-detect (TPU pods, SLURM, ...)
      num_processes=0,       # 0 = auto-detect
      process_id=-1,         # -1 = auto-detect
  ))
  return c


def genppl_group() -> config_dict.ConfigDict:
  """``genppl.*`` (``--mode=genppl``): generative perplexity of samples drawn with the ``sample``
  group's settings, scored by a GPT-2 (the paper: GPT-2 Large)."""
  return config_dict.ConfigDict(dict(
      scorer="hf:openai-community/gpt2-large",  # local HF GPT-2 folder, or hf:OWNER/REPO
      sampling="",          # "TOP_P/TEMPERATURE,...", "paper" (1.0/1.0,0.95/0.9,0.95/0.7);
                            # "" = sample.top_p / sample.temperature
      steps="",             # "64,128,...", "paper" (64..1024); "" = sample.steps
      prepend_eot=False,    # score every token after an end-of-text (default: token 0 = context)
      batch_size=8,         # scorer batch
      name="genppl",        # output file stem under WORKDIR/eval/
  ))


def solve_group() -> config_dict.ConfigDict:
  """``solve.*`` (``--mode=solve``, aogpt_jax/evaluation/solve.py): solve a task's puzzles with
  the ``sample`` group's sampler and check them with the task's verifier."""
  return config_dict.ConfigDict(dict(
      puzzles="heldout",    # "heldout" (task.heldout(task.heldout_seed, solve.count)) or a FILE
                            # the task reads (Sudoku: one puzzle,solution per row, 81 chars)
      count=256,            # puzzles (heldout: how many; FILE: the first this many, 0 = all)
      batch_size=64,        # puzzles per sampler batch (the results do not depend on it)
      seed=0,               # sampling key: puzzle i uses fold_in(key(seed), i)
      name="solve",         # output stem under WORKDIR/solve/ (never overwritten: NAME-2, ...)
      # search decoding (aogpt_jax/sampling/search.py) instead of the sampler: 0 = the sampler;
      # W >= 1 keeps W beams, branching on search_branch tokens at max_prob's cell; the
      # finished beams ranked by pseudo-likelihood ("pll") or cumulative logp ("logp");
      # search_checker=True prunes tokens that break the task's rules (labelled "checker")
      search_width=0,
      search_branch=2,
      search_rescore="pll",
      search_checker=False,
  ))


# ----------------------------------------------------------------------------- checks


def _fail(key: str, msg: str):
  raise ConfigError(f"{key}: {msg}")


FREE_FORM = ("order.kwargs", "task.options")   # checked by their owners, not the schema


def check_keys(cfg, schema=None, prefix: str = "") -> None:
  """Every key of ``cfg`` must exist in the schema (``order.kwargs`` is free-form and checked
  against the chosen distribution instead)."""
  schema = default_config() if schema is None else schema
  for key in cfg.keys():
    name = prefix + key
    if name in FREE_FORM:
      continue
    if key not in schema:
      known = ", ".join(sorted(prefix + k for k in schema.keys()))
      _fail(name, f"unknown config key; known keys here: {known}")
    if isinstance(schema[key], config_dict.ConfigDict):
      if not isinstance(cfg[key], (config_dict.ConfigDict, dict)):
        _fail(name, f"must be a group of keys, got {cfg[key]!r}")
      check_keys(cfg[key], schema[key], name + ".")


def _positive(cfg, *keys: str, allow_zero: bool = False) -> None:
  for key in keys:
    v = cfg
    for part in key.split("."):
      v = v[part]
    if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
      _fail(key, f"must be an integer >= {0 if allow_zero else 1}, got {v!r}")


FOLLOWERS = ("sample.method", "eval.model_kind")   # keys that follow ``objective``


def objective_value(cfg, key: str) -> str:
  """``key`` (one of FOLLOWERS) as set, or the objective's default when left "" (unchecked)."""
  group, name = key.split(".")
  value = str(cfg[group][name] or "")
  if value:
    return value
  try:
    return objectives_lib.get(cfg.objective).follows(key)[0]
  except ValueError as e:
    raise ConfigError(str(e)) from None


def follow_objective(cfg) -> None:
  """Fills each of FOLLOWERS left "" with the objective's default, in place; raises naming the
  key when a run sets one that does not fit the objective's model."""
  try:
    obj = objectives_lib.get(cfg.objective)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  for key in FOLLOWERS:
    value, fits = objective_value(cfg, key), obj.follows(key)
    if value not in fits:
      _fail(key, f"{value!r} does not fit objective={obj.name!r} (use one of {fits}, or leave "
            f"it \"\" to follow the objective)")
    group, name = key.split(".")
    cfg[group][name] = value
  if cfg.eval.ensemble_max_m and not obj.ensembles:
    _fail("eval.ensemble_max_m", f"{cfg.eval.ensemble_max_m}: context-order ensembles (Eq. 4) "
          f"need a model whose prediction depends on the order of its context; "
          f"objective={obj.name!r} trains {obj.description}; set it to 0")


def rules(cfg) -> dict[str, tuple[str, ...]]:
  """``mesh.rules`` as ``{logical axis: mesh axes}``, checked."""
  out = {}
  for logical, value in cfg.mesh.rules.items():
    if logical not in LOGICAL_AXES:
      _fail(f"mesh.rules.{logical}", f"unknown logical axis; known: {', '.join(LOGICAL_AXES)}")
    axes = tuple(a.strip() for a in str(value or "").split(",") if a.strip())
    for a in axes:
      if a not in MESH_AXES:
        _fail(f"mesh.rules.{logical}", f"unknown mesh axis {a!r}; mesh axes: {MESH_AXES}")
    if len(set(axes)) != len(axes):
      _fail(f"mesh.rules.{logical}", f"repeats a mesh axis: {value!r}")
    out[logical] = axes
  return out


def check_pack(cfg, k: int) -> None:
  """``model.pack``: the AO-GPT losses only, and a divisor of every batch they see (the rows of
  a microbatch and of a held-out batch; `train.sharding` checks the rows per device)."""
  if k == 1:
    return
  if cfg.objective != "ao":
    _fail("model.pack", f"{k}: packing runs the AO-GPT losses (objective='ao'); the "
          f"{cfg.objective!r} objective runs its rows one by one (set model.pack=1)")
  micro = cfg.batch_size // cfg.microbatches
  if micro % k:
    _fail("model.pack", f"{k} does not divide the {micro} rows of a microbatch (batch_size="
          f"{cfg.batch_size} / microbatches={cfg.microbatches})")
  eval_bs = cfg.eval.batch_size or cfg.batch_size
  if eval_bs % k:
    _fail("model.pack", f"{k} does not divide eval.batch_size={eval_bs} (the held-out loss "
          f"packs its rows too)")


def ema_decay(cfg) -> float | None:
  d = cfg.optimizer.ema_decay
  return None if d is None or d == 0 else float(d)


def model_config(cfg) -> model_lib.ModelConfig:
  """``model.preset`` with every non-None ``model.*`` field applied; the vocabulary comes from
  ``data.tokenizer`` unless set explicitly."""
  from aogpt_jax import data  # the data package is only needed to size the vocabulary

  task = task_of(cfg)
  if task is not None:
    ids, what = task.vocab_size, f"task {task.name!r}"
  else:
    try:
      ids = data.get_tokenizer(cfg.data.tokenizer).vocab_size
    except ValueError as e:
      raise ConfigError(str(e)) from None
    what = f"tokenizer {cfg.data.tokenizer!r}"
  overrides = {k: v for k, v in cfg.model.items() if k != "preset" and v is not None}
  # the encoder MDM's [MASK] is the first padding id: it needs one (ids a multiple of 64)
  mask_id = 1 if cfg.get("objective", "ao") == "mdm" else 0
  derived = {"valid_vocab_size": ids, "vocab_size": data.padded_vocab_size(ids + mask_id)}
  for k in _DERIVED_MODEL_FIELDS:
    overrides.setdefault(k, derived[k])
  if overrides["valid_vocab_size"] < ids:
    _fail("model.valid_vocab_size", f"{overrides['valid_vocab_size']} is smaller than the "
          f"{ids} ids of {what}")
  try:
    return model_lib.preset(cfg.model.preset, **overrides)
  except (ValueError, TypeError) as e:
    msg = str(e)
    raise ConfigError(msg if msg.startswith("model.") else f"model: {msg}") from None


def resolve(cfg) -> model_lib.ModelConfig:
  """Checks every key and value that can be checked without devices; returns the model."""
  check_keys(cfg)
  follow_task(cfg)
  follow_grid(cfg)
  _positive(cfg, "total_steps", "batch_size", "microbatches", "seq_len", "log_every")
  _positive(cfg, "eval_every", "checkpoint_every", "checkpoint.keep", "checkpoint.keep_every",
            "eval.batch_size", "eval.train_max_blocks", "eval.max_blocks", allow_zero=True)
  if not isinstance(cfg.seed, int):
    _fail("seed", f"must be an integer, got {cfg.seed!r}")
  if cfg.batch_size % cfg.microbatches:
    _fail("microbatches", f"{cfg.microbatches} does not divide batch_size={cfg.batch_size}")
  follow_objective(cfg)
  try:
    mc = objectives_lib.get(cfg.objective).model_config(model_config(cfg))
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if cfg.seq_len < 2:
    _fail("seq_len", f"must be >= 2 (one token has no context to learn from), got {cfg.seq_len}")
  check_pack(cfg, mc.pack)
  task = task_of(cfg)
  if task is not None:
    if cfg.seq_len != task.length:
      _fail("seq_len", f"{cfg.seq_len}: task {task.name!r} rows are {task.length} tokens; set "
            f"seq_len={task.length}")
    _positive(cfg, "task.heldout_count")
    if not isinstance(cfg.task.heldout_seed, int) or isinstance(cfg.task.heldout_seed, bool):
      _fail("task.heldout_seed", f"must be an integer, got {cfg.task.heldout_seed!r}")
    if mc.loss_chunk:
      _fail("model.loss_chunk", f"{mc.loss_chunk}: the chunked loss scores every token; a task "
            f"trains on the tokens after its prompt (set model.loss_chunk=0)")
    check_task_tokenizer(cfg)
    check_grid(mc.position_init, task)

  if cfg.seq_len > mc.block_size:
    _fail("seq_len", f"{cfg.seq_len} is longer than model.block_size={mc.block_size}")
  if cfg.order.name not in orders_lib.names():
    _fail("order.name", f"unknown order distribution {cfg.order.name!r}; known: "
          f"{', '.join(orders_lib.names())}")
  kwargs = order_kwargs(cfg)
  try:
    orders_lib.check_kwargs(cfg.order.name, kwargs)
    orders_lib.sample(cfg.order.name, jax.random.key(0), 1, cfg.seq_len, **kwargs)
  except (ValueError, TypeError) as e:
    _fail("order.kwargs", str(e))

  o = cfg.optimizer
  for key in ("lr", "b1", "b2", "eps", "weight_decay", "min_lr_ratio", "grad_clip"):
    if (not isinstance(o[key], (int, float)) or isinstance(o[key], bool)
        or not math.isfinite(o[key]) or o[key] < 0):
      _fail(f"optimizer.{key}", f"must be a finite number >= 0, got {o[key]!r}")
  for key in ("b1", "b2", "min_lr_ratio"):
    if o[key] > 1:
      _fail(f"optimizer.{key}", f"must be <= 1, got {o[key]}")
  _positive(cfg, "optimizer.warmup_steps", "optimizer.decay_steps", allow_zero=True)
  if o.decay_steps and o.decay_steps < o.warmup_steps:
    _fail("optimizer.decay_steps", f"the cosine would end at step {o.decay_steps}, before the "
          f"warmup ends (optimizer.warmup_steps={o.warmup_steps}); 0 = total_steps")
  d = ema_decay(cfg)
  if d is not None and not 0.0 < d < 1.0:
    _fail("optimizer.ema_decay", f"must be in (0, 1), or 0/None for no EMA, got {d}")

  for axis in MESH_AXES:
    v = cfg.mesh[axis]
    if not isinstance(v, int) or (v < 1 and v != -1):
      _fail(f"mesh.{axis}", f"must be a positive integer or -1 (fill), got {v!r}")
  if [cfg.mesh[a] for a in MESH_AXES].count(-1) > 1:
    _fail("mesh", "at most one of mesh.data / mesh.fsdp / mesh.tensor may be -1")
  rules(cfg)
  if cfg.eval.split == "train":
    _fail("eval.split", "held-out evaluation must not use the training split")
  if cfg.train.get("remat", "") not in ("", "auto"):
    _fail("train.remat", f"expected '' (model.remat as set) or 'auto' (chosen from the compiled "
          f"step's memory estimate on the device), got {cfg.train.remat!r}")
  check_data(cfg)
  return mc


def check_data(cfg) -> None:
  """The ``data`` values checked before anything is read (a one-line ConfigError)."""
  f = cfg.data.get("validation_fraction", 0.0)
  if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 <= f < 1:
    _fail("data.validation_fraction", f"must be a number in [0, 1), got {f!r}")


def check_prompt_training(cfg, mc: model_lib.ModelConfig) -> None:
  """Training: ``model.prompt_attention`` other than causal needs prompts, i.e. a task (text
  pretraining has none); so does ``model.blank_block``. The post-training and solve modes name their missing task themselves."""
  if task_of(cfg) is None and mc.prompt_attention != "causal":
    _fail("model.prompt_attention", f"{mc.prompt_attention!r} needs prompts, and text "
          f"pretraining has none: train on a task (task.name: configs/sudoku.py, "
          f"configs/sft_text.py) or keep 'causal'")
  if task_of(cfg) is None and mc.blank_block:
    _fail("model.blank_block", "True is trained for tasks decoded by the adaptive sampler; text "
          "pretraining evaluates and samples the one-pass chain: train on a task (task.name) or "
          "keep False")


def task_options(cfg) -> dict[str, Any]:
  group = cfg.get("task", None)
  opts = None if group is None else group.get("options", None)
  return {} if opts is None else dict(opts.to_dict() if hasattr(opts, "to_dict") else opts)


def import_task_module(cfg) -> None:
  """Imports ``task.module`` (a task of one's own: a dotted name or a .py file), a one-line
  ConfigError naming it when that fails; importing it again is a no-op."""
  from aogpt_jax import tasks  # pylint: disable=g-import-not-at-top
  group = cfg.get("task", None)
  spec = "" if group is None else str(group.get("module", "") or "")
  try:
    tasks.import_modules(spec)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  full = tasks.base.canonical(spec)
  if full != spec:   # a .py file by its absolute path: a resume from another folder finds it
    group.module = full


def task_of(cfg):
  """The `aogpt_jax.tasks` task a run trains on (``task.name``, after importing ``task.module``),
  or None for text data; a bad name or option is a ConfigError naming ``task.name`` /
  ``task.options``."""
  group = cfg.get("task", None)
  name = "" if group is None else str(group.get("name", "") or "")
  if not name:
    return None
  import_task_module(cfg)
  from aogpt_jax import tasks  # pylint: disable=g-import-not-at-top
  module = str(group.get("module", "") or "")
  if module and name not in tasks.names():
    mods = [tasks.base.import_module(m) for m in module.split(",") if m.strip()]
    files = {os.path.realpath(getattr(m, "__file__", "") or "") for m in mods}
    own = sorted(n for n, cls in tasks.REGISTRY.items()
                 if tasks.base._origin(cls)[1] in files  # noqa: SLF001
                 or cls.__module__ in {m.__name__ for m in mods})
    _fail("task.name", f"{name!r}: task.module={module} registered "
          f"{'no task' if not own else 'only ' + ', '.join(map(repr, own))}; registered tasks: "
          f"{', '.join(tasks.names())} (expected @tasks.register({name!r}) on a Task class in "
          f"that module)")
  return _make_task(name, json.dumps(task_options(cfg), sort_keys=True))


def check_task_tokenizer(cfg) -> None:
  """A task that reads text with a tokenizer (``task.options.tokenizer``) makes that the run's
  tokenizer: ``data.tokenizer`` (what config.json records and --mode=sample / eval decode with)
  must name the same one."""
  task = task_of(cfg)
  name = getattr(task, "tokenizer_name", None)
  if name is not None and str(cfg.data.tokenizer) != name:
    _fail("data.tokenizer", f"{cfg.data.tokenizer!r}, but the task's rows are in "
          f"task.options.tokenizer={name!r}; set --config.data.tokenizer={name} (the run's "
          f"tokenizer: config.json records it and --mode=sample / eval decode with it)")


def task_options_full(name: str, options: dict) -> dict:
  """``options`` of task ``name`` with every option it leaves out at its default (what two
  configs of one task are compared by)."""
  from aogpt_jax import tasks  # pylint: disable=g-import-not-at-top
  return {**tasks.base.defaults(name), **(options or {})}


@functools.lru_cache(maxsize=16)
def _make_task(name: str, options_json: str):
  from aogpt_jax import tasks  # pylint: disable=g-import-not-at-top
  if name not in tasks.names():
    _fail("task.name", f"unknown task {name!r}; known: {', '.join(tasks.names())}; a task of "
          f"your own: set task.module to the module that registers it (a dotted name or a .py "
          f"file; docs/tasks.md, \"Your own task\")")
  try:
    return tasks.make(name, **json.loads(options_json))
  except (ValueError, TypeError) as e:
    _fail("task.options", str(e))


def follow_task(cfg) -> None:
  """``seq_len=0`` (configs/task.py) follows the task: the task's row length, with
  ``model.block_size`` and ``sample.steps`` (when unset: one cell per step) set to it; and
  ``rl.steps=0`` is the task's length; in place."""
  rl_steps = "rl" in cfg and cfg.rl.steps == 0 and not isinstance(cfg.rl.steps, bool)
  if cfg.seq_len != 0 and not rl_steps:
    return
  task = task_of(cfg)
  if task is None:
    if cfg.seq_len == 0:
      _fail("seq_len", "0 follows the task's row length, and task.name is unset; set "
            "--config.task.name=NAME (and --config.task.module=MODULE for a task of your own)")
    return
  if rl_steps:
    cfg.rl.steps = task.length
  if cfg.seq_len != 0:
    return
  cfg.seq_len = task.length
  if cfg.model.block_size is None:
    cfg.model.block_size = task.length
  if cfg.sample.steps is None:
    cfg.sample.steps = task.length


def follow_grid(cfg) -> None:
  """``model.position_init="grid"`` takes the task's own grid (`tasks.base`: Sudoku's rows,
  columns and boxes; a star graph's edge pairs): ``"grid:R,C,BR,BC"`` from ``task.grid``, in
  place; a task without one is a one-line ConfigError."""
  if cfg.model.get("position_init") != "grid":
    return
  task = task_of(cfg)
  grid = getattr(task, "grid", None) if task is not None else None
  if grid is None:
    what = f"task {task.name!r} with {task.options()}" if task is not None else "no task"
    _fail("model.position_init", f"'grid' takes the task's grid, and {what} has none; expected "
          f"'grid:ROWS,COLS,BOX_ROWS,BOX_COLS' or '' (random position tables)")
  cfg.model.position_init = "grid:" + ",".join(str(int(v)) for v in grid)


def check_grid(position_init: str, task) -> None:
  """``model.position_init="grid:R,C,BR,BC"`` must code the grid task's rows, columns and
  boxes (a one-line ConfigError naming both)."""
  grid = getattr(task, "grid", None)
  if not str(position_init or "").startswith("grid:") or grid is None:
    return
  try:
    ours = layers_lib.grid_shape(position_init)
  except ValueError:
    return                          # the model's own check names the bad code
  if tuple(ours) != tuple(grid):
    r, c, br, bc = grid
    _fail("model.position_init", f"{position_init!r} codes a {ours[0]}x{ours[1]} grid of "
          f"{ours[2]}x{ours[3]} boxes but task {task.name!r} is a {r}x{c} grid of {br}x{bc} "
          f"boxes; use 'grid:{r},{c},{br},{bc}'")


def check_task(cfg) -> None:
  """A run's task, checked on its first training batch and its held-out rows before the first
  step (`tasks.check_task`: shapes, ids in range, the prompt mask, the verifier on the reference
  answers); a ``task.heldout_count`` above the held-out split's size is capped to it, with a
  line. One-line ConfigErrors."""
  task = task_of(cfg)
  if task is None:
    return
  from aogpt_jax import tasks  # pylint: disable=g-import-not-at-top
  count = int(cfg.task.heldout_count)
  try:
    have = tasks.check_task(task, seed=int(cfg.seed), batch=int(cfg.batch_size),
                            heldout_seed=int(cfg.task.heldout_seed), heldout_count=count)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  if have < count:
    logging.warning("task.heldout_count=%d: task %r has %d held-out rows; scoring those %d",
                    count, task.name, have, have)
    cfg.task.heldout_count = have


def task_module_of_run(cfg, *workdirs) -> str:
  """When ``task.module`` is unset and a run folder in ``workdirs`` (the run's WORKDIR, its
  ``train.init_from``) trained this task from a module, that module (recorded in its
  config.json), set in ``cfg``; "" otherwise."""
  if str(cfg.task.module or "") or not str(cfg.task.name or ""):
    return ""
  for wd in workdirs:
    path = os.path.join(os.path.expanduser(str(wd or "")), "config.json")
    if not wd or not os.path.isfile(path):
      continue
    try:
      with open(path, encoding="utf-8") as f:
        task = json.load(f).get("task") or {}
    except (OSError, ValueError, AttributeError):
      continue
    if task.get("name") == cfg.task.name and task.get("module"):
      cfg.task.module = str(task["module"])
      return cfg.task.module
  return ""


def order_kwargs(cfg) -> dict[str, Any]:
  kw = cfg.order.get("kwargs", None)
  return {} if kw is None else dict(kw.to_dict() if hasattr(kw, "to_dict") else kw)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
  """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; ``order.kwargs`` and ``task.options`` stay one
  value each."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict) and prefix + k not in FREE_FORM:
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def resolved_dict(cfg, mc: model_lib.ModelConfig) -> dict[str, Any]:
  """The config as plain data with every ``model.*`` field filled in (WORKDIR/config.json)."""
  d = json.loads(cfg.to_json())
  d["model"] = {"preset": cfg.model.preset, **mc.to_dict()}
  return d
