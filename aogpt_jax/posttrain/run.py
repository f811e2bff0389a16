"""The post-training run loop behind ``--mode=rl`` (and any other post-training algorithm).

`run(cfg, workdir, algorithm)` is `train.loop.train` for an *algorithm* object instead of the
pre-training step: the WORKDIR lock and WORKDIR/train.log, the trainer's checkpoints
(`checkpoints.store.Checkpointer`: every ``checkpoint_every`` updates, at ``total_steps`` and on
SIGTERM / Ctrl-C), exact resume, an EMA of the weights, metrics.jsonl and TensorBoard
(`train.metrics`), a progress line every ``log_every`` updates, held-out evaluation every
``eval_every`` updates and at the end (with the EMA weights when there is an EMA), and a summary
line. The state is the trainer's pytree::

    {"params", "opt_state", "ema" (when the algorithm's ema_decay > 0), "step", "rng"}

with ``params`` / ``ema`` ``nnx.to_pure_dict`` trees of the model, so `store.load_model`,
``--mode=solve`` / ``sample`` / ``eval`` and ``train.init_from`` read a post-training WORKDIR as
they read a training one. Nothing else carries state: update ``s`` gets the key
``fold_in(rng, s)`` and must draw its data from ``s`` (e.g. ``task.train_batch(seed, index=s)``),
so a resumed run continues bitwise like an uninterrupted one (tests/test_posttrain_run.py).

An algorithm (`Algorithm`) is a small object:

* ``name``: the metrics prefix and the word of the log lines ("rl");
* ``ema_decay``: 0 for none, else the EMA's decay (with the trainer's warm-up, `step.ema_update`);
* ``model``: the starting model (its weights are the run's first params; its graph is used to
  evaluate);
* ``init_opt_state(params)``; ``update(params, opt_state, step, key) -> (params, opt_state,
  metrics)`` with host float metrics (``loss`` and ``grad_norm`` are checked to be finite);
* ``evaluate(params) -> (scalars, line)``: held-out scalars (written under ``eval/``) and their
  log line; ``progress(means) -> str``: the progress line's middle, from the window's means;
* ``summary(last) -> str``: the final numbers for the summary line;
* ``mesh``: set by the loop to the run's mesh before the first update.

The mesh: the run uses the trainer's (`train.sharding.make_mesh`, ``jax.set_mesh``); params, EMA
and optimizer state are replicated over it and an algorithm may shard its batch rows over the
data axes (`train.sharding.batch_sharding`); one process only.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from aogpt_jax import config as config_lib
from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax.model import order_head as order_head_lib
from aogpt_jax.train import loop as train_loop
from aogpt_jax.train import metrics as metrics_lib
from aogpt_jax.train import sharding as sharding_lib
from aogpt_jax.train import step as step_lib
from aogpt_jax.train import workdir as workdir_lib


class Algorithm(Protocol):
  name: str
  ema_decay: float
  model: Any
  mesh: Any

  def init_opt_state(self, params) -> Any: ...

  def update(self, params, opt_state, step: int, key: jax.Array) -> tuple[Any, Any, dict]: ...

  def evaluate(self, params) -> tuple[dict[str, float], str]: ...

  def progress(self, means: dict[str, float]) -> str: ...

  def summary(self, last: dict[str, float]) -> str: ...


def check_loop_config(cfg, mode: str) -> None:
  """The loop's own one-line errors (config.resolve checked the rest)."""
  if jax.process_count() > 1:
    raise config_lib.ConfigError(f"distributed: --mode={mode} runs in one process (it has "
                                 f"{jax.process_count()})")


def check_ema_decay(value, key: str) -> float:
  """``key`` (an EMA decay) as a float in [0, 1) (0: no EMA), or a one-line ConfigError."""
  if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
    raise config_lib.ConfigError(f"{key}: must be in [0, 1) (0: no EMA), got {value!r}")
  return float(value)


def data_parallel(cfg) -> int:
  """How many devices the run's batch rows split over (mesh.data * mesh.fsdp)."""
  shape = sharding_lib.mesh_shape(cfg, jax.device_count())
  return int(shape[0] * shape[1])


def starting_model(cfg, mc, mode: str):
  """``train.init_from``, required by every post-training mode: the model it names, checked
  against the run's model (`train.loop.load_init`)."""
  if not cfg.train.init_from:
    raise config_lib.ConfigError(
        f"train.init_from: --mode={mode} starts from a trained model; set it to the run's "
        f"WORKDIR or a model SPEC (e.g. /tmp/sudoku, trained by configs/sudoku.py:tiny)")
  m = train_loop.load_init(cfg, mc)
  diff = [f"model.{f}={getattr(m.cfg, f)!r} (the config has {getattr(mc, f)!r})"
          for f in LAYOUT_FIELDS if getattr(m.cfg, f) != getattr(mc, f)]
  if diff:
    raise config_lib.ConfigError(
        f"train.init_from: {cfg.train.init_from} was trained with {'; '.join(diff)}; "
        f"--mode={mode} trains the starting model as it is, so set the config to match (e.g. "
        f"--config.{diff[0].split(' ')[0]}), or change the layout by training first")
  return m


# The attention layout a post-training run keeps from its starting model: the run trains the
# loaded model, so its config (and what config.json and the checkpoints record) must say the same.
LAYOUT_FIELDS = ("blank_block", "blank_attention", "prompt_attention")


def load_reference(spec: str, start_model, key: str):
  """A frozen reference model: ``spec`` (a WORKDIR or SPEC, read errors one line naming
  ``key``), or a copy of ``start_model``'s weights when ``spec`` is ""."""
  if not spec:
    return nnx.clone(start_model)   # a copy (nnx.merge(*nnx.split(m)) would share its variables)
  return train_loop.load_spec(spec, key)


def run_meta(cfg, mc, algorithm: Algorithm, mode: str) -> dict:
  """The checkpoints' meta: the trainer's (`store.run_meta`), with the algorithm's EMA and the
  mode that wrote them."""
  meta = checkpoint_lib.run_meta(cfg, mc)
  meta["has_ema"] = bool(algorithm.ema_decay)
  meta["mode"] = mode
  head = order_head_lib.spec(algorithm.model)
  if head is not None:       # the weights hold an order head (rl.order_head): load_model adds it
    meta["order_head"] = head
  return meta


def run(cfg, workdir: str, algorithm: Algorithm, *, mc, mode: str) -> dict[str, float]:
  """Runs (or resumes) ``algorithm`` in ``workdir`` to ``total_steps`` updates; returns the last
  metrics and eval scalars. ``cfg`` was checked (`config.resolve` -> ``mc``) and the algorithm
  built, with their one-line errors, before this is called."""
  t0 = time.perf_counter()
  check_loop_config(cfg, mode)
  mesh = sharding_lib.make_mesh(cfg)
  workdir = workdir_lib.prepare_workdir(workdir)
  checkpoint_lib.check_writable(checkpoint_lib.checkpoint_dir(workdir))
  meta = run_meta(cfg, mc, algorithm, mode)
  lock = workdir_lib.lock_workdir(workdir)
  log_file = train_loop._LogFile(workdir / train_loop.LOG_FILE, encoding="utf-8")  # noqa: SLF001
  log_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  log_file.addFilter(train_loop._OwnLines())  # noqa: SLF001
  logging.getLogger().addHandler(log_file)
  try:
    with jax.set_mesh(mesh):
      return _run(cfg, workdir, algorithm, mesh, meta, mode, t0)
  finally:
    logging.getLogger().removeHandler(log_file)
    log_file.close()
    lock.close()


def fresh_state(algorithm: Algorithm, seed: int, rep) -> dict:
  params = jax.device_put(nnx.to_pure_dict(nnx.state(algorithm.model, nnx.Param)), rep)
  state = {"params": params, "opt_state": jax.device_put(algorithm.init_opt_state(params), rep),
           "step": jnp.zeros((), jnp.int32), "rng": jax.random.PRNGKey(seed)}
  if algorithm.ema_decay:
    state["ema"] = jax.tree.map(jnp.copy, params)
  return state


def _run(cfg, workdir, algorithm, mesh, meta, mode, t0) -> dict[str, float]:
  rep = sharding_lib.replicated(mesh)
  algorithm.mesh = mesh
  shapes = jax.eval_shape(lambda: fresh_state(algorithm, int(cfg.seed), None))
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), shapes)
  ckpt = checkpoint_lib.Checkpointer(workdir, cfg.checkpoint)
  try:
    restored = ckpt.restore_latest(abstract, None, meta)
  except BaseException:
    ckpt.close()
    raise
  total = int(cfg.total_steps)
  if restored is None:
    state, start = fresh_state(algorithm, int(cfg.seed), rep), 0
    logging.info("starting a new %s run in %s from the weights of train.init_from=%s", mode,
                 workdir, cfg.train.init_from)
  else:
    start, state = restored
    if start > total:
      ckpt.close()
      raise config_lib.ConfigError(
          f"total_steps: {total} is below the newest checkpoint's step {start} in "
          f"{ckpt.directory}; set total_steps > {start} to continue the run, or use a new "
          f"--workdir")
    if start == total:
      ckpt.close()
      logging.warning("the %s run in %s already reached total_steps=%d: nothing to do (raise "
                      "total_steps to continue it); checkpoints in %s", mode, workdir, start,
                      ckpt.directory)
      return {}
    logging.info("resumed from %s", ckpt.directory / str(start))
  workdir_lib.write_json_atomic(workdir / "config.json", train_loop.json_dumps(meta["config"]))
  writer = metrics_lib.create_writer(workdir, resume_step=start)
  try:
    last = _loop(cfg, algorithm, state, start, ckpt, writer, meta)
  except OSError:
    ckpt.wait()
    raise
  finally:
    try:
      writer.close()
    finally:
      ckpt.close()
  signum = last.pop("stopped_by", None)
  if signum == signal.SIGINT:
    raise KeyboardInterrupt(f"Ctrl-C: stopped after saving the checkpoint of step "
                            f"{ckpt.last_saved} in {ckpt.directory}")
  if signum is None:
    done = f"updates {start}-{total}" if start else f"{total} updates"
    logging.info("%s finished: %s in %s; %s; checkpoints in %s; %s", mode, done,
                 metrics_lib.format_duration(time.perf_counter() - t0), algorithm.summary(last),
                 ckpt.directory, next_commands(workdir))
  return last


def next_commands(workdir) -> str:
  """What to run next on a post-training run (always a task's): ``--mode=solve``."""
  return train_loop.next_commands(workdir, task=True)


# The speed metrics of an update, left out of the progress line's means for the first update of
# a process (its compilation would be averaged into the rollout rate).
COMPILE_TIMED = ("rollout_sec", "update_sec", "rollouts_per_sec", "update_share")


def _check_finite(step: int, m: dict[str, float], ckpt, name: str) -> None:
  bad = {k: m[k] for k in ("loss", "grad_norm") if k in m and not math.isfinite(m[k])}
  if bad:
    ckpt.wait()
    saved = ckpt.last_saved
    where = (f"the last good state is the checkpoint of step {saved} ({ckpt.directory / str(saved)})"
             if saved is not None else "no checkpoint of this run exists yet")
    raise train_loop.NonFiniteLoss(f"{name} update {step} produced non-finite values {bad}; "
                                   f"stopping. This update was not saved; {where}.")


def _loop(cfg, algorithm, state, start: int, ckpt, writer, meta) -> dict[str, float]:
  total, name = int(cfg.total_steps), algorithm.name
  decay = float(algorithm.ema_decay or 0.0)
  ema_update = jax.jit(lambda e, p, k: step_lib.ema_update(e, p, decay, k))
  progress = metrics_lib.Progress(start, total)
  stop = workdir_lib.StopSignal()
  window: dict[str, list[float]] = {}
  last: dict[str, float] = {}
  step = start
  eval_weights = "ema" if "ema" in state else "params"
  try:
    while step < total:
      key = jax.random.fold_in(state["rng"], step)
      params, opt_state, m = algorithm.update(state["params"], state["opt_state"], step, key)
      step += 1
      state = dict(state, params=params, opt_state=opt_state,
                   step=jnp.asarray(step, jnp.int32))
      if "ema" in state:
        state["ema"] = ema_update(state["ema"], params, step)
      _check_finite(step, m, ckpt, name)
      ckpt.check()
      if step == start + 1:
        progress.restart(step)   # the first update compiles: not in the rate
      scalars = {f"{name}/{k}": float(v) for k, v in m.items()}
      writer.write_scalars(step, scalars)
      last.update(scalars)
      for k, v in m.items():
        if step == start + 1 and k in COMPILE_TIMED:   # the first update compiles: the metrics
          continue                                      # (metrics.jsonl) keep it, the line not
        window.setdefault(k, []).append(float(v))
      stopping = stop.should_stop(step)
      is_log = step % cfg.log_every == 0 or step == total
      is_eval = (cfg.eval_every and step % cfg.eval_every == 0) or step == total
      is_ckpt = (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == total
      if is_log and window:
        rate, eta = progress.window(step)
        means = {k: float(np.mean(v)) for k, v in window.items()}
        logging.info("%s update %d/%d (%.1f%%) | %s | %.2f updates/s | ETA %s", name, step,
                     total, 100.0 * step / total, algorithm.progress(means), rate,
                     metrics_lib.format_duration(eta))
        window = {}
      if is_ckpt or stopping:   # before the eval: a failing eval loses no update
        with progress.paused():
          ckpt.save(step, state, None, meta)
        writer.flush()
      if is_eval:
        try:
          with progress.paused(), stop.interruptible():   # a stop signal ends the eval at once
            ev, line = algorithm.evaluate(state[eval_weights])
        except workdir_lib.StopRequested:
          stopping, is_eval = True, False
      if is_eval:
        ev = {f"eval/{k}": float(v) for k, v in ev.items()}
        writer.write_scalars(step, ev)
        last.update(ev)
        logging.info("%s update %d eval (%s weights): %s", name, step,
                     "EMA" if eval_weights == "ema" else "live", line)
      if stopping:
        ckpt.wait()
        logging.warning("stopped at %s update %d on request; the checkpoint is saved (run the "
                        "same command to resume)", name, step)
        last["stopped_by"] = stop.signum
        break
  finally:
    stop.restore()
  return last
