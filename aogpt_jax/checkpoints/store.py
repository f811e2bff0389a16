"""Orbax checkpoints in WORKDIR/checkpoints, and loading a trained model from a workdir.

A checkpoint is a folder per step (written to a temporary name and renamed when complete, so a
killed run never leaves a half-written step behind) holding the items::

    params, opt_state, ema (when EMA is on), train ({step, rng}), data (the grain iterator,
    one file per process; none in a post-training run), meta (JSON: the resolved config of the
    run that wrote it)

Once a save has finished, ``<step>/aogpt_sha256.json`` records the size and sha256 of every file
of the step; restoring checks them first. Resuming takes the newest readable step; one whose
bytes differ from its manifest (or, without a manifest, that cannot be read) is moved to
WORKDIR/checkpoints_corrupt/ with a warning naming it and the previous step is used. A step whose
checksums match but which still cannot be restored is not corrupt: that is an error naming it. A
checkpoint written with a config that changes the shape of the state or the data stream is
refused with an error naming the differing field.

Other modes load a trained model with::

    model, config = store.load_model(workdir, which="ema")   # or which="params"; aogpt_jax.load
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import hashlib
import json
import logging
import os
import pathlib
import shutil
import sys
import time
from typing import Any, Callable

import grain
import jax
import orbax.checkpoint as ocp
from flax import nnx
from ml_collections import config_dict

from aogpt_jax import config as config_lib
from aogpt_jax import config_groups
from aogpt_jax.errors import _root, one_line
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import order_head as order_head_lib

STATE_ITEMS = ("params", "opt_state", "ema")
# Model fields that do not change the parameters (free to differ between save and restore).
_FREE_MODEL_FIELDS = {"dropout", "attention", "attention_impl", "dtype", "remat", "remat_policy",
                      "loss_chunk", "init_truncation"}  # init_truncation: used only at init
_MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(model_lib.ModelConfig)}
# Top-level keys that fix the data stream and the random stream of a run.
# data.worker_count: grain's saved iterator state has another layout with worker processes.
_STREAM_KEYS = {"seed", "batch_size", "seq_len", "data.source", "data.tokenizer",
                "data.worker_count", "task.name", "task.options"}
# Keys added to the config since a checkpoint may have been written; absent there and at this
# default here, they change nothing.
_ADDED_KEYS = {"task.name": "", "task.options": {}, "task.heldout_seed": 0,
               "task.heldout_count": 256, "task.module": "", "train.for_mode": "",
               "train.remat": ""}
MANIFEST = "aogpt_sha256.json"
_ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax: STEP<suffix> is renamed to STEP on commit
FORMAT = 1


class _QuietReadOnly(logging.Filter):
  """Drops orbax's routine "Given directory is read only" warning of every eval/sample run."""

  def filter(self, record) -> bool:
    return not (record.pathname.endswith("checkpoint_manager.py")
                and str(record.msg).startswith("Given directory is read only"))


logging.getLogger("absl").addFilter(_QuietReadOnly())


class _QuietSaveThreads(logging.Filter):
  """Drops orbax's error reports with a traceback (a save's background threads, each for itself,
  and its wait): a failed save is reported once, as the `CheckpointSaveError` naming the step
  and folder (its cause chain keeps the traceback for --verbose)."""

  dropped = 0

  def filter(self, record) -> bool:
    if (record.levelno >= logging.ERROR and "/orbax/" in record.pathname
        and (record.exc_info or "raised an exception" in str(record.msg))):
      _QuietSaveThreads.dropped += 1
      return False
    return True


logging.getLogger("absl").addFilter(_QuietSaveThreads())


class IncompatibleCheckpoint(config_lib.ConfigError):
  """The checkpoint was written by a run whose state or data stream differs from this one."""


class CheckpointSaveError(OSError):
  """A save failed (no space left, an unwritable folder); the message names step and folder."""


class CorruptCheckpoint(OSError):
  """A checkpoint file's size or sha256 differs from the manifest written at save time."""


def _sha256(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


# orbax's own bookkeeping, rewritten when a step is committed (after the manifest is written)
_UNHASHED = {MANIFEST, MANIFEST + ".tmp", "_CHECKPOINT_METADATA", "commit_success.txt"}


def _files(step_dir: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for p in step_dir.rglob("*")
                if p.is_file() and not (p.parent == step_dir and p.name in _UNHASHED))


def write_manifest(step_dir: str | os.PathLike) -> pathlib.Path:
  """Writes STEP_DIR/aogpt_sha256.json: {relative path: [size, sha256]} of every file."""
  step_dir = pathlib.Path(step_dir)
  files = {str(p.relative_to(step_dir)): [p.stat().st_size, _sha256(p)] for p in _files(step_dir)}
  out = step_dir / MANIFEST
  tmp = out.with_name(MANIFEST + ".tmp")
  tmp.write_text(json.dumps({"sha256": files}, sort_keys=True) + "\n", encoding="utf-8")
  os.replace(tmp, out)
  return out


def verify_manifest(step_dir: str | os.PathLike) -> bool:
  """True if STEP_DIR's files match its manifest, False if it has none; raises
  `CorruptCheckpoint` naming the first file that is missing or differs."""
  step_dir = pathlib.Path(step_dir)
  path = step_dir / MANIFEST
  if not path.exists():
    logging.warning("checkpoint %s has no checksum manifest (saved before checksums existed, or "
                    "the run was killed between the save and its manifest): its bytes cannot be "
                    "verified", step_dir)
    return False
  try:
    files = json.loads(path.read_text(encoding="utf-8"))["sha256"]
  except (ValueError, KeyError, TypeError) as e:
    raise CorruptCheckpoint(f"{path}: unreadable manifest ({type(e).__name__})") from None
  for rel, (size, digest) in sorted(files.items()):
    p = step_dir / rel
    if not p.is_file():
      raise CorruptCheckpoint(f"{p} is missing")
    if p.stat().st_size != size:
      raise CorruptCheckpoint(f"{p} has {p.stat().st_size} bytes, {size} when saved")
    if _sha256(p) != digest:
      raise CorruptCheckpoint(f"{p}: sha256 differs from the one written at save time")
  return True


def check_writable(directory: str | os.PathLike, what: str = "checkpoints", *,
                   keep: bool = True) -> None:
  """A one-line `ConfigError` (before anything compiles) when DIRECTORY cannot be written;
  orbax would otherwise retry for minutes and time out without naming the permission. A file
  where a folder should be is named as such. ``keep=False``: the folders this check had to
  create are removed again (an output folder appears only with its first file, so a run that
  fails leaves no empty folder behind)."""
  directory = pathlib.Path(directory)
  for parent in (directory, *directory.parents):
    if parent.exists() and not parent.is_dir():
      raise config_lib.ConfigError(
          f"{what}: {parent} is a file, not a folder; give a folder path (an existing folder "
          f"or one to create)")
    if parent.exists():
      break
  created = [p for p in (directory, *directory.parents) if not p.exists()]
  try:
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".write_probe.{os.getpid()}.{jax.process_index()}"
    probe.write_text("ok")
    probe.unlink()
    if not keep:
      for p in created:                 # deepest first
        p.rmdir()
  except OSError as e:
    for p in created if not keep else ():   # leave nothing behind on failure either
      try:
        p.rmdir()
      except OSError:
        pass
    raise config_lib.ConfigError(
        f"{what}: {directory} is not writable ({e.strerror or type(e).__name__}); fix its "
        f"permissions (chmod u+w) or use another --workdir") from None


def checkpoint_dir(workdir: str | os.PathLike) -> pathlib.Path:
  return pathlib.Path(workdir).absolute() / "checkpoints"


def recorded_meta(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """The newest committed checkpoint's meta of the run in ``workdir`` (its mode, model and
  config), read from the JSON alone, no weights; None where there is none or it cannot be read
  (the restore then says why)."""
  folder = checkpoint_dir(workdir)
  steps = sorted((int(p.name) for p in folder.glob("*") if p.name.isdigit()
                  and (p / "meta" / "metadata").is_file()), reverse=True) if folder.is_dir() else []
  for step in steps:
    try:
      with open(folder / str(step) / "meta" / "metadata", encoding="utf-8") as f:
        meta = json.load(f)
    except (OSError, ValueError):
      continue
    if isinstance(meta, dict):
      return meta
  return None


def check_mode(workdir: str | os.PathLike, mode: str) -> None:
  """A run folder written by another mode (its newest checkpoint's meta): the one line
  `check_compatible` gives at restore, before anything is created or compiled."""
  meta = recorded_meta(workdir)
  if meta is not None:
    check_compatible({"mode": meta.get("mode", "train"), "config": {}},
                     {"mode": mode, "config": {}}, str(checkpoint_dir(workdir)))


def run_meta(cfg, mc: model_lib.ModelConfig) -> dict[str, Any]:
  return {"format": FORMAT, "config": config_lib.resolved_dict(cfg, mc), "model": mc.to_dict(),
          "has_ema": config_lib.ema_decay(cfg) is not None}


def check_compatible(saved: dict, current: dict, where: str) -> None:
  """Raises `IncompatibleCheckpoint` naming the first field that makes ``saved`` unusable for
  the current run; logs the fields that differ harmlessly (e.g. learning rate, total_steps)."""
  was, now = saved.get("mode", "train"), current.get("mode", "train")
  if was != now:      # the trees differ: name the modes, not orbax's tree mismatch
    raise IncompatibleCheckpoint(
        f"{where} was written by --mode={was}; this is --mode={now}: run --mode={was} to "
        f"continue that run, or use a new --workdir for --mode={now}")
  old = config_lib.flatten(saved["config"])
  new = config_lib.flatten(current["config"])
  task = new.get("task.name")
  if task and old.get("task.name") == task:   # a task option left out is at its default
    for d in (old, new):
      d["task.options"] = config_lib.task_options_full(task, d.get("task.options"))
  harmless = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
    if a == b or key.startswith("distributed."):
      continue
    if a == "<absent>" and key.startswith("model.") and b == _MODEL_DEFAULTS.get(key[6:], a):
      continue                  # a model field added since, at its default: the same model
    if a == "<absent>" and key in _ADDED_KEYS and b == _ADDED_KEYS[key]:
      continue                  # a key added since, at its default
    if a == "<absent>" and key.split(".", 1)[0] in config_groups.OWNERS and b == _group_default(
        key):
      continue                  # a key of a config group (rl.*, ...) added since, at its default
    structural = (key in _STREAM_KEYS or
                  (key.startswith("model.") and key.split(".", 1)[1] not in _FREE_MODEL_FIELDS
                   and key != "model.preset"))
    if structural:
      was = f"{a!r}"
      if a == "<absent>" and key.startswith("model.") and key[6:] in _MODEL_DEFAULTS:
        a = _MODEL_DEFAULTS[key[6:]]     # a field newer than the checkpoint: its default then
        was = f"{a!r} (the default: the field is newer than the checkpoint)"
      restore = f"--config.{key}={a}" if a != "<absent>" else "the old value"
      raise IncompatibleCheckpoint(
          f"{key}: the checkpoint {where} was written with {key}={was} but this run has "
          f"{key}={b!r}; resume with {restore} or use a new --workdir")
    harmless.append(f"{key}: {a!r} -> {b!r}")
  if saved.get("has_ema") != current.get("has_ema"):
    raise IncompatibleCheckpoint(
        f"optimizer.ema_decay: the checkpoint {where} was written "
        f"{'with' if saved.get('has_ema') else 'without'} an EMA and this run "
        f"{'has' if current.get('has_ema') else 'has none'}; restore the old value or use a "
        f"new --workdir")
  if harmless:
    logging.warning("resuming from %s with changed settings: %s", where, "; ".join(harmless))


def _group_default(key: str):
  """The default of ``key`` in its config group (`config_groups`), or a marker for none."""
  group, _, name = key.partition(".")
  defaults = config_groups.groups().get(group)
  return defaults.get(name, "<no default>") if defaults is not None else "<no default>"


class Checkpointer:
  """The CheckpointManager of one run: keep the last ``checkpoint.keep`` steps plus every step
  that is a multiple of ``checkpoint.keep_every``; saves asynchronously."""

  def __init__(self, workdir, ckpt_cfg):
    self.workdir = pathlib.Path(workdir).absolute()
    self.directory = checkpoint_dir(workdir)
    check_writable(self.directory)
    self._saving: int | None = None      # the step of the save in flight
    self._failed = False                 # a save failed (and was raised): nothing more to wait for
    self.last_saved: int | None = None   # the newest step whose save has finished (or restored)
    async_options = (ocp.AsyncOptions(post_finalization_callback=self._manifest_before_commit)
                     if ckpt_cfg.async_save else None)  # orbax allows it only with async saves
    options = ocp.CheckpointManagerOptions(
        max_to_keep=ckpt_cfg.keep or None, keep_period=ckpt_cfg.keep_every or None,
        enable_async_checkpointing=ckpt_cfg.async_save, cleanup_tmp_directories=True,
        create=True, async_options=async_options)
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    # The background threads of a failed save report to nobody (hundreds of lines otherwise).
    self._quiet = _quiet_unraisable().__enter__()

  def _manifest_before_commit(self) -> None:
    """orbax's hook after the data of an async save is written and before its temporary folder
    is renamed to the step: the manifest goes in first, so every committed step has one."""
    tmp = self.directory / f"{self._saving}{_ORBAX_TMP_SUFFIX}"
    if self._saving is not None and jax.process_index() == 0 and tmp.is_dir():
      write_manifest(tmp)

  def _finished(self) -> None:
    """After the save in flight has finished: its manifest, if the hook did not write it (sync
    saves; a file system without atomic renames)."""
    step, self._saving = self._saving, None
    step_dir = self.directory / str(step)
    if step is None or not step_dir.is_dir():
      return
    if jax.process_index() == 0 and not (step_dir / MANIFEST).exists():
      write_manifest(step_dir)
    self.last_saved = max(step, self.last_saved or 0)

  def save(self, step: int, state: dict, data_iter, meta: dict) -> None:
    items = {k: ocp.args.StandardSave(state[k]) for k in STATE_ITEMS if k in state}
    items["train"] = ocp.args.StandardSave({"step": state["step"], "rng": state["rng"]})
    if data_iter is not None:   # None: a run without a data iterator (post-training)
      items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    items["meta"] = ocp.args.JsonSave(meta)
    self.wait()
    self._saving = step
    with self._failure(step):
      self.manager.save(step, args=ocp.args.Composite(**items), force=True)
    if not self.manager.is_saving_in_progress():
      self._finished()

  @contextlib.contextmanager
  def _failure(self, step: int | None):
    """A failed save (a full disk, a folder gone read-only) is one `CheckpointSaveError` naming
    the step and the folder, raised where it is found: at the save itself, or for an async
    save at the next wait (the next save, a stop, or the end of the run)."""
    try:
      with _quiet_unraisable():
        yield
    except Exception as e:  # noqa: BLE001 - orbax wraps the OSError in several layers
      self._saving, self._failed = None, True
      _quiet_failed_futures()
      removed = self._remove_partial(step)
      root = _root(e)
      why = getattr(root, "strerror", None) or getattr(e, "strerror", None) or one_line(root)
      if "No space left on device" in why:   # tensorstore's ValueError says it at the end
        why = "No space left on device"
      raise CheckpointSaveError(
          f"checkpoint: saving step {step} to {self.directory} failed ({why}); the steps "
          f"saved before it are intact ({self.last_saved if self.last_saved is not None else 'none'}"
          f" is the newest){removed}; free space or fix the folder, then rerun to resume"
      ) from e

  def _remove_partial(self, step: int | None) -> str:
    """Removes the temporary folder of the failed save of ``step`` (on a full disk it holds the
    space the resume needs); returns what the error adds about it."""
    if step is None or jax.process_index() != 0:
      return ""
    try:      # orbax's writer threads may still be adding files to the folder: let them end
      self.manager.wait_until_finished()
    except Exception:  # noqa: BLE001 - the save already failed; its error is the one reported
      pass
    removed, left = [], []
    for tmp in self.directory.glob(f"{step}{_ORBAX_TMP_SUFFIX}*"):
      for _ in range(3):     # a late write re-creates a file: remove again
        shutil.rmtree(tmp, ignore_errors=True)
        if not tmp.exists():
          break
        time.sleep(0.2)
      (left if tmp.exists() else removed).append(tmp.name)
    out = f"; its partial folder {', '.join(removed)} was removed" if removed else ""
    if left:
      out += f"; its partial folder {', '.join(left)} could not be removed (remove it by hand)"
    return out

  def restore_latest(self, abstract_state: dict, data_iter, meta: dict):
    """``(step, state)`` from the newest readable compatible checkpoint (the data iterator is
    set to its saved position; None: a run without one), or None when there is none."""
    def read(step):
      verified = verify_manifest(self.directory / str(step))
      saved = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
      check_compatible(saved.meta, meta, str(self.directory / str(step)))
      items = {k: ocp.args.StandardRestore(abstract_state[k])
               for k in STATE_ITEMS if k in abstract_state}
      items["train"] = ocp.args.StandardRestore(
          {"step": abstract_state["step"], "rng": abstract_state["rng"]})
      if data_iter is not None:
        items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
      try:
        r = self.manager.restore(step, args=ocp.args.Composite(**items))
      except Exception as e:  # noqa: BLE001
        if verified:   # intact bytes: a setting of this run, not corruption
          raise IncompatibleCheckpoint(
              f"checkpoint {self.directory / str(step)} is intact (its checksums match) but "
              f"cannot be restored into this run ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:200] if str(e) else ''}); restore the run's settings "
              f"(see its meta/config) or use a new --workdir") from None
        raise
      self.last_saved = step
      state = {k: r[k] for k in STATE_ITEMS if k in abstract_state}
      state.update(step=r.train["step"], rng=r.train["rng"])
      return state

    return _newest_readable(self.manager, self.directory, read, on_failure=self._set_aside)

  def _set_aside(self, step: int) -> None:
    """Moves an unreadable step out of the checkpoint folder (kept for inspection), so that a
    later save of the same step does not collide with it."""
    if jax.process_index() == 0:
      src = self.directory / str(step)
      dst_dir = self.workdir / "checkpoints_corrupt"
      dst_dir.mkdir(parents=True, exist_ok=True)
      dst = dst_dir / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
      if src.exists():
        try:
          os.replace(src, dst)
        except OSError as e:
          if e.errno != errno.EXDEV:
            raise
          shutil.move(str(src), str(dst))   # checkpoints/ on another file system (a symlink)
        logging.warning("moved unreadable checkpoint %s to %s", src, dst)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"aogpt_set_aside_{step}")
    self.manager.reload()

  def check(self) -> None:
    """Raises the `CheckpointSaveError` of an async save that has already failed, without
    waiting for one still running (every step: a full disk stops the run at the next step, not
    at the next save)."""
    if self._saving is not None and not self.manager.is_saving_in_progress():
      self.wait()

  def wait(self) -> None:
    if self._failed:   # raised once, at the save that failed; orbax would raise it again
      return
    with self._failure(self._saving):
      self.manager.wait_until_finished()
    self._finished()

  def close(self) -> None:
    try:
      self.wait()
      try:
        self.manager.close()
      except Exception:  # noqa: BLE001
        if not self._failed:
          raise   # else: the failed save's error again, already raised
    finally:
      if self._quiet is not None:
        self._quiet.__exit__(None, None, None)
        self._quiet = None


def _newest_readable(manager, directory, read: Callable[[int], Any],
                     on_failure: Callable[[int], None] | None = None):
  """Tries the steps newest first; an unreadable one is skipped with a warning naming it.
  `IncompatibleCheckpoint` is not a read failure and propagates."""
  with _quiet_unraisable():
    return _try_newest(manager, directory, read, on_failure)


class _FailedFutures(logging.Filter):
  """asyncio's "Future exception was never retrieved" reports of a failed save's background
  writes (one per array), each with a traceback: the save's one error line says it all."""

  def filter(self, record) -> bool:
    return "exception was never retrieved" not in str(record.msg)


def _quiet_failed_futures() -> None:
  """After a save failed: asyncio's reports of its abandoned writes are dropped (for the rest of
  the process, which ends with the save's error; they arrive when the futures are collected)."""
  log = logging.getLogger("asyncio")
  if not any(isinstance(f, _FailedFutures) for f in log.filters):
    log.addFilter(_FailedFutures())


class _quiet_unraisable:  # pylint: disable=invalid-name
  """Counts, instead of printing, the "Exception ignored in ..." reports of orbax / tensorstore
  objects collected after a failed read (hundreds of lines per corrupt checkpoint otherwise);
  every other unraisable exception still reaches the previous hook."""

  def __enter__(self):
    self.previous, self.dropped = sys.unraisablehook, 0
    sys.unraisablehook = self._hook
    return self

  def _hook(self, u) -> None:
    where = (f"{getattr(u.object, '__module__', '')} {getattr(type(u.object), '__module__', '')} "
             f"{u.object!r:.200} ")
    tb = u.exc_traceback
    while tb is not None:
      where += tb.tb_frame.f_code.co_filename + " "
      tb = tb.tb_next
    closed = "Event loop is closed" in str(u.exc_value) and "asyncio" in where
    if "orbax" in where or "tensorstore" in where or closed:   # closed: a failed save's callbacks
      self.dropped += 1
    else:
      self.previous(u)

  def __exit__(self, *exc):
    gc.collect()
    sys.unraisablehook = self.previous
    if self.dropped:   # WORKDIR/train.log only (main.py): the failure itself was reported
      logging.info("dropped %d 'Exception ignored' reports of orbax after a failed read or save",
                   self.dropped, extra={"file_only": True})
    return False


def _try_newest(manager, directory, read, on_failure):
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      return step, read(step)
    except IncompatibleCheckpoint:
      raise
    except Exception as e:  # noqa: BLE001 - any read failure means "try the previous one"
      what = "is corrupt" if isinstance(e, CorruptCheckpoint) else "is unreadable"
      logging.warning("checkpoint %s %s (%s: %s); trying the previous one",
                      directory / str(step), what, type(e).__name__,
                      (str(e).splitlines() or [""])[0][:300])
      if on_failure is not None:
        on_failure(step)
  return None


# ----------------------------------------------------------------------------- loading models


def _import_task_module(run_cfg) -> None:
  """The run's ``task.module`` (a task of one's own), imported so that ``tasks.make`` finds the
  run's task after loading it; a module that cannot be imported now is a warning (the weights
  load all the same)."""
  from aogpt_jax import tasks  # pylint: disable=g-import-not-at-top
  module = str((run_cfg.get("task", None) or {}).get("module", "") or "")
  try:
    tasks.import_modules(module)
  except ValueError as e:
    logging.warning("%s (the run's task %r cannot be made until it imports)", e,
                    run_cfg.task.get("name", ""))


def load_model(workdir: str | os.PathLike, which: str = "ema", step: int | None = None,
               **model_overrides) -> tuple[model_lib.AOGPT, config_dict.ConfigDict]:
  """An `AOGPT` with the weights of a checkpoint in ``workdir`` and the run's config; the
  config's ``loaded`` entry says what was loaded: ``checkpoint`` (path), ``step``, ``weights``
  (``ema`` or ``params``, after any fallback).

  which: "ema" (the EMA weights; falls back to the live weights, with a warning, when the run
    had no EMA) or "params" (the live weights).
  step: a specific step; None = the newest readable one.
  model_overrides: ModelConfig fields that do not change the parameters (dtype, attention,
    attention_impl, remat, dropout), e.g. ``dtype="bfloat16"`` for fast sampling.
  The arrays are placed on the first local device.
  """
  if which not in ("ema", "params"):
    raise ValueError(f"which must be 'ema' or 'params', got {which!r}")
  bad = sorted(set(model_overrides) - _FREE_MODEL_FIELDS)
  if bad:
    raise ValueError(f"load_model: {bad} change the parameters; only {sorted(_FREE_MODEL_FIELDS)}"
                     f" may be overridden")
  directory = checkpoint_dir(workdir)
  if not directory.is_dir():
    raise FileNotFoundError(f"no checkpoints in {directory}")
  manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
      read_only=True, save_interval_steps=0, create=False))

  def read(s):
    verify_manifest(directory / str(s))
    meta = manager.restore(s, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    mc = model_lib.ModelConfig(**meta["model"]).replace(**model_overrides)
    item = which
    if which == "ema" and not meta.get("has_ema"):
      logging.warning("%s: the run had no EMA; loading the live weights", directory / str(s))
      item = "params"
    abstract_model = nnx.eval_shape(lambda: order_head_lib.with_head(
        model_lib.AOGPT(mc, rngs=nnx.Rngs(0)), meta.get("order_head")))
    graphdef, abstract = nnx.split(abstract_model, nnx.Param)
    dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev),
                          nnx.to_pure_dict(abstract))
    r = manager.restore(s, args=ocp.args.Composite(**{item: ocp.args.StandardRestore(target)}))
    run_cfg = config_dict.ConfigDict(meta["config"])
    _import_task_module(run_cfg)
    # What was actually loaded (after any fallback), for every output's provenance.
    run_cfg.loaded = {"checkpoint": str(directory / str(s)), "step": int(s), "weights": item}
    return nnx.merge(graphdef, r[item]), run_cfg

  try:
    if step is not None:
      if step not in manager.all_steps():
        raise FileNotFoundError(f"no checkpoint for step {step} in {directory}; "
                                f"available: {sorted(manager.all_steps())}")
      return read(step)
    found = _newest_readable(manager, directory, read)
    if found is None:
      raise FileNotFoundError(f"no readable checkpoint in {directory}")
    return found[1]
  finally:
    manager.close()
