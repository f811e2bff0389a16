"""A new user's first hour: defaults that fit, outputs that show themselves, numbers that are
right (sample.steps defaults to the length; --mode=sample and --mode=eval print what they wrote;
the eval cost line names the blocks' own length; one-line usage errors; no warning about a
choice nobody made)."""

import json
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from aogpt_jax import evaluation, modes
from aogpt_jax.data import get_tokenizer
from aogpt_jax.sampling import config as sample_config_lib
from aogpt_jax.sampling import sampler
from aogpt_jax.sampling import write as sample_write
from helpers import trainer as tu
from helpers.sampler import tiny_model

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "workdir_v0_1"
# The overrides the fixture workdir was trained with (tests/test_fixture_workdir.py).
RUN = {"seq_len": 16, "total_steps": 4, "checkpoint_every": 4, "log_every": 2,
       "optimizer.warmup_steps": 1, "eval.batch_size": 8, "model.rope": False}


@pytest.fixture(scope="module")
def model():
  return tiny_model(vocab=320, valid=257, block=24)


# ----------------------------------------------------------------------------- sample.steps


def test_sample_settings_steps_default_to_the_length(model):
  s = sampler.SampleSettings(length=20)          # more than the old default's 64 would allow
  assert s.steps is None and s.num_steps == 20
  s.validate(model.cfg)
  out = sampler.generate(model, jax.random.key(0), s, batch=2)
  same = sampler.generate(model, jax.random.key(0), sampler.SampleSettings(length=20, steps=20),
                          batch=2)
  np.testing.assert_array_equal(out.tokens, same.tokens)
  assert sampler.SampleSettings(length=20, steps=4).num_steps == 4     # explicit: as given
  with pytest.raises(ValueError, match=r"sample.steps: must be in \[1, length=20\], got 21"):
    sampler.SampleSettings(length=20, steps=21).validate(model.cfg)


def test_sample_group_steps_unset_is_the_length(model, tmp_path):
  c = sample_config_lib.sample_config()
  assert c.steps is None
  assert sample_config_lib.settings_from_config(c, model.cfg, trained_length=16).num_steps == 16
  c.steps = 8                                                       # --config.sample.steps=8
  assert sample_config_lib.settings_from_config(c, model.cfg, trained_length=16).steps == 8
  c.update(dict(steps=None, num_samples=2, batch_size=2, length=12))
  path = sample_write.write_samples(model, c, str(tmp_path), get_tokenizer("byte"))
  assert "_T12_" in pathlib.Path(path).name
  assert json.loads(pathlib.Path(path).with_suffix(".json").read_text())["settings"]["steps"] == 12


# ----------------------------------------------------------------------------- eval cost line


def test_eval_cost_line_names_the_blocks_length(model, caplog):
  tokens = np.random.default_rng(0).integers(0, 257, (4, 8)).astype(np.int32)
  batches = [{"tokens": tokens, "weight": np.ones(4, np.float32)}]
  s = evaluation.EvalSettings(ensemble_max_m=2)
  caplog.set_level("INFO")
  evaluation.evaluate(model, {"toy": batches}, s)
  cost = evaluation.zero_shot.cost_per_block(s, 8)
  assert f"about {cost:,.0f} full forwards per block of 8 tokens" in caplog.text, caplog.text
  assert "block of 24 tokens" not in caplog.text                     # not model.block_size


# ----------------------------------------------------------------------------- the modes print


@pytest.fixture()
def workdir(tmp_path):
  w = tmp_path / "w"
  shutil.copytree(FIXTURE, w)
  return w


def _cfg(tmp_path):
  return tu.tiny_config(tmp_path / "cache", **{k.replace(".", "__"): v for k, v in RUN.items()})


@pytest.mark.slow
def test_sample_mode_prints_the_first_samples_and_order(workdir, tmp_path, capsys):
  cfg = _cfg(tmp_path)
  cfg.sample.update(dict(num_samples=6, batch_size=6, length=16))
  path = modes.sample_mode(cfg, str(workdir))
  rows = [json.loads(x) for x in pathlib.Path(path).read_text().splitlines()]
  out = capsys.readouterr().out.splitlines()
  assert out[0] == f"samples written to {path}; the first {modes.SHOWN_SAMPLES}:"
  assert out[1:1 + modes.SHOWN_SAMPLES] == [repr(r["text"]) for r in rows[:modes.SHOWN_SAMPLES]]
  assert out[1 + modes.SHOWN_SAMPLES] == f"order: {rows[0]['order']}"


@pytest.mark.slow
def test_eval_mode_prints_its_table(workdir, tmp_path, capsys):
  cfg = _cfg(tmp_path)
  cfg.eval.update(dict(max_blocks=8, datasets="heldout"))
  res = modes.eval_mode(cfg, str(workdir))
  out = capsys.readouterr().out
  table = pathlib.Path(res["files"][1]).read_text().strip()
  assert table.startswith("| Method") and table in out


# ----------------------------------------------------------------------------- warnings, usage


def test_converted_folder_warns_only_when_ema_was_asked(tmp_path, caplog):
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from aogpt_jax.checkpoints import convert  # pylint: disable=g-import-not-at-top
  from aogpt_jax.checkpoints import spec as checkpoint_spec  # pylint: disable=g-import-not-at-top
  from aogpt_jax.model import aogpt as model_lib  # pylint: disable=g-import-not-at-top
  m = model_lib.AOGPT(model_lib.preset("tiny", n_layer=1, n_embd=32, n_head=2, target_dim=8,
                                       block_size=16, vocab_size=264, valid_vocab_size=257),
                      rngs=nnx.Rngs(0))
  folder = str(tmp_path / "flat")
  convert.export_safetensors(m, folder, meta={"which": "gpt2", "iter_num": None})
  caplog.set_level("WARNING")
  _, _, prov = checkpoint_spec.load(folder)                # nothing asked: no warning
  assert prov["weights"] == "gpt2" and "as asked" not in caplog.text
  cfg = tu.tiny_config(tmp_path / "cache")
  assert cfg.eval.which == "" and cfg.sample.which == ""   # the config asks nothing either
  checkpoint_spec.load(folder, "ema")                      # asked explicitly: said
  assert "holds the gpt2 weights only, not ema as asked" in caplog.text


@pytest.mark.subprocess
@pytest.mark.parametrize("missing,argv", [
    ("--workdir", ["--config=configs/quickstart.py", "--mode=sample"]),
    ("--config", ["--workdir=/tmp/nowhere", "--mode=sample"])])
def test_a_missing_flag_is_one_line(missing, argv):
  p = subprocess.run([sys.executable, "-m", "aogpt_jax.main", *argv], cwd=tu.REPO,
                     env=tu.cpu_env(), capture_output=True, text=True, timeout=120)
  assert p.returncode == 1
  (line,) = p.stderr.strip().splitlines()
  assert line.startswith(f"aogpt_jax: {missing} is required (e.g. {missing}="), line
