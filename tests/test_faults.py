"""Fault injection (issue 16), on a tiny config on CPU: a concurrent run on a busy workdir, kill -9
during saves, flipped checkpoint bytes, a changed ``data.worker_count`` on resume, read-only
checkpoint / sample folders, a non-finite loss, and the one-line CLI errors (Ctrl-C, repeated
kill -9 and a lowered total_steps: test_resume.py).

Read-only folders: root ignores permission bits, so the chmod test skips itself when it can still
write (os.access), and a simulated test (EACCES injected on the probe write) runs everywhere."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from absl import flags

from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax import config as config_lib
from aogpt_jax import data as data_lib
from aogpt_jax import modes
from aogpt_jax.train import step as train_lib
from aogpt_jax.train import loop as train_loop
from aogpt_jax.train import workdir as workdir_lib

from helpers.trainer import REPO, checkpoint_steps, cli_args, cpu_env, start, tiny_config, wait_for
from helpers.trainer import run as run_cli, saved_state
from helpers.trainer import copy_workdir as _copy

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


@pytest.mark.subprocess
@pytest.mark.slow
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
  # Killed at any moment (mid-save included): no finished step is corrupt, the newest loads.
  for step in _steps(work):
    checkpoint_lib.verify_manifest(work / "checkpoints" / str(step))   # raises if corrupt
  _, run_cfg = checkpoint_lib.load_model(work, which="params")
  assert run_cfg.loaded.step == _steps(work)[-1]
  lock = workdir_lib.lock_workdir(work)        # a stale lock file is no obstacle
  lock.close()
  lock = workdir_lib.lock_workdir(work)
  try:
    with pytest.raises(config_lib.ConfigError, match="in use by another run"):
      workdir_lib.lock_workdir(work)           # a held lock refuses, in-process as well
  finally:
    lock.close()


# ------------------------------------------------------------ a finished tiny run, copied per test

RUN = dict(total_steps=4, checkpoint_every=2, log_every=2, eval_every=0)


@pytest.fixture(scope="module")
def trained(cache_dir, tmp_path_factory):
  """A workdir with checkpoints 2 and 4 (trained in-process once)."""
  work = tmp_path_factory.mktemp("trained")
  train_loop.train(tiny_config(cache_dir, **RUN), str(work))
  assert _steps(work) == [2, 4]
  return work


def _no_compile(monkeypatch):
  """Fails the test if the trainer gets as far as building (compiling) anything."""
  def build(*a, **k):
    raise AssertionError("the run got as far as building the train step")
  monkeypatch.setattr(train_lib, "build", build)


@pytest.mark.slow
def test_flipped_bytes_are_detected_set_aside_and_the_previous_step_used(cache_dir, trained,
                                                                         tmp_path, caplog):
  work = _copy(trained, tmp_path)
  for step in (2, 4):   # a manifest of every file, written once the save had finished
    assert checkpoint_lib.verify_manifest(work / "checkpoints" / str(step))
  victim = max((p for p in (work / "checkpoints/4/params").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
  raw = bytearray(victim.read_bytes())
  raw[len(raw) // 2] ^= 0xFF                      # size unchanged
  victim.write_bytes(bytes(raw))
  with pytest.raises(checkpoint_lib.CorruptCheckpoint, match="sha256 differs"):
    checkpoint_lib.verify_manifest(work / "checkpoints/4")
  _, run_cfg = checkpoint_lib.load_model(work, which="params")
  assert run_cfg.loaded.step == 2                 # load_model skips it (and moves nothing)
  caplog.set_level(logging.WARNING)
  train_loop.train(tiny_config(cache_dir, **dict(RUN, total_steps=2)), str(work))
  assert _steps(work) == [2]
  assert [p.name.split("-")[0] for p in (work / "checkpoints_corrupt").iterdir()] == ["4"]
  assert "checkpoints/4 is corrupt (CorruptCheckpoint" in caplog.text


@pytest.mark.slow
def test_changed_worker_count_is_an_error_naming_it_and_sets_nothing_aside(cache_dir, trained,
                                                                           tmp_path):
  work = _copy(trained, tmp_path)
  flags.FLAGS.mark_as_parsed()         # grain workers need parsed absl flags
  cfg = tiny_config(cache_dir, **dict(RUN, total_steps=6), data__worker_count=1)
  with pytest.raises(config_lib.ConfigError,
                     match=r"data\.worker_count: .* data\.worker_count=0 but this run has "
                           r"data\.worker_count=1"):
    train_loop.train(cfg, str(work))
  assert _steps(work) == [2, 4] and not (work / "checkpoints_corrupt").exists()


@pytest.mark.slow
def test_an_intact_checkpoint_that_cannot_be_restored_is_not_set_aside(cache_dir, trained,
                                                                       tmp_path, monkeypatch):
  """Whatever the setting (here: the worker-count check switched off), a checkpoint whose
  checksums match is never moved to checkpoints_corrupt/."""
  work = _copy(trained, tmp_path)
  flags.FLAGS.mark_as_parsed()
  monkeypatch.setattr(checkpoint_lib, "_STREAM_KEYS",
                      checkpoint_lib._STREAM_KEYS - {"data.worker_count"})
  cfg = tiny_config(cache_dir, **dict(RUN, total_steps=6), data__worker_count=1)
  with pytest.raises(config_lib.ConfigError, match="is intact .* cannot be restored"):
    train_loop.train(cfg, str(work))
  assert _steps(work) == [2, 4] and not (work / "checkpoints_corrupt").exists()


@pytest.mark.slow
def test_loading_for_eval_or_sample_logs_no_orbax_warnings(trained, caplog):
  caplog.set_level(logging.WARNING)
  checkpoint_lib.load_model(trained, which="ema")
  assert not [r.getMessage() for r in caplog.records if "orbax" in r.pathname]


class _Leaky:
  """An object whose finalizer fails, as orbax / tensorstore objects do in hundreds after a
  failed read ("Exception ignored in ..." on stderr for each)."""

  def __del__(self):
    raise RuntimeError("leaked future")


def test_orbax_exception_ignored_reports_are_counted_not_printed(monkeypatch, caplog):
  caplog.set_level(logging.INFO)
  reported = []                              # what would be printed ("Exception ignored in")
  monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(type(u.object)))
  def __del__(self):                         # a finalizer that orbax defines
    raise RuntimeError("leaked future")
  __del__.__module__ = "orbax.checkpoint.fake"
  orbax_leaky = type("Leaky", (), {"__del__": __del__})
  with checkpoint_lib._quiet_unraisable():
    for _ in range(50):
      orbax_leaky()
    _Leaky()                                 # not orbax's: still reported
  assert len(reported) == 1
  assert "dropped 50 'Exception ignored' reports of orbax" in caplog.text


def _simulate_read_only(monkeypatch, folder_name: str):
  """EACCES on writing any file under a folder named ``folder_name`` (what chmod a-w gives a
  non-root user; root ignores permission bits, so this works the same for everyone)."""
  real = pathlib.Path.write_text

  def write_text(self, *a, **k):
    if folder_name in self.parts:
      raise PermissionError(13, "Permission denied", str(self))
    return real(self, *a, **k)
  monkeypatch.setattr(pathlib.Path, "write_text", write_text)


@pytest.mark.slow
def test_read_only_checkpoints_fail_fast_naming_the_folder(cache_dir, trained, tmp_path,
                                                           monkeypatch):
  work = _copy(trained, tmp_path)
  _no_compile(monkeypatch)
  _simulate_read_only(monkeypatch, "checkpoints")
  t = time.time()
  with pytest.raises(config_lib.ConfigError,
                     match=rf"checkpoints: {work}/checkpoints is not writable \(Permission "
                           rf"denied\)"):
    train_loop.train(tiny_config(cache_dir, **dict(RUN, total_steps=6)), str(work))
  assert time.time() - t < 30


@pytest.mark.slow
def test_read_only_checkpoints_by_chmod(cache_dir, trained, tmp_path, monkeypatch):
  work = _copy(trained, tmp_path)
  ckpts = work / "checkpoints"
  ckpts.chmod(0o555)
  try:
    if os.access(ckpts, os.W_OK):
      pytest.skip("running as root: chmod a-w does not stop root writing (the simulated test "
                  "above covers this path)")
    _no_compile(monkeypatch)
    with pytest.raises(config_lib.ConfigError, match="checkpoints: .* is not writable"):
      train_loop.train(tiny_config(cache_dir, **dict(RUN, total_steps=6)), str(work))
  finally:
    ckpts.chmod(0o755)


@pytest.mark.slow
def test_read_only_workdir_in_sample_mode_is_one_line(cache_dir, trained, tmp_path, monkeypatch):
  work = _copy(trained, tmp_path)
  _simulate_read_only(monkeypatch, "samples")
  monkeypatch.setattr(checkpoint_lib, "load_model", lambda *a, **k: pytest.fail("loaded"))
  assert not (work / "samples").exists()
  with pytest.raises(config_lib.ConfigError, match="--workdir: .*/samples is not writable"):
    modes.sample_mode(tiny_config(cache_dir), str(work))
  assert not (work / "samples").exists()           # no empty folder left behind


@pytest.mark.slow
def test_eval_on_a_run_of_the_other_objective_names_eval_model_kind(cache_dir, trained,
                                                                        tmp_path):
  work = _copy(trained, tmp_path)
  run = json.loads((work / "config.json").read_text())
  run["objective"] = "mdm"
  (work / "config.json").write_text(json.dumps(run))
  with pytest.raises(config_lib.ConfigError, match=r"^eval\.model_kind: .*encoder"):
    modes.eval_mode(tiny_config(cache_dir), str(work))
  with pytest.raises(config_lib.ConfigError, match=r"^sample\.method: .*encoder"):
    modes.sample_mode(tiny_config(cache_dir), str(work))


@pytest.mark.slow
def test_non_finite_loss_names_the_last_saved_step(cache_dir, tmp_path):
  """(Without any checkpoint: the CLI test below.)"""
  cfg = tiny_config(cache_dir, optimizer__lr=1e30, optimizer__warmup_steps=1, total_steps=20,
                    checkpoint_every=1, log_every=1, optimizer__ema_decay=0.0)
  with pytest.raises(train_loop.NonFiniteLoss) as e:
    train_loop.train(cfg, str(tmp_path / "b"))
  steps = _steps(tmp_path / "b")
  if steps:
    assert f"the last good state is the checkpoint of step {steps[-1]} (" in str(e.value)
  else:
    assert "no checkpoint of this run exists yet" in str(e.value)


@pytest.mark.subprocess
@pytest.mark.slow
def test_cli_errors_are_one_line_and_verbose_shows_the_traceback(cache_dir, tmp_path):
  kw = dict(cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=120)
  base = [sys.executable, "-m", "aogpt_jax.main", f"--workdir={tmp_path / 'w'}"]
  cases = {
      "--config=configs/nope.py": "config error: --config: no such file: configs/nope.py",
      "--config.modle.n_layer=2": ("config error: --config.modle.n_layer: no config key "
                                   "'modle'; did you mean --config.model?"),
      "--config.sample.stpes=3": ("config error: --config.sample.stpes: no config key "
                                  "'sample.stpes'; did you mean --config.sample.steps?"),
      "--config.totl_steps=3": "did you mean --config.total_steps?",
      "--config.optimizer.lr=abc": ("config error: --config.optimizer.lr: expected a number "
                                    "(float), got 'abc'"),
      "--config.seq_len=1.5": "config error: --config.seq_len: expected an integer, got '1.5'",
      "--config=configs/quickstart.py:bogus": ("--config=configs/quickstart.py:bogus: unknown "
                                               "'bogus'; this config file takes only 'tiny'"),
      "--config=configs/quickstart.py:tinny": ("--config=configs/quickstart.py:tinny: unknown "
                                               "'tinny' (did you mean 'tiny'?)"),
  }
  for arg, want in cases.items():
    args = base + ([arg] if arg.startswith("--config=") else
                   ["--config=configs/quickstart.py", arg])
    p = subprocess.run(args, **kw)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 1 and lines and want in lines[-1], (arg, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and "Error: " not in lines[-1], (arg, p.stderr[-2000:])
  p = subprocess.run(base + ["--config=configs/quickstart.py", "--config.modle.n_layer=2",
                             "--verbose"], **kw)
  assert p.returncode != 0 and "Traceback" in p.stderr
  # A NonFiniteLoss (an error at run time) is one line too.
  nan = cli_args(cache_dir, tmp_path / "nan", optimizer__lr=1e30, optimizer__warmup_steps=1,
                 total_steps=20, checkpoint_every=100, log_every=1, optimizer__ema_decay=0.0)
  p = subprocess.run(nan, **kw)
  assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("aogpt_jax: NonFiniteLoss: training step"), last
  assert last.endswith("no checkpoint of this run exists yet."), last


# ------------------------------------------- kill -9 exactly between orbax's commit and the manifest

_KILL_AT_MANIFEST = """
import os, pathlib, signal, sys
from absl import app
from aogpt_jax import main
from aogpt_jax.checkpoints import store as checkpoint
real, die_at = checkpoint.write_manifest, sys.argv.pop()   # the step to die at
def write_manifest(step_dir):
  if pathlib.Path(step_dir).name.split(".")[0] == die_at:
    os.kill(os.getpid(), signal.SIGKILL)
  return real(step_dir)
checkpoint.write_manifest = write_manifest
app.run(main.main, flags_parser=main.parse_flags)
"""

KILLED = dict(total_steps=6, checkpoint_every=2, log_every=2, eval_every=0)


@pytest.fixture(scope="module")
def uninterrupted(cache_dir, tmp_path_factory):
  work = tmp_path_factory.mktemp("uninterrupted")
  run_cli(cli_args(cache_dir, work, **KILLED), work / "log")
  return saved_state(work, 6)


@pytest.mark.parametrize("async_save", [True, False])
@pytest.mark.subprocess
@pytest.mark.slow
def test_kill9_between_commit_and_manifest_resumes_exactly(cache_dir, uninterrupted, tmp_path,
                                                           async_save):
  """Async saves write the manifest into orbax's temporary folder before the commit rename, so a
  kill there leaves step 4 uncommitted (resume from 2); sync saves write it right after the
  commit, so the kill leaves a committed step 4 without a manifest, which must be used (not set
  aside) and named as unverified. Either way the finished run equals the uninterrupted one."""
  work = tmp_path / "work"
  args = cli_args(cache_dir, work, **KILLED, checkpoint__async_save=async_save)
  script = tmp_path / "kill_at_manifest.py"
  script.write_text(_KILL_AT_MANIFEST)
  killed = subprocess.run([sys.executable, str(script)] + args[3:] + ["4"], cwd=REPO,
                          env=cpu_env(), capture_output=True, text=True, timeout=300)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert _steps(work) == ([2] if async_save else [2, 4])
  if not async_save:
    assert not (work / "checkpoints/4" / checkpoint_lib.MANIFEST).exists()
  resumed = subprocess.run(args, cwd=REPO, env=cpu_env(), capture_output=True, text=True,
                           timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert not (work / "checkpoints_corrupt").exists()
  if not async_save:
    assert "checkpoints/4 has no checksum manifest" in resumed.stderr, resumed.stderr[-3000:]
  assert f"resumed from {work}/checkpoints/{2 if async_save else 4}\n" in resumed.stderr, \
      resumed.stderr[-3000:]
  jax.tree.map(np.testing.assert_array_equal, saved_state(work, 6), uninterrupted)
  assert checkpoint_lib.verify_manifest(work / "checkpoints/6")


@pytest.mark.subprocess
@pytest.mark.slow
def test_sample_falls_back_past_an_unverifiable_corrupt_step_in_one_quiet_line(cache_dir, trained,
                                                                               tmp_path):
  """A step saved without a manifest (older runs) whose EMA files are garbage: the CLI names it,
  samples from the previous step, and prints no "Exception ignored" reports of orbax."""
  work = _copy(trained, tmp_path)
  for step in (2, 4):
    (work / "checkpoints" / str(step) / checkpoint_lib.MANIFEST).unlink()
  for f in (work / "checkpoints/4/ema").rglob("*"):
    if f.is_file():
      f.write_bytes(b"\x00garbage")
  args = cli_args(cache_dir, work, sample__num_samples=1, sample__length=8, sample__steps=4)
  p = subprocess.run(args + ["--mode=sample"], cwd=REPO, env=cpu_env(), capture_output=True,
                     text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "checkpoints/4 is unreadable" in p.stderr and "Exception ignored" not in p.stderr
  line = next(x for x in p.stdout.splitlines() if x.startswith("samples written to "))
  written = pathlib.Path(line.split("samples written to ")[1].split("; the first")[0])
  assert json.loads(written.with_suffix(".json").read_text())["loaded"]["step"] == 2
