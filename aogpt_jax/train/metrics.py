"""Training metrics: writers and the progress line (also used by sampling and evaluation).

* `create_writer(workdir, resume_step)`: on process 0 a `MetricWriter` that sends every
  ``write_scalars(step, {name: value})`` to TensorBoard event files (tensorboardX, in
  WORKDIR/tensorboard) and as one JSON line to WORKDIR/metrics.jsonl; on other processes a
  writer that does nothing. Lines and events after the restored step (written by a run that was
  killed; step 0 when nothing was restored) are dropped so every step appears once.
* `Progress`: steps/s and ETA over the time spent training (evaluation and checkpointing are
  excluded).

Model FLOPs, MFU and the compiled step's memory are in `aogpt_jax.train.flops`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pathlib
import time

import jax



class NullWriter:
  """The writer of processes other than 0."""

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    del step, scalars

  def flush(self) -> None:
    pass

  def close(self) -> None:
    pass


class MetricsWriteError(OSError):
  """Writing metrics.jsonl or the TensorBoard events failed (a full disk, a folder gone)."""


class MetricWriter(NullWriter):
  """A tiny clu-like writer: TensorBoard events plus WORKDIR/metrics.jsonl. A failed write is
  one `MetricsWriteError` naming the step and the folder; the writer then closes quietly (no
  second report from TensorBoard's own threads at exit)."""

  def __init__(self, workdir: str | os.PathLike, resume_step: int | None = None):
    from tensorboardX import SummaryWriter  # imported here: only process 0 writes

    workdir = pathlib.Path(workdir)
    self.jsonl_path = workdir / "metrics.jsonl"
    if resume_step is not None:
      truncate_jsonl(self.jsonl_path, resume_step)
    self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
    self._tb = SummaryWriter(str(workdir / "tensorboard"),
                             purge_step=None if resume_step is None else resume_step + 1)

  @contextlib.contextmanager
  def _guard(self, step):
    try:
      yield
    except OSError as e:
      self._close_quietly()
      why = e.strerror or str(e)
      at = f" step {step}" if step is not None else ""
      raise MetricsWriteError(
          f"metrics: writing{at} to {self.jsonl_path.parent} (metrics.jsonl, tensorboard/) "
          f"failed ({why}); the checkpoints saved before it are intact; free space or fix the "
          f"folder, then rerun to resume") from None

  def _close_quietly(self) -> None:
    self.failed = True
    for f in (self._jsonl.close, self._tb.close):
      with contextlib.suppress(Exception):
        f()

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    if getattr(self, "failed", False):
      return
    clean = {k: float(v) for k, v in scalars.items() if v is not None}
    with self._guard(step):
      for k, v in clean.items():
        self._tb.add_scalar(k, v, global_step=step)
      line = {"step": int(step),
              **{k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}
      self._jsonl.write(json.dumps(line) + "\n")
      self._jsonl.flush()

  def flush(self) -> None:
    if not getattr(self, "failed", False):
      with self._guard(None):
        self._jsonl.flush()
        self._tb.flush()

  def close(self) -> None:
    if getattr(self, "failed", False):
      return
    with self._guard(None):
      self._jsonl.close()
      self._tb.close()


def create_writer(workdir, resume_step: int | None = None) -> NullWriter:
  return MetricWriter(workdir, resume_step) if jax.process_index() == 0 else NullWriter()


def truncate_jsonl(path: pathlib.Path, max_step: int) -> None:
  """Keeps the lines with step <= max_step (a torn last line from a killed run is dropped)."""
  if not path.exists():
    return
  keep = []
  for line in path.read_text(encoding="utf-8").splitlines():
    try:
      if json.loads(line)["step"] <= max_step:
        keep.append(line)
    except (ValueError, KeyError, TypeError):
      continue
  tmp = path.with_suffix(".jsonl.tmp")
  tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
  os.replace(tmp, path)


class Progress:
  """Steps/s and ETA from the wall time spent in training steps only."""

  def __init__(self, start_step: int, total_steps: int):
    self.total = total_steps
    self.window_start_step = start_step
    self.window_time = 0.0
    self._t = time.perf_counter()
    self._paused = 0.0

  def restart(self, step: int) -> None:
    """Starts the current window afresh at ``step`` (e.g. after the compiling first step)."""
    self._t, self._paused, self.window_start_step = time.perf_counter(), 0.0, step

  @contextlib.contextmanager
  def paused(self):
    """Time spent inside (evaluation, checkpointing, compilation) is not training time."""
    t = time.perf_counter()
    try:
      yield
    finally:
      self._paused += time.perf_counter() - t

  def window(self, step: int) -> tuple[float, float]:
    """Returns (steps/s, seconds to the end) since the previous call, and starts a new window."""
    now = time.perf_counter()
    elapsed = max(now - self._t - self._paused, 1e-9)
    rate = (step - self.window_start_step) / elapsed
    self._t, self._paused, self.window_start_step = now, 0.0, step
    eta = (self.total - step) / rate if rate > 0 else float("inf")
    return rate, eta


class ProgressLog:
  """``WHAT: i/N (x%), ETA ...`` log lines for a long loop of N known items, at most one every
  ``every`` seconds (and one at the end); the first item (compilation) is not in the ETA."""

  def __init__(self, what: str, total: int | None, every: float = 10.0):
    self.what, self.total, self.every = what, total, every
    self._t0 = self._last = time.perf_counter()
    self._t1 = None       # time when the first item finished

  def update(self, done: int) -> None:
    now = time.perf_counter()
    if self._t1 is None:
      self._t1 = now
      if done < (self.total or 0):
        return
    if now - self._last < self.every and done != self.total:
      return
    self._last = now
    if self.total and done >= self.total:   # finished: no ETA to guess
      logging.info("%s: %d/%d (100%%), done in %s", self.what, done, self.total,
                   format_duration(now - self._t0))
    elif self.total:
      rate = (done - 1) / max(now - self._t1, 1e-9) if done > 1 else 0.0
      eta = (self.total - done) / rate if rate > 0 else float("inf")
      logging.info("%s: %d/%d (%.0f%%), %s elapsed, ETA %s", self.what, done, self.total,
                   100.0 * done / self.total, format_duration(now - self._t0),
                   format_duration(eta))
    else:
      logging.info("%s: %d done, %s elapsed", self.what, done, format_duration(now - self._t0))


def format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  s = int(round(seconds))
  h, rem = divmod(s, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
