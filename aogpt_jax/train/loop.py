"""The training loop behind ``python -m aogpt_jax.main --mode=train``.

`train(cfg, workdir)`: checks the config, builds the mesh and the jitted steps, resumes from
the newest readable checkpoint in WORKDIR/checkpoints (or starts fresh), then trains to
``total_steps`` with periodic logging, held-out evaluation with the EMA weights (L2R and
any-order), and checkpoints. It stops:

* at ``total_steps`` after a final checkpoint;
* on SIGTERM or SIGINT (Ctrl-C) (or a multi-host preemption notice) after saving a checkpoint at
  the current step;
* at once with a one-line error if another run holds the workdir lock (WORKDIR/.lock);
* with `NonFiniteLoss` naming the step when the loss, the gradients or the new parameters stop
  being finite and the step of the newest checkpoint saved (or that none exists); that step is
  not saved.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import signal
import sys
import time

import jax

from aogpt_jax import config as config_lib
from aogpt_jax import data as data_lib
from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax.model import objectives
from aogpt_jax.tasks import pipeline as task_pipeline
from aogpt_jax.train import flops as flops_lib
from aogpt_jax.train import metrics as metrics_lib
from aogpt_jax.train import sharding as sharding_lib
from aogpt_jax.train import step as train_lib
from aogpt_jax.train import workdir as workdir_lib


class NonFiniteLoss(FloatingPointError):
  """A training step produced a NaN or infinite loss, gradient norm or parameter norm."""


class _Window:
  """Sums of the per-step metrics between two log lines (host side)."""

  def __init__(self):
    self.sums: dict[str, float] = {}
    self.steps = 0
    self.last: dict[str, float] = {}

  def add(self, m: dict[str, float]) -> None:
    for k, v in m.items():
      self.sums[k] = self.sums.get(k, 0.0) + float(v)
    self.steps += 1
    self.last = m

  def scalars(self) -> dict[str, float]:
    s, out = self.sums, {}
    for name, suffix in (("loss", ""), ("loss_l2r", "_l2r"), ("loss_random", "_random")):
      if s.get("token_count" + suffix, 0) > 0:
        out[f"train/{name}"] = s["nll_sum" + suffix] / s["token_count" + suffix]
    out["train/grad_norm"] = s["grad_norm"] / self.steps
    out["train/param_norm"] = self.last["param_norm"]
    out["train/lr"] = self.last["lr"]
    return out


def _eval_line(ev: dict[str, float]) -> str:
  names = {"eval/loss_l2r": "L2R loss", "eval/loss_random": "any-order loss",
           "eval/loss_train_order": "training-order loss", "eval/elbo": "ELBO bound"}
  return ", ".join(f"{names[k]} {v:.4f}" for k, v in ev.items())


def _check_finite(step: int, m: dict[str, float], ckpt=None) -> None:
  loss = m["nll_sum"] / max(m["token_count"], 1.0)
  bad = {k: v for k, v in (("loss", loss), ("grad_norm", m["grad_norm"]),
                           ("param_norm", m["param_norm"])) if not math.isfinite(v)}
  if bad:
    if ckpt is not None:
      ckpt.wait()                 # a save in flight is finished (and counted) first
    saved = None if ckpt is None else ckpt.last_saved
    where = (f"the last good state is the checkpoint of step {saved} ({ckpt.directory / str(saved)})"
             if saved is not None else "no checkpoint of this run exists yet")
    raise NonFiniteLoss(f"training step {step} produced non-finite values {bad}; stopping. This "
                        f"step was not saved; {where}.")


def heldout_eval(trainer: train_lib.Trainer, params, cfg) -> dict[str, float]:
  """Held-out NLL per token under the L2R order, under uniform orders (fixed seed) and, for a
  run on another fixed order distribution, under that one (`train.step.heldout_orders`)."""
  bs = cfg.eval.batch_size or cfg.batch_size
  batches = _eval_batches(cfg, bs)
  sums: dict[str, float] = {}
  key = jax.random.PRNGKey(cfg.eval.seed)
  blocks = 0
  for i, local in enumerate(batches):
    out = trainer.eval_step(params, sharding_lib.global_batch(local, trainer.mesh),
                            jax.random.fold_in(key, i))
    blocks += int((local["weight"] > 0).sum())   # one weight per block (0: padding)
    for k, v in jax.device_get(out).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  heldout_eval.blocks = blocks * jax.process_count()   # this process's share, times processes
  return objectives.get(cfg.objective).report(sums, train_lib.heldout_orders(cfg))


heldout_eval.blocks = 0   # how many held-out blocks the last call scored (for its log line)


def _eval_batches(cfg, batch_size: int):
  """The held-out batches of the eval during training: ``eval.split`` of the text data, or a
  task's held-out puzzles (``task.heldout_seed`` / ``task.heldout_count``)."""
  where = dict(global_batch_size=batch_size, process_index=jax.process_index(),
               process_count=jax.process_count())
  task = config_lib.task_of(cfg)
  if task is not None:
    return task_pipeline.eval_batches(task, seed=cfg.task.heldout_seed,
                                      count=cfg.task.heldout_count, **where)
  return data_lib.eval_batches(cfg.data, split=cfg.eval.split, seq_len=cfg.seq_len,
                               max_blocks=cfg.eval.train_max_blocks, **where)


def train_iterator(cfg, process_index: int, process_count: int):
  """The run's training batches: ``data.source`` blocks, or a task's puzzles with their prompt
  masks (``task.name``); checkpointable either way."""
  task = config_lib.task_of(cfg)
  if task is not None:
    return task_pipeline.train_iterator(task, global_batch_size=cfg.batch_size, seed=cfg.seed,
                                        process_index=process_index, process_count=process_count)
  return data_lib.train_iterator(cfg.data, seq_len=cfg.seq_len, global_batch_size=cfg.batch_size,
                                 seed=cfg.seed, process_index=process_index,
                                 process_count=process_count)


LOG_FILE = "train.log"   # WORKDIR/train.log: every log line of every (resumed) run, appended
# ``extra=`` of a record for the log file only: the command line prints it with --verbose
# (main.py); the console shows what README's quickstart shows (tests/test_docs.py checks it).
FILE_ONLY = {"file_only": True}


class _OwnLines:
  """The log file keeps this project's lines and the libraries' warnings."""

  def filter(self, record) -> bool:
    return record.levelno >= logging.WARNING or "aogpt_jax" in record.pathname


class _LogFile(logging.FileHandler):
  """WORKDIR/train.log; when it cannot be written (a full disk) one line says so and the file
  is left alone, instead of a "Logging error" traceback for every line of the run."""

  failed = False

  def handleError(self, record) -> None:  # noqa: N802 - logging's name
    if not self.failed:
      self.failed = True
      err = sys.exc_info()[1]
      print(f"aogpt_jax: {self.baseFilename}: cannot write ({err}); no more lines go there",
            file=sys.stderr)

  def emit(self, record) -> None:
    if not self.failed:
      super().emit(record)


def train(cfg, workdir: str) -> dict[str, float]:
  """Trains (or resumes) the run in ``workdir``; returns the last logged and eval scalars."""
  t0 = time.perf_counter()
  model_cfg = config_lib.resolve(cfg)
  config_lib.check_prompt_training(cfg, model_cfg)
  config_lib.check_task(cfg)   # a task's rows and verifier, before anything compiles
  mesh = sharding_lib.make_mesh(cfg)
  sharding_lib.check_batch_sizes(cfg, mesh)
  workdir = workdir_lib.prepare_workdir(workdir)
  checkpoint_lib.check_writable(checkpoint_lib.checkpoint_dir(workdir))  # before compiling
  if cfg.train.get("remat", "") == "auto":
    model_cfg = choose_remat(cfg, model_cfg, mesh)
  meta = checkpoint_lib.run_meta(cfg, model_cfg)
  proc = jax.process_index()
  lock = workdir_lib.lock_workdir(workdir) if proc == 0 else None
  log_file = None
  if proc == 0:
    log_file = _LogFile(workdir / LOG_FILE, encoding="utf-8")
    log_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log_file.addFilter(_OwnLines())
    logging.getLogger().addHandler(log_file)
  try:
    return _train(cfg, workdir, model_cfg, mesh, meta, proc, t0)
  finally:
    if log_file is not None:
      logging.getLogger().removeHandler(log_file)
      log_file.close()
    if lock is not None:
      lock.close()


# train.remat=auto: the step must fit in this share of the device's memory (XLA's estimate is
# not the allocator's peak); the policies tried after "off", the one that recomputes least
# first (blocks.REMAT_POLICIES: "dots" keeps every matmul's output, "block" only the inputs).
REMAT_MARGIN = 0.85
REMAT_ORDER = ("dots", "dots_no_batch", "attention", "block")


def choose_remat(cfg, model_cfg, mesh, limit: int | None = None):
  """``train.remat=auto``: the model config with the rematerialisation chosen on this device
  from the compiled train step's memory estimate: off when the peak fits ``REMAT_MARGIN`` of the
  device's memory, else the first policy of ``REMAT_ORDER`` that fits, else "block" (which
  saves most). Where the device reports no limit (CPU), model.remat stays as set. The choice
  goes into ``cfg.model`` (config.json and the checkpoints record it) and one log line. Each
  setting tried costs a compilation of the step (the one kept is compiled again to run)."""
  limit = flops_lib.device_bytes_limit() if limit is None else limit
  if not limit:
    logging.info("train.remat=auto: the device reports no memory limit; model.remat=%s as set",
                 model_cfg.remat)
    return model_cfg
  batch = {k: jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len), "int32" if k == "tokens"
                                   else "bool", sharding=sharding_lib.batch_sharding(mesh))
           for k in (("tokens", "prompt") if config_lib.task_of(cfg) else ("tokens",))}
  tried = []
  candidates = [model_cfg.replace(remat=False)] + [
      model_cfg.replace(remat=True, remat_policy=p) for p in REMAT_ORDER]
  for mc in candidates:
    with jax.set_mesh(mesh):
      trainer = train_lib.build(cfg, mc, mesh)
      peak = flops_lib.compiled_memory(
          trainer.step.lower(trainer.abstract_state, batch).compile())["peak_bytes"]
    name = mc.remat_policy if mc.remat else "off"
    tried.append(f"{name} {peak / 2**30:.2f} GiB")
    if peak <= REMAT_MARGIN * limit:
      break
  with cfg.unlocked():
    cfg.model.remat, cfg.model.remat_policy = mc.remat, mc.remat_policy
  logging.info("train.remat=auto: remat=%s (step memory estimates per device: %s; %.0f%% of "
               "the %.2f GiB device limit allowed)", name, ", ".join(tried),
               100 * REMAT_MARGIN, limit / 2**30)
  return mc


def puzzle_task(cfg) -> bool:
  """A run on a puzzle task (``task.name`` set, no ``tokenizer`` option: not the text ``pairs``
  task): solved, not sampled or evaluated as text."""
  return bool(cfg.task.name) and "tokenizer" not in cfg.task.options


def next_commands(workdir, task: bool = False) -> str:
  """The commands that sample from and evaluate this run: this process's own command line
  (config file and overrides) with ``--mode=sample`` / ``--mode=eval``; a task run's
  (``task``): ``--mode=solve`` (sample and eval are for text corpora)."""
  argv = sys.argv[1:] if sys.argv and sys.argv[0].endswith(("main.py", "aogpt_jax.main")) else []
  keep = [a for a in argv if not a.startswith(("--mode", "--verbose", "--noverbose"))]
  if not any(a.startswith("--config") for a in keep):
    keep = ["--config=CONFIG", f"--workdir={workdir}"]
  base = " ".join(["python -m aogpt_jax.main", *map(shlex.quote, keep)])
  if task:
    return f"solve: {base} --mode=solve"
  return f"sample: {base} --mode=sample; evaluate: {base} --mode=eval"


def _train(cfg, workdir, model_cfg, mesh, meta, proc, t0) -> dict[str, float]:

  with jax.set_mesh(mesh):
    trainer = train_lib.build(cfg, model_cfg, mesh)
    data_iter = train_iterator(cfg, proc, jax.process_count())
    ckpt = checkpoint_lib.Checkpointer(workdir, cfg.checkpoint)
    restored = ckpt.restore_latest(trainer.abstract_state, data_iter, meta)
    if restored is None:
      src = load_init(cfg, model_cfg) if cfg.train.init_from else None
      state, start = trainer.init(), 0
      if src is not None:
        state = init_from(state, src)
        logging.info("starting a new run in %s from the weights of train.init_from=%s "
                     "(optimizer, EMA and step fresh)", workdir, cfg.train.init_from)
      else:
        logging.info("starting a new run in %s", workdir, extra=FILE_ONLY)
    else:
      start, state = restored
      if start > cfg.total_steps:
        ckpt.close()
        raise config_lib.ConfigError(
            f"total_steps: {cfg.total_steps} is below the newest checkpoint's step {start} in "
            f"{ckpt.directory}; set total_steps > {start} to continue the run, or use a new "
            f"--workdir")
      if start == cfg.total_steps:   # the last line says so, with what to do next
        ckpt.close()
        logging.warning("the run in %s already reached total_steps=%d: nothing to train "
                        "(raise total_steps to continue it); checkpoints in %s; %s", workdir,
                        start, ckpt.directory, next_commands(workdir, puzzle_task(cfg)))
        return {}
      logging.info("resumed from %s", ckpt.directory / str(start))
    if proc == 0:   # only once every resume check passed: a refused resume changes nothing
      workdir_lib.write_json_atomic(workdir / "config.json", json_dumps(meta["config"]))
    # Lines and events after the restored step (0: nothing restored) are a killed run's: dropped.
    writer = metrics_lib.create_writer(workdir, resume_step=start)
    if proc == 0:
      _log_overview(state["params"], cfg, model_cfg, mesh, workdir)
    try:
      last = _loop(cfg, trainer, state, start, data_iter, ckpt, writer, meta)
    except OSError:
      ckpt.wait()   # a full disk: the failed save (step, folder) is the error, if there is one
      raise
    finally:
      try:
        writer.close()
      finally:
        ckpt.close()
    stopped = "stopped_by" in last
    signum = last.pop("stopped_by", None)
    if signum == signal.SIGINT:   # saved; the command line exits with 130 (main.py)
      raise KeyboardInterrupt(f"Ctrl-C: stopped after saving the checkpoint of step "
                              f"{ckpt.last_saved} in {ckpt.directory}")
    if proc == 0 and not stopped:
      logging.info("%s", summary_line(last, cfg.total_steps, start, time.perf_counter() - t0,
                                      ckpt.directory, workdir, puzzle_task(cfg)))
    return last


def summary_line(last: dict[str, float], total: int, start: int, seconds: float, ckpt_dir,
                 workdir, task: bool = False) -> str:
  """The end of a finished run in one line: steps, time, final losses, the checkpoint folder,
  the commands to sample and evaluate."""
  losses = [f"{name} {last[k]:.4f}" for k, name in (
      ("train/loss", "train loss"), ("eval/loss_l2r", "held-out L2R"),
      ("eval/loss_random", "held-out any-order"), ("eval/elbo", "held-out ELBO bound"))
            if k in last]
  trained = f"steps {start}-{total}" if start else f"{total} steps"
  return (f"training finished: {trained} in {metrics_lib.format_duration(seconds)}; "
          f"{', '.join(losses)} (nats/token); checkpoints in {ckpt_dir}; "
          f"{next_commands(workdir, task)}")


def load_init(cfg, model_cfg):
  """``train.init_from``: the model it names (any --checkpoint SPEC or a WORKDIR), checked
  against the run's model field for field (`from_gpt.FUNCTION_FIELDS`) before anything
  compiles."""
  from aogpt_jax.checkpoints import from_gpt  # pylint: disable=g-import-not-at-top
  spec = str(cfg.train.init_from)
  m = load_spec(spec, "train.init_from")
  diff = [f"model.{f}={getattr(m.cfg, f)!r} (the run has {getattr(model_cfg, f)!r})"
          for f in from_gpt.FUNCTION_FIELDS if getattr(m.cfg, f) != getattr(model_cfg, f)]
  if diff:
    raise config_lib.ConfigError(
        f"train.init_from: {spec} is a different model: {'; '.join(diff)}; set those model.* "
        f"fields (a2o configs: configs/a2o_gpt2_small.py)")
  return m


NO_SUCH_SPEC = ("no such folder or file; expected the WORKDIR of a trained run (train one there "
                "first) or a model SPEC: a published .pt, a converted folder, hf:OWNER/REPO/PATH, "
                "gpt2:DIR or causal:DIR")


def check_init_from(cfg, model_cfg, fields: tuple[str, ...] = (), mode: str = "train") -> None:
  """``train.init_from`` checked before anything is created or compiled, from what the run
  records (no weights): the folder or file exists; a training WORKDIR's model has the run's
  function fields (`from_gpt.FUNCTION_FIELDS`) and ``fields``. A SPEC (hf:, gpt2:, a .pt, a
  converted folder) is read when the run loads it (`load_init`)."""
  from aogpt_jax.checkpoints import from_gpt  # pylint: disable=g-import-not-at-top
  spec = str(cfg.train.init_from or "")
  if not spec or spec.startswith("hf:") or from_gpt.is_spec(spec):
    return
  path = os.path.expanduser(spec)
  if not os.path.exists(path):
    raise config_lib.ConfigError(f"train.init_from: {spec}: {NO_SUCH_SPEC}")
  meta = checkpoint_lib.recorded_meta(path)
  if meta is None or not isinstance(meta.get("model"), dict):
    return
  theirs = meta["model"]
  diff = [f"model.{f}={theirs[f]!r} (the run has {getattr(model_cfg, f)!r})"
          for f in (*from_gpt.FUNCTION_FIELDS, *fields)
          if f in theirs and theirs[f] != json.loads(json.dumps(getattr(model_cfg, f)))]
  if diff:
    then = ("" if not fields else f"; --mode={mode} trains the starting model as it is, so set "
            f"the config to match (e.g. --config.{diff[0].split('=')[0]})")
    raise config_lib.ConfigError(
        f"train.init_from: {spec} was trained with a different model: {'; '.join(diff)}"
        + (then or "; set those model.* fields (a2o configs: configs/a2o_gpt2_small.py)"))


def load_spec(spec: str, key: str):
  """The model of a WORKDIR or SPEC that config key ``key`` names (``train.init_from``,
  ``rl.reference``, ...); a read error is one `ConfigError` naming ``key`` (not --checkpoint,
  which the user did not type)."""
  from aogpt_jax.checkpoints import from_gpt  # pylint: disable=g-import-not-at-top
  from aogpt_jax.checkpoints import spec as spec_lib  # pylint: disable=g-import-not-at-top
  try:
    m, _ = spec_lib.load_any(spec)
  except (ValueError, OSError) as err:
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    prefixed = spec.startswith("hf:") or from_gpt.is_spec(spec)
    if not prefixed and not os.path.exists(os.path.expanduser(spec)):
      msg = NO_SUCH_SPEC
    else:
      msg = msg.removeprefix(f"--checkpoint={spec}: ")
    raise config_lib.ConfigError(f"{key}: {spec}: {msg.replace('--checkpoint=', '')}"
                                 ) from None
  return m


def init_from(state, m):
  """A fresh state with ``m``'s weights as the parameters and the EMA (the optimizer moments and
  the step stay those of a new run)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  params = nnx.to_pure_dict(nnx.state(m, nnx.Param))
  if jax.tree.structure(params) != jax.tree.structure(state["params"]):
    raise config_lib.ConfigError("train.init_from: its parameters do not fit the run's model")
  params = jax.tree.map(lambda p, ref: jax.device_put(p.astype(ref.dtype), ref.sharding),
                        params, state["params"])
  state = dict(state, params=params)
  if "ema" in state:
    state["ema"] = jax.tree.map(lambda p: p.copy(), params)
  return state


def json_dumps(d) -> str:
  return json.dumps(d, indent=2, sort_keys=True) + "\n"


def _log_overview(params, cfg, model_cfg, mesh, workdir) -> None:
  from clu import parameter_overview
  logging.info("model: %s", model_cfg, extra=FILE_ONLY)
  logging.info("mesh: %s over %d devices (%s)", dict(mesh.shape), mesh.size,
               jax.devices()[0].device_kind, extra=FILE_ONLY)
  count = sum(int(x.size) for x in jax.tree.leaves(params))
  logging.info("parameters:\n%s", parameter_overview.get_parameter_overview(
      params, include_stats="sharding"), extra=FILE_ONLY)
  logging.info("parameters: %s (the table: %s; --verbose prints it)", f"{count:,}",
               workdir / LOG_FILE)
  logging.info("tokens per step: %d (batch %d x seq_len %d, %d microbatch(es))",
               cfg.batch_size * cfg.seq_len, cfg.batch_size, cfg.seq_len, cfg.microbatches,
               extra=FILE_ONLY)


def _compile_step(trainer, state, batch):
  """The train step compiled ahead of time for this state and batch; logs the mesh and XLA's
  per-device memory estimate of the step (one line, before the first step runs)."""
  compiled = trainer.step.lower(state, batch).compile()
  mem, limit = flops_lib.compiled_memory(compiled), flops_lib.device_bytes_limit()
  options = flops_lib.memory_options(trainer.model_cfg, trainer.cfg.microbatches)
  logging.info("%s", flops_lib.memory_line(trainer.mesh, mem, limit, options), extra=FILE_ONLY)
  warning = flops_lib.memory_warning(mem, limit)
  if warning:
    logging.warning("%s", warning)
  return compiled


def _loop(cfg, trainer, state, start: int, data_iter, ckpt, writer, meta) -> dict[str, float]:
  total = cfg.total_steps
  flops = flops_lib.train_flops_per_step(trainer.model_cfg, cfg.batch_size, cfg.seq_len,
                                           cfg.microbatches)
  tokens_per_step = cfg.batch_size * cfg.seq_len
  progress = metrics_lib.Progress(start, total)
  stop = workdir_lib.StopSignal()
  window = _Window()
  pending = None        # (step, device metrics) of the last dispatched step, not yet checked
  last: dict[str, float] = {}
  step = start
  eval_params = "ema" if "ema" in state else "params"
  is_main = jax.process_index() == 0   # progress lines from process 0 only

  def drain():
    nonlocal pending
    if pending is not None:
      s, m = pending
      pending = None
      host = {k: float(v) for k, v in jax.device_get(m).items()}
      _check_finite(s, host, ckpt)
      window.add(host)

  try:
    while step < total:
      try:
        raw = next(data_iter)
      except task_pipeline.TaskBatchError as e:
        drain()
        saved = _save_before_failing(ckpt, step, start, state, data_iter, meta)
        raise task_pipeline.TaskBatchError(f"{e}; {saved}") from None
      batch = sharding_lib.global_batch(raw, trainer.mesh)
      first = step == start
      if first:   # compilation is not training time
        t = time.perf_counter()
        step_fn = _compile_step(trainer, state, batch)
        state, m = step_fn(state, batch)
        jax.block_until_ready(m)
        logging.info("first step (compilation included) took %.1fs", time.perf_counter() - t,
                     extra=FILE_ONLY)
        progress.restart(start + 1)
      else:
        state, m = step_fn(state, batch)
      step += 1
      ckpt.check()            # an async save that failed (a full disk) stops the run here
      drain()                 # the previous step's metrics, while this one runs
      pending = (step, m)
      stopping = stop.should_stop(step)
      is_log = step % cfg.log_every == 0 or step == total
      is_eval = (cfg.eval_every and step % cfg.eval_every == 0) or step == total
      is_ckpt = (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == total
      if not (is_log or is_eval or is_ckpt or stopping):
        continue
      drain()
      if is_log and window.steps:
        rate, eta = progress.window(step)
        scalars = window.scalars()
        scalars["train/steps_per_sec"] = rate
        scalars["train/tokens_per_sec"] = rate * tokens_per_step
        u = flops_lib.mfu(flops, rate)
        if u is not None:
          scalars["train/mfu"] = u
        writer.write_scalars(step, scalars)
        last.update(scalars)
        if is_main:
          logging.info("%s", _progress_line(step, total, scalars, eta))
        window = _Window()
      if is_ckpt or stopping:   # before the eval: a failing eval loses no trained step
        with progress.paused():
          ckpt.save(step, state, data_iter, meta)
        writer.flush()
      if is_eval:
        try:
          with progress.paused(), stop.interruptible():   # a stop signal ends the eval at once
            ev = heldout_eval(trainer, state[eval_params], cfg)
        except workdir_lib.StopRequested:
          stopping, is_eval = True, False
      if is_eval:
        writer.write_scalars(step, ev)
        last.update(ev)
        if is_main:
          logging.info("step %d eval (%s weights, %d held-out blocks of %d tokens, nats/token): "
                       "%s", step, "EMA" if eval_params == "ema" else "live", heldout_eval.blocks,
                       cfg.seq_len, _eval_line(ev))
      if stopping:
        ckpt.wait()
        logging.warning("stopped at step %d on request; the checkpoint is saved (run the same "
                        "command to resume)", step)
        last["stopped_by"] = stop.signum
        break
  finally:
    stop.restore()
  return last


def _save_before_failing(ckpt, step: int, start: int, state, data_iter, meta) -> str:
  """Saves the steps trained before a batch failed (none new: says where the last one is)."""
  if step > start and ckpt.last_saved != step:
    try:
      ckpt.save(step, state, data_iter, meta)
      ckpt.wait()
    except Exception as e:  # noqa: BLE001 - the batch's error is the one to report
      return f"saving step {step} failed too ({type(e).__name__}: {e})"
    return f"the {step - start} steps trained are saved (step {step} in {ckpt.directory})"
  if ckpt.last_saved is not None:
    return f"the newest checkpoint is step {ckpt.last_saved} in {ckpt.directory}"
  return "no step was trained"


def _progress_line(step: int, total: int, s: dict[str, float], eta: float) -> str:
  parts = [f"step {step}/{total} ({100.0 * step / total:.1f}%)",
           f"loss {s.get('train/loss', float('nan')):.4f}"]
  if "train/loss_l2r" in s:
    parts.append(f"l2r {s['train/loss_l2r']:.4f}")
  if "train/loss_random" in s:
    parts.append(f"random {s['train/loss_random']:.4f}")
  parts += [f"gnorm {s['train/grad_norm']:.3f}", f"lr {s['train/lr']:.2e}",
            f"{s['train/steps_per_sec']:.2f} steps/s",
            f"{s['train/tokens_per_sec']:,.0f} tok/s"]
  if "train/mfu" in s:
    parts.append(f"MFU {100 * s['train/mfu']:.1f}%")
  parts.append(f"ETA {metrics_lib.format_duration(eta)}")
  return " | ".join(parts)

