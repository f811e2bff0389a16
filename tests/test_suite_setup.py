"""The suite's own set-up (tests/conftest.py): the shared XLA compilation cache is written
atomically in this process and in every Python process the suite starts, without a size limit."""

import os
import subprocess
import sys

import jax
import pytest
from jax._src import lru_cache


def test_this_process_writes_the_cache_atomically_without_a_limit(tmp_path):
  assert getattr(lru_cache.LRUCache.put, "atomic", False)
  assert jax.config.jax_compilation_cache_max_size == -1
  cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)
  cache.put("k", b"entry")
  cache.put("k", b"another")                 # an entry is never replaced
  assert cache.get("k") == b"entry"
  assert sorted(os.listdir(tmp_path)) == ["k-cache"]      # no partial file, no access times


@pytest.mark.subprocess
def test_a_process_the_suite_starts_is_patched_too():
  code = ("import sys; assert 'jax' not in sys.modules\n"
          "from jax._src import lru_cache; print(getattr(lru_cache.LRUCache.put, 'atomic', 0))")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr[-2000:]
