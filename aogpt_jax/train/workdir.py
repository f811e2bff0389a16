"""The training workdir: its creation, its lock (one run at a time), atomic JSON writes, and the
stop signals (SIGTERM / Ctrl-C: save, then exit; a multi-host preemption notice)."""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import signal

import jax

from aogpt_jax import config as config_lib
from aogpt_jax.checkpoints import store as checkpoint_lib


def prepare_workdir(workdir: str) -> pathlib.Path:
  if not workdir:
    raise config_lib.ConfigError("--workdir: required")
  path = pathlib.Path(workdir).expanduser().absolute()
  checkpoint_lib.check_writable(path, "--workdir")
  return path


def lock_workdir(workdir) -> "object":
  """Takes WORKDIR/.lock (an flock, released by the kernel when the process dies, so a kill -9
  leaves no stale lock); raises a one-line ConfigError if another run holds it. Returns the open
  lock file: keep it open for the whole run, close it to release."""
  import fcntl
  path = pathlib.Path(workdir) / ".lock"
  f = open(path, "a+", encoding="utf-8")
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    f.seek(0)
    holder = f.read().strip() or "unknown"
    f.close()
    raise config_lib.ConfigError(
        f"--workdir: {workdir} is in use by another run (pid {holder}, lock {path}); "
        "wait for it or use another --workdir") from None
  f.seek(0)
  f.truncate()
  f.write(f"{os.getpid()}\n")
  f.flush()
  return f


def write_json_atomic(path: pathlib.Path, text: str) -> None:
  """Writes ``text`` to a temporary file next to ``path``, then renames it over ``path``: a
  reader (or a kill) sees the old file or the new one, never half of one."""
  path = pathlib.Path(path)
  tmp = path.with_name(path.name + ".tmp")
  try:
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
  except OSError as e:     # a full disk: no .tmp left behind, and the error names the file
    try:
      tmp.unlink()
    except OSError:
      pass
    raise OSError(e.errno, f"writing {path} failed: {e.strerror or e}") from e


def check_name(name: str, key: str) -> str:
  """An output file stem given by a user (``eval.name``, ``genppl.name``, ``sample.name``): one
  path component, so that nothing is written outside its folder; a one-line ConfigError
  otherwise."""
  name = str(name)
  if (not name or "/" in name or "\\" in name or name in (".", "..") or name.startswith(".")
      or "\0" in name):
    raise config_lib.ConfigError(
        f"{key}: {name!r} is not a plain file name (no '/', no leading '.'); outputs stay in "
        f"their folder")
  return name


def fresh_stem(folder, name: str, exts: tuple[str, ...]) -> str:
  """``name``, or ``name-2``, ``name-3``, ... : the first stem with none of ``exts`` in
  ``folder`` (outputs are never overwritten)."""
  stem, k = name, 1
  while any(os.path.exists(os.path.join(folder, stem + ext)) for ext in exts):
    k += 1
    stem = f"{name}-{k}"
  return stem


class StopRequested(Exception):
  """A stop signal arrived inside `StopSignal.interruptible` (a long host loop: a held-out eval):
  the loop is abandoned, and the run saves and stops."""


class StopSignal:
  """SIGTERM or SIGINT (Ctrl-C) -> "save and exit"; a second Ctrl-C stops at once, unsaved.
  Multi-host runs use JAX's preemption sync point instead, so that every process stops at the
  same step."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = False
    self.signum = None      # the signal that asked to stop (None: a multi-host preemption)
    self.multihost = jax.process_count() > 1
    self._previous = {}
    self._interruptible = False
    if not self.multihost:
      self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

  def _handle(self, signum, frame):
    del frame
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt("second Ctrl-C: stopping without saving")
    logging.warning("received %s: saving a checkpoint and stopping (Ctrl-C again: stop without "
                    "saving)", signal.Signals(signum).name)
    self.requested = True
    self.signum = int(signum)
    if self._interruptible:
      raise StopRequested(signal.Signals(signum).name)

  @contextlib.contextmanager
  def interruptible(self):
    """Within it a stop signal also raises `StopRequested` at once: for work that may run long
    between two checks of `should_stop` (a held-out eval: minutes of host loops, sampling)."""
    if self.requested:
      raise StopRequested(signal.Signals(self.signum).name if self.signum else "preemption")
    self._interruptible = True
    try:
      yield
    finally:
      self._interruptible = False

  def should_stop(self, step: int) -> bool:
    if self.multihost and not self.requested:
      from jax.experimental import multihost_utils
      try:
        self.requested = multihost_utils.reached_preemption_sync_point(step)
      except RuntimeError as e:   # preemption service disabled: SIGTERM is not caught
        logging.warning("no preemption sync point (%s); SIGTERM will not save", e)
        self.multihost = False
    return self.requested

  def restore(self) -> None:
    for s, previous in self._previous.items():
      signal.signal(s, previous)
