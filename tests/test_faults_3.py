"""Fault injection, third sweep (issue 42): converting over a run refused, ``l2r:`` only for runs
trained left to right, a gen-PPL steps grid for samplers that ignore steps refused, the held-out
share of whole-file text rows, untrained sample positions warned, lm-eval's ``batch_size``
model_arg, a full disk in one line, Ctrl-C while starting, and the temporary folder of a killed
``data.prepare`` removed by the next one."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from ml_collections import config_dict

from aogpt_jax import config as config_lib
from aogpt_jax import modes
from aogpt_jax.checkpoints import convert, from_gpt
from aogpt_jax.data import build
from aogpt_jax.data import config as data_config
from aogpt_jax.data import sources
from aogpt_jax.evaluation import genppl
from aogpt_jax.sampling import config as sample_config

from helpers import published
from helpers.trainer import REPO, cli_args, cpu_env, tiny_config

ConfigError = config_lib.ConfigError


# ------------------------------------------------------------------ 6: from-gpt over a run


def test_convert_from_gpt_refuses_a_non_empty_out(tmp_path):
  folder = published.gpt2_folder(tmp_path / "g", vocab=257, n_positions=17, n_layer=1)
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text('{"data": {"source": "python_stdlib"}}')
  with pytest.raises(SystemExit) as e:
    convert.main(["from-gpt", "--spec", f"gpt2:{folder}", "--out", str(run)])
  msg = str(e.value.code)
  assert "--out" in msg and "is not empty" in msg and "\n" not in msg, msg
  assert (run / "config.json").read_text() == '{"data": {"source": "python_stdlib"}}'
  assert sorted(os.listdir(run)) == ["config.json"]


# ------------------------------------------------------------------ 8: l2r: only for a GPT run


def _l2r_source(target="none"):
  from aogpt_jax.model import aogpt as model_lib
  from flax import nnx
  return model_lib.AOGPT(model_lib.preset("tiny", n_layer=1, n_embd=32, n_head=2, target_dim=8,
                                          block_size=16, target=target), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("objective,order,kwargs,want", [
    ("mdm", "mixture", {"p_l2r": 0.1}, r"objective='mdm'; l2r: takes a left-to-right GPT run"),
    ("ao", "uniform", {}, r"order.name='uniform': the run was not trained left to right only"),
    ("ao", "mixture", {"p_l2r": 0.1}, r"order.name='mixture' with kwargs \{'p_l2r': 0.1\}"),
    ("ao", "curriculum", {"steps": 10}, r"order.name='curriculum'"),
])
def test_l2r_spec_refuses_runs_not_trained_left_to_right(tmp_path, monkeypatch, objective, order,
                                                         kwargs, want):
  from aogpt_jax.checkpoints import store
  (tmp_path / "checkpoints").mkdir()
  run_cfg = config_dict.ConfigDict({"objective": objective,
                                    "order": {"name": order, "kwargs": kwargs}})
  monkeypatch.setattr(store, "load_model", lambda *a, **k: (_l2r_source(), run_cfg))
  with pytest.raises(from_gpt.ConversionError, match=f"^l2r:{tmp_path}: {want}") as e:
    from_gpt.load(f"l2r:{tmp_path}")
  assert "\n" not in str(e.value)


def test_l2r_spec_accepts_l2r_and_all_l2r_mixture_runs(tmp_path, monkeypatch):
  from aogpt_jax.checkpoints import store
  (tmp_path / "checkpoints").mkdir()
  for order, kwargs in (("l2r", {}), ("mixture", {"p_l2r": 1.0})):
    run_cfg = config_dict.ConfigDict({"objective": "ao", "order": {"name": order,
                                                                   "kwargs": kwargs}})
    run_cfg.loaded = {"step": 3, "weights": "ema"}
    monkeypatch.setattr(store, "load_model", lambda *a, r=run_cfg, **k: (_l2r_source(), r))
    m, cfg, prov = from_gpt.load(f"l2r:{tmp_path}")
    assert cfg.target == "adaln" and prov["step"] == 3


@pytest.mark.slow
def test_l2r_spec_refuses_a_trained_uniform_order_run(tmp_path):
  """End to end: a target=none run trained on uniform orders, for --checkpoint and init_from."""
  from aogpt_jax.train import loop
  cfg = tiny_config(tmp_path / "cache", model__target="none", total_steps=1, checkpoint_every=1)
  cfg.order.name, cfg.order.kwargs = "uniform", config_dict.ConfigDict({})
  loop.train(cfg, str(tmp_path / "uni"))
  with pytest.raises(from_gpt.ConversionError, match="order.name='uniform'"):
    from_gpt.load(f"l2r:{tmp_path / 'uni'}")
  with pytest.raises(SystemExit, match="order.name='uniform'"):
    convert.main(["from-gpt", "--spec", f"l2r:{tmp_path / 'uni'}", "--out",
                  str(tmp_path / "out")])
  assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


# ------------------------------------------------------------------ 9: a steps grid that varies nothing


@pytest.mark.parametrize("method,policy", [("speculative", "max_prob"), ("ar", "max_prob"),
                                           ("adaptive", "threshold")])
def test_genppl_steps_grid_refused_for_samplers_that_ignore_steps(tmp_path, method, policy):
  cfg = tiny_config(tmp_path, sample__method=method, sample__policy=policy,
                    genppl__steps="4,8")
  with pytest.raises(ConfigError, match=rf"^genppl.steps: '4,8' varies sample.steps, which "
                                        rf"sample.method='{method}'.* ignores") as e:
    modes.genppl_mode(cfg, str(tmp_path / "nowhere"))     # before anything is loaded
  assert "\n" not in str(e.value)
  assert not (tmp_path / "nowhere").exists()


def test_genppl_steps_grid_kept_where_steps_matter(tmp_path):
  for method, policy in (("diffusion", "max_prob"), ("", "max_prob"), ("adaptive", "max_prob")):
    cfg = tiny_config(tmp_path, sample__method=method, sample__policy=policy,
                      genppl__steps="4,8")
    assert genppl.grid_from_config(cfg.genppl, cfg.sample)["steps"] == [4, 8]
  cfg = tiny_config(tmp_path, sample__method="ar", genppl__steps="8")     # one value: fine
  assert genppl.grid_from_config(cfg.genppl, cfg.sample)["steps"] == [8]


# ------------------------------------------------------------------ 10: held-out share, whole files


def _files(folder, n=12):
  rng = np.random.default_rng(0)
  folder.mkdir()
  for i in range(n):
    lines = [f"line {j} of file {i} " + "x" * int(rng.integers(0, 60))
             for j in range(int(rng.integers(200, 2000)))]
    (folder / f"f{i}.txt").write_text("\n".join(lines) + "\n")
  return str(folder / "*.txt")


@pytest.mark.parametrize("fraction", [0.05, 0.01, 0.002])
def test_whole_file_rows_hold_out_the_fraction_of_the_text(tmp_path, fraction):
  c = data_config.resolve({}, source="text_files", glob=_files(tmp_path / "corpus"),
                          validation_fraction=fraction, cache_dir=str(tmp_path / "c"))
  train = list(sources.raw_split(c, "train").rows)
  val = list(sources.raw_split(c, "validation").rows)
  text = "".join(p.read_text() for p in sorted((tmp_path / "corpus").glob("*.txt")))
  assert sum(map(len, train + val)) == len(text)             # every character on one side
  assert sorted("".join(train + val).splitlines()) == sorted(text.splitlines())
  share = sum(map(len, val)) / len(text)
  assert abs(share - fraction) < 0.1 * fraction + 1e-4, share
  assert f"({share:.2%}; validation_fraction {fraction})" in sources.raw_split(
      c, "validation").origin


def test_line_rows_are_never_cut(tmp_path):
  c = data_config.resolve({}, source="text_files", glob=_files(tmp_path / "corpus", 3),
                          validation_fraction=0.05, txt_rows="line")
  rows = list(sources.raw_split(c, "train").rows) + list(sources.raw_split(c, "validation").rows)
  assert all(r.endswith("\n") and r.count("\n") == 1 for r in rows)


def test_a_fraction_too_small_for_a_line_names_the_fix(tmp_path):
  (tmp_path / "a.txt").write_text(("a fairly long line of text, " * 8 + "\n") * 40)
  c = data_config.resolve({}, source="text_files", glob=str(tmp_path / "a.txt"),
                          validation_fraction=0.001)
  with pytest.raises(ValueError, match=r"data.validation_fraction: 0.001 of \d+ characters holds "
                                       r"out no whole line.*raise data.validation_fraction.*"
                                       r"data.validation_glob"):
    list(sources.raw_split(c, "validation").rows)


# ------------------------------------------------------------------ 11: untrained positions


def test_sample_length_past_the_trained_length_warns(tmp_path, monkeypatch, caplog):
  from aogpt_jax.sampling import write

  class Stop(Exception):
    pass

  def stop(*a, **k):
    raise Stop
  monkeypatch.setattr(write, "prepare", stop)         # nothing compiles
  m = _l2r_source(target="adaln")                     # block_size 16
  c = sample_config.sample_config()
  c.update(dict(length=16, steps=8, num_samples=1, batch_size=1))
  caplog.set_level("WARNING")
  from aogpt_jax.data import tokenizers
  with pytest.raises(Stop):
    write.write_samples(m, c, str(tmp_path), tokenizers.get_tokenizer("byte"), trained_length=8)
  lines = [r.getMessage() for r in caplog.records if "never trained" in r.getMessage()]
  assert lines == ["sample.length=16: positions >= 8 (the run's seq_len) were never trained; "
                   "the samples past them are extrapolation"]
  caplog.clear()
  c.length = 8
  with pytest.raises(Stop):
    write.write_samples(m, c, str(tmp_path), tokenizers.get_tokenizer("byte"), trained_length=8)
  assert "never trained" not in caplog.text


# ------------------------------------------------------------------ 13: a full disk, Ctrl-C


_FULL_DISK = """
import errno, runpy, sys
from aogpt_jax.checkpoints import store
real = store.write_manifest
def full(step_dir):   # the disk fills up during the first async save, in its background thread
  raise OSError(errno.ENOSPC, "No space left on device")
store.write_manifest = full
sys.argv = ["aogpt_jax.main"] + sys.argv[1:]
runpy.run_module("aogpt_jax.main", run_name="__main__")
"""


def _check_one_line(p, work, max_step):
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 1, p.stderr[-3000:]
  for bad in ("Traceback", "Logging error", "Exception ignored", "Event loop is closed",
              "exception was never retrieved", "dropped"):
    assert bad not in p.stderr, p.stderr[-5000:]
  errs = [ln for ln in lines if "CheckpointSaveError" in ln]
  assert len(errs) == 1 and errs[0] == lines[-1], lines[-5:]
  assert errs[0].startswith(f"aogpt_jax: CheckpointSaveError: checkpoint: saving step 4 to "
                            f"{work}/checkpoints failed (No space left on device)"), errs[0]
  # the failed save's temporary folder is gone: its space is free for the resume (issue 51)
  assert "its partial folder 4.orbax-checkpoint-tmp" in errs[0], errs[0]
  assert not list((work / "checkpoints").glob("*orbax-checkpoint-tmp*"))
  steps = [json.loads(x)["step"] for x in (work / "metrics.jsonl").read_text().splitlines()]
  assert max(steps, default=0) <= max_step, steps


@pytest.mark.subprocess
@pytest.mark.slow
def test_full_disk_during_an_async_save_is_one_line_at_that_save(tmp_path):
  script = tmp_path / "full.py"
  script.write_text(_FULL_DISK)
  work = tmp_path / "work"
  args = cli_args(tmp_path / "cache", work, total_steps=400, checkpoint_every=4, log_every=2,
                  eval_every=0)
  args = [sys.executable, str(script)] + args[3:]
  p = subprocess.run(args, cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=400)
  _check_one_line(p, work, max_step=8)     # the next save at the latest; not the run's end


@pytest.mark.xfail(reason="a real full disk: which write meets it first (a checkpoint, metrics, "
                   "train.log, orbax's own temporary files) varies from run to run; the one-line "
                   "paths are tested deterministically (the async-save test above, "
                   "tests/test_metrics.py); this one passed here when last run", strict=False)
@pytest.mark.subprocess
@pytest.mark.slow
def test_real_full_disk_on_a_tiny_tmpfs_is_one_line(tmp_path):
  mnt = tmp_path / "mnt"
  mnt.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)],
                    capture_output=True).returncode:
    pytest.skip("cannot mount a tmpfs here")
  try:
    work = mnt / "work"
    args = cli_args(tmp_path / "cache", work, total_steps=400, checkpoint_every=4, log_every=4,
                    eval_every=0, checkpoint__keep=0)
    p = subprocess.run(args, cwd=REPO, env=cpu_env(), capture_output=True, text=True,
                       timeout=400)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-5000:]
    assert "Logging error" not in p.stderr and "Event loop is closed" not in p.stderr
    # whichever write meets the full disk first, the checkpoint's or the metrics'
    assert lines[-1].startswith(("aogpt_jax: CheckpointSaveError: checkpoint: saving step ",
                                 "aogpt_jax: MetricsWriteError: metrics: writing step ")), lines
    assert "(No space left on device)" in lines[-1]
  finally:
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _interrupt_after(args, seconds: float) -> subprocess.CompletedProcess:
  p = subprocess.Popen(args, cwd=REPO, env=cpu_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  time.sleep(seconds)
  p.send_signal(signal.SIGINT)
  out, err = p.communicate(timeout=120)
  return subprocess.CompletedProcess(args, p.returncode, out, err)


# Ctrl-C while the command lines import: tests/test_faults_4.py (at a chosen import, not a time).


@pytest.mark.subprocess
@pytest.mark.slow
def test_ctrl_c_during_figures_is_one_line_and_130(tmp_path):
  args = [sys.executable, "-m", "aogpt_jax.figures", "fig8", "--size=tiny",
          f"--workdir={tmp_path / 'fig'}"]
  for seconds in (12.0,):           # once running
    p = _interrupt_after(args, seconds)
    assert p.returncode == 130, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "KeyboardInterrupt" not in p.stderr, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1].startswith("aogpt_jax.figures: interrupted"), \
        p.stderr[-3000:]


# ------------------------------------------------------------------ 14: a killed prepare's folder


_KILLED_PREPARE = """
import os, signal, sys
from aogpt_jax.data import build, records
from aogpt_jax.data import config as data_config
def killed(self, tokens):   # kill -9 in the middle of writing the split
  os.kill(os.getpid(), signal.SIGKILL)
records.BlockWriter.add = killed
cfg = data_config.resolve({}, source="python_stdlib", tokenizer="byte", cache_dir=sys.argv[1])
build.prepare_split(cfg, "train", block_size=16, num_proc=1, progress=False)
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_killed_prepare_leaves_a_folder_the_next_prepare_removes(tmp_path):
  script = tmp_path / "killed.py"
  script.write_text(_KILLED_PREPARE)
  cache = tmp_path / "cache"
  p = subprocess.run([sys.executable, str(script), str(cache)], cwd=REPO, env=cpu_env(),
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
  left = list(cache.rglob(".train.tmp-*"))
  assert len(left) == 1, left
  parent = left[0].parent
  # A preparation running right now (this process) and one of another host keep theirs.
  live = parent / f".train.tmp-{build.socket.gethostname()}-{os.getpid()}-0123abcd"
  other = parent / ".train.tmp-elsewhere-1-0123abcd"
  live.mkdir()
  other.mkdir()
  cfg = data_config.resolve({}, source="python_stdlib", tokenizer="byte", cache_dir=str(cache))
  said = []
  meta = build.prepare_split(cfg, "train", block_size=16, num_proc=1, progress=False,
                             log=said.append)
  assert meta["num_blocks"] > 0
  assert sorted(parent.glob(".train.tmp-*")) == sorted([live, other])
  assert any(f"removed {left[0]}: left by a preparation that was killed" == s for s in said), said


def test_old_style_temporary_folders_go_once_an_hour_old(tmp_path):
  fresh, old = tmp_path / ".train.tmp-1a2b3c4d", tmp_path / ".train.tmp-5e6f7a8b"
  fresh.mkdir()
  old.mkdir()
  hour_ago = time.time() - 2 * build.OLD_TMP_SECONDS
  os.utime(old, (hour_ago, hour_ago))
  assert build.remove_stale_tmp(pathlib.Path(tmp_path), "train", log=lambda s: None) == [old]
  assert fresh.exists() and not old.exists()
