"""The non-training modes of ``python -m aogpt_jax.main``: ``eval``, ``sample``, ``genppl`` and
``prepare``.

Each takes ``(config, workdir)``, like `train.loop.train`, and reads its own config group:

* ``--mode=eval``: loads WORKDIR's newest checkpoint (``eval.which``: EMA by default) and
  scores ``eval.datasets`` (``heldout`` = the training source's ``eval.split``; the zero-shot
  names wikitext2 / wikitext103 / ptb / lambada / lm1b; or any ``source:split``), writing
  WORKDIR/eval/<eval.name>.json and .md.
* ``--mode=sample``: loads the checkpoint (``sample.which``) and writes WORKDIR/samples/.
* ``--mode=genppl``: samples over the ``genppl`` grid with the ``sample`` settings, scores the
  samples with the GPT-2 ``genppl.scorer`` and writes WORKDIR/eval/<genppl.name>.json and .md.
* ``--mode=prepare``: prepares ``data.source`` for sequences of ``seq_len`` (WORKDIR unused).
* ``--mode=solve``: solves the ``task``'s puzzles (``solve.puzzles``: its held-out split or a
  file) with the ``sample`` settings, checks them with the task's verifier and writes
  WORKDIR/solve/<solve.name>.jsonl, .json and .md (evaluation/solve.py).
* ``--mode=rl``: GRPO from ``train.init_from`` on the ``task``'s puzzles with the ``rl`` group,
  checkpointed and resumable like training (posttrain/rl.py, docs/post_training.md).
* ``--mode=dpo``: DPO from ``train.init_from`` on the ``task``'s preference pairs with the
  ``dpo`` group, on the same run loop (posttrain/dpo_run.py, docs/post_training.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import types

import jax
import numpy as np
from absl import logging

from aogpt_jax import config as config_lib
from aogpt_jax import data
from aogpt_jax import errors
from aogpt_jax import evaluation
from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax.config import ConfigError
from aogpt_jax.model import objectives
from aogpt_jax.model import order_head as order_head_lib
from aogpt_jax.sampling import config as sample_config
from aogpt_jax.sampling import write as sample_write
from aogpt_jax.tasks import base as tasks_base
from aogpt_jax.train import loop as train_loop
from aogpt_jax.train import workdir as workdir_lib

EVAL_SETTINGS = tuple(f.name for f in dataclasses.fields(evaluation.EvalSettings))


def _split_of(name: str, cfg) -> str:
  if name == "heldout":
    return cfg.eval.split
  if name in data.ZERO_SHOT:
    return f"{name}:{data.ZERO_SHOT[name]}"
  return name


def read_run_config(workdir: str) -> dict | None:
  """WORKDIR/config.json (None if absent); a truncated or foreign file is a one-line error
  naming it."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      run = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ConfigError(f"--workdir: {path} is not valid JSON ({err}); it is not a run's "
                      f"config.json (truncated?)") from None
  if not isinstance(run, dict) or not isinstance(run.get("model"), dict):
    raise ConfigError(f"--workdir: {path} has no 'model' entry; it is not a run's config.json")
  return run


def _check_run(cfg, workdir: str, key: str) -> None:
  """The tokenizer and objective asked for must be the run's (from WORKDIR/config.json); ``key``
  is the mode's setting that picks the model kind (sample.method or eval.model_kind)."""
  run = read_run_config(workdir)
  if run is None:
    return                        # load_model reports the missing run
  valid = run["model"].get("valid_vocab_size")
  tok = data.get_tokenizer(cfg.data.tokenizer)
  task = config_lib.task_of(cfg)
  if task is not None and hasattr(task, "tokenizer_name"):
    config_lib.check_task_tokenizer(cfg)        # a text task: its tokenizer is the run's
  if (task is None or hasattr(task, "tokenizer_name")) and tok.vocab_size != valid:
    raise ConfigError(f"data.tokenizer: {cfg.data.tokenizer!r} has {tok.vocab_size} ids but the "
                      f"run in {workdir} has {valid}; use the run's tokenizer")
  trained = objectives.get(run.get("objective", "ao"))
  value = config_lib.objective_value(cfg, key)
  if value not in trained.follows(key):
    raise ConfigError(f"{key}: the run in {workdir} trained {trained.description}; {key} must "
                      f"be one of {trained.follows(key)}, got {value!r} (use the run's config "
                      f"file)")
  if key == "sample.method":
    _check_adaptive(value, run["model"].get("target"), run.get("objective", "ao"),
                    f"the run in {workdir}")


def _check_adaptive(method: str, target, objective: str, what: str) -> None:
  """``method='adaptive'`` needs a model that is told which position a query predicts (an
  AO-GPT's target conditioning) or the encoder MDM; a left-to-right decoder
  (``model.target='none'``, objective ``ao``) has neither, and the samplers would otherwise take
  it for the encoder."""
  if method == "adaptive" and target == "none" and objective != "mdm":
    raise ConfigError(f"sample.method: 'adaptive' needs an AO-GPT (model.target 'adaln' or "
                      f"'sigma_gpt') or the encoder MDM; {what} is a left-to-right decoder "
                      f"(model.target='none'), got 'adaptive'; use sample.method=ar")


# What fixes the content of the "heldout" dataset: it must be the run's unless eval.data says
# otherwise.
HELDOUT_KEYS = ("data.source", "data.path", "data.glob", "data.validation_glob",
                "data.text_field", "data.txt_rows", "data.detokenizer",
                "data.validation_fraction", "eval.split", "seq_len")


def _check_heldout(cfg, workdir: str) -> None:
  """eval.data="" (the default): the "heldout" dataset must be the run's held-out split (the
  run's data source, split and sequence length); eval.data="config" scores this config's data
  even where it differs from the run's."""
  mode = str(cfg.eval.get("data", "") or "")
  if mode not in ("", "config"):
    raise ConfigError(f"eval.data: expected '' (the run's held-out data) or 'config' (this "
                      f"config's data group, eval.split and seq_len), got {mode!r}")
  run = read_run_config(workdir)
  if mode or run is None:
    return
  ours, theirs = config_lib.flatten(json.loads(cfg.to_json())), config_lib.flatten(run)
  for key in HELDOUT_KEYS:
    if key in theirs and ours.get(key) != theirs[key]:
      raise ConfigError(f"{key}: the run in {workdir} has {key}={theirs[key]!r} but this eval "
                        f"asks {ours.get(key)!r}: its 'heldout' would not be the run's held-out "
                        f"data; use the run's config file, or set eval.data=config to score "
                        f"this config's data")


def _data_meta(cfg) -> dict:
  """The data settings an output was made with (recorded in its JSON)."""
  return {"source": str(cfg.data.source), "tokenizer": str(cfg.data.tokenizer),
          "seq_len": int(cfg.seq_len), "config": cfg.data.to_dict()}


def _eval_data_meta(cfg, names) -> dict:
  """What each dataset of an evaluation is (recorded in its JSON)."""
  return {"data": {**_data_meta(cfg), "eval.data": str(cfg.eval.get("data", "")),
                   "split": str(cfg.eval.split),
                   "datasets": {n: _split_of(n, cfg) for n in names}}}


def _check_output(cfg, workdir: str, checkpoint: str, key: str, folder: str) -> None:
  """Before loading anything: the output name is a plain name, the run exists (nothing is
  created in a workdir that holds no run), and WORKDIR/FOLDER is writable."""
  group, name = key.split(".")
  workdir_lib.check_name(cfg[group][name], key)
  if not checkpoint and not os.path.isdir(os.path.join(workdir, "checkpoints")):
    raise FileNotFoundError(f"--workdir: no run in {workdir} (no checkpoints/ folder); pass the "
                            f"workdir of a trained run, or --checkpoint=SPEC")
  checkpoint_lib.check_writable(os.path.join(workdir, folder), "--workdir", keep=False)


def eval_order_kwargs(cfg) -> dict:
  """``eval.order_kwargs`` (JSON); empty: the run's ``order.kwargs`` if ``eval.order`` is the
  run's own order distribution, else no options."""
  raw = str(cfg.eval.order_kwargs or "").strip()
  if not raw:
    return config_lib.order_kwargs(cfg) if cfg.eval.order == cfg.order.name else {}
  try:
    kw = json.loads(raw)
  except json.JSONDecodeError as err:
    raise ConfigError(f"eval.order_kwargs: not JSON ({err.msg}): {raw!r}; e.g. "
                      f"'{{\"seed\": 3}}'") from None
  if not isinstance(kw, dict):
    raise ConfigError(f"eval.order_kwargs: expected a JSON object, got {raw!r}")
  return kw


def _from_spec(cfg, spec: str, which: str | None):
  """--checkpoint=SPEC: (model, provenance); the tokenizer must fit; the model is an AO-GPT.
  ``which`` None: EMA where the checkpoint has it, else the weights it holds (no warning)."""
  from aogpt_jax.checkpoints import spec as checkpoint_spec  # pylint: disable=g-import-not-at-top
  m, mc, prov = checkpoint_spec.load(spec, which)
  tok = data.get_tokenizer(cfg.data.tokenizer)
  checkpoint_spec.check_vocab(mc, cfg.data.tokenizer, tok.vocab_size, prov)
  for key in config_lib.FOLLOWERS:
    if (value := config_lib.objective_value(cfg, key)) not in objectives.get("ao").follows(key):
      raise ConfigError(f"{key}: --checkpoint={spec} is an AO-GPT, got {value!r}")
  _check_adaptive(config_lib.objective_value(cfg, "sample.method"), mc.target, "ao",
                  f"--checkpoint={spec}")
  return m, prov


def refuse_task_run(cfg, mode: str) -> None:
  """eval and sample read text corpora and print text: on a puzzle task's run (``task.name`` set,
  no ``tokenizer`` option: not the text ``pairs`` task) they prepared the byte corpus and failed,
  or printed grids as byte reprs; one line instead."""
  if train_loop.puzzle_task(cfg):
    raise ConfigError(f"task.name: --mode={mode} is for text models; this run is task "
                      f"{cfg.task.name!r}: use --mode=solve (its held-out puzzles, or "
                      f"solve.puzzles=FILE)")


def check_eval(cfg, workdir: str, checkpoint: str = ""):
  """The checks of ``--mode=eval`` (one line each, before anything loads): (settings, the
  dataset names)."""
  refuse_task_run(cfg, "eval")
  e = cfg.eval
  try:
    settings = evaluation.EvalSettings.from_dict(
        {k: e[k] for k in EVAL_SETTINGS} | {"order_kwargs": eval_order_kwargs(cfg),
        "model_kind": config_lib.objective_value(cfg, "eval.model_kind")})
  except ValueError as err:
    raise ConfigError(str(err) if str(err).startswith("eval") else f"eval: {err}") from None
  for key, zero in (("batch_size", "batch_size"), ("max_blocks", "all blocks")):
    if not isinstance(e[key], int) or isinstance(e[key], bool) or e[key] < 0:
      raise ConfigError(f"eval.{key}: must be an integer >= 0 (0: {zero}), got {e[key]!r}")
  if int(cfg.seq_len) < 2:
    raise ConfigError(f"seq_len: must be >= 2, got {cfg.seq_len}")
  if e.split == "train":
    raise ConfigError("eval.split: held-out evaluation must not use the training split")
  names = [n.strip() for n in str(e.datasets).split(",") if n.strip()]
  if not names:
    raise ConfigError("eval.datasets: empty")
  _check_output(cfg, workdir, checkpoint, "eval.name", "eval")
  if not checkpoint:
    _check_run(cfg, workdir, "eval.model_kind")
    if "heldout" in names:
      _check_heldout(cfg, workdir)
  return settings, names


def eval_mode(cfg, workdir: str, checkpoint: str = "") -> dict:
  settings, names = check_eval(cfg, workdir, checkpoint)
  e = cfg.eval
  config_lib.follow_objective(cfg)
  batch = int(e.batch_size) or int(cfg.batch_size)

  def batches(split):
    return lambda: data.eval_batches(
        cfg.data, split=split, seq_len=int(cfg.seq_len), global_batch_size=batch,
        process_index=jax.process_index(), process_count=jax.process_count(),
        max_blocks=int(e.max_blocks))

  datasets = {n: batches(_split_of(n, cfg)) for n in names}
  for n in names:   # a missing dataset fails here, naming the command that prepares it
    data.prepared_path(cfg.data, _split_of(n, cfg), int(cfg.seq_len))
  meta = _eval_data_meta(cfg, names)
  if checkpoint:
    m, prov = _from_spec(cfg, checkpoint, e.which or None)
    results = evaluation.evaluate(m, datasets, settings, workdir=workdir, name=e.name,
                                  meta={**prov, **meta})
  else:
    results = evaluation.evaluate_workdir(workdir, datasets, settings, which=e.which or "ema",
                                          name=e.name,
                                          meta=meta)
  if jax.process_index() == 0:
    js, md = results["files"]
    with open(md) as f:
      print(f.read().rstrip("\n"))
    print(f"eval results written to {js} and {md}")
    print(scored_line(results, cfg))
  return results


def scored_line(results: dict, cfg) -> str:
  """What --mode=eval scored, and why its held-out numbers differ from training's eval."""
  parts = []
  for name, d in results["datasets"].items():
    s = next((d[k] for k in ("l2r", "any_order", "elbo") if d.get(k)), None)
    if s is not None and "blocks" in s:
      parts.append(f"{name} {int(s['blocks'])} blocks of {int(cfg.seq_len)} tokens")
  line = f"scored: {', '.join(parts)} (eval.max_blocks={int(cfg.eval.max_blocks)}, 0 = all)"
  if "heldout" in results["datasets"]:
    line += (f"; training's own eval scores the first eval.train_max_blocks="
             f"{int(cfg.eval.train_max_blocks)} held-out blocks, so its numbers differ "
             f"(docs/evaluation.md)")
  return line


def check_sample(cfg, workdir: str, checkpoint: str = "") -> None:
  """The checks of ``--mode=sample`` (one line each, before anything loads)."""
  refuse_task_run(cfg, "sample")
  if cfg.sample.name:
    workdir_lib.check_name(cfg.sample.name, "sample.name")
  if not checkpoint and not os.path.isdir(os.path.join(workdir, "checkpoints")):
    raise FileNotFoundError(f"--workdir: no run in {workdir} (no checkpoints/ folder); pass the "
                            f"workdir of a trained run, or --checkpoint=SPEC")
  checkpoint_lib.check_writable(os.path.join(workdir, "samples"), "--workdir",
                               keep=False)
  if not checkpoint:
    _check_run(cfg, workdir, "sample.method")


def sample_mode(cfg, workdir: str, checkpoint: str = "") -> str:
  check_sample(cfg, workdir, checkpoint)
  if checkpoint:
    m, prov = _from_spec(cfg, checkpoint, cfg.sample.which or None)
    config_lib.follow_objective(cfg)
    path = sample_write.write_samples(m, cfg, workdir, data.get_tokenizer(cfg.data.tokenizer),
                                 step=prov["step"], loaded=prov, data=_data_meta(cfg))
  else:
    config_lib.follow_objective(cfg)
    m, run_cfg = checkpoint_lib.load_model(workdir, which=cfg.sample.which or "ema")
    path = sample_write.write_samples(m, cfg, workdir, data.get_tokenizer(cfg.data.tokenizer),
                                 step=run_cfg.loaded.step, loaded=run_cfg.loaded.to_dict(),
                                 data=_data_meta(cfg), trained_length=run_cfg.get("seq_len"))
  show_samples(path)
  return path


SHOWN_SAMPLES = 4   # --mode=sample prints this many samples (repr of the text) and the first's order


def show_samples(path: str, n: int = SHOWN_SAMPLES) -> None:
  """Prints where the samples are, the first ``n`` texts (their repr: newlines and quotes
  visible) and the first sample's order (the position written at each step)."""
  with open(path) as f:
    rows = [json.loads(line) for _, line in zip(range(n), f)]
  print(f"samples written to {path}; the first {len(rows)}:")
  for r in rows:
    print(repr(r["text"]))
  if rows:
    print(f"order: {rows[0]['order']}")


def prepare_mode(cfg, workdir: str) -> list:
  del workdir
  from aogpt_jax.data.prepare import prepare  # pylint: disable=g-import-not-at-top
  return prepare(cfg.data, block_size=int(cfg.seq_len))


def check_genppl(cfg, workdir: str, checkpoint: str = "") -> dict:
  """The checks of ``--mode=genppl`` (one line each, before anything loads): its grid."""
  from aogpt_jax.evaluation import genppl  # pylint: disable=g-import-not-at-top
  grid = genppl.grid_from_config(cfg.genppl, cfg.sample)
  _check_output(cfg, workdir, checkpoint, "genppl.name", "eval")
  if not checkpoint:
    _check_run(cfg, workdir, "sample.method")
  return grid


def genppl_mode(cfg, workdir: str, checkpoint: str = "") -> dict:
  """Samples with the ``sample`` group over the ``genppl`` grid (files in WORKDIR/samples/),
  scores them with ``genppl.scorer`` and writes WORKDIR/eval/<genppl.name>.json and .md."""
  from aogpt_jax.evaluation import genppl  # pylint: disable=g-import-not-at-top
  g = cfg.genppl
  grid = check_genppl(cfg, workdir, checkpoint)
  tok = data.get_tokenizer(cfg.data.tokenizer)
  trained_length = None
  if checkpoint:
    m, prov = _from_spec(cfg, checkpoint, cfg.sample.which or None)
  else:
    m, run_cfg = checkpoint_lib.load_model(workdir, which=cfg.sample.which or "ema")
    prov = run_cfg.loaded.to_dict()
    trained_length = run_cfg.get("seq_len")
  config_lib.follow_objective(cfg)
  try:                                                            # before any sampling
    scorer = genppl.GPT2Scorer.from_pretrained(str(g.scorer))
  except Exception as err:  # noqa: BLE001 - a garbage file raises whatever its reader raises
    msg = str(err).splitlines()[0] if str(err) else repr(err)
    raise ConfigError(f"genppl.scorer: {msg if str(g.scorer) in msg else f'{g.scorer}: {msg}'}"
                      ) from None
  if scorer.cfg.vocab_size != tok.vocab_size:
    raise ConfigError(f"genppl.scorer: {g.scorer} has vocab_size {scorer.cfg.vocab_size} but "
                      f"data.tokenizer {cfg.data.tokenizer!r} has {tok.vocab_size} ids; the "
                      f"samples must be in the scorer's tokens (GPT-2 for GPT-2 Large)")
  sample_length = sample_config.default_length(cfg.sample, m.cfg, trained_length)
  grid["steps"] = [sample_length if t is None else t for t in grid["steps"]]  # sample.steps None
  length = sample_length + bool(g.prepend_eot)
  if length > scorer.cfg.n_positions:
    raise ConfigError(f"genppl.scorer: {g.scorer} reads at most {scorer.cfg.n_positions} tokens "
                      f"but the samples have {length} (sample.length"
                      f"{' + 1 for genppl.prepend_eot' if g.prepend_eot else ''}); lower "
                      f"sample.length or use a scorer with a longer context")

  files = []

  def sample_fn(*, num_samples, steps, top_p, temperature, seed):
    c = cfg.sample.copy_and_resolve_references()
    c.update(dict(num_samples=num_samples, steps=steps, top_p=top_p, temperature=temperature,
                  seed=seed, name=""))
    path = sample_write.write_samples(m, c, workdir, tok, step=prov.get("step"), loaded=prov,
                                      data=_data_meta(cfg),
                                      trained_length=trained_length)
    with open(path) as f:
      rows = [json.loads(line)["tokens"] for line in f]
    files.append(os.path.abspath(path))
    print(f"  sampled {path}")
    return rows

  rows = genppl.run_grid(sample_fn, scorer, num_samples=int(cfg.sample.num_samples),
                         seed=int(cfg.sample.seed), grid=grid, prepend_eot=bool(g.prepend_eot),
                         batch_size=int(g.batch_size), eot=tok.eot_id)
  for r, f in zip(rows, files):
    r["samples_file"] = f
  table = genppl.grid_table(rows)
  out = {"rows": rows, "grid": grid, "scorer": str(g.scorer), "meta": prov,
         "scorer_config": dataclasses.asdict(scorer.cfg), "jax": jax.__version__,
         "backend": jax.default_backend(),
         "aggregations": {"corpus": "exp(total NLL / total scored tokens), pooled over samples",
                          "per_sample_mean": "mean over samples of exp(mean NLL of the sample)"},
         "sample": cfg.sample.to_dict(), "data": _data_meta(cfg)}
  folder = os.path.join(workdir, "eval")
  os.makedirs(folder, exist_ok=True)
  stem = os.path.join(folder, workdir_lib.fresh_stem(folder, str(g.name), (".json", ".md")))
  workdir_lib.write_json_atomic(stem + ".json", json.dumps(out, indent=1))
  workdir_lib.write_json_atomic(
      stem + ".md", f"Generative perplexity under {g.scorer} ({rows[0]['num_samples']} "
      f"samples per row of {rows[0]['length']} tokens); unigram entropy in nats, "
      f"per-sample mean.\n\n{table}\n")
  print(table)
  print(f"generative perplexity written to {stem}.json and {stem}.md")
  return out


def load_puzzles(task, cfg) -> tuple[dict, dict]:
  """``solve.puzzles``: the task's held-out puzzles, or a file the task reads; (puzzles, where
  they came from)."""
  src, count = str(cfg.solve.puzzles or ""), cfg.solve.count
  if not isinstance(count, int) or isinstance(count, bool) or count < 0:
    raise ConfigError(f"solve.count: must be an integer >= 0 (0 = every puzzle of a file), got "
                      f"{count!r}")
  if src == "heldout":
    if count < 1:
      raise ConfigError("solve.count: the held-out split needs a count >= 1, got 0")
    seed = int(cfg.task.heldout_seed)
    try:
      puzzles = task.heldout(seed, count)
    except Exception as e:  # noqa: BLE001 - a task's own code may raise anything
      raise ConfigError(f"solve.count={count} (the count asked for): task {task.name!r}: "
                        f"heldout(seed={seed}, count={count}) raised {errors.one_line(e)}"
                        ) from e
    have = len(puzzles["tokens"])
    if not have:
      raise ConfigError(f"solve.count: task {task.name!r} has an empty held-out split "
                        f"(heldout(seed={seed}, count={count}) returned no rows)")
    if have < count:
      logging.warning("solve.count=%d: task %r has %d held-out puzzles; solving those %d", count,
                      task.name, have, have)
    return puzzles, {"puzzles": "heldout", "heldout_seed": seed, "count": have}
  if not src:
    raise ConfigError("solve.puzzles: expected 'heldout' or a puzzle file, got ''")
  if not os.path.exists(src):
    raise ConfigError(f"solve.puzzles: no such file {src!r} (or 'heldout' for the task's "
                      f"held-out puzzles)")
  if not hasattr(task, "load"):
    raise ConfigError(f"solve.puzzles: task {task.name!r} reads no puzzle files; use 'heldout'")
  try:
    puzzles = task.load(src, limit=count or None)
  except (ValueError, OSError) as err:
    raise ConfigError(f"solve.puzzles: {err}") from None
  rows = len(puzzles["tokens"])
  repeats = rows - distinct_puzzles(puzzles)
  if repeats:
    logging.warning("solve.puzzles: %d of the %d rows of %s repeat an earlier row (the same "
                    "puzzle and solution): the 95%% interval treats all %d rows as independent "
                    "puzzles, though only %d differ", repeats, rows, src, rows, rows - repeats)
  return puzzles, {"puzzles": os.path.abspath(src), "count": int(rows),
                   "duplicates": int(repeats)}


def distinct_puzzles(puzzles: dict) -> int:
  """How many different rows (tokens and given cells) ``puzzles`` holds."""
  both = np.concatenate([np.asarray(puzzles["tokens"], np.int64),
                         np.asarray(puzzles["prompt"], np.int64)], axis=1)
  return int(len(np.unique(both, axis=0)))


def check_solve(cfg, workdir: str, checkpoint: str = "") -> dict:
  """The checks of ``--mode=solve`` (one line each, before any weights load or anything is
  created): the task, the puzzles and its verifier on their answers, the run (the task it
  trained) and the output folder, and the sampler and search settings against the model the run
  records. Returns what the mode goes on with: task, puzzles, source, run, checkpoint."""
  if cfg.seq_len == 0:
    config_lib.follow_task(cfg)
  task = config_lib.task_of(cfg)
  if task is None:
    raise ConfigError("task.name: --mode=solve needs a task (a config such as configs/sudoku.py "
                      "sets it)")
  workdir_lib.check_name(cfg.solve.name, "solve.name")
  bs = cfg.solve.batch_size
  if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
    raise ConfigError(f"solve.batch_size: must be an integer >= 1, got {bs!r}")
  if not isinstance(cfg.solve.seed, int) or isinstance(cfg.solve.seed, bool):
    raise ConfigError(f"solve.seed: must be an integer, got {cfg.solve.seed!r}")
  puzzles, source = load_puzzles(task, cfg)
  try:   # before sampling: the verifier runs on the reference answers
    tasks_base.check_verifier(task, puzzles, f"solve.puzzles={cfg.solve.puzzles}")
  except ValueError as err:
    raise ConfigError(str(err)) from err
  if not checkpoint and not os.path.isdir(os.path.join(workdir, "checkpoints")):
    raise FileNotFoundError(f"--workdir: no run in {workdir} (no checkpoints/ folder); pass the "
                            f"workdir of a trained run, or --checkpoint=WORKDIR or SPEC to solve "
                            f"with those weights (the outputs go to --workdir)")
  checkpoint_lib.check_writable(os.path.join(workdir, "solve"), "--workdir", keep=False)
  run = workdir
  if checkpoint and os.path.isdir(os.path.join(os.path.expanduser(checkpoint), "checkpoints")):
    run, checkpoint = os.path.expanduser(checkpoint), ""   # a run's WORKDIR: checked alike
  if not checkpoint:
    _check_task(cfg, run)
    _check_run(cfg, run, "sample.method")
    meta = checkpoint_lib.recorded_meta(run)
    if meta is not None and isinstance(meta.get("model"), dict):
      check_solve_settings(cfg, task, puzzles, model_config_of(meta["model"]))
  return {"task": task, "puzzles": puzzles, "source": source, "run": run,
          "checkpoint": checkpoint}


def model_config_of(recorded: dict):
  """A `ModelConfig` from a run's recorded model fields (fields this version lacks dropped)."""
  from aogpt_jax.model import aogpt as model_lib  # pylint: disable=g-import-not-at-top
  names = {f.name for f in dataclasses.fields(model_lib.ModelConfig)}
  return model_lib.ModelConfig(**{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in recorded.items() if k in names})


def check_solve_settings(cfg, task, puzzles, mc):
  """The sampler (or search) settings of ``--mode=solve`` against the model ``mc``: (sampler
  settings, search settings or None); one-line ConfigErrors."""
  from aogpt_jax.evaluation import solve as solve_lib  # pylint: disable=g-import-not-at-top
  if mc.valid_vocab_size != task.vocab_size:
    raise ConfigError(f"task: the model has {mc.valid_vocab_size} token ids but task "
                      f"{task.name!r} has {task.vocab_size}")
  follow = cfg.copy_and_resolve_references()   # the sampler keys the run's objective sets
  config_lib.follow_objective(follow)
  try:
    settings = sample_config.settings_from_config(follow.sample, mc, task.length)
    solve_lib.check_puzzles(task, puzzles, settings)
    search = search_settings(follow, types.SimpleNamespace(cfg=mc), task)
    if search is None:
      settings.validate(mc)
    elif settings.order_head:
      raise ValueError(f"sample.order_head: the order head decodes with the adaptive sampler; "
                       f"the search (solve.search_width={search.width}) does not use it; set "
                       f"solve.search_width=0")
  except ValueError as err:
    raise ConfigError(str(err)) from None
  return settings, search


def solve_mode(cfg, workdir: str, checkpoint: str = "", checked: dict | None = None) -> dict:
  """Solves ``solve.puzzles`` of the run's task with the ``sample`` settings (module docstring);
  ``checked``: what `check_solve` returned for these arguments (the command's checks stage)."""
  from aogpt_jax import tasks  # pylint: disable=g-import-not-at-top
  from aogpt_jax.evaluation import solve as solve_lib  # pylint: disable=g-import-not-at-top
  if cfg.seq_len == 0:
    config_lib.follow_task(cfg)
  job = checked or check_solve(cfg, workdir, checkpoint)
  task, puzzles, source, run = job["task"], job["puzzles"], job["source"], job["run"]
  checkpoint, bs = job["checkpoint"], cfg.solve.batch_size
  if checkpoint:
    from aogpt_jax.checkpoints import spec as checkpoint_spec  # pylint: disable=g-import-not-at-top
    m, _, prov = checkpoint_spec.load(checkpoint, cfg.sample.which or None)
  else:
    m, run_cfg = checkpoint_lib.load_model(run, which=cfg.sample.which or "ema")
    prov = run_cfg.loaded.to_dict()
  config_lib.follow_objective(cfg)
  settings, search = check_solve_settings(cfg, task, puzzles, m.cfg)
  if settings.order_head and order_head_lib.head_of(m) is None:
    raise ConfigError(f"sample.order_head: True needs a model with an order head (trained by "
                      f"--mode=rl with rl.order_head=K); the model loaded from "
                      f"{checkpoint or run} has none")
  if search is not None:
    result = solve_lib.solve_search(m, task, puzzles, settings, search, batch_size=bs)
  else:
    result = solve_lib.solve(m, task, puzzles, settings, key=jax.random.key(int(cfg.solve.seed)),
                             batch_size=bs)
  provenance = {"model": prov, **source, "seed": int(cfg.solve.seed),
                "task": {"name": task.name, "options": tasks.base.options(task)},
                "jax": jax.__version__, "backend": jax.default_backend()}
  path = solve_lib.write(result, workdir, str(cfg.solve.name), provenance)
  if jax.process_index() == 0:
    print(f"puzzle 0 of {len(result.rows)} as the model filled it "
          f"({'solved' if result.rows[0]['solved'] else 'not solved'}):")
    print(result.rows[0]["rendered"])
    print(solve_lib.summary_line(result.summary))
    print(f"solutions written to {path} (summary: {path[:-1]} and {path[:-5]}md)")
  return result.summary


def search_settings(cfg, model, task):
  """The ``solve.search_*`` settings (`sampling.search`), None for the sampler
  (``solve.search_width=0``); one-line errors before anything compiles."""
  from aogpt_jax.sampling import search as search_lib  # pylint: disable=g-import-not-at-top
  width = cfg.solve.search_width
  if isinstance(width, bool) or not isinstance(width, int) or width < 0:
    raise ValueError(f"solve.search_width: must be an integer >= 0 (0 = the sampler), got "
                     f"{width!r}")
  if not width:
    return None
  s = search_lib.SearchSettings(width=width, branch=cfg.solve.search_branch,
                                checker=cfg.solve.search_checker,
                                rescore=cfg.solve.search_rescore)
  s.validate()
  search_lib.check_model(model)
  if s.checker and not (callable(getattr(task, "legal", None))
                        and callable(getattr(task, "valid", None))):
    raise ValueError(f"solve.search_checker: task {task.name!r} has no rule checker "
                     f"(Task.legal and Task.valid); expected solve.search_checker=False")
  return s


def _check_task(cfg, workdir: str) -> None:
  """The task asked for must be the run's (its config.json), or the puzzles would be scored by a
  model trained on other rows."""
  run = read_run_config(workdir)
  if run is None:
    return
  theirs = dict(run.get("task") or {})
  ours = {"name": str(cfg.task.name), "options": config_lib.task_options(cfg)}
  if theirs.get("name") == ours["name"]:   # an option left out is at its default
    theirs["options"] = config_lib.task_options_full(ours["name"], theirs.get("options"))
    ours["options"] = config_lib.task_options_full(ours["name"], ours["options"])
  for key in ("name", "options"):
    if theirs.get(key, "" if key == "name" else {}) != ours[key]:
      raise ConfigError(f"task.{key}: the run in {workdir} trained with task.{key}="
                        f"{theirs.get(key)!r}, this config asks {ours[key]!r}; use the run's "
                        f"config file")


def rl_mode(cfg, workdir: str) -> dict:
  """``--mode=rl``: GRPO as a run (`aogpt_jax.posttrain.rl`)."""
  from aogpt_jax.posttrain import rl  # pylint: disable=g-import-not-at-top
  return rl.rl_mode(cfg, workdir)


def dpo_mode(cfg, workdir: str) -> dict:
  """``--mode=dpo``: DPO as a run (`aogpt_jax.posttrain.dpo_run`)."""
  from aogpt_jax.posttrain import dpo_run  # pylint: disable=g-import-not-at-top
  return dpo_run.dpo_mode(cfg, workdir)
