"""Shared test set-up: CPU only, 8 fake devices for the sharding tests, fp32 matmuls; tests/ on
sys.path so that ``from helpers import ...`` works from any working directory and import mode."""

import gc
import os
import pathlib
import sys

_TESTS = str(pathlib.Path(__file__).resolve().parent)
if _TESTS not in sys.path:
  sys.path.insert(0, _TESTS)

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops every test module's compiled programs after it. One pytest process compiles thousands
  of XLA:CPU programs; with all of them kept, the full suite once crashed (SIGSEGV) inside a late
  XLA:CPU compilation that passes on its own. The cause is not pinned down (the process's memory
  map count stayed far below vm.max_map_count); releasing the programs avoided it."""
  yield
  jax.clear_caches()
  gc.collect()
