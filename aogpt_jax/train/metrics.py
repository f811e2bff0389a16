"""Training metrics: writers, the progress line, and model FLOPs for tokens/s and MFU.

* `create_writer(workdir, resume_step)`: on process 0 a `MetricWriter` that sends every
  ``write_scalars(step, {name: value})`` to TensorBoard event files (tensorboardX, in
  WORKDIR/tensorboard) and as one JSON line to WORKDIR/metrics.jsonl; on other processes a
  writer that does nothing. On resume, lines and events after the restored step (written by the
  run that was killed) are dropped so every step appears once.
* `Progress`: steps/s and ETA over the time spent training (evaluation and checkpointing are
  excluded).
* `train_flops_per_step`: model FLOPs of one optimizer step (forward + backward = 3x forward,
  rematerialisation not counted), `peak_flops` per accelerator, hence MFU.
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

from aogpt_jax.model import aogpt as model_lib


class NullWriter:
  """The writer of processes other than 0."""

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    del step, scalars

  def flush(self) -> None:
    pass

  def close(self) -> None:
    pass


class MetricWriter(NullWriter):
  """A tiny clu-like writer: TensorBoard events plus WORKDIR/metrics.jsonl."""

  def __init__(self, workdir: str | os.PathLike, resume_step: int | None = None):
    from tensorboardX import SummaryWriter  # imported here: only process 0 writes

    workdir = pathlib.Path(workdir)
    self.jsonl_path = workdir / "metrics.jsonl"
    if resume_step is not None:
      truncate_jsonl(self.jsonl_path, resume_step)
    self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
    self._tb = SummaryWriter(str(workdir / "tensorboard"),
                             purge_step=None if resume_step is None else resume_step + 1)

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    clean = {k: float(v) for k, v in scalars.items() if v is not None}
    for k, v in clean.items():
      self._tb.add_scalar(k, v, global_step=step)
    line = {"step": int(step), **{k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}
    self._jsonl.write(json.dumps(line) + "\n")
    self._jsonl.flush()

  def flush(self) -> None:
    self._jsonl.flush()
    self._tb.flush()

  def close(self) -> None:
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
    if self.total:
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


# ----------------------------------------------------------------------------- FLOPs


def matmul_params_per_token(mc: model_lib.ModelConfig) -> int:
  """Weights every token multiplies with: the block matrices and the output head (embedding
  lookups are free; the adaLN projections are counted per position in `train_flops_per_step`)."""
  d, hidden = mc.n_embd, mc.mlp_ratio * mc.n_embd
  per_layer = d * 3 * d + d * d + 2 * d * hidden
  return mc.n_layer * per_layer + d * mc.vocab_size


def forward_flops(mc: model_lib.ModelConfig, batch_size: int, seq_len: int,
                  causal: bool = True) -> float:
  """Model FLOPs of one forward pass over ``batch_size`` sequences of ``seq_len`` tokens.

  Per token: 2 FLOPs per weight it multiplies with; attention over the (r + 1) keys slot r
  may see costs 2 * 2 * d * (r + 1) (scores and weighted values), 2 d (n + 1) per token on
  average (``causal=False``: 4 d n, what a kernel that computes the masked half costs). adaLN
  modulation depends only on the target position, so the model computes it once per position
  (n + 1 rows including "no target") per call instead of once per token.
  """
  tokens = batch_size * seq_len
  keys = (seq_len + 1) / 2 if causal else seq_len
  flops = tokens * (2 * matmul_params_per_token(mc) + mc.n_layer * 4 * mc.n_embd * keys)
  if mc.target == "adaln":
    rows = min(tokens, mc.block_size + 1)
    flops += 2 * rows * mc.target_dim * mc.n_embd * (6 * mc.n_layer + 2)
  return float(flops)


def train_flops_per_step(mc: model_lib.ModelConfig, batch_size: int, seq_len: int,
                         microbatches: int = 1) -> float:
  """Model FLOPs of one optimizer step: forward + backward = 3x the forward, summed over the
  microbatches (rematerialisation is not model work and is not counted)."""
  return 3.0 * microbatches * forward_flops(mc, batch_size // microbatches, seq_len)


# Dense bf16 peak FLOP/s per device, matched against jax's device_kind (first match wins).
_PEAK_FLOPS = (
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12),
    ("B200", 2250e12), ("A100", 312e12), ("L4", 121e12), ("A10G", 125e12),
    ("TPU v6", 918e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5", 459e12),
    ("TPU v4", 275e12), ("TPU v3", 123e12),
)


def peak_flops(device=None) -> float | None:
  """Dense bf16 peak of one device, or None when unknown (e.g. CPU). AOGPT_PEAK_TFLOPS
  overrides the table."""
  if os.environ.get("AOGPT_PEAK_TFLOPS"):
    return float(os.environ["AOGPT_PEAK_TFLOPS"]) * 1e12
  device = device or jax.devices()[0]
  if device.platform == "cpu":
    return None
  kind = getattr(device, "device_kind", "")
  for name, flops in _PEAK_FLOPS:
    if name.lower() in kind.lower():
      return flops
  return None


def mfu(flops_per_step: float, steps_per_sec: float, n_devices: int | None = None) -> float | None:
  peak = peak_flops()
  if peak is None:
    return None
  return flops_per_step * steps_per_sec / (peak * (n_devices or jax.device_count()))


# ----------------------------------------------------------------------------- memory


def compiled_memory(compiled) -> dict[str, int]:
  """XLA's per-device memory analysis of a compiled program (``jit(f).lower(...).compile()``):
  arguments, outputs, aliased (donated) bytes, temporaries, and the peak estimate arguments +
  temporaries + outputs not aliased to arguments."""
  mem = compiled.memory_analysis()
  args, outs, temps = (int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes),
                       int(mem.temp_size_in_bytes))
  alias = int(getattr(mem, "alias_size_in_bytes", 0))
  return {"argument_bytes": args, "output_bytes": outs, "alias_bytes": alias,
          "temp_bytes": temps, "peak_bytes": args + temps + max(outs - alias, 0)}


def device_bytes_limit(device=None) -> int | None:
  """The device's memory limit from ``memory_stats()`` (GPU, TPU); None where unknown (CPU)."""
  try:
    stats = (device or jax.devices()[0]).memory_stats() or {}
  except Exception:  # noqa: BLE001 - backends without memory stats
    return None
  return stats.get("bytes_limit")


def memory_line(mesh, mem: dict[str, int], limit: int | None) -> str:
  """One log line: the mesh and the compiled train step's memory estimate per device."""
  g = lambda b: f"{b / 2**30:.2f} GiB"
  fit = "device limit unknown" if not limit else (
      f"{100 * mem['peak_bytes'] / limit:.0f}% of the {g(limit)} device limit")
  return (f"mesh {dict(mesh.shape)} over {mesh.size} {jax.devices()[0].device_kind} devices; "
          f"train step memory estimate per device (XLA): arguments {g(mem['argument_bytes'])} + "
          f"temporaries {g(mem['temp_bytes'])} -> peak ~{g(mem['peak_bytes'])} ({fit})")
