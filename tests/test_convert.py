"""Checkpoint import/export: published PyTorch AO-GPT and sigma-GPT layouts.

The PyTorch models below are written here, independently of the converter, from the published
architecture (module registration order decides state-dict names and the EMA shadow order).
"""

import math

import numpy as np
import pytest

from aogpt_jax.checkpoints import convert

torch = pytest.importorskip("torch", reason="needs torch (pip install -r requirements-extra.txt)")

pytestmark = pytest.mark.torch

nn, F = torch.nn, torch.nn.functional

V, N, D, H, L, TD = 64, 12, 32, 4, 2, 128   # the published code hard-codes TD = 128


class RMS(nn.Module):
  def __init__(self, d):
    super().__init__()
    self.weight = nn.Parameter(torch.ones(d))

  def forward(self, x):
    return F.rms_norm(x, self.weight.shape, self.weight, 1e-5)


class Attn(nn.Module):
  def __init__(self, qk):
    super().__init__()
    self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
    if qk:
      self.q_norm, self.k_norm = RMS(D // H), RMS(D // H)
    self.qk = qk

  def forward(self, x):
    b, t, _ = x.shape
    q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in self.c_attn(x).split(D, dim=2))
    if self.qk:
      q, k = self.q_norm(q), self.k_norm(k)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).reshape(b, t, D))


class MLP(nn.Module):
  def __init__(self):
    super().__init__()
    self.c_fc, self.c_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

  def forward(self, x):
    return self.c_proj(F.gelu(self.c_fc(x)))


class AdaBlock(nn.Module):
  def __init__(self):
    super().__init__()
    self.ln_1, self.attn, self.ln_2, self.mlp = RMS(D), Attn(True), RMS(D), MLP()
    self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(TD, 6 * D))

  def forward(self, x, c):
    sa, ca, ga, sm, cm, gm = self.adaLN(c).chunk(6, dim=-1)
    x = x + ga * self.attn(self.ln_1(x) * (1 + ca) + sa)
    return x + gm * self.mlp(self.ln_2(x) * (1 + cm) + sm)


class Final(nn.Module):
  def __init__(self):
    super().__init__()
    self.ln_f = RMS(D)
    self.adaLN_final = nn.Sequential(nn.SiLU(), nn.Linear(TD, 2 * D))

  def forward(self, x, c):
    shift, scale = self.adaLN_final(c).chunk(2, dim=-1)
    return self.ln_f(x) * (1 + scale) + shift


class LNBlock(nn.Module):
  def __init__(self):
    super().__init__()
    self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(D), Attn(False), nn.LayerNorm(D), MLP()

  def forward(self, x):
    x = x + self.attn(self.ln_1(x))
    return x + self.mlp(self.ln_2(x))


class TorchAOGPT(nn.Module):
  """Published layout: variant "aogpt" (adaLN) or "sigma_gpt" (input target embedding)."""

  def __init__(self, variant):
    super().__init__()
    sig = variant == "sigma_gpt"
    mods = dict(wte=nn.Embedding(V, D), wpe=nn.Embedding(N + 1, D),
                wtpe=nn.Embedding(N, D if sig else TD), wnonee=nn.Embedding(1, D),
                drop=nn.Dropout(0.0),
                h=nn.ModuleList([LNBlock() if sig else AdaBlock() for _ in range(L)]))
    mods.update(ln_f=nn.LayerNorm(D)) if sig else mods.update(final_layer=Final())
    self.transformer = nn.ModuleDict(mods)
    self.lm_head = nn.Linear(D, V, bias=not sig)
    if sig:
      self.transformer.wte.weight = self.lm_head.weight
    self.sig = sig
    with torch.no_grad():
      for p in self.parameters():
        p.copy_(0.3 * torch.randn_like(p) + (1.0 if p.ndim == 1 and p.shape[0] == D else 0.0))

  def forward(self, idx, order):
    b, t = idx.shape
    tw = self.transformer
    xs = torch.gather(idx, 1, order)
    tok = torch.cat([tw.wnonee.weight.expand(b, 1, D), tw.wte(xs)], 1)
    pos = torch.cat([tw.wpe.weight[:1].expand(b, 1, D), tw.wpe(order + 1)], 1)
    tgt = torch.cat([tw.wtpe(order), torch.zeros(b, 1, tw.wtpe.weight.shape[1])], 1)
    x = tok + pos
    if self.sig:
      x = x + tgt
      for blk in tw.h:
        x = blk(x)
      x = tw.ln_f(x)
    else:
      for blk in tw.h:
        x = blk(x, tgt)
      x = tw.final_layer(x, tgt)
    return self.lm_head(x)[:, :-1]


def _checkpoint(variant, tmp_path):
  torch.manual_seed(0)
  tm = TorchAOGPT(variant)
  shadow = [p.detach() * 0.5 + 0.01 for p in tm.parameters()]   # EMA: parameters() order
  ck = {"model": tm.state_dict(), "model_args": dict(n_layer=L, n_head=H, n_embd=D, block_size=N,
                                                     bias=True, vocab_size=V, dropout=0.0),
        "ema_model": {"decay": 0.9999, "num_updates": 3, "shadow_params": shadow},
        "iter_num": 7, "config": {"lr": 1.0}}
  path = tmp_path / "ckpt.pt"
  torch.save(ck, path)
  return tm, shadow, str(path)


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
  for bad in (dict(target_dim=64), dict(mlp_ratio=2)):
    cfg = model_lib.preset("tiny", vocab_size=V, valid_vocab_size=V, block_size=N, **bad)
    m = model_lib.AOGPT(cfg, rngs=nnx.Rngs(0))
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"'{name}'.*cannot be written in the published aogpt"):
      convert.export_safetensors(m, str(tmp_path / name), layout="published")
    assert not (tmp_path / name).exists()
