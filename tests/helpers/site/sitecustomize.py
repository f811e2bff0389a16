"""Imported at start-up by every Python process the test suite runs (tests/conftest.py puts this
folder first on PYTHONPATH; nothing outside the tests sees it). It makes one change, to JAX's
persistent compilation cache: an entry is written to a temporary file and renamed into place, so
a process never reads an entry another process is still writing.

Why: the suite shares one cache folder between its two xdist workers and the hundreds of
``python -m aogpt_jax.main`` processes it starts. JAX writes entries in place, and it takes a
cross-process file lock only when the cache has a size limit. With a size limit, every new entry
also scans the whole folder for eviction: it stats every entry and reads its access-time file.
That made each write cost in proportion to the entries already there, late in the suite, under a
lock all processes share. With atomic writes, the suite runs the cache without a size limit (no
lock, no scan). jax is not imported here: the patch waits for ``jax._src.lru_cache`` to be
imported (a process that never imports jax, such as the ``tasks`` import test, stays without it).
"""

import importlib.abc
import importlib.util
import os
import sys
import tempfile

_MODULE = "jax._src.lru_cache"


def patch(mod) -> None:
  """``LRUCache.put`` without eviction: a temporary file in the folder, then ``os.replace``."""
  original = mod.LRUCache.put

  def put(self, key: str, value: bytes) -> None:
    if self.eviction_enabled or not key:
      return original(self, key, value)
    folder = str(self.path)
    final = os.path.join(folder, f"{key}{mod._CACHE_SUFFIX}")
    if os.path.exists(final):
      return
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".partial-")
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(value)
      os.replace(tmp, final)
    except BaseException:
      if os.path.exists(tmp):
        os.unlink(tmp)
      raise

  put.atomic = True
  mod.LRUCache.put = put


class _Finder(importlib.abc.MetaPathFinder):
  """Runs `patch` right after ``jax._src.lru_cache`` is first executed."""

  def find_spec(self, name, path=None, target=None):
    if name != _MODULE:
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
      return spec
    exec_module = spec.loader.exec_module

    def exec_and_patch(module):
      exec_module(module)
      patch(module)

    spec.loader.exec_module = exec_and_patch
    return spec


if os.environ.get("AOGPT_TEST_ATOMIC_XLA_CACHE") == "1" and _MODULE not in sys.modules:
  sys.meta_path.insert(0, _Finder())
