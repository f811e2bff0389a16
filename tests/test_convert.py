"""Checkpoint import/export: published PyTorch AO-GPT and sigma-GPT layouts, against the PyTorch
mirror of the published architecture in helpers/torch_published.py."""

import math

import numpy as np
import pytest

from aogpt_jax.checkpoints import convert

torch = pytest.importorskip("torch", reason="needs torch (pip install -r requirements-extra.txt)")

pytestmark = pytest.mark.torch

from helpers.torch_published import H, L, N, V, checkpoint as _checkpoint  # noqa: E402

@pytest.mark.parametrize("variant", ["aogpt", "sigma_gpt"])
def test_converted_logits_match_torch(variant, tmp_path):
  tm, shadow, path = _checkpoint(variant, tmp_path)
  ck = convert.read_torch_checkpoint(path)
  rng = np.random.default_rng(0)
  x = rng.integers(0, V, (3, N))
  order = np.stack([rng.permutation(N) for _ in range(3)])
  order[0] = np.arange(N)
  for which in ("params", "ema"):
    m, cfg = convert.convert_checkpoint(ck, which)
    assert cfg.target == ("adaln" if variant == "aogpt" else "sigma_gpt")
    assert (cfg.n_head, cfg.n_layer, cfg.block_size, cfg.valid_vocab_size) == (H, L, N, V)
    if which == "ema":
      with torch.no_grad():
        for p, s in zip(tm.parameters(), shadow):
          p.copy_(s)
    want = tm(torch.tensor(x), torch.tensor(order)).detach().numpy()
    got = np.asarray(m(x, order))
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("variant", ["aogpt", "sigma_gpt"])
def test_state_dict_round_trip_uses_every_tensor_once(variant, tmp_path):
  tm, _, path = _checkpoint(variant, tmp_path)
  ck = convert.read_torch_checkpoint(path)
  sd = ck["model"]
  m, cfg = convert.convert_checkpoint(ck, "params")
  back = convert.flat_to_state_dict(convert.model_to_flat(m), variant, cfg)
  assert sorted(back) == sorted(sd)
  for k in sd:
    np.testing.assert_array_equal(back[k], sd[k], err_msg=k)
  names = [src for src, _, _ in convert.published_names(variant, L, True)]
  assert names == [n for n, _ in tm.named_parameters()]      # the EMA shadow order
  assert len(set(dst for _, dst, _ in convert.published_names(variant, L, True))) == len(names)
  extra = dict(sd, **{"transformer.h.0.extra.weight": np.zeros(3)})
  with pytest.raises(ValueError, match="not used"):
    convert.state_dict_to_flat(extra, variant, cfg)
  missing = {k: v for k, v in sd.items() if k != names[5]}
  with pytest.raises(ValueError, match="has no"):
    convert.state_dict_to_flat(missing, variant, cfg)


def test_ema_in_wrong_order_is_refused(tmp_path):
  _, shadow, path = _checkpoint("aogpt", tmp_path)
  ck = convert.read_torch_checkpoint(path)
  sh = list(ck["ema_model"]["shadow_params"])
  sh[0], sh[1] = sh[1], sh[0]                                  # wte <-> wpe: shapes differ
  ck["ema_model"] = dict(ck["ema_model"], shadow_params=sh)
  with pytest.raises(ValueError, match=r"shadow_params\[0\].*parameters\(\) order"):
    convert.convert_checkpoint(ck, "ema")
  ck["ema_model"] = dict(ck["ema_model"], shadow_params=sh[:-1])
  with pytest.raises(ValueError, match="has 36 tensors.*has 37 parameters"):
    convert.convert_checkpoint(ck, "ema")


@pytest.mark.parametrize("layout", ["aogpt_jax", "published"])
def test_export_and_cli(layout, tmp_path):
  _, _, path = _checkpoint("aogpt", tmp_path)
  convert.main(["import", "--ckpt", path, "--out", str(tmp_path / "conv")])
  m, cfg = convert.load_safetensors(str(tmp_path / "conv" / "ema"))
  convert.export_safetensors(m, str(tmp_path / "exp"), layout=layout)
  m2, cfg2 = convert.load_safetensors(str(tmp_path / "exp"))
  assert cfg2 == cfg
  a, b = convert.model_to_flat(m), convert.model_to_flat(m2)
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  live, _ = convert.load_safetensors(str(tmp_path / "conv" / "params"))
  assert not np.array_equal(convert.model_to_flat(live)["wte.embedding"], a["wte.embedding"])


def test_errors_name_the_problem(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    convert.read_torch_checkpoint(str(tmp_path / "nope.pt"))
  with pytest.raises(FileNotFoundError, match="config.json"):
    convert.load_safetensors(str(tmp_path))
  with pytest.raises(ValueError, match="neither AO-GPT"):
    convert.detect_variant({"foo": 1})
  _, _, path = _checkpoint("sigma_gpt", tmp_path)
  ck = convert.read_torch_checkpoint(path)
  ck.pop("model_args")
  with pytest.raises(ValueError, match="--n_head"):
    convert.convert_checkpoint(ck, "params")
  m, _ = convert.convert_checkpoint(ck, "live", n_head=H)   # "live" = "params"
  with pytest.raises(ValueError, match="cannot be written in the published aogpt layout"):
    convert.export_safetensors(m, str(tmp_path / "x"), layout="published", variant="aogpt")
  assert math.isfinite(float(np.asarray(m(np.zeros((1, N), int), np.arange(N)[None])).max()))


def test_conflicting_overrides_and_variants_are_named(tmp_path):
  import json
  _, _, path = _checkpoint("sigma_gpt", tmp_path)
  ck = convert.read_torch_checkpoint(path)
  with pytest.raises(ValueError, match=r"--n_head=2 conflicts with the checkpoint \(model_args "
                                       r"give n_head=4\)"):
    convert.convert_checkpoint(ck, "params", n_head=2)
  with pytest.raises(ValueError, match=r"--mlp_ratio=2 conflicts .*tensor shapes give mlp_ratio=4"):
    convert.convert_checkpoint(ck, "params", mlp_ratio=2)
  convert.main(["import", "--ckpt", path, "--out", str(tmp_path / "conv"), "--which", "params"])
  meta = json.loads((tmp_path / "conv" / "params" / "config.json").read_text())
  assert meta["variant"] == "sigma_gpt" and meta["model"]["target"] == "sigma_gpt"
  _, _, apath = _checkpoint("aogpt", tmp_path)
  with pytest.raises(ValueError, match=r"--n_head=2 conflicts .*n_head=4"):
    convert.convert_checkpoint(convert.read_torch_checkpoint(apath), "params", n_head=2)


def test_published_export_refuses_what_the_published_code_cannot_load(tmp_path):
  from flax import nnx
  from aogpt_jax.model import aogpt as model_lib
  for bad in (dict(target_dim=64), dict(mlp_ratio=2), dict(rope=True)):
    cfg = model_lib.preset("tiny", vocab_size=V, valid_vocab_size=V, block_size=N,
                           **{"target_dim": 128, **bad})
    m = model_lib.AOGPT(cfg, rngs=nnx.Rngs(0))
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"'{name}'.*cannot be written in the published aogpt"):
      convert.export_safetensors(m, str(tmp_path / name), layout="published")
    assert not (tmp_path / name).exists()
