"""Fault injection, second sweep (issue 32): outputs never overwritten and never outside their
folder, outputs that say what produced them, eval refusing a held-out set that is not the
run's, an edited corpus re-prepared, refused resumes that change nothing, metrics without
repeated steps, corrupt steps set aside across file systems, data workers that die with the
trainer, failed saves in one line, and one-line errors for every command line
(`aogpt_jax.errors.run_cli`)."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from aogpt_jax import config as config_lib
from aogpt_jax import data as data_lib
from aogpt_jax import errors
from aogpt_jax import evaluation
from aogpt_jax import modes
from aogpt_jax.checkpoints import convert
from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax.data import config as data_config
from aogpt_jax.data import pipeline
from aogpt_jax.data import prepare as prepare_lib
from aogpt_jax.data import records
from aogpt_jax.train import loop as train_loop
from aogpt_jax.train import workdir as workdir_lib

from helpers.trainer import REPO, checkpoint_steps, cpu_env, tiny_config
from helpers.trainer import copy_workdir as _copy

ConfigError = config_lib.ConfigError


# ------------------------------------------------------------------ one line per CLI, no training


def test_run_cli_one_line_verbose_and_ctrl_c(capsys):
  def bad(argv):
    del argv
    try:
      raise KeyError("inner")
    except KeyError as e:
      raise ValueError("data.source: unknown source 'x'") from e

  with pytest.raises(SystemExit) as e:
    errors.run_cli(bad, ["--a"], prog="prog")
  assert e.value.code == ("prog: ValueError: data.source: unknown source 'x' (--verbose for the "
                          "traceback)")
  with pytest.raises(ValueError):
    errors.run_cli(bad, ["--verbose"], prog="prog")
  seen = []
  errors.run_cli(seen.append, ["--x", "--verbose=false"], prog="prog")
  assert seen == [["--x", "--verbose=false"]]

  def interrupted(argv):
    raise KeyboardInterrupt

  with pytest.raises(SystemExit) as e:
    errors.run_cli(interrupted, [], prog="prog")
  assert e.value.code == 130 and "prog: interrupted" in capsys.readouterr().err

  def bug(argv):
    raise AttributeError("a bug keeps its traceback")

  with pytest.raises(AttributeError):
    errors.run_cli(bug, [], prog="prog")


@pytest.mark.parametrize("args,want", [
    (["--source=nope"], "data.source: unknown source 'nope'"),
    (["--source=python_stdlib", "--block_size=0"], "--block_size: must be >= 2"),
    (["--source=python_stdlib", "--split=test"], "not 'test'"),
    (["--source=python_stdlib", "--tokenizer=hf:{tmp}/missing.json"], "no tokenizer.json"),
    (["--source=python_stdlib", "--tokenizer=hf:{tmp}/bad.json"], "bad.json is not a readable"),
    (["--source=python_stdlib", "--verify", "--cache_dir={tmp}/c"], "is not prepared"),
    (["--source=text_files", "--glob={tmp}/*.txt", "--validation_fraction=-0.5",
      "--cache_dir={tmp}/c"], "data.validation_fraction: must be a number in [0, 1)"),
])
def test_prepare_cli_errors_are_one_line(tmp_path, args, want):
  (tmp_path / "bad.json").write_text('{"model": ')
  (tmp_path / "a.txt").write_text("hello\n")
  args = [a.replace("{tmp}", str(tmp_path)) for a in args]
  with pytest.raises(SystemExit) as e:
    prepare_lib.main(args)
  msg = str(e.value.code)
  assert msg.startswith("aogpt_jax.data.prepare: ") and want in msg and "\n" not in msg, msg
  with pytest.raises(Exception) as e:     # --verbose: the exception itself (its traceback)
    prepare_lib.main(args + ["--verbose"])
  assert not isinstance(e.value, SystemExit)
  assert not (tmp_path / "c").exists() or not list((tmp_path / "c").rglob("*.array_record"))


def test_malformed_tokenizer_json_names_the_file_in_the_main_cli_path(tmp_path):
  bad = tmp_path / "tokenizer.json"
  bad.write_text("{ not json")
  with pytest.raises(ValueError, match=f"{bad} is not a readable tokenizer.json"):
    data_lib.get_tokenizer(f"hf:{bad}")


@pytest.mark.subprocess
@pytest.mark.slow
def test_lmeval_cli_error_is_one_line():
  pytest.importorskip("lm_eval")
  base = [sys.executable, "-m", "aogpt_jax.evaluation.lmeval", "--model", "aogpt",
          "--tasks", "lambada_openai"]
  kw = dict(cwd=REPO, env=dict(cpu_env(), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1"),
            capture_output=True, text=True, timeout=300)
  p = subprocess.run(base + ["--model_args", "which=ema"], **kw)
  last = p.stderr.strip().splitlines()[-1]
  assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
  assert last.startswith("aogpt_jax.evaluation.lmeval: ValueError: aogpt model_args: "
                         "checkpoint=SPEC is required"), last


def test_convert_refuses_a_non_empty_output_folder(tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  (out / "config.json").write_text("{}")
  for argv in (["export", "--workdir", str(tmp_path / "run"), "--out", str(out)],
               ["import", "--ckpt", str(tmp_path / "x.pt"), "--out", str(tmp_path),
                "--which", "out"]):
    with pytest.raises(SystemExit) as e:
      convert.main(argv)
    assert "is not empty" in str(e.value.code) and "\n" not in str(e.value.code)
  assert (out / "config.json").read_text() == "{}"


# ------------------------------------------------------------------ accepted bad values, no training


@pytest.mark.parametrize("key,value,want", [
    ("optimizer.lr", float("nan"), "optimizer.lr: must be a finite number"),
    ("data.validation_fraction", -0.5, "data.validation_fraction: must be a number in"),
])
def test_bad_values_are_refused_before_anything_runs(tmp_path, key, value, want):
  cfg = tiny_config(tmp_path, **{key.replace(".", "__"): value})
  with pytest.raises(ConfigError, match=want):
    config_lib.resolve(cfg)


def test_eval_settings_bound_ensembles_and_check_order_kwargs_values():
  with pytest.raises(ValueError, match=r"eval.ensemble_max_m must be in \[0, 1024\]"):
    evaluation.EvalSettings(ensemble_max_m=100000)
  with pytest.raises(ValueError, match="eval.order / eval.order_kwargs: TypeError"):
    evaluation.EvalSettings(order="blockwise", order_kwargs={"block": "x"})


@pytest.mark.parametrize("name", ["../config", "sub/dir/x", "..", ".hidden", ""])
def test_output_names_stay_in_their_folder(name):
  with pytest.raises(ConfigError, match="eval.name: .* is not a plain file name"):
    workdir_lib.check_name(name, "eval.name")


def test_fresh_stem_never_reuses_a_name(tmp_path):
  assert workdir_lib.fresh_stem(tmp_path, "r", (".json", ".md")) == "r"
  (tmp_path / "r.md").write_text("")
  (tmp_path / "r-2.json").write_text("")
  assert workdir_lib.fresh_stem(tmp_path, "r", (".json", ".md")) == "r-3"


def test_edited_text_files_corpus_gets_a_new_cache_key(tmp_path):
  f = tmp_path / "corpus" / "a.txt"
  f.parent.mkdir()
  f.write_text("first version\n")
  cfg = data_config.resolve({}, source="text_files", glob=str(tmp_path / "corpus" / "*.txt"),
                         cache_dir=str(tmp_path / "c"))
  before = records.split_dir(cfg, "train", 16)
  assert records.split_dir(cfg, "train", 16) == before          # stable while unchanged
  f.write_text("second version, longer\n")
  assert records.split_dir(cfg, "train", 16) != before          # edited: prepared again
  (tmp_path / "corpus" / "b.txt").write_text("new file\n")
  assert len({before, records.split_dir(cfg, "train", 16)}) == 2


# ------------------------------------------------------------------ trainer mechanisms, no training


class _FakeManager:
  def reload(self):
    pass


def test_set_aside_works_across_file_systems(tmp_path, monkeypatch):
  """os.replace across devices raises EXDEV (checkpoints/ a symlink to another file system):
  the step is moved with shutil.move instead of failing every resume."""
  ck = tmp_path / "checkpoints"
  (ck / "4" / "params").mkdir(parents=True)
  (ck / "4" / "params" / "x").write_text("data")
  fake = type("C", (), {})()
  fake.directory, fake.workdir, fake.manager = ck, tmp_path, _FakeManager()
  real = os.replace

  def cross_device(src, dst, *a, **k):
    if "checkpoints_corrupt" in str(dst):
      raise OSError(errno.EXDEV, "Invalid cross-device link")
    return real(src, dst, *a, **k)
  monkeypatch.setattr(os, "replace", cross_device)
  checkpoint_lib.Checkpointer._set_aside(fake, 4)
  moved = list((tmp_path / "checkpoints_corrupt").iterdir())
  assert not (ck / "4").exists() and len(moved) == 1
  assert (moved[0] / "params" / "x").read_text() == "data"


_PARENT = """
import multiprocessing as mp, sys, time
from aogpt_jax.data import config as data_config
from aogpt_jax.data import pipeline

def worker():
  pipeline.die_with_parent(0, 1, poll=0.1)
  time.sleep(600)

if __name__ == "__main__":
  mp.set_start_method("spawn")
  p = mp.Process(target=worker)
  p.start()
  print(p.pid, flush=True)
  time.sleep(600)
"""


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split()[2] != "Z"
  except FileNotFoundError:
    return False


@pytest.mark.subprocess
@pytest.mark.slow
def test_data_worker_dies_with_a_killed_trainer(tmp_path):
  """kill -9 of the process that started a worker (grain's worker_init_fn is die_with_parent):
  the worker exits within a second instead of living on under PID 1."""
  script = tmp_path / "parent.py"
  script.write_text(_PARENT)
  parent = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=cpu_env(),
                            stdout=subprocess.PIPE, text=True)
  child = int(parent.stdout.readline())
  try:
    time.sleep(1.0)
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 120   # the worker may still be importing
    while _alive(child) and time.time() < deadline:
      time.sleep(0.1)
    assert not _alive(child), "the worker outlived its parent"
  finally:
    if _alive(child):
      os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_train_iterator_workers_get_the_parent_watch(cache_dir, monkeypatch):
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  cfg = tiny_config(cache_dir, data__worker_count=1)
  seen = {}

  def mp_prefetch(self, options=None, worker_init_fn=None, **k):
    seen["init"] = worker_init_fn
    return self
  monkeypatch.setattr(pipeline.grain.IterDataset, "mp_prefetch", mp_prefetch)
  pipeline.train_iterator(cfg.data, seq_len=16, global_batch_size=8, seed=0)
  assert seen["init"] is pipeline.die_with_parent


# ------------------------------------------------------------------ on a trained tiny run

RUN = dict(total_steps=4, checkpoint_every=2, log_every=2, eval_every=0)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("cache")
  cfg = tiny_config(d)
  for split in ("train", "validation"):
    data_lib.token_stream(cfg.data, split)
  return d


@pytest.fixture(scope="module")
def trained(cache_dir, tmp_path_factory):
  work = tmp_path_factory.mktemp("trained")
  train_loop.train(tiny_config(cache_dir, **RUN), str(work))
  assert checkpoint_steps(work) == [2, 4]
  return work


def _eval_cfg(cache_dir, **kw):
  return tiny_config(cache_dir, eval__max_blocks=8, eval__batch_size=8, **kw)


@pytest.mark.slow
def test_refused_resume_leaves_config_json_alone(cache_dir, trained, tmp_path):
  work = _copy(trained, tmp_path)
  before = (work / "config.json").read_bytes()
  with pytest.raises(ConfigError, match="total_steps: 2 is below the newest checkpoint's step 4"):
    train_loop.train(tiny_config(cache_dir, **dict(RUN, total_steps=2)), str(work))
  assert (work / "config.json").read_bytes() == before


@pytest.mark.slow
def test_metrics_of_a_run_killed_before_its_first_save_are_dropped(cache_dir, tmp_path,
                                                                   monkeypatch):
  """Nothing restored (killed during the first save): the rerun truncates the old lines, so
  every step appears once. The rerun's held-out eval runs for minutes (issue 51: a held-out
  search) and gets SIGTERM: the eval ends at once, the checkpoint is saved, the run stops."""
  def endless_eval(*args):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(120)
    raise AssertionError("the stop signal did not end the held-out eval")
  monkeypatch.setattr(train_loop, "heldout_eval", endless_eval)
  work = tmp_path / "work"
  work.mkdir()
  (work / "metrics.jsonl").write_text('{"step": 2, "train/loss": 9.0}\n')
  train_loop.train(tiny_config(cache_dir, **dict(RUN, total_steps=2)), str(work))
  lines = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
  assert lines and all(x["step"] == 2 for x in lines)
  assert not [x for x in lines if x.get("train/loss") == 9.0], "the killed run's line stayed"
  assert sum("train/loss" in x for x in lines) == 1
  assert checkpoint_steps(work) == [2] and not any("eval/loss_l2r" in x for x in lines)


@pytest.mark.slow
def test_failed_save_is_one_error_naming_step_and_folder(cache_dir, trained, tmp_path,
                                                         monkeypatch):
  work = _copy(trained, tmp_path)

  def full(self, *a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(checkpoint_lib.ocp.CheckpointManager, "save", full)
  with pytest.raises(checkpoint_lib.CheckpointSaveError,
                     match=rf"checkpoint: saving step 6 to {work}/checkpoints failed \(No space "
                           rf"left on device\).*\(4 is the newest"):
    train_loop.train(tiny_config(cache_dir, **dict(RUN, total_steps=6, checkpoint_every=6)),
                     str(work))


@pytest.mark.slow
def test_eval_reruns_never_overwrite_and_record_provenance(cache_dir, trained, tmp_path):
  work = _copy(trained, tmp_path)
  first = modes.eval_mode(_eval_cfg(cache_dir), str(work))
  old = (work / "eval" / "zero_shot.json").read_text()
  second = modes.eval_mode(_eval_cfg(cache_dir), str(work))
  assert first["files"][0].endswith("eval/zero_shot.json")
  assert second["files"][0].endswith("eval/zero_shot-2.json")
  assert (work / "eval" / "zero_shot.json").read_text() == old
  saved = json.loads(pathlib.Path(second["files"][0]).read_text())
  meta = saved["meta"]
  assert saved["complete"] is True
  assert meta["step"] == 4 and meta["weights"] == "ema" and meta["checkpoint"].endswith("/4")
  assert meta["data"]["source"] == "python_stdlib" and meta["data"]["split"] == "validation"
  assert meta["data"]["tokenizer"] == "byte" and meta["data"]["seq_len"] == 16
  assert meta["data"]["datasets"] == {"heldout": "validation"}


@pytest.mark.slow
def test_eval_refusals_come_first_and_create_nothing(cache_dir, trained, tmp_path):
  work = _copy(trained, tmp_path)
  config_json = (work / "config.json").read_text()
  cases = {
      "eval.name: '../config' is not a plain file name": dict(eval__name="../config"),
      "eval.split: held-out evaluation must not use the training split":
          dict(eval__split="train"),
      "eval.max_blocks: must be an integer >= 0": dict(eval__max_blocks=-1),
      "eval.batch_size: must be an integer >= 0": dict(eval__batch_size=-4),
      "seq_len: must be >= 2": dict(seq_len=1),
      "data.source: the run in .* has data.source='python_stdlib' but this eval asks "
      "'text_files'": dict(data__source="text_files", data__glob="/x/*.txt"),
      "seq_len: the run in .* has seq_len=16": dict(seq_len=8),
  }
  for want, kw in cases.items():
    cfg = tiny_config(cache_dir, **{"eval__max_blocks": 8, "eval__batch_size": 8, **kw})
    with pytest.raises(ConfigError, match=want):
      modes.eval_mode(cfg, str(work))
  assert (work / "config.json").read_text() == config_json
  assert not (work / "eval").exists() or not list((work / "eval").iterdir())
  with pytest.raises(FileNotFoundError, match="no run in"):
    modes.eval_mode(_eval_cfg(cache_dir), str(tmp_path / "nope"))
  assert not (tmp_path / "nope").exists()
  with pytest.raises(ConfigError, match="sample.name: 'sub/dir/x' is not a plain file name"):
    modes.sample_mode(tiny_config(cache_dir, sample__name="sub/dir/x"), str(work))
  with pytest.raises(ConfigError, match="genppl.name: '../x' is not a plain file name"):
    modes.genppl_mode(tiny_config(cache_dir, genppl__name="../x"), str(work))
  assert not (work / "samples").exists() or not list((work / "samples").iterdir())
  # eval.data=config: this config's data, recorded as such (here: a shorter sequence)
  out = modes.eval_mode(_eval_cfg(cache_dir, seq_len=8, eval__data="config"), str(work))
  assert out["meta"]["data"]["seq_len"] == 8 and out["meta"]["data"]["eval.data"] == "config"


@pytest.mark.slow
def test_broken_config_json_is_one_line_naming_the_file(cache_dir, trained, tmp_path):
  work = _copy(trained, tmp_path)
  path = work / "config.json"
  full = path.read_text()
  path.write_text(full[:len(full) // 2])
  with pytest.raises(ConfigError, match=f"{path} is not valid JSON"):
    modes.eval_mode(_eval_cfg(cache_dir), str(work))
  path.write_text(json.dumps({"seed": 0}))
  with pytest.raises(ConfigError, match=f"{path} has no 'model' entry"):
    modes.sample_mode(tiny_config(cache_dir), str(work))


@pytest.mark.slow
def test_interrupted_eval_keeps_the_finished_datasets(cache_dir, trained, tmp_path):
  work = _copy(trained, tmp_path)
  m, _ = checkpoint_lib.load_model(work)
  cfg = _eval_cfg(cache_dir)

  def heldout():
    return data_lib.eval_batches(cfg.data, split="validation", seq_len=16, global_batch_size=8,
                                 max_blocks=8)

  def interrupted():
    raise KeyboardInterrupt
    yield  # pylint: disable=unreachable

  with pytest.raises(KeyboardInterrupt):
    evaluation.evaluate(m, {"first": heldout, "second": interrupted}, workdir=str(work),
                        name="partial")
  saved = json.loads((work / "eval" / "partial.json").read_text())
  assert list(saved["datasets"]) == ["first"] and saved["complete"] is False
  assert saved["datasets"]["first"]["l2r"]["tokens"] > 0


@pytest.mark.slow
def test_flat_folder_asked_for_other_weights_warns_and_records_them(tmp_path, caplog):
  from flax import nnx
  from aogpt_jax.checkpoints import spec as checkpoint_spec
  from aogpt_jax.model import aogpt as model_lib
  m = model_lib.AOGPT(model_lib.preset("tiny", n_layer=1, n_embd=32, n_head=2, target_dim=8,
                                       block_size=16, vocab_size=264, valid_vocab_size=257),
                      rngs=nnx.Rngs(0))
  folder = str(tmp_path / "flat")
  convert.export_safetensors(m, folder, meta={"which": "params", "iter_num": 3})
  caplog.set_level("WARNING")
  _, _, prov = checkpoint_spec.load(folder, "ema")
  assert prov["weights"] == "params"
  assert "holds the params weights only, not ema as asked" in caplog.text


@pytest.mark.slow
def test_garbage_genppl_scorer_is_one_line_naming_the_key(cache_dir, trained, tmp_path):
  work = _copy(trained, tmp_path)
  scorer = tmp_path / "scorer"
  scorer.mkdir()
  (scorer / "config.json").write_text(json.dumps({"n_embd": 8}))
  (scorer / "model.safetensors").write_bytes(b"\x00garbage" * 10)
  with pytest.raises(ConfigError, match=r"^genppl.scorer: .*scorer"):
    modes.genppl_mode(tiny_config(cache_dir, genppl__scorer=str(scorer)), str(work))
  assert not (work / "samples").exists() or not list((work / "samples").iterdir())
