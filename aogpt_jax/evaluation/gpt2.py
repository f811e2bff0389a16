"""A JAX GPT-2 (pure functions over a parameter dict) that loads Hugging Face GPT-2 weights.

Any size works (gpt2, -medium, -large, -xl): a local folder with ``config.json`` and
``model.safetensors`` (or a sharded ``model.safetensors.index.json``), e.g. made with

    hf download openai-community/gpt2-large config.json model.safetensors \\
        --local-dir ~/models/gpt2-large

Nothing is downloaded here (no network at run time). Key names may carry the ``transformer.``
prefix of ``GPT2LMHeadModel.save_pretrained`` or not (the hub files); the causal-mask buffers
(``attn.bias``, ``attn.masked_bias``) of old files are ignored; the output head is tied to
``wte``. HF's Conv1D stores weights as [in, out], which is already our layout.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.checkpoints import from_gpt

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
DOWNLOAD_HINT = ("hf download openai-community/gpt2-large config.json "
                 "model.safetensors --local-dir {path}")


@dataclasses.dataclass(frozen=True)
class GPT2Config:
  vocab_size: int = 50257
  n_positions: int = 1024
  n_embd: int = 768
  n_layer: int = 12
  n_head: int = 12
  layer_norm_epsilon: float = 1e-5
  activation_function: str = "gelu_new"
  scale_attn_weights: bool = True
  scale_attn_by_inverse_layer_idx: bool = False

  @classmethod
  def from_hf(cls, d: dict[str, Any]) -> "GPT2Config":
    if d.get("model_type", "gpt2") != "gpt2":
      raise ValueError(f"evaluator config.json: model_type {d.get('model_type')!r} is not 'gpt2'")
    act = d.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu", "gelu_pytorch_tanh", "relu"):
      raise ValueError(f"evaluator config.json: unsupported activation_function {act!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: d[k] for k in names if k in d})


def _act(name: str, x):
  if name in ("gelu_new", "gelu_pytorch_tanh"):
    return jax.nn.gelu(x, approximate=True)
  if name == "gelu":
    return jax.nn.gelu(x, approximate=False)
  return jax.nn.relu(x)


def _ln(x, p, eps):
  x32 = x.astype(jnp.float32)
  mu = jnp.mean(x32, -1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mu), -1, keepdims=True)
  return ((x32 - mu) * jax.lax.rsqrt(var + eps) * p["weight"] + p["bias"]).astype(x.dtype)


def _dense(x, p):
  return jnp.dot(x, p["weight"].astype(x.dtype)) + p["bias"].astype(x.dtype)


@functools.partial(jax.jit, static_argnames=("cfg",))
def logits(params: dict, tokens: jax.Array, *, cfg: GPT2Config) -> jax.Array:
  """GPT-2 forward: fp32 logits [B, T, vocab] for int tokens [B, T] (causal)."""
  b, t = tokens.shape
  dtype = params["wte"].dtype
  x = jnp.take(params["wte"], tokens, axis=0) + params["wpe"][:t][None]
  nh, hd = cfg.n_head, cfg.n_embd // cfg.n_head
  for li, lp in enumerate(params["h"]):
    qkv = _dense(_ln(x, lp["ln_1"], cfg.layer_norm_epsilon), lp["attn"]["c_attn"])
    q, k, v = jnp.split(qkv.reshape(b, t, 3, nh, hd).astype(jnp.float32), 3, axis=2)
    scale = (1.0 / np.sqrt(hd) if cfg.scale_attn_weights else 1.0)
    if cfg.scale_attn_by_inverse_layer_idx:
      scale /= li + 1
    y = jax.nn.dot_product_attention(q[:, :, 0], k[:, :, 0], v[:, :, 0], scale=scale,
                                     is_causal=True, implementation="xla")
    x = x + _dense(y.reshape(b, t, cfg.n_embd).astype(dtype), lp["attn"]["c_proj"])
    h = _act(cfg.activation_function,
             _dense(_ln(x, lp["ln_2"], cfg.layer_norm_epsilon), lp["mlp"]["c_fc"]))
    x = x + _dense(h, lp["mlp"]["c_proj"])
  x = _ln(x, params["ln_f"], cfg.layer_norm_epsilon)
  return jnp.dot(x, params["wte"].T.astype(x.dtype)).astype(jnp.float32)


def load(path: str, dtype: str = "float32") -> tuple[dict, GPT2Config]:
  """Loads (params, config) from a local Hugging Face GPT-2 folder; clear errors if absent."""
  path = os.path.expanduser(path)
  cfg_file = os.path.join(path, "config.json")
  if not os.path.exists(cfg_file) or not any(os.path.exists(os.path.join(path, w))
                                             for w in WEIGHT_FILES):
    raise FileNotFoundError(
        f"generative perplexity needs Hugging Face GPT-2 weights: expected {cfg_file} and "
        f"{os.path.join(path, 'model.safetensors')} (the paper scores with GPT-2 Large). "
        f"Fetch them once on a machine with network access, e.g. "
        f"`{DOWNLOAD_HINT.format(path=path)}`, and pass that folder to "
        f"genppl.GPT2Scorer.from_pretrained(PATH).")
  with open(cfg_file) as f:
    cfg = GPT2Config.from_hf(json.load(f))
  hf, raw, where = from_gpt.read_gpt2(path)
  dt = jnp.dtype(dtype)
  t = {k: jnp.asarray(v, dt) for k, v in from_gpt.gpt2_tensors(hf, raw, where).items()}
  wb = lambda p: {"weight": t[p + ".weight"], "bias": t[p + ".bias"]}   # weight and bias
  params = {"wte": t["wte.weight"], "wpe": t["wpe.weight"], "ln_f": wb("ln_f"), "h": []}
  for i in range(cfg.n_layer):
    p = f"h.{i}."
    params["h"].append({
        "ln_1": wb(p + "ln_1"), "ln_2": wb(p + "ln_2"),
        "attn": {"c_attn": wb(p + "attn.c_attn"), "c_proj": wb(p + "attn.c_proj")},
        "mlp": {"c_fc": wb(p + "mlp.c_fc"), "c_proj": wb(p + "mlp.c_proj")},
    })
  return params, cfg
