"""A PyTorch mirror of the published AO-GPT and sigma-GPT architecture, written independently of
the converter (module registration order decides the state-dict names and the EMA shadow order),
and `checkpoint`, a random published-format ``ckpt.pt`` of it. Needs torch: import it after
``pytest.importorskip("torch")``."""

import torch

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


def checkpoint(variant, tmp_path):
  """A published-format ``ckpt.pt`` of a random TorchAOGPT: (torch model, EMA shadow, path)."""
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
