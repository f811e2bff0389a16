"""--checkpoint=SPEC: published .pt (converted and cached), converted folders, hf: errors."""

import os

import numpy as np
import pytest

from aogpt_jax.checkpoints import spec as checkpoint_spec
from aogpt_jax.checkpoints import convert

pytest.importorskip("torch", reason="needs torch (pip install -r requirements-extra.txt)")
from helpers.torch_published import checkpoint as _checkpoint  # noqa: E402

pytestmark = pytest.mark.torch


def _flat(m):
  return convert.model_to_flat(m)


def test_pt_is_converted_cached_and_matches_convert(tmp_path):
  _, _, path = _checkpoint("aogpt", tmp_path)
  m, cfg, prov = checkpoint_spec.load(path, "ema")
  ref, _ = convert.convert_checkpoint(convert.read_torch_checkpoint(path), "ema")
  for k, v in _flat(ref).items():
    np.testing.assert_array_equal(_flat(m)[k], v)
  assert prov == {"source": path, "step": 7, "weights": "ema"}
  cache = path + ".aogpt_jax/ema"
  assert os.path.exists(os.path.join(cache, "model.safetensors"))
  # second load reads the cache (the .pt is not read: make it unreadable as a pickle)
  st = os.stat(path)
  m2, cfg2, prov2 = checkpoint_spec.load(path, "ema")
  assert cfg2 == cfg and prov2["step"] == 7
  for k, v in _flat(ref).items():
    np.testing.assert_array_equal(_flat(m2)[k], v)
  # a changed .pt invalidates the cache
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
  _, _, p3 = checkpoint_spec.load(path, "params")
  assert p3["weights"] == "params"
  assert os.path.exists(path + ".aogpt_jax/params/model.safetensors")


def test_converted_folder_and_import_layout(tmp_path):
  _, _, path = _checkpoint("sigma_gpt", tmp_path)
  convert.main(["import", "--ckpt", path, "--out", str(tmp_path / "conv")])
  m, cfg, prov = checkpoint_spec.load(str(tmp_path / "conv"), "params")
  ref, _ = convert.convert_checkpoint(convert.read_torch_checkpoint(path), "params")
  for k, v in _flat(ref).items():
    np.testing.assert_array_equal(_flat(m)[k], v)
  assert prov["weights"] == "params" and prov["step"] == 7


def test_errors_name_the_spec(tmp_path):
  bad = tmp_path / "garbage.pt"
  bad.write_bytes(b"not a checkpoint at all")
  with pytest.raises(checkpoint_spec.CheckpointSpecError, match="garbage.pt.*not a readable"):
    checkpoint_spec.load(str(bad))
  _, _, path = _checkpoint("aogpt", tmp_path)
  trunc = tmp_path / "trunc.pt"
  trunc.write_bytes(open(path, "rb").read()[:2000])
  with pytest.raises(checkpoint_spec.CheckpointSpecError, match="trunc.pt"):
    checkpoint_spec.load(str(trunc))
  with pytest.raises(checkpoint_spec.CheckpointSpecError, match="no such file"):
    checkpoint_spec.load(str(tmp_path / "missing.pt"))
  with pytest.raises(checkpoint_spec.CheckpointSpecError, match="hf:OWNER/REPO"):
    checkpoint_spec.load("hf:justone")


def test_hf_offline_error_names_the_route(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
  monkeypatch.delenv("HF_HUB_CACHE", raising=False)
  with pytest.raises(checkpoint_spec.CheckpointSpecError,
                     match="repository someone/aogpt .* not in the Hugging Face cache .*"
                           "hf download someone/aogpt ckpt.pt"):
    checkpoint_spec.load("hf:someone/aogpt/ckpt.pt")


def test_vocab_mismatch_names_both_values(tmp_path):
  _, _, path = _checkpoint("aogpt", tmp_path)
  _, cfg, _ = checkpoint_spec.load(path, "params")
  with pytest.raises(checkpoint_spec.CheckpointSpecError,
                     match=f"50257 ids.*valid_vocab_size={cfg.valid_vocab_size}"):
    checkpoint_spec.check_vocab(cfg, "gpt2", 50257)


def test_aogpt_jax_load_takes_every_spec(tmp_path):
  """`aogpt_jax.load`: a published .pt, a converted folder and an hf: local folder give the
  weights `checkpoint_spec.load` gives, with a run config that names the model and provenance
  (workdirs: tests/test_fixture_workdir.py)."""
  import aogpt_jax  # pylint: disable=g-import-not-at-top
  _, _, path = _checkpoint("aogpt", tmp_path)
  convert.main(["import", "--ckpt", path, "--out", str(tmp_path / "conv")])
  for spec in (path, str(tmp_path / "conv"), f"hf:{tmp_path / 'conv'}"):
    m, cfg = aogpt_jax.load(spec, which="params")
    ref, _, prov = checkpoint_spec.load(spec, "params")
    for k, v in _flat(ref).items():
      np.testing.assert_array_equal(_flat(m)[k], v)
    assert cfg.loaded.to_dict() == prov and cfg.loaded.source == spec
    assert cfg.model.n_embd == m.cfg.n_embd and cfg.model.n_layer == m.cfg.n_layer
    assert cfg.seq_len == m.cfg.block_size
  with pytest.raises(checkpoint_spec.CheckpointSpecError, match="no such file"):
    aogpt_jax.load(str(tmp_path / "nothing"))
