"""`write_samples` (the --mode=sample entry): files, prompts from text, config errors."""

import json
import os

import pytest

from aogpt_jax.sampling import sampler
from aogpt_jax.sampling import config as sample_config_lib
from aogpt_jax.sampling import write as sample_write
from aogpt_jax.data import get_tokenizer
from helpers.sampler import tiny_model


@pytest.fixture(scope="module")
def model():
  return tiny_model(vocab=320, valid=257, block=24)


def _cfg(**kw):
  c = sample_config_lib.sample_config()
  c.update(dict(num_samples=5, batch_size=2, length=16, steps=4), **kw)
  return c


@pytest.mark.slow
def test_write_samples_with_prompt_and_suffix(model, tmp_path):
  tok = get_tokenizer("byte")
  c = _cfg(prompt="Hi", suffix="!", order="random", top_p=0.9, temperature=0.8)
  compiled_before = sampler.sampler_program._cache_size()
  path = sample_write.write_samples(model, c, str(tmp_path), tok, step=7)
  assert sampler.sampler_program._cache_size() == compiled_before + 1   # 3 batches, one compile
  lines = [json.loads(l) for l in open(path)]
  assert [l["index"] for l in lines] == list(range(5))
  for l in lines:
    assert len(l["tokens"]) == 16 and max(l["tokens"]) < 257
    assert l["tokens"][:2] == [72, 105] and l["tokens"][-1] == 33
    assert l["text"] == tok.decode(l["tokens"])
    assert sorted(l["order"]) == list(range(16)) and l["order"][:3] == [0, 1, 15]
  meta = json.load(open(path[:-len(".jsonl")] + ".json"))
  assert meta["settings"]["steps"] == 4 and meta["checkpoint_step"] == 7
  assert meta["config"]["prompt"] == "Hi" and meta["plan"]["scan_steps"] == 4
  # the same config gives the same samples; the whole group or the full config both work
  full = sample_config_lib.sample_config()
  outer = type(full)({"sample": c})
  again = [json.loads(l) for l in open(sample_write.write_samples(model, outer, str(tmp_path), tok))]
  assert [l["tokens"] for l in again] == [l["tokens"] for l in lines]


def test_ar_mode_writes_samples(model, tmp_path):
  c = _cfg(method="ar", prompt="ab", name="ar_run")
  path = sample_write.write_samples(model, c, str(tmp_path), get_tokenizer("byte"))
  assert os.path.basename(path) == "ar_run.jsonl"
  assert all(json.loads(l)["tokens"][:2] == [97, 98] for l in open(path))


@pytest.mark.parametrize("change,match", [
    (dict(steps=0), "sample.steps"), (dict(steps=17), "sample.steps"),
    (dict(top_p=0.0), "sample.top_p"), (dict(temperature=-1.0), "sample.temperature"),
    (dict(num_samples=0), "sample.num_samples"), (dict(length=25), "sample.length"),
    (dict(prompt_pairs="99:1"), "position 99 is out of range"),
    (dict(prompt_pairs="3:300"), "token 300 is outside the vocabulary"),
    (dict(prompt_pairs="3:1,3:2"), "position 3 is given more than once"),
    (dict(prompt="Hi", prompt_pairs="1:5"), "position 1 is given more than once"),
    (dict(prompt_pairs="x"), "position:token_id"),
    (dict(prompt="a" * 10, suffix="b" * 7), "exceed sample.length"),
    (dict(method="ar", suffix="z"), "prefix prompts only")])
def test_config_errors_before_compiling(model, tmp_path, monkeypatch, change, match):
  def no_run(*a, **k):
    raise AssertionError("compiled before validating")
  monkeypatch.setattr(sampler, "sample_batch", no_run)
  with pytest.raises(ValueError, match=match):
    sample_write.write_samples(model, _cfg(**change), str(tmp_path), get_tokenizer("byte"))


def test_default_length_is_the_trained_sequence_length(model):
  """sample.length=0 samples the length the run trained on (its seq_len), not block_size: the
  positions past it were never trained; without a run config, block_size."""
  c = _cfg(length=0)
  assert sample_config_lib.settings_from_config(c, model.cfg, 12).length == 12
  assert sample_config_lib.settings_from_config(c, model.cfg).length == 24
  assert sample_config_lib.settings_from_config(c, model.cfg, 99).length == 24   # at most
  assert sample_config_lib.settings_from_config(_cfg(length=20), model.cfg, 12).length == 20


def test_a_failed_sample_leaves_no_samples_folder(model, tmp_path, monkeypatch):
  def boom(*a, **k):
    raise RuntimeError("sampler failed")
  monkeypatch.setattr(sample_write, "sample_batch", boom)
  with pytest.raises(RuntimeError):
    sample_write.write_samples(model, _cfg(), str(tmp_path / "run"), get_tokenizer("byte"))
  assert not (tmp_path / "run").exists()
  with pytest.raises(ValueError, match="sample.steps"):      # a bad setting: no folder either
    sample_write.write_samples(model, _cfg(steps=0), str(tmp_path), get_tokenizer("byte"))
  assert not (tmp_path / "samples").exists()
