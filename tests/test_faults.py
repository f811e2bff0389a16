"""Fault injection on the trainer (issue 16): a second run on a busy workdir is refused, the
workdir lock does not outlive a kill -9 (Ctrl-C and a lowered total_steps: test_resume.py).
Subprocess runs of a tiny config on CPU."""

from __future__ import annotations

import subprocess

import pytest

from aogpt_jax import config as config_lib
from aogpt_jax import data as data_lib
from aogpt_jax import train_loop

from trainer_util import REPO, checkpoint_steps, cli_args, cpu_env, start, tiny_config, wait_for

LONG = dict(total_steps=100000, checkpoint_every=4, log_every=4, eval_every=0)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("cache")
  cfg = tiny_config(d)
  for split in ("train", "validation"):
    data_lib.token_stream(cfg.data, split)
  return d


def _steps(workdir) -> list[int]:
  return checkpoint_steps(workdir)


def _wait_for(predicate, proc, timeout=400.0):
  return wait_for(predicate, proc, timeout)


def test_second_run_on_a_busy_workdir_is_refused_and_kill9_frees_the_lock(cache_dir, tmp_path):
  work = tmp_path / "work"
  first = start(cli_args(cache_dir, work, **LONG), tmp_path / "first.log")
  try:
    assert _wait_for(lambda: bool(_steps(work)), first), (tmp_path / "first.log").read_text()
    second = subprocess.run(cli_args(cache_dir, work, **LONG), cwd=REPO, env=cpu_env(),
                            capture_output=True, text=True, timeout=120)
    assert second.returncode != 0
    assert "in use by another run" in second.stderr, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert first.poll() is None, "the second run stopped the first"
  finally:
    first.kill()                              # kill -9: the lock must not outlive the process
    first.wait()
  lock = train_loop.lock_workdir(work)        # a stale lock file is no obstacle
  lock.close()
  lock = train_loop.lock_workdir(work)
  try:
    with pytest.raises(config_lib.ConfigError, match="in use by another run"):
      train_loop.lock_workdir(work)           # a held lock refuses, in-process as well
  finally:
    lock.close()
