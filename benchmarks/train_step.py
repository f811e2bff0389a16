"""Train-step throughput of a config: step time, tokens/s, model FLOPs and MFU (accelerators).

    python benchmarks/train_step.py --config=configs/quickstart.py
    python benchmarks/train_step.py --config=configs/aogpt_small.py --config.microbatches=4 \
        --config.batch_size=64                                          # one GPU: H100 / H200
    python benchmarks/train_step.py --config=configs/quickstart.py --config.model.n_layer=8

The step is the trainer's own jitted step (same sharding, donation, accumulation) on random
tokens, or for a task config (``task.name``) on the task's own rows and prompt masks, drawn
before the timer, so data loading is not measured; ``rows_per_s`` is then puzzles per second:

    python benchmarks/train_step.py --config=configs/sudoku.py:tiny --config.model.pack=4

Works unchanged on CPU, GPU and TPU; sizes come from
the config and ``--config.*`` overrides. Prints one JSON object and writes it
(`benchmarks/common.py`'s schema) to ``--out`` (default
benchmarks/results/train_step_<config>/<machine>.json). MFU uses the dense bf16 peak
of the device (flops.peak_flops; AOGPT_PEAK_TFLOPS overrides) and is null on CPU. Memory per
device: XLA's estimate of the compiled step (`xla_memory`) and the measured peak
(`measured_peak_bytes`, from `memory_stats()`; null on CPU). ``--profile_dir=DIR`` adds a
``jax.profiler`` trace of three more steps in DIR, summarised into the result's ``profile``
(`benchmarks/profile/trace_summary.py`: accelerator time per step by kernel group, busy and idle).
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from aogpt_jax import config as config_lib  # noqa: E402
from aogpt_jax.train import flops as flops_lib  # noqa: E402
from aogpt_jax.train import loop as train_loop  # noqa: E402
from aogpt_jax.train import sharding as sharding_lib  # noqa: E402
from aogpt_jax.train import step as train_lib  # noqa: E402

import common  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (file.py[:arg]).")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.")
_OUT = flags.DEFINE_string("out", "", "Output JSON path.")
_PROFILE = flags.DEFINE_string(
    "profile_dir", "", "If set: after timing, a jax.profiler trace of 3 more steps written there "
    "(open with TensorBoard's profile plugin or xprof).")


def main(argv) -> None:
  del argv
  cfg = _CONFIG.value
  sharding_lib.maybe_initialize_distributed(cfg)
  mc = config_lib.resolve(cfg)
  mesh = sharding_lib.make_mesh(cfg)
  sharding_lib.check_batch_sizes(cfg, mesh)
  if cfg.train.get("remat", "") == "auto":   # as a run chooses it (train.loop.choose_remat)
    mc = train_loop.choose_remat(cfg, mc, mesh)
  rng = np.random.default_rng(0)
  local = cfg.batch_size // jax.process_count()
  task_batches = (train_loop.train_iterator(cfg, jax.process_index(), jax.process_count())
                  if config_lib.task_of(cfg) is not None else None)

  def batch():
    if task_batches is not None:   # a task's own rows and prompt masks (drawn before the timer)
      b = next(task_batches)
      return sharding_lib.global_batch({"tokens": b["tokens"], "prompt": b["prompt"]}, mesh)
    tokens = rng.integers(0, mc.valid_vocab_size, (local, cfg.seq_len), dtype=np.int32)
    return sharding_lib.global_batch({"tokens": tokens}, mesh)

  with jax.set_mesh(mesh):
    trainer = train_lib.build(cfg, mc, mesh)
    state = trainer.init()
    t = time.perf_counter()
    b = batch()
    step = trainer.step.lower(state, b).compile()   # the estimate next to the measured peak
    xla_memory = flops_lib.compiled_memory(step)
    state, m = step(state, b)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t
    for _ in range(_WARMUP.value):
      state, m = step(state, batch())
    jax.block_until_ready(m)
    times = []
    for _ in range(_STEPS.value):
      b = batch()
      t = time.perf_counter()
      state, m = step(state, b)
      jax.block_until_ready(m)
      times.append(time.perf_counter() - t)
    profile_error = None
    if _PROFILE.value:
      try:   # a profiler that fails (no CUPTI, say) costs the profile, not the timings
        with jax.profiler.trace(_PROFILE.value):
          for _ in range(3):
            state, m = step(state, batch())
          jax.block_until_ready(m)
      except Exception as e:  # noqa: BLE001
        profile_error = f"{type(e).__name__}: {e}"

  step_s = statistics.median(times)
  flops = flops_lib.train_flops_per_step(mc, cfg.batch_size, cfg.seq_len, cfg.microbatches)
  mfu = flops_lib.mfu(flops, 1.0 / step_s)
  dev = jax.devices()[0]
  try:
    measured_peak = (dev.memory_stats() or {}).get("peak_bytes_in_use")
  except Exception:  # noqa: BLE001 - backends without memory stats (CPU)
    measured_peak = None
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainer.abstract_state["params"]))
  result = {
      "config_args": [a for a in sys.argv[1:] if a.startswith("--config")],
      "platform": dev.platform, "device_kind": dev.device_kind, "devices": jax.device_count(),
      "processes": jax.process_count(), "mesh": dict(mesh.shape),
      "model": {k: v for k, v in mc.to_dict().items()
                if k in ("n_layer", "n_head", "n_embd", "target", "dtype", "attention",
                         "attention_impl", "remat", "remat_policy", "vocab_size")},
      "parameters": n_params,
      "batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "microbatches": cfg.microbatches,
      "order": cfg.order.name, "compile_s": round(compile_s, 3),
      "step_s_median": step_s, "step_s_mean": statistics.fmean(times),
      "step_s_min": min(times), "steps_timed": len(times),
      "tokens_per_s": cfg.batch_size * cfg.seq_len / step_s,
      "rows_per_s": cfg.batch_size / step_s,   # a task's puzzles (or graphs) per second
      "task": cfg.task.get("name") or None, "pack": mc.pack,
      "model_flops_per_step": flops, "achieved_tflops": flops / step_s / 1e12,
      "peak_tflops_per_device": (flops_lib.peak_flops() or 0) / 1e12 or None,
      "mfu": mfu, "jax": jax.__version__,
      # Per device: XLA's estimate of the compiled step and the allocator's measured peak
      # (jax Device.memory_stats; null on CPU).
      "xla_memory": xla_memory, "measured_peak_bytes": measured_peak,
  }
  if _PROFILE.value:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "profile"))
    import trace_summary  # noqa: E402 - benchmarks/profile/trace_summary.py
    try:
      result["profile"] = (trace_summary.summarize(_PROFILE.value, steps=3)
                           if profile_error is None else {"error": profile_error})
    except Exception as e:  # noqa: BLE001
      result["profile"] = {"error": f"{type(e).__name__}: {e}"}
  text = json.dumps(result, indent=2)
  print(text)
  if jax.process_index() == 0:
    name = next((pathlib.Path(a.split("=", 1)[1].split(":")[0]).stem for a in sys.argv[1:]
                 if a.startswith("--config=")), "config")
    args = {"argv": sys.argv[1:], "steps": _STEPS.value, "warmup": _WARMUP.value,
            "out": _OUT.value, "profile_dir": _PROFILE.value}
    common.write_result(f"train_step_{name}", args, result, out=_OUT.value or None)


if __name__ == "__main__":
  if sys.argv[1:2] in (["-h"], ["--help"]):   # absl's --help exits 1; say it and exit 0
    print(__doc__ + "\n" + flags.FLAGS.main_module_help())
    sys.exit(0)
  app.run(main)
