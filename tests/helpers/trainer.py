"""Shared helpers of the trainer tests: a very small run config, its command-line form, and
subprocess runs of ``python -m aogpt_jax.main`` on CPU."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time

import jax
import orbax.checkpoint as ocp
from ml_collections import config_dict

from aogpt_jax import config as config_lib
from aogpt_jax import recipes

REPO = pathlib.Path(__file__).resolve().parents[2]

# A model that compiles in seconds; every dimension divides 2 (the sharding tests use 2x2x2).
TINY_OVERRIDES = {
    "model.preset": "tiny", "model.n_layer": 1, "model.n_embd": 32, "model.n_head": 2,
    "model.target_dim": 8, "model.block_size": 32, "model.dtype": "float32",
    "data.source": "python_stdlib", "data.tokenizer": "byte",
    "seq_len": 16, "batch_size": 8, "microbatches": 1, "total_steps": 10, "seed": 0,
    "log_every": 5, "eval_every": 0, "checkpoint_every": 5,
    "optimizer.lr": 3e-3, "optimizer.warmup_steps": 2, "optimizer.ema_decay": 0.99,
    "eval.batch_size": 8, "eval.train_max_blocks": 8,
    "mesh.data": -1, "mesh.fsdp": 1, "mesh.tensor": 1,
}


def tiny_config(cache_dir: str | os.PathLike, **overrides) -> config_dict.ConfigDict:
  cfg = config_lib.default_config()
  recipes.apply(cfg, TINY_OVERRIDES)
  recipes.apply(cfg, {"data.cache_dir": str(cache_dir)})
  recipes.apply(cfg, {k.replace("__", "."): v for k, v in overrides.items()})
  return cfg


def cli_args(cache_dir, workdir, **overrides) -> list[str]:
  """``python -m aogpt_jax.main`` arguments for `tiny_config(cache_dir, **overrides)`."""
  flat = {**TINY_OVERRIDES, "data.cache_dir": str(cache_dir),
          **{k.replace("__", "."): v for k, v in overrides.items()}}
  args = [sys.executable, "-m", "aogpt_jax.main", "--config=configs/quickstart.py",
          f"--workdir={workdir}"]
  args += [f"--config.{k}={str(v).lower() if isinstance(v, bool) else v}"
           for k, v in flat.items()]
  return args


# XLA:CPU's backend at optimisation level 0: a program compiles in about 3/4 of the time at level
# 1 (the suite's, tests/conftest.py) and runs slower. For subprocesses that compile much and run
# little (the docs' 2-step commands, the benchmarks at their test size): a tiny `--mode=rl` run
# took 20 s instead of 27 on the 2-core CPU. Never for runs compared bitwise with another process
# (those keep the suite's flags, so both compile alike).
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def cpu_env(devices: int = 1, fast_compile: bool = False) -> dict[str, str]:
  """The environment of a CPU subprocess: ``devices`` CPU devices, the suite's XLA flags (or
  FAST_COMPILE_FLAGS), the repository importable, no multi-host set-up."""
  env = dict(os.environ)
  env["JAX_PLATFORMS"] = "cpu"
  flags = FAST_COMPILE_FLAGS if fast_compile else os.environ.get("AOGPT_TEST_XLA_FLAGS", "")
  env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
  env.pop("AOGPT_DISTRIBUTED", None)
  return env


def start(args, log_path, devices: int = 1) -> subprocess.Popen:
  log = open(log_path, "w")
  return subprocess.Popen(args, cwd=REPO, env=cpu_env(devices), stdout=log,
                          stderr=subprocess.STDOUT)


def run(args, log_path, devices: int = 1, timeout: float = 180) -> None:
  p = start(args, log_path, devices)
  rc = p.wait(timeout=timeout)
  if rc != 0:
    raise AssertionError(f"{' '.join(map(str, args))} exited with {rc}:\n"
                         + pathlib.Path(log_path).read_text()[-4000:])


def checkpoint_steps(workdir) -> list[int]:
  """The steps saved under WORKDIR/checkpoints, in order."""
  d = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


def wait_for(predicate, proc, timeout: float = 120.0) -> bool:
  """Polls ``predicate`` until it holds (True) or ``proc`` exits first (False)."""
  t = time.time()
  while not predicate():
    if proc.poll() is not None:
      return False
    if time.time() - t > timeout:
      raise TimeoutError("the run did not get there in time")
    time.sleep(0.05)
  return True


def saved_state(workdir, step) -> dict:
  """The params, optimizer state, EMA and train state saved at STEP under WORKDIR/checkpoints,
  on the host (read-only: nothing in the run is changed)."""
  mngr = ocp.CheckpointManager(pathlib.Path(workdir) / "checkpoints",
                               options=ocp.CheckpointManagerOptions(read_only=True))
  items = {k: ocp.args.StandardRestore() for k in ("params", "opt_state", "ema", "train")}
  try:
    r = mngr.restore(step, args=ocp.args.Composite(**items))
    return {k: jax.device_get(r[k]) for k in items}
  finally:
    mngr.close()


def copy_workdir(src, tmp_path) -> pathlib.Path:
  """A copy of the run folder ``src`` as ``tmp_path/work`` (tests that change a run keep the
  shared one intact)."""
  work = pathlib.Path(tmp_path) / "work"
  shutil.copytree(src, work)
  return work
