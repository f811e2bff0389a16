"""A Hugging Face Llama-family causal LM -> an AO-GPT with exactly its logits under the L2R order.

SPEC ``causal:DIR[?block_size=N]`` (``--checkpoint``, ``train.init_from``, ``aogpt_jax.load``,
``convert from-gpt --spec``): DIR holds ``config.json`` and ``model.safetensors`` (or the shards a
``model.safetensors.index.json`` names) of a ``llama``, ``mistral``, ``qwen2``, ``qwen3`` or
``gemma`` model (``causal:OWNER/REPO[@REV]``: its snapshot in the local Hugging Face cache; nothing
is downloaded). ``block_size`` (default ``max_position_embeddings - 1``) bounds the AO-GPT's
sequences: its adaLN target tables have a row per position, so a shorter one saves memory.
``data.tokenizer=causal:DIR`` is the folder's ``tokenizer.json`` (data/tokenizers.py).

The mapping (docs/training.md, "Starting from a GPT"), following `from_gpt`'s GPT-2 convention:

* The START slot is the source's BOS token at position 0 (START vector = the BOS embedding,
  ``bos_token_id``, else ``eos_token_id``); the token at position p sits at position p + 1. So
  under L2R the AO-GPT's logits at every position r (predicting x_r) are the source's logits
  on ``[BOS, x_0, ..., x_{n-2}]``: slot r holds x_{r-1} (BOS for r = 0) at the source's
  position r.
* Positions by rotation alone: ``learned_pos=False`` (no ``wpe``), ``rope=True`` with the
  source's ``rope_theta`` and ``rope_query='token'``: a query turned at its own token's position
  as in the source (the default ``'target'`` turns it at the target's, one further under L2R,
  which is a different function). The target position enters through adaLN only.
* RMSNorm (the source's eps), SwiGLU (``mlp='swiglu'``; Gemma: ``geglu`` with its tanh GELU),
  grouped-query attention (``n_kv_head``), heads of the source's ``head_dim`` (``head_size``),
  no biases except Qwen2's q/k/v (``qkv_bias``), Qwen3's QK-norm, tied or untied head without
  bias. Gemma: embeddings times sqrt(hidden_size) (``embed_scale``) and its ``(1 + w)`` norms
  stored as the scales ``1 + w`` (the same function). ``c_attn`` = [q | k | v] and ``c_fc`` =
  [gate | up] of the source's [out, in] weights, transposed.
* The target conditioning is added as the identity (`from_gpt.IDENTITY_FIELDS`).

Anything else a config sets is refused in one `ConversionError` line naming the field: RoPE
scaling of any type but the default, partial rotary, sliding windows that can bind, o_proj / MLP
biases, attention or logit softcapping, mixtures of experts, other layer types, other activations.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

import numpy as np

from aogpt_jax.checkpoints import from_gpt
from aogpt_jax.checkpoints.from_gpt import ConversionError
from aogpt_jax.model import aogpt as model_lib

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma")
# Per family: the transformers config-class defaults a config.json may leave out.
DEFAULTS = {
    "llama": dict(rms_norm_eps=1e-6, max_position_embeddings=2048, tie_word_embeddings=False,
                  hidden_act="silu"),
    "mistral": dict(rms_norm_eps=1e-6, max_position_embeddings=131072, tie_word_embeddings=False,
                    hidden_act="silu", sliding_window=4096),
    "qwen2": dict(rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=False,
                  hidden_act="silu"),
    "qwen3": dict(rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=False,
                  hidden_act="silu", head_dim=128),
    "gemma": dict(rms_norm_eps=1e-6, max_position_embeddings=8192, tie_word_embeddings=True,
                  hidden_act="gelu_pytorch_tanh", head_dim=256),
}
ACTIVATIONS = {"silu": ("swiglu", "exact"), "swish": ("swiglu", "exact"),
               "gelu_pytorch_tanh": ("geglu", "tanh"), "gelu_new": ("geglu", "tanh"),
               "gelu": ("geglu", "exact")}
# Fields that, when set (truthy), change the function in a way this conversion does not follow.
REFUSED = ("attn_logit_softcapping", "final_logit_softcapping", "num_experts",
           "num_local_experts", "moe_intermediate_size", "use_sliding_window",
           "use_bidirectional_attention", "query_pre_attn_scalar", "attention_bias", "mlp_bias",
           "cross_attention_layers", "sliding_window_pattern", "altup_num_inputs")
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads")


def parse(spec: str) -> tuple[str, int]:
  """``causal:BODY[?block_size=N]`` -> (BODY, N or 0)."""
  body, _, query = spec[len("causal:"):].partition("?")
  block = 0
  if query:
    key, _, value = query.partition("=")
    if key != "block_size" or not value.isdigit() or int(value) < 1:
      raise ConversionError(f"{spec}: the only option is ?block_size=N (N >= 1), got {query!r}")
    block = int(value)
  return body, block


def read_causal(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
  """(config.json with the family's defaults filled in, every tensor, the weights file)."""
  hf = from_gpt.read_config(path, "a Hugging Face causal LM folder holds config.json and "
                                  "model.safetensors")
  kind = hf.get("model_type")
  if kind not in FAMILIES:
    raise ConversionError(f"{os.path.join(path, 'config.json')}: model_type {kind!r} is not one "
                          f"of {FAMILIES} (the causal: families that convert)")
  tensors, where = from_gpt.read_weights(path, f"{kind} weights")
  return {**DEFAULTS[kind], **{k: v for k, v in hf.items() if v is not None}}, tensors, where


def rope_theta(hf: Mapping[str, Any], bad) -> float:
  """The rotary base; every RoPE variant but the plain one is refused (naming its field)."""
  params = hf.get("rope_parameters") or {}
  scaling = hf.get("rope_scaling") or {}
  for key, d in (("rope_parameters", params), ("rope_scaling", scaling)):
    kind = d.get("rope_type", d.get("type", "default"))
    if kind != "default":
      bad(f"{key}.rope_type", f"{kind!r}: only the default (unscaled) RoPE converts")
    if float(d.get("partial_rotary_factor", 1.0)) != 1.0:
      bad(f"{key}.partial_rotary_factor", f"{d['partial_rotary_factor']}: only full rotary "
          f"converts")
  if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
    bad("partial_rotary_factor", f"{hf['partial_rotary_factor']}: only full rotary converts")
  return float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))


def model_config(hf: Mapping[str, Any], *, target: str = "adaln", target_dim: int = 128,
                 block_size: int = 0, where: str = "config.json") -> model_lib.ModelConfig:
  """The AO-GPT config of a causal LM's ``config.json`` (with `DEFAULTS` filled in)."""
  def bad(key, msg):
    raise ConversionError(f"{where}: {key} {msg}")

  if target not in from_gpt.TARGETS:
    raise ConversionError(f"target: must be one of {from_gpt.TARGETS}, got {target!r}")
  kind = hf["model_type"]
  for key in REQUIRED:
    if not isinstance(hf.get(key), int) or hf[key] < 1:
      bad(key, f"{hf.get(key)!r}: a positive integer is needed")
  for key in REFUSED:
    if hf.get(key):
      bad(key, f"{hf[key]!r}: not supported (the conversion would not be exact)")
  types = set(hf.get("layer_types") or ["full_attention"])
  if types != {"full_attention"}:
    bad("layer_types", f"{sorted(types)}: only full_attention layers convert")
  act = hf.get("hidden_activation") or hf["hidden_act"]
  if act not in ACTIVATIONS or (kind == "gemma") != (ACTIVATIONS[act][0] == "geglu"):
    allowed = [a for a, (m, _) in ACTIVATIONS.items() if (m == "geglu") == (kind == "gemma")]
    bad("hidden_act", f"{act!r}: {kind} converts with {allowed}")
  mlp, gelu = ACTIVATIONS[act]
  theta = rope_theta(hf, bad)
  d, nh, v = hf["hidden_size"], hf["num_attention_heads"], hf["vocab_size"]
  hd = int(hf.get("head_dim") or d // nh)
  nkv = int(hf.get("num_key_value_heads") or nh)
  if nh % nkv:
    bad("num_key_value_heads", f"{nkv} does not divide num_attention_heads={nh}")
  if hd % 2:
    bad("head_dim", f"{hd} is odd (rotary pairs)")
  npos = int(hf["max_position_embeddings"])
  block = block_size or npos - 1
  if not 1 <= block <= npos - 1:
    bad("max_position_embeddings", f"{npos}: block_size {block} needs block_size + 1 positions")
  window = hf.get("sliding_window") if kind == "mistral" else None
  if window and window <= block:
    bad("sliding_window", f"{window}: the window binds within block_size {block} (+ START); "
        f"convert with ?block_size=N for N < {window}")
  return model_lib.ModelConfig(
      vocab_size=from_gpt.padded(v), valid_vocab_size=v, block_size=block,
      n_layer=hf["num_hidden_layers"], n_head=nh, n_kv_head=0 if nkv == nh else nkv,
      head_size=0 if hd * nh == d else hd, n_embd=d, target=target, target_dim=target_dim,
      norm="rmsnorm", norm_eps=float(hf["rms_norm_eps"]), bias=False,
      qkv_bias=kind == "qwen2", qk_norm=kind == "qwen3", rope=True, rope_theta=theta,
      rope_query="token", learned_pos=False, mlp=mlp, mlp_hidden=hf["intermediate_size"],
      gelu=gelu, tie_embeddings=bool(hf["tie_word_embeddings"]), head_bias=False,
      embed_scale=math.sqrt(d) if kind == "gemma" else 1.0, dropout=0.0,
      **from_gpt.IDENTITY_FIELDS)


def bos_id(hf: Mapping[str, Any], where: str) -> int:
  """The id whose embedding becomes the START vector: ``bos_token_id``, else ``eos_token_id``."""
  for key in ("bos_token_id", "eos_token_id"):
    e = hf.get(key)
    e = e[0] if isinstance(e, list) and e else e
    if isinstance(e, int) and 0 <= e < hf["vocab_size"]:
      return e
  raise ConversionError(f"{where}: bos_token_id / eos_token_id: neither is an id below "
                        f"vocab_size {hf['vocab_size']} (the START vector is its embedding)")


def flat_params(hf: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
                cfg: model_lib.ModelConfig, where: str) -> dict[str, np.ndarray]:
  """The source's tensors (checked: missing, misshapen and unknown ones are named) -> our flat
  parameter names."""
  kind = hf["model_type"]
  d, v, h, hd = cfg.n_embd, cfg.valid_vocab_size, cfg.mlp_width, cfg.head_dim
  qd, kvd = cfg.n_head * hd, cfg.kv_heads * hd
  shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
  if not cfg.tie_embeddings:
    shapes["lm_head.weight"] = (v, d)
  for i in range(cfg.n_layer):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                   p + "self_attn.q_proj.weight": (qd, d), p + "self_attn.k_proj.weight": (kvd, d),
                   p + "self_attn.v_proj.weight": (kvd, d), p + "self_attn.o_proj.weight": (d, qd),
                   p + "mlp.gate_proj.weight": (h, d), p + "mlp.up_proj.weight": (h, d),
                   p + "mlp.down_proj.weight": (d, h)})
    if cfg.qkv_bias:
      shapes.update({p + "self_attn.q_proj.bias": (qd,), p + "self_attn.k_proj.bias": (kvd,),
                     p + "self_attn.v_proj.bias": (kvd,)})
    if cfg.qk_norm:
      shapes[p + "self_attn.q_norm.weight"] = shapes[p + "self_attn.k_norm.weight"] = (hd,)
  t = from_gpt.checked_tensors(tensors, shapes, where)
  used = set(shapes)
  if cfg.tie_embeddings and "lm_head.weight" in tensors:
    if not np.array_equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]):
      raise ConversionError(f"{where}: tensor 'lm_head.weight' differs from "
                            f"'model.embed_tokens.weight' but config.json ties them")
    used.add("lm_head.weight")
  left = sorted(k for k in set(tensors) - used if not k.endswith("rotary_emb.inv_freq"))
  if left:
    raise ConversionError(f"{where}: unexpected tensor(s) {left[:5]} (not a plain {kind} "
                          f"causal LM?)")
  norm = (lambda w: w + 1.0) if kind == "gemma" else (lambda w: w)   # Gemma's (1 + w) norms
  pad = np.zeros((cfg.vocab_size - v, d), np.float32)
  emb = t["model.embed_tokens.weight"]
  start = emb[bos_id(hf, where)] * np.float32(cfg.embed_scale)
  flat = {"wte.embedding": np.concatenate([emb, pad]), "wnone": start,
          "ln_f.scale": norm(t["model.norm.weight"])}
  if not cfg.tie_embeddings:
    flat["lm_head.kernel"] = np.concatenate([t["lm_head.weight"], pad]).T
  for i in range(cfg.n_layer):
    p, q = f"model.layers.{i}.", f"h.{i}."
    a = p + "self_attn."
    flat[q + "ln_1.scale"] = norm(t[p + "input_layernorm.weight"])
    flat[q + "ln_2.scale"] = norm(t[p + "post_attention_layernorm.weight"])
    flat[q + "attn.c_attn.kernel"] = np.concatenate(
        [t[a + n + "_proj.weight"] for n in "qkv"]).T
    if cfg.qkv_bias:
      flat[q + "attn.c_attn.bias"] = np.concatenate([t[a + n + "_proj.bias"] for n in "qkv"])
    flat[q + "attn.c_proj.kernel"] = t[a + "o_proj.weight"].T
    if cfg.qk_norm:
      flat[q + "attn.q_norm.scale"] = norm(t[a + "q_norm.weight"])
      flat[q + "attn.k_norm.scale"] = norm(t[a + "k_norm.weight"])
    flat[q + "mlp.c_fc.kernel"] = np.concatenate(
        [t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]]).T
    flat[q + "mlp.c_proj.kernel"] = t[p + "mlp.down_proj.weight"].T
  return flat


def tokenizer_spec(path: str, body: str) -> str | None:
  """``data.tokenizer`` for the folder's own tokenizer (None without a tokenizer.json)."""
  return f"causal:{body}" if os.path.isfile(os.path.join(path, "tokenizer.json")) else None


def from_causal(path: str, *, target: str = "adaln", target_dim: int = 128, block_size: int = 0,
                seed: int = 0):
  """A Hugging Face causal LM folder -> (AOGPT, ModelConfig, meta)."""
  hf, tensors, where = read_causal(path)
  cfg = model_config(hf, target=target, target_dim=target_dim, block_size=block_size,
                     where=os.path.join(path, "config.json"))
  m = from_gpt.with_weights(cfg, flat_params(hf, tensors, cfg, where), seed, where)
  return m, cfg, {"weights_file": where, "bos_id": bos_id(hf, where),
                  "model_type": hf["model_type"]}


def load(spec: str, *, target: str = "adaln", seed: int = 0):
  """``causal:DIR[?block_size=N]`` -> (AOGPT, ModelConfig, provenance)."""
  body, block = parse(spec)
  path = from_gpt.local_dir("causal", body)
  m, cfg, meta = from_causal(path, target=target, block_size=block, seed=seed)
  prov = {"source": spec, "step": None, "weights": meta["model_type"], **meta}
  tok = tokenizer_spec(path, body)
  if tok:
    prov["tokenizer"] = tok
  return m, cfg, prov


def load_any(spec: str, which: str = "ema", *, target: str = "adaln", seed: int = 0):
  """Any `from_gpt.is_spec` SPEC (``causal:``, ``gpt2:``, ``l2r:``) -> (AOGPT, ModelConfig,
  provenance)."""
  if str(spec).startswith("causal:"):
    return load(str(spec), target=target, seed=seed)
  return from_gpt.load(spec, which, target=target, seed=seed)
