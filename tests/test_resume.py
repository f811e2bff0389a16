"""End to end through ``python -m aogpt_jax.main``: a run killed with SIGKILL at a random
moment, then stopped with SIGTERM, then finished, ends bitwise equal to an uninterrupted run;
a non-finite loss stops the run naming the step and keeps the last good checkpoint."""

import json
import random
import re
import shutil
import signal
import subprocess
import time

import jax
import numpy as np
import pytest

from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax import data as data_lib
from aogpt_jax.train import loop as train_loop
from helpers.trainer import (REPO, checkpoint_steps, cli_args, cpu_env, run, saved_state, start,
                          tiny_config, wait_for)

TOTAL = 96
RUN = dict(total_steps=TOTAL, checkpoint_every=4, log_every=8, eval_every=0,
           **{"checkpoint.keep": 3, "checkpoint.keep_every": 32})


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("cache")
  cfg = tiny_config(d)
  for split in ("train", "validation"):      # build the token cache once, up front
    data_lib.token_stream(cfg.data, split)
  return d


def _steps(workdir) -> list[int]:
  return checkpoint_steps(workdir)


def _wait_for(predicate, proc, timeout=120.0):
  return wait_for(predicate, proc, timeout)


def _metric_steps(workdir):
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  return [json.loads(line)["step"] for line in lines if "train/loss" in line]


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigkill_then_sigterm_then_finish_equals_uninterrupted(cache_dir, tmp_path):
  ref, work = tmp_path / "reference", tmp_path / "interrupted"
  run(cli_args(cache_dir, ref, **RUN), tmp_path / "reference.log")

  seed = random.randrange(10**6)
  rnd = random.Random(seed)
  killed_at = None
  for attempt in range(4):            # the kill must land while the run is still going
    p = start(cli_args(cache_dir, work, **RUN), tmp_path / f"killed{attempt}.log")
    assert _wait_for(lambda: bool(_steps(work)), p), "no checkpoint before the run ended"
    time.sleep(rnd.uniform(0.0, 2.0) / (attempt + 1))
    p.send_signal(signal.SIGKILL)
    if p.wait() == -signal.SIGKILL and (not _steps(work) or _steps(work)[-1] < TOTAL):
      killed_at = _steps(work)[-1] if _steps(work) else 0
      break
    shutil.rmtree(work)
  assert killed_at is not None, f"could not kill the run mid-way (random seed {seed})"

  # Resume, then stop it with SIGTERM once it has saved a newer checkpoint.
  p = start(cli_args(cache_dir, work, **RUN), tmp_path / "terminated.log")
  assert _wait_for(lambda: _steps(work) and _steps(work)[-1] > killed_at + 4, p)
  p.send_signal(signal.SIGTERM)
  assert p.wait(timeout=120) == 0, (tmp_path / "terminated.log").read_text()[-3000:]
  log = (tmp_path / "terminated.log").read_text()
  assert f"resumed from {work / 'checkpoints'}" in log
  stopped = int(log.split("stopped at step ")[1].split()[0])
  assert stopped in _steps(work) and stopped < TOTAL, (stopped, _steps(work))

  run(cli_args(cache_dir, work, **RUN), tmp_path / "finished.log")
  assert _steps(work)[-1] == TOTAL and {32, 64} <= set(_steps(work))   # keep_every
  # It says it is done, in one last line: steps, time, losses, checkpoints, what to run next.
  args = cli_args(cache_dir, work, **RUN)
  last = (tmp_path / "finished.log").read_text().strip().splitlines()[-1]
  assert f"training finished: steps {stopped}-{TOTAL} in " in last, last
  assert "train loss " in last and f"checkpoints in {work / 'checkpoints'}; " in last, last
  assert (f"sample: python -m aogpt_jax.main {' '.join(args[3:])} --mode=sample; evaluate: "
          f"python -m aogpt_jax.main {' '.join(args[3:])} --mode=eval") in last, last
  log = (tmp_path / "finished.log").read_text()
  assert "Unable to initialize backend" not in log and "parameters: " in log
  assert re.search(r"step 96 eval \((EMA|live) weights, 8 held-out blocks of 16 tokens, "
                   r"nats/token\): L2R loss", log), log[-3000:]     # eval.train_max_blocks=8
  assert "| Name" not in log and "| Name" in (work / train_loop.LOG_FILE).read_text()
  # A rerun has nothing to train, and that is its last line.
  run(args, tmp_path / "rerun.log")
  last = (tmp_path / "rerun.log").read_text().strip().splitlines()[-1]
  assert f"already reached total_steps={TOTAL}: nothing to train" in last and "--mode=eval" in last
  assert len(_steps(work)) <= 3 + 2          # the last 3 plus the multiples of 32
  got, want = saved_state(work, TOTAL), saved_state(ref, TOTAL)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b, err_msg=f"seed {seed}"), got,
               want)                  # bitwise, not just close
  assert int(got["train"]["step"]) == TOTAL
  # Every logged step appears once in metrics.jsonl despite the interruptions.
  assert _metric_steps(work) == _metric_steps(ref) == list(range(8, TOTAL + 1, 8))
  assert json.loads((work / "config.json").read_text())["model"]["n_layer"] == 1


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(cache_dir, tmp_path):
  cfg = tiny_config(cache_dir, optimizer__lr=1e30, optimizer__warmup_steps=1, total_steps=20,
                    checkpoint_every=1, log_every=1, optimizer__ema_decay=0.0)
  with pytest.raises(train_loop.NonFiniteLoss, match=r"training step (\d+) produced") as e:
    train_loop.train(cfg, str(tmp_path))
  bad = int(str(e.value).split("training step ")[1].split()[0])
  assert 1 <= bad < 20
  assert _steps(tmp_path) == list(range(1, bad)), (bad, _steps(tmp_path))
  if bad > 1:   # the newest checkpoint holds finite parameters
    m, _ = checkpoint_lib.load_model(tmp_path, which="params")
    from flax import nnx
    leaves = jax.tree.leaves(nnx.state(m, nnx.Param))
    assert all(np.isfinite(np.asarray(x)).all() for x in leaves)


@pytest.mark.subprocess
def test_bad_mode_and_config_errors_exit_with_a_message(cache_dir, tmp_path):
  args = cli_args(cache_dir, tmp_path / "w")
  kw = dict(capture_output=True, text=True, env=cpu_env(), cwd=REPO, timeout=120)
  p = subprocess.run(args + ["--mode=dance"], **kw)
  assert p.returncode != 0 and "--mode=dance: unknown mode; known: eval, genppl, prepare, rl, sample, solve, train" in p.stderr
  p = subprocess.run(args + ["--mode=smaple"], **kw)   # one line, no usage text
  assert p.returncode == 1 and p.stderr.strip().splitlines() == [
      "aogpt_jax: --mode=smaple: unknown mode; known: eval, genppl, prepare, rl, sample, solve, train; "
      "did you mean --mode=sample?"], p.stderr[-2000:]
  file = tmp_path / "a_file"
  file.write_text("x")
  p = subprocess.run(cli_args(cache_dir, file), **kw)   # no chmod advice for a file
  assert p.returncode == 1 and p.stderr.strip().splitlines()[-1] == (
      f"aogpt_jax: config error: --workdir: {file} is a file, not a folder; give a folder path "
      f"(an existing folder or one to create)"), p.stderr[-2000:]
  p = subprocess.run(args + ["--config.model.n_head=3"], **kw)
  assert p.returncode == 1
  assert "config error: model.n_head: 3 heads do not divide n_embd=32" in p.stderr


@pytest.mark.subprocess
@pytest.mark.slow
def test_ctrl_c_saves_like_sigterm_and_a_lower_total_steps_is_refused(cache_dir, tmp_path):
  work = tmp_path / "w"
  p = start(cli_args(cache_dir, work, **RUN), tmp_path / "interrupted.log")
  assert _wait_for(lambda: bool(_steps(work)), p), "no checkpoint before the run ended"
  p.send_signal(signal.SIGINT)
  assert p.wait(timeout=120) == 130, (tmp_path / "interrupted.log").read_text()[-3000:]
  log = (tmp_path / "interrupted.log").read_text()
  assert "received SIGINT: saving a checkpoint and stopping" in log
  stopped = int(log.split("stopped at step ")[1].split()[0])
  assert stopped == _steps(work)[-1] and stopped < TOTAL
  assert log.strip().splitlines()[-1] == (
      f"aogpt_jax: interrupted: Ctrl-C: stopped after saving the checkpoint of step {stopped} "
      f"in {work / 'checkpoints'}")
  # A total_steps below the newest checkpoint is an error, not a silent exit 0.
  kw = dict(capture_output=True, text=True, env=cpu_env(), cwd=REPO, timeout=120)
  lower = cli_args(cache_dir, work, **dict(RUN, total_steps=stopped - 1))
  q = subprocess.run(lower, **kw)
  assert q.returncode == 1, q.stderr[-2000:]
  assert (f"config error: total_steps: {stopped - 1} is below the newest checkpoint's step "
          f"{stopped}") in q.stderr
  assert _steps(work)[-1] == stopped                     # nothing was touched
