"""Fault injection, fourth sweep (issue 51): a text task's tokenizer is the run's; solve files with
a byte-order mark, undecodable bytes, rows with no blank and repeated rows; every option of the
``pairs`` task a config key; the rl sampler's keys checked up front under their own names;
``train.init_from`` errors naming it; DPO on identical pairs refused; a stop signal ends a
held-out eval at once; a failed save leaves no temporary folder and no asyncio reports; Ctrl-C
while the command lines start up is one line and status 130. In-process and tiny, but the
Ctrl-C test (interpreters killed before JAX has imported)."""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from aogpt_jax import config as config_lib
from aogpt_jax import main as main_lib
from aogpt_jax import modes
from aogpt_jax import recipes
from aogpt_jax import tasks
from aogpt_jax.checkpoints import store
from aogpt_jax.evaluation import solve as solve_lib
from aogpt_jax.posttrain import dpo, dpo_run, grpo, rl
from aogpt_jax.sampling import SampleSettings
from aogpt_jax.tasks import sudoku, text_pairs
from aogpt_jax.train import loop as train_loop
from aogpt_jax.train import workdir as workdir_lib

from helpers import posttrain as pt
from helpers.trainer import REPO, cpu_env

ConfigError = config_lib.ConfigError
SFT = REPO / "configs" / "sft_text.py"


# ------------------------------------------------------------------ 1, 5: a text task's options


def test_a_text_tasks_tokenizer_is_the_runs_everywhere_it_is_recorded(tmp_path):
  cfg = recipes.config_file(SFT, "tiny")
  cfg.task.options.tokenizer = "gpt2"          # what --config.task.options.tokenizer=gpt2 does
  assert cfg.data.tokenizer == "gpt2"
  mc = config_lib.resolve(cfg)
  assert mc.valid_vocab_size == 50257
  assert store.run_meta(cfg, mc)["config"]["data"]["tokenizer"] == "gpt2"   # config.json
  cfg.data.tokenizer = "byte"                  # either key sets both
  assert cfg.task.options.tokenizer == "byte"
  # A config that sets them apart is refused before anything runs.
  other = recipes.apply(recipes.quickstart(), {
      "task.name": "pairs", "task.options": {"path": str(text_pairs_file(tmp_path)),
                                             "tokenizer": "gpt2", "length": 32},
      "seq_len": 32, "model.loss_chunk": 0})
  with pytest.raises(ConfigError, match=r"^data.tokenizer: 'byte', but the task's rows are in "
                     r"task.options.tokenizer='gpt2'; set --config.data.tokenizer=gpt2"):
    config_lib.resolve(other)
  # --mode=sample / eval / solve on a 50257-id text-task run with the byte tokenizer: one line.
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"model": {"valid_vocab_size": 50257}}))
  with pytest.raises(ConfigError, match=r"^data.tokenizer: 'byte' has 257 ids but the run in "):
    modes._check_run(recipes.config_file(SFT, "tiny"), str(run), "sample.method")


def text_pairs_file(tmp_path, lines=None) -> pathlib.Path:
  f = tmp_path / "pairs.jsonl"
  lines = lines or [{"prompt": f"{i}+{i}=", "response": str(2 * i)} for i in range(40)]
  f.write_text("".join(json.dumps(x) + "\n" for x in lines))
  return f


def test_every_option_of_the_pairs_task_is_a_config_key():
  cfg = recipes.config_file(SFT, "tiny")
  assert set(cfg.task.options) == set(tasks.base.defaults("pairs"))
  cfg.task.options.truncate = True                  # docs/post_training.md documents it
  assert config_lib.task_of(cfg).truncate is True
  # A run recorded before a key existed (at its default) is the same task.
  opts = config_lib.task_options(cfg)
  del opts["truncate"], opts["limit"]
  assert config_lib.task_options_full("pairs", opts) == config_lib.task_options_full(
      "pairs", {**opts, "truncate": False})


# ------------------------------------------------------------------ 2, 3, 6, 10: puzzle files


def _rows(count=3):
  t = tasks.make("sudoku", size=4)
  h = t.heldout(0, count)
  return t, h, [(sudoku.to_string(a, p), sudoku.to_string(a)) for a, p in zip(h["tokens"],
                                                                             h["prompt"])]


def test_puzzle_files_with_a_bom_or_bytes_that_are_not_utf8(tmp_path):
  _, h, rows = _rows()
  csv = "puzzle,solution\n" + "".join(f"{p},{s}\n" for p, s in rows)
  bom = tmp_path / "excel.csv"
  bom.write_text(csv, encoding="utf-8-sig")          # Excel's "CSV UTF-8"
  got = sudoku.load_puzzles(str(bom), size=4)
  np.testing.assert_array_equal(got["tokens"], h["tokens"])
  np.testing.assert_array_equal(got["prompt"], h["prompt"])
  bad = tmp_path / "bad.csv"
  bad.write_bytes(csv.encode() + b"1234,\xff\n")
  with pytest.raises(ValueError, match=rf"^{bad}: line 5: byte 0xff at column 6 is not UTF-8; "):
    sudoku.load_puzzles(str(bad), size=4)
  jsonl = tmp_path / "bad.jsonl"
  jsonl.write_bytes(b'\xef\xbb\xbf{"prompt": "a", "response": "b"}\n{"prompt": "\xc3("}\n')
  with pytest.raises(ValueError, match=rf"^{jsonl}: line 2: byte 0xc3 at column 13 is not "):
    text_pairs.read_examples(("prompt", "response"), path=str(jsonl))
  jsonl.write_bytes(b'\xef\xbb\xbf{"prompt": "a", "response": "b"}\n')
  assert text_pairs.read_examples(("prompt", "response"), path=str(jsonl))[0][1] == {
      "prompt": "a", "response": "b"}


def test_rows_with_no_blank_are_solved_and_repeated_rows_are_counted(tmp_path, caplog):
  task, h, _ = _rows(2)
  given = np.ones_like(h["prompt"])
  given[1] = h["prompt"][1]                     # row 0: every cell given; row 1: a puzzle
  ref = h["tokens"]
  order = np.argsort(~given, axis=1, kind="stable")
  verdict = task.verify(ref, {"tokens": ref, "prompt": given})
  res = solve_lib._result(task, ref, given, ref, order, np.array([0, 5]), verdict, 0.1,
                          SampleSettings(length=16))
  assert [r["solved"] for r in res.rows] == [True, True]
  assert [r["first_error_rank"] for r in res.rows] == [-1, -1]
  all_given = solve_lib.early_errors(ref[:1], ref[:1], given[:1], order[:1])
  assert all_given[0].shape == (1, 0) and all_given[1].tolist() == [-1]
  # Repeated rows: said, and recorded.
  _, _, rows = _rows(3)
  f = tmp_path / "p.csv"
  f.write_text("".join(f"{p},{s}\n" for p, s in rows + rows[:2]))
  cfg = pt.config("sudoku.py", **{"solve.puzzles": str(f), "task.options": {"size": 4},
                                  "seq_len": 16})
  with caplog.at_level(logging.WARNING):
    puzzles, source = modes.load_puzzles(config_lib.task_of(cfg), cfg)
  assert len(puzzles["tokens"]) == 5 and source["duplicates"] == 2
  assert "2 of the 5 rows" in caplog.text and "only 3 differ" in caplog.text


def test_solve_in_a_workdir_with_no_run_names_a_hint_that_works(tmp_path):
  cfg = pt.config("sudoku.py", **{"solve.count": 2})
  with pytest.raises(FileNotFoundError, match=r"no run in .*; pass the workdir of a trained run, "
                     r"or --checkpoint=WORKDIR or SPEC to solve with those weights"):
    modes.solve_mode(cfg, str(tmp_path / "none"))
  assert "solve" in main_lib.CHECKPOINT_MODES     # (followed: tests/test_solve.py)
  assert not (tmp_path / "none").exists()


# ------------------------------------------------------------------ 7, 11: rl / dpo up front


def test_rl_sampler_keys_are_checked_up_front_under_their_names():
  task = tasks.make("sudoku", size=4)
  mc = config_lib.model_config(pt.config("sudoku.py", **{"task.options": {"size": 4},
                                                         "seq_len": 16,
                                                         "model.blank_block": False}))
  rl.check_sampler(grpo.GRPOSettings(steps=16), task, mc)
  for bad, want in ((dict(temperature=0.0), r"^rl.temperature: must be a finite number >= .* "
                     r"\(the rollouts are drawn at it; the held-out eval decodes greedily\)"),
                    (dict(order="spiral"), r"^rl.*spiral")):
    with pytest.raises(ValueError, match=want) as e:
      rl.check_sampler(grpo.GRPOSettings(steps=16, **bad), task, mc)
    assert "sample." not in str(e.value)


def test_a_missing_init_from_or_reference_names_its_key(tmp_path):
  for key in ("train.init_from", "rl.reference"):
    with pytest.raises(ConfigError, match=rf"^{key}: {tmp_path}/none: no such folder or file; "
                       r"expected the WORKDIR of a trained run") as e:
      train_loop.load_spec(str(tmp_path / "none"), key)
    assert "--checkpoint" not in str(e.value)


def test_dpo_refuses_pairs_whose_chosen_equals_rejected(tmp_path, caplog):
  same = [{"prompt": f"q{i}", "chosen": f"a{i}", "rejected": f"a{i}"} for i in range(40)]
  path = text_pairs_file(tmp_path, same)
  cfg = pt.config("dpo_sudoku.py", **{
      "task.name": "preferences", "task.options": {"path": str(path), "length": 16},
      "seq_len": 16, "data.tokenizer": "byte", "dpo.pairs": 8, "train.init_from": "/none"})
  with pytest.raises(ConfigError, match=r"^task.options: every one of the \d+ training pairs of "
                     r".*has 'chosen' equal to 'rejected' \(after encoding\)"):
    dpo_run.build(cfg, config_lib.resolve(cfg))
  path = text_pairs_file(tmp_path, same[:20] + [dict(x, rejected="no") for x in same[20:]])
  task = tasks.make("preferences", path=str(path), length=16)
  assert dpo.check_distinct(task) == int((task.train_index < 20).sum()) > 0


# ------------------------------------------------------------------ 8: a stop signal, a long loop


def test_a_stop_signal_ends_an_interruptible_host_loop_at_once():
  stop = workdir_lib.StopSignal()
  try:
    t = time.perf_counter()
    with pytest.raises(workdir_lib.StopRequested):
      with stop.interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)                      # a search of minutes: ended by the signal
    assert time.perf_counter() - t < 10 and stop.requested and stop.signum == signal.SIGTERM
    with pytest.raises(workdir_lib.StopRequested):   # already asked: not started at all
      with stop.interruptible():
        raise AssertionError("ran")
  finally:
    stop.restore()
  # (in a run: tests/test_faults_2.py, test_metrics_of_a_run_killed_before_its_first_save_...)


# ------------------------------------------------------------------ 12: a failed save


def test_a_failed_save_removes_its_temporary_folder(tmp_path, monkeypatch):
  def full(step_dir):       # the disk fills up in the async save's background thread
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(store, "write_manifest", full)
  ckpt = store.Checkpointer(tmp_path, config_lib.default_config().checkpoint)
  state = {"params": {"w": np.ones((64, 64), np.float32)}, "step": np.int32(3),
           "rng": np.asarray(jax.random.PRNGKey(0))}
  ckpt.save(3, state, None, {"config": {}})
  with pytest.raises(store.CheckpointSaveError, match=r"saving step 3 .*\(No space left on "
                     r"device\).*its partial folder 3.orbax-checkpoint-tmp\S* was removed"):
    ckpt.wait()
  ckpt.close()
  assert sorted(os.listdir(ckpt.directory)) == []


def test_after_a_failed_save_asyncio_reports_of_its_writes_are_dropped(caplog):
  log = logging.getLogger("asyncio")

  def abandoned_write():
    loop = asyncio.new_event_loop()
    fut = loop.create_future()
    fut.set_exception(OSError(errno.ENOSPC, "No space left on device"))
    del fut
    gc.collect()
    loop.close()

  before = list(log.filters)
  log.filters[:] = [f for f in before if not isinstance(f, store._FailedFutures)]  # an earlier save
  try:
    with caplog.at_level(logging.ERROR, logger="asyncio"):
      abandoned_write()
      assert "exception was never retrieved" in caplog.text     # what would be printed
      caplog.clear()
      store._quiet_failed_futures()
      abandoned_write()
    assert "exception was never retrieved" not in caplog.text
  finally:
    log.filters[:] = before


# ------------------------------------------------------------------ 13: Ctrl-C while starting


_CTRL_C = """
import os, runpy, signal, sys
how, trigger, mod = sys.argv[1:4]
class Finalized:
  def __del__(self):
    os.kill(os.getpid(), signal.SIGINT)
    sum(range(10000))          # the handler runs here, inside __del__ (an "ignored" context)
class Hook:                    # Ctrl-C while TRIGGER imports
  def find_spec(self, name, path=None, target=None):
    if name == trigger:
      if how == "import":
        os.kill(os.getpid(), signal.SIGINT)
      else:
        Finalized()
    return None
sys.meta_path.insert(0, Hook())
sys.argv = [mod] + sys.argv[4:]
runpy.run_module(mod, run_name="__main__", alter_sys=True)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("how", ["import", "finalizer"])
@pytest.mark.parametrize("mod", ["aogpt_jax.main", "aogpt_jax.figures"])
def test_ctrl_c_while_starting_is_one_line_and_130(tmp_path, mod, how):
  script = tmp_path / "ctrl_c.py"
  script.write_text(_CTRL_C)
  p = subprocess.run([sys.executable, str(script), how, "numpy._core.multiarray", mod, "fig8",
                      "--size=tiny", f"--workdir={tmp_path / 'w'}"], cwd=REPO, env=cpu_env(),
                     capture_output=True, text=True, timeout=120)
  prog = "aogpt_jax" if mod.endswith("main") else mod
  assert (p.returncode, p.stderr.splitlines()) == (130, [f"{prog}: interrupted (Ctrl-C)"]), \
      p.stderr[-3000:]
  assert not (tmp_path / "w").exists()


_GC_CTRL_C = r"""
import gc, os, signal, sys, time
from aogpt_jax.errors import ctrl_c_handler
# explicit either way: a test runner's worker may hand its SIGINT disposition (ignored) down
signal.signal(signal.SIGINT, ctrl_c_handler if sys.argv[1] == "fixed" else
              signal.default_int_handler)
fired = []
def cb(phase, info):            # Ctrl-C while a gc callback runs (JAX registers one)
  if phase == "start" and not fired:
    fired.append(1)
    os.kill(os.getpid(), signal.SIGINT)
    sum(range(100000))
gc.callbacks.append(cb)
try:
  gc.collect()
  t = time.time()
  while time.time() - t < 3:
    time.sleep(0.01)
  print("the run went on")
except KeyboardInterrupt:
  print("interrupted")
"""


@pytest.mark.subprocess
def test_ctrl_c_in_a_gc_callback_is_not_lost(tmp_path):
  """A Ctrl-C landing in JAX's gc callback was printed as "Exception ignored ...
  KeyboardInterrupt" and lost (the run went on to its end): `errors.ctrl_c_handler` delivers it
  again outside the callback. The default handler shows the finding."""
  script = tmp_path / "gc_ctrl_c.py"
  script.write_text(_GC_CTRL_C)
  run = lambda how: subprocess.run([sys.executable, str(script), how], cwd=REPO,  # noqa: E731
                                   env=cpu_env(), capture_output=True, text=True, timeout=60)
  default, fixed = run("default"), run("fixed")
  assert default.stdout.strip() == "the run went on" and "Exception ignored" in default.stderr
  assert fixed.stdout.strip() == "interrupted" and "Exception ignored" not in fixed.stderr, \
      fixed.stderr


def test_a_partial_folder_written_again_is_removed_again(tmp_path, monkeypatch):
  """On a real full disk the error said the partial folder was removed while
  checkpoints/2.orbax-checkpoint-tmp was still there (a writer thread added to it after the
  removal): the removal is retried, and a folder that stays is said to stay."""
  ckpt = store.Checkpointer(tmp_path, config_lib.default_config().checkpoint)
  tmp = ckpt.directory / "2.orbax-checkpoint-tmp"
  real, calls = shutil.rmtree, []

  def late_writer(path, ignore_errors=False):
    real(path, ignore_errors=ignore_errors)
    calls.append(path)
    if len(calls) == 1:                   # a background write lands after the first removal
      (pathlib.Path(path) / "params").mkdir(parents=True)
  monkeypatch.setattr(store.shutil, "rmtree", late_writer)
  (tmp / "params").mkdir(parents=True)
  assert ckpt._remove_partial(2) == "; its partial folder 2.orbax-checkpoint-tmp was removed"  # noqa: SLF001
  assert not tmp.exists() and len(calls) >= 2
  (tmp / "params").mkdir(parents=True)
  monkeypatch.setattr(store.shutil, "rmtree", lambda path, ignore_errors=False: None)
  assert "could not be removed (remove it by hand)" in ckpt._remove_partial(2)  # noqa: SLF001
  ckpt.close()
