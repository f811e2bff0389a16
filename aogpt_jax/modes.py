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
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax

from aogpt_jax import config as config_lib
from aogpt_jax import data
from aogpt_jax import evaluation
from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax.config import ConfigError
from aogpt_jax.model import objectives
from aogpt_jax.sampling import config as sample_config
from aogpt_jax.sampling import write as sample_write

EVAL_SETTINGS = tuple(f.name for f in dataclasses.fields(evaluation.EvalSettings))


def _split_of(name: str, cfg) -> str:
  if name == "heldout":
    return cfg.eval.split
  if name in data.ZERO_SHOT:
    return f"{name}:{data.ZERO_SHOT[name]}"
  return name


def _check_run(cfg, workdir: str, key: str) -> None:
  """The tokenizer and objective asked for must be the run's (from WORKDIR/config.json); ``key``
  is the mode's setting that picks the model kind (sample.method or eval.model_kind)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return                        # load_model reports the missing run
  with open(path) as f:
    run = json.load(f)
  valid = run["model"]["valid_vocab_size"]
  tok = data.get_tokenizer(cfg.data.tokenizer)
  if tok.vocab_size != valid:
    raise ConfigError(f"data.tokenizer: {cfg.data.tokenizer!r} has {tok.vocab_size} ids but the "
                      f"run in {workdir} has {valid}; use the run's tokenizer")
  trained = objectives.get(run.get("objective", "ao"))
  value = config_lib.objective_value(cfg, key)
  if value not in trained.follows(key):
    raise ConfigError(f"{key}: the run in {workdir} trained {trained.description}; {key} must "
                      f"be one of {trained.follows(key)}, got {value!r} (use the run's config "
                      f"file)")


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


def _from_spec(cfg, spec: str, which: str):
  """--checkpoint=SPEC: (model, provenance); the tokenizer must fit; the model is an AO-GPT."""
  from aogpt_jax.checkpoints import spec as checkpoint_spec  # pylint: disable=g-import-not-at-top
  m, mc, prov = checkpoint_spec.load(spec, which)
  tok = data.get_tokenizer(cfg.data.tokenizer)
  checkpoint_spec.check_vocab(mc, cfg.data.tokenizer, tok.vocab_size)
  for key in config_lib.FOLLOWERS:
    if (value := config_lib.objective_value(cfg, key)) not in objectives.get("ao").follows(key):
      raise ConfigError(f"{key}: --checkpoint={spec} is an AO-GPT, got {value!r}")
  return m, prov


def eval_mode(cfg, workdir: str, checkpoint: str = "") -> dict:
  e = cfg.eval
  try:
    settings = evaluation.EvalSettings.from_dict(
        {k: e[k] for k in EVAL_SETTINGS} | {"order_kwargs": eval_order_kwargs(cfg),
        "model_kind": config_lib.objective_value(cfg, "eval.model_kind")})
  except ValueError as err:
    raise ConfigError(str(err) if str(err).startswith("eval") else f"eval: {err}") from None
  if not checkpoint:
    _check_run(cfg, workdir, "eval.model_kind")
  config_lib.follow_objective(cfg)
  checkpoint_lib.check_writable(os.path.join(workdir, "eval"), "--workdir",
                               keep=False)
  batch = int(e.batch_size) or int(cfg.batch_size)
  names = [n.strip() for n in str(e.datasets).split(",") if n.strip()]
  if not names:
    raise ConfigError("eval.datasets: empty")

  def batches(split):
    return lambda: data.eval_batches(
        cfg.data, split=split, seq_len=int(cfg.seq_len), global_batch_size=batch,
        process_index=jax.process_index(), process_count=jax.process_count(),
        max_blocks=int(e.max_blocks))

  datasets = {n: batches(_split_of(n, cfg)) for n in names}
  for n in names:   # a missing dataset fails here, naming the command that prepares it
    data.prepared_path(cfg.data, _split_of(n, cfg), int(cfg.seq_len))
  if checkpoint:
    m, prov = _from_spec(cfg, checkpoint, e.which)
    results = evaluation.evaluate(m, datasets, settings, workdir=workdir, name=e.name, meta=prov)
  else:
    results = evaluation.evaluate_workdir(workdir, datasets, settings, which=e.which, name=e.name)
  if jax.process_index() == 0:
    out = os.path.join(workdir, "eval", e.name)
    print(f"eval results written to {out}.json and {out}.md")
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


def sample_mode(cfg, workdir: str, checkpoint: str = "") -> str:
  checkpoint_lib.check_writable(os.path.join(workdir, "samples"), "--workdir",
                               keep=False)
  if checkpoint:
    m, prov = _from_spec(cfg, checkpoint, cfg.sample.which)
    config_lib.follow_objective(cfg)
    path = sample_write.write_samples(m, cfg, workdir, data.get_tokenizer(cfg.data.tokenizer),
                                 step=prov["step"], loaded=prov)
  else:
    _check_run(cfg, workdir, "sample.method")
    config_lib.follow_objective(cfg)
    m, run_cfg = checkpoint_lib.load_model(workdir, which=cfg.sample.which)
    path = sample_write.write_samples(m, cfg, workdir, data.get_tokenizer(cfg.data.tokenizer),
                                 step=run_cfg.loaded.step, loaded=run_cfg.loaded.to_dict(),
                                 trained_length=run_cfg.get("seq_len"))
  print(f"samples written to {path}")
  return path


def prepare_mode(cfg, workdir: str) -> list:
  del workdir
  from aogpt_jax.data.prepare import prepare  # pylint: disable=g-import-not-at-top
  return prepare(cfg.data, block_size=int(cfg.seq_len))


def genppl_mode(cfg, workdir: str, checkpoint: str = "") -> dict:
  """Samples with the ``sample`` group over the ``genppl`` grid (files in WORKDIR/samples/),
  scores them with ``genppl.scorer`` and writes WORKDIR/eval/<genppl.name>.json and .md."""
  from aogpt_jax.evaluation import genppl  # pylint: disable=g-import-not-at-top
  g = cfg.genppl
  grid = genppl.grid_from_config(g, cfg.sample)
  tok = data.get_tokenizer(cfg.data.tokenizer)
  trained_length = None
  if checkpoint:
    m, prov = _from_spec(cfg, checkpoint, cfg.sample.which)
  else:
    _check_run(cfg, workdir, "sample.method")
    m, run_cfg = checkpoint_lib.load_model(workdir, which=cfg.sample.which)
    prov = run_cfg.loaded.to_dict()
    trained_length = run_cfg.get("seq_len")
  config_lib.follow_objective(cfg)
  try:                                                            # before any sampling
    scorer = genppl.GPT2Scorer.from_pretrained(str(g.scorer))
  except (OSError, ValueError, KeyError) as err:
    raise ConfigError(f"genppl.scorer: {str(err).splitlines()[0] if str(err) else repr(err)}"
                      ) from None
  if scorer.cfg.vocab_size != tok.vocab_size:
    raise ConfigError(f"genppl.scorer: {g.scorer} has vocab_size {scorer.cfg.vocab_size} but "
                      f"data.tokenizer {cfg.data.tokenizer!r} has {tok.vocab_size} ids; the "
                      f"samples must be in the scorer's tokens (GPT-2 for GPT-2 Large)")
  length = sample_config.default_length(cfg.sample, m.cfg, trained_length) + bool(g.prepend_eot)
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
         "sample": cfg.sample.to_dict()}
  os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
  stem = os.path.join(workdir, "eval", str(g.name))
  with open(stem + ".json", "w") as f:
    json.dump(out, f, indent=1)
  with open(stem + ".md", "w") as f:
    f.write(f"Generative perplexity under {g.scorer} ({rows[0]['num_samples']} "
            f"samples per row of {rows[0]['length']} tokens); unigram entropy in nats, "
            f"per-sample mean.\n\n{table}\n")
  print(table)
  print(f"generative perplexity written to {stem}.json and {stem}.md")
  return out
