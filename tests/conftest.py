"""Shared test set-up: CPU only, 8 fake devices for the sharding tests, fp32 matmuls; tests/ on
sys.path so that ``from helpers import ...`` works from any working directory and import mode."""

import gc
import os
import pathlib
import shutil
import sys
import tempfile

_TESTS = str(pathlib.Path(__file__).resolve().parent)
if _TESTS not in sys.path:
  sys.path.insert(0, _TESTS)

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA:CPU compiles at LLVM optimisation level 1 without LLVM's expensive passes: the same
# computation (results may differ from the default build's in the last bits), compiled faster.
# The suite's models are tiny, so compiling is most of its CPU time: this saves about 15% of a
# tiny training run's CPU time and 25% of a sampler's, and test_speculative.py's 14%. (Level 0
# saves more compile time, but its machine code made the 20,000-sample tests 2-7x slower:
# test_speculative.py took twice the CPU time.) Every process the tests start gets the same flags
# (helpers.trainer.cpu_env reads AOGPT_TEST_XLA_FLAGS), so runs compared bitwise across
# processes compile alike.
os.environ["AOGPT_TEST_XLA_FLAGS"] = ("--xla_backend_optimization_level=1 "
                                      "--xla_llvm_disable_expensive_passes=true")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                           os.environ["AOGPT_TEST_XLA_FLAGS"] +
                           " --xla_force_host_platform_device_count=8").strip()

# One persistent XLA compilation cache per test session (a fresh temporary folder, removed at the
# end), shared through the environment by this process, every `python -m aogpt_jax.main ...`
# subprocess the tests start and the pytest-xdist workers: the suite compiles the same tiny
# programs in hundreds of processes, and a cache hit skips XLA:CPU's compiler (about 2/3 of a tiny
# training run's CPU time). Every program is kept (no minimum compile time or size). A user's own
# JAX_COMPILATION_CACHE_DIR is not used, so the suite never reads or fills it.
_XLA_CACHE_OWNER = "AOGPT_TEST_XLA_CACHE_OWNER"
if not os.environ.get(_XLA_CACHE_OWNER):
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="aogpt_test_xla_cache_")
  os.environ[_XLA_CACHE_OWNER] = str(os.getpid())
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
# No size limit: with one, JAX locks the folder across processes for every read and write and,
# for every write, scans every entry for eviction (the cost grew with the entries already there,
# under a lock every process shares). Instead every process writes its entries atomically:
# tests/helpers/site/sitecustomize.py, first on PYTHONPATH, patches the cache in each Python the
# suite starts (xdist workers included); this process is patched below.
os.environ.pop("JAX_COMPILATION_CACHE_MAX_SIZE", None)
os.environ["AOGPT_TEST_ATOMIC_XLA_CACHE"] = "1"
_SITE = str(pathlib.Path(_TESTS) / "helpers" / "site")
if _SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
  os.environ["PYTHONPATH"] = os.pathsep.join(
      [_SITE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

import jax  # noqa: E402
from jax._src import lru_cache as _lru_cache  # noqa: E402

if not getattr(_lru_cache.LRUCache.put, "atomic", False):
  import importlib.util  # noqa: E402  pylint: disable=g-import-not-at-top
  _spec = importlib.util.spec_from_file_location("_aogpt_test_site", f"{_SITE}/sitecustomize.py")
  _site = importlib.util.module_from_spec(_spec)
  _spec.loader.exec_module(_site)
  _site.patch(_lru_cache)

jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
jax.config.update("jax_compilation_cache_max_size", -1)


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


def pytest_unconfigure(config):
  """Removes the session's compilation cache (only the process that made it: not an xdist worker)."""
  del config
  if os.environ.get(_XLA_CACHE_OWNER) == str(os.getpid()):
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
