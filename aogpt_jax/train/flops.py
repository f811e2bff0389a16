"""Model FLOPs (hence tokens/s and MFU) and XLA's memory estimate of a compiled step.

* `train_flops_per_step`: model FLOPs of one optimizer step (forward + backward = 3x forward,
  rematerialisation not counted); `peak_flops` per accelerator, hence `mfu`.
* `compiled_memory`, `device_bytes_limit`, `memory_options`, `memory_line`, `memory_warning`:
  the training log's memory line (and a warning when the estimate exceeds the device's memory),
  printed before the first step.
"""

from __future__ import annotations

import os

import jax

from aogpt_jax.model import aogpt as model_lib


def matmul_params_per_token(mc: model_lib.ModelConfig) -> int:
  """Weights every token multiplies with: the block matrices and the output head (embedding
  lookups are free; the adaLN projections are counted per position in `train_flops_per_step`)."""
  d, hidden = mc.n_embd, mc.mlp_width
  qd, kvd = mc.n_head * mc.head_dim, mc.kv_heads * mc.head_dim
  per_layer = d * (qd + 2 * kvd) + qd * d + (2 if mc.mlp == "gelu" else 3) * d * hidden
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
  flops = tokens * (2 * matmul_params_per_token(mc) + mc.n_layer * 4 * mc.n_head * mc.head_dim * keys)
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


def memory_options(mc: model_lib.ModelConfig, microbatches: int = 1) -> str:
  """The settings that decide the train step's activation memory, for the memory line:
  attention kernel, chunked loss, rematerialisation (and its policy), gradient accumulation."""
  remat = f"remat={mc.remat_policy}" if mc.remat else "remat=off"
  return (f"attention_impl={mc.attention_impl}, loss_chunk={mc.loss_chunk or 'off'}, {remat}, "
          f"microbatches={microbatches}")


def memory_line(mesh, mem: dict[str, int], limit: int | None, options: str = "") -> str:
  """One log line: the mesh, the memory options on (`memory_options`) and the compiled train
  step's memory estimate per device."""
  g = lambda b: f"{b / 2**30:.2f} GiB"
  fit = "device limit unknown" if not limit else (
      f"{100 * mem['peak_bytes'] / limit:.0f}% of the {g(limit)} device limit")
  opts = f"; {options}" if options else ""
  return (f"mesh {dict(mesh.shape)} over {mesh.size} {jax.devices()[0].device_kind} devices; "
          f"train step memory estimate per device (XLA{opts}): arguments "
          f"{g(mem['argument_bytes'])} + temporaries {g(mem['temp_bytes'])} -> peak "
          f"~{g(mem['peak_bytes'])} ({fit})")


def memory_warning(mem: dict[str, int], limit: int | None) -> str | None:
  """One warning line when the estimated peak exceeds the device's memory (None otherwise)."""
  if not limit or mem["peak_bytes"] <= limit:
    return None
  return (f"the train step's memory estimate ({mem['peak_bytes'] / 2**30:.2f} GiB per device) "
          f"exceeds the device's {limit / 2**30:.2f} GiB: it may run out of memory; set "
          f"model.remat=true, more microbatches, model.loss_chunk=1024 or shard over "
          f"mesh.fsdp (docs/scaling.md)")
