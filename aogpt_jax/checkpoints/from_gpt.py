"""A left-to-right GPT -> an AO-GPT that computes exactly the same logits under the L2R order.

Three sources (``--checkpoint`` / ``train.init_from`` / ``aogpt_jax.load`` SPECs):

* ``gpt2:DIR``: a Hugging Face GPT-2 of any size (``config.json`` + ``model.safetensors`` or a
  sharded ``model.safetensors.index.json``); ``gpt2:OWNER/REPO[@REV]`` reads the repository's
  snapshot in the local Hugging Face cache (`hub`; nothing is downloaded).
* ``causal:DIR``: a Hugging Face Llama / Mistral / Qwen2 / Qwen3 / Gemma causal LM
  (`from_causal`, which documents its mapping);
* ``l2r:WORKDIR``: this project's own left-to-right run (``objective=ao``, ``model.target=none``,
  trained on ``order.name=l2r`` or a ``mixture`` with ``p_l2r=1``, e.g. ``configs/gpt2_small.py``;
  `check_l2r_run` refuses any other), its newest checkpoint (EMA weights unless
  ``which='params'``).

How GPT-2 maps onto the AO-GPT (docs/training.md, "Starting from a GPT"):

* GPT-2 reads its end-of-text token at position 0 as the context of its first token; the AO-GPT's
  START slot (rank-slot 0, position row 0) gets the end-of-text embedding as its START vector,
  and the token at position p sits at position row p + 1, so ``wpe`` is copied row for row and
  ``block_size = n_positions - 1``.
* ``gelu='tanh'`` (GPT-2's ``gelu_new``), ``norm='layernorm'`` with biases, no QK-norm, the head
  tied to ``wte`` without bias; the vocabulary is padded to a multiple of 64 with zero rows (the
  padding ids are never scored or sampled).
* The target conditioning is added as the identity: adaLN projections zero-initialised
  (``zero_init_modulation``: shift and scale 0) with ``gate_offset=1`` (gate = 1 + g, g = 0),
  so every block is the plain GPT block until training moves them; per-block / sigma-GPT target
  embeddings start at zero (``zero_init_target``). Only the adaLN target-position table keeps
  its random init (a zero table would receive no gradient through the zero projections).

Every problem with a source is one `ConversionError` line naming the file and the tensor.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from aogpt_jax.checkpoints import hub
from aogpt_jax.model import aogpt as model_lib

PREFIXES = ("gpt2:", "l2r:", "causal:")
TARGETS = ("adaln", "sigma_gpt", "repeat", "per_block", "none")
GPT2_ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "exact"}
# What makes the added target conditioning the identity at initialisation.
IDENTITY_FIELDS = dict(zero_init_modulation=True, gate_offset=1.0, zero_init_target=True)
# ModelConfig fields that change the function a model computes (the others are run choices:
# dtype, attention kernel, remat, dropout, initialisation): a model loaded into a run must agree.
FUNCTION_FIELDS = ("vocab_size", "valid_vocab_size", "block_size", "n_layer", "n_head", "n_embd",
                   "target", "target_dim", "norm", "qk_norm", "bias", "mlp_ratio",
                   "tie_embeddings", "head_bias", "gelu", "gate_offset", "rope", "rope_theta",
                   "rope_query", "learned_pos", "n_kv_head", "head_size", "qkv_bias", "mlp",
                   "mlp_hidden", "norm_eps", "embed_scale")


class ConversionError(ValueError):
  """A source that cannot be converted; one line naming the file (and tensor)."""


def is_spec(spec: str) -> bool:
  return str(spec).startswith(PREFIXES)


def padded(v: int, multiple: int = 64) -> int:
  return -(-v // multiple) * multiple


# ----------------------------------------------------------------------------- GPT-2


def gpt2_dir(body: str) -> str:
  """``gpt2:BODY`` -> a local folder: BODY itself, or OWNER/REPO[@REV] in the HF cache."""
  return local_dir("gpt2", body, ("config.json", "model.safetensors"))


def local_dir(prefix: str, body: str, files: tuple = ("config.json",)) -> str:
  """``PREFIX:BODY`` -> a local folder: BODY itself, or OWNER/REPO[@REV] in the HF cache."""
  path = os.path.expanduser(body)
  if os.path.isdir(path) or body.startswith(("/", ".", "~")):
    if not os.path.isdir(path):
      raise ConversionError(f"{prefix}:{body}: no such folder ({os.path.abspath(path)})")
    return path
  try:
    return hub.resolve("hf:" + body, files=files)
  except hub.HubError as err:
    raise ConversionError(f"{prefix}:{err}".replace(f"{prefix}:hf:", f"{prefix}:")) from None


def read_gpt2(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
  """(config.json as a dict, tensors without the ``transformer.`` prefix, the weights file)."""
  hf = read_config(path, "a Hugging Face GPT-2 folder holds config.json and model.safetensors")
  cfg_file = os.path.join(path, "config.json")
  if hf.get("model_type") != "gpt2":
    raise ConversionError(f"{cfg_file}: model_type {hf.get('model_type')!r} is not 'gpt2' "
                          f"(only GPT-2 checkpoints convert)")
  raw, where = read_weights(path, "GPT-2 weights")
  tensors = {(k[len("transformer."):] if k.startswith("transformer.") else k): v
             for k, v in raw.items()}
  return hf, tensors, where


def read_config(path: str, hint: str) -> dict[str, Any]:
  """``path/config.json`` as a dict (``hint``: what the folder should hold, for the error)."""
  cfg_file = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_file):
    raise ConversionError(f"{cfg_file}: missing; {hint}")
  try:
    with open(cfg_file) as f:
      return json.load(f)
  except ValueError as err:
    raise ConversionError(f"{cfg_file}: not JSON ({err})") from None


def read_weights(path: str, what: str) -> tuple[dict[str, np.ndarray], str]:
  """Every tensor of ``path/model.safetensors`` or of the shards that
  ``model.safetensors.index.json`` names, and the file read (``what``: for the error)."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  single, index = (os.path.join(path, n) for n in ("model.safetensors",
                                                    "model.safetensors.index.json"))
  if os.path.isfile(single):
    files, where = [single], single
  elif os.path.isfile(index):
    with open(index) as f:
      files = [os.path.join(path, s) for s in sorted(set(json.load(f)["weight_map"].values()))]
    where = index
  else:
    raise ConversionError(f"{single}: missing ({what} in safetensors; a .bin file is not read)")
  raw: dict[str, np.ndarray] = {}
  for fn in files:
    try:
      raw.update(load_file(fn))
    except Exception as err:  # pylint: disable=broad-except  (an unreadable file: one line)
      raise ConversionError(f"{fn}: not a readable safetensors file ({type(err).__name__}: "
                            f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
  return raw, where


def gpt2_model_config(hf: Mapping[str, Any], *, target: str = "adaln", target_dim: int = 128,
                      where: str = "config.json") -> model_lib.ModelConfig:
  """The AO-GPT config of a GPT-2 ``config.json`` (the conversion's fields + IDENTITY_FIELDS)."""
  def bad(key, msg):
    raise ConversionError(f"{where}: {key} {msg}")

  if target not in TARGETS:
    raise ConversionError(f"target: must be one of {TARGETS}, got {target!r}")
  act = hf.get("activation_function", "gelu_new")
  if act not in GPT2_ACTIVATIONS:
    bad("activation_function", f"{act!r} is not one of {sorted(GPT2_ACTIVATIONS)}")
  if float(hf.get("layer_norm_epsilon", 1e-5)) != 1e-5:
    bad("layer_norm_epsilon", f"{hf['layer_norm_epsilon']} is not 1e-5 (the model's norms)")
  if not hf.get("scale_attn_weights", True) or hf.get("scale_attn_by_inverse_layer_idx", False):
    bad("scale_attn_weights", "/ scale_attn_by_inverse_layer_idx: only the 1/sqrt(head_dim) "
        "attention scale converts")
  d, nh = int(hf.get("n_embd", 768)), int(hf.get("n_head", 12))
  inner = hf.get("n_inner") or 4 * d
  if inner % d:
    bad("n_inner", f"{inner} is not a multiple of n_embd={d}")
  if d % nh:
    bad("n_head", f"{nh} does not divide n_embd={d}")
  vocab, npos = int(hf.get("vocab_size", 50257)), int(hf.get("n_positions", 1024))
  if npos < 2:
    bad("n_positions", f"{npos}: needs at least 2 (START + one token)")
  return model_lib.ModelConfig(
      vocab_size=padded(vocab), valid_vocab_size=vocab, block_size=npos - 1,
      n_layer=int(hf.get("n_layer", 12)), n_head=nh, n_embd=d, mlp_ratio=inner // d,
      target=target, target_dim=target_dim, norm="layernorm", bias=True, qk_norm=False,
      tie_embeddings=True, head_bias=False, gelu=GPT2_ACTIVATIONS[act], dropout=0.0,
      **IDENTITY_FIELDS)


def eot_id(hf: Mapping[str, Any]) -> int:
  """GPT-2's end-of-text id: ``eos_token_id`` when it is in the vocabulary, else the last id
  (50256 for GPT-2; 256 for a byte-level vocabulary of 257)."""
  vocab = int(hf.get("vocab_size", 50257))
  e = hf.get("eos_token_id")
  return int(e) if isinstance(e, int) and 0 <= e < vocab else vocab - 1


def checked_tensors(tensors, shapes: dict, where: str) -> dict:
  """``{name: float32 array}`` for every name of ``shapes``, each present in ``tensors`` with
  the shape config.json implies (a one-line `ConversionError` naming the tensor otherwise)."""
  out = {}
  for name, shape in shapes.items():
    if name not in tensors:
      raise ConversionError(f"{where}: missing tensor {name!r}")
    if tuple(tensors[name].shape) != shape:
      raise ConversionError(f"{where}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                            f"config.json implies {shape}")
    out[name] = np.asarray(tensors[name], np.float32)
  return out


def gpt2_tensors(hf: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
                 where: str) -> dict[str, np.ndarray]:
  """GPT-2's parameters as float32 arrays under their Hugging Face names (without the
  ``transformer.`` prefix), each checked against ``config.json``: missing, misshapen or unknown
  tensors are named, a head that is not tied to ``wte`` is refused, causal-mask buffers are
  dropped. (HF's Conv1D weights are [in, out].) Shared by the conversion and the gen-PPL
  scorer's JAX GPT-2 (evaluation/gpt2.py)."""
  d, v = int(hf.get("n_embd", 768)), int(hf.get("vocab_size", 50257))
  inner = int(hf.get("n_inner") or 4 * d)
  shapes = {"wte.weight": (v, d), "wpe.weight": (int(hf.get("n_positions", 1024)), d),
            "ln_f.weight": (d,), "ln_f.bias": (d,)}
  for i in range(int(hf.get("n_layer", 12))):
    p = f"h.{i}."
    for ln in ("ln_1", "ln_2"):
      shapes[p + ln + ".weight"] = shapes[p + ln + ".bias"] = (d,)
    for name, i_, o in (("attn.c_attn", d, 3 * d), ("attn.c_proj", d, d),
                        ("mlp.c_fc", d, inner), ("mlp.c_proj", inner, d)):
      shapes[p + name + ".weight"], shapes[p + name + ".bias"] = (i_, o), (o,)
  out = checked_tensors(tensors, shapes, where)
  used = set(shapes)
  if "lm_head.weight" in tensors:
    if not np.array_equal(tensors["lm_head.weight"], tensors["wte.weight"]):
      raise ConversionError(f"{where}: tensor 'lm_head.weight' differs from 'wte.weight'; only "
                            f"GPT-2's tied head is read")
    used.add("lm_head.weight")
  buffers = {k for k in tensors if k.endswith(".attn.masked_bias")
             or (k.endswith(".attn.bias") and np.ndim(tensors[k]) == 4)}
  left = sorted(set(tensors) - used - buffers)
  if left:
    raise ConversionError(f"{where}: unexpected tensor(s) {left[:5]} (not a GPT2LMHeadModel?)")
  return out


def gpt2_flat(hf, tensors: Mapping[str, np.ndarray], cfg: model_lib.ModelConfig,
              where: str) -> dict[str, np.ndarray]:
  """GPT-2 tensors -> our flat parameter names (`gpt2_tensors` checks them; ``cfg`` is
  `gpt2_model_config` of the same ``hf``)."""
  t = gpt2_tensors(hf, tensors, where)
  d, v = cfg.n_embd, cfg.valid_vocab_size
  flat = {"wte.embedding": np.concatenate([t["wte.weight"],
                                           np.zeros((cfg.vocab_size - v, d), np.float32)]),
          "wpe.embedding": t["wpe.weight"],
          "wnone": t["wte.weight"][eot_id(hf)].copy(),
          "ln_f.scale": t["ln_f.weight"], "ln_f.bias": t["ln_f.bias"]}
  for i in range(cfg.n_layer):
    p = f"h.{i}."
    for ln in ("ln_1", "ln_2"):
      flat[p + ln + ".scale"] = t[p + ln + ".weight"]
      flat[p + ln + ".bias"] = t[p + ln + ".bias"]
    for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
      flat[p + name + ".kernel"] = t[p + name + ".weight"]
      flat[p + name + ".bias"] = t[p + name + ".bias"]
  return flat


def from_gpt2(path: str, *, target: str = "adaln", target_dim: int = 128, seed: int = 0):
  """A Hugging Face GPT-2 folder -> (AOGPT, ModelConfig, meta)."""
  hf, tensors, where = read_gpt2(path)
  cfg = gpt2_model_config(hf, target=target, target_dim=target_dim,
                          where=os.path.join(path, "config.json"))
  m = with_weights(cfg, gpt2_flat(hf, tensors, cfg, where), seed, where)
  return m, cfg, {"weights_file": where, "eot_id": eot_id(hf)}


# ----------------------------------------------------------------------------- our L2R runs


def from_l2r(src: model_lib.AOGPT, *, target: str = "adaln", seed: int = 0,
             where: str = "") -> tuple[model_lib.AOGPT, model_lib.ModelConfig]:
  """This project's left-to-right model (``target='none'``) -> the same model with identity
  target conditioning (every parameter copied; the new ones at IDENTITY_FIELDS)."""
  if src.cfg.target != "none":
    raise ConversionError(f"{where or 'l2r model'}: model.target={src.cfg.target!r}; l2r: takes "
                          f"a left-to-right run (model.target='none', e.g. configs/gpt2_small.py)")
  if target not in TARGETS:
    raise ConversionError(f"target: must be one of {TARGETS}, got {target!r}")
  cfg = src.cfg.replace(target=target, **IDENTITY_FIELDS)
  return with_weights(cfg, flatten(nnx.to_pure_dict(nnx.state(src, nnx.Param))), seed,
                      where), cfg


def trained_l2r_only(order_name: str, kwargs: Mapping[str, Any]) -> bool:
  """Whether the order distribution ``order_name(**kwargs)`` draws only the identity (L2R)."""
  if order_name == "l2r":
    return True
  if order_name == "mixture":
    return float(kwargs.get("p_l2r", 0.1)) >= 1.0
  return False


def check_l2r_run(run_cfg, where: str) -> None:
  """``l2r:`` promises a GPT: a run of the any-order objective (``objective='ao'``) trained on
  left-to-right orders only (``order.name='l2r'``, or ``mixture`` with ``p_l2r=1``), so that
  the converted AO-GPT's L2R logits are those of a trained left-to-right model. An encoder MDM,
  or a run whose rows were (partly) in other orders, is refused in one line naming the key
  (its target field is checked by `from_l2r`)."""
  objective = str(run_cfg.get("objective", "ao") or "ao")
  order = run_cfg.get("order", None) or {}
  name = str(order.get("name", "mixture"))
  kw = order.get("kwargs", None) or {}
  kwargs = kw.to_dict() if hasattr(kw, "to_dict") else dict(kw)
  accepted = ("l2r: takes a left-to-right GPT run (objective='ao', model.target='none', "
              "order.name='l2r' or mixture with p_l2r=1, e.g. configs/gpt2_small.py)")
  if objective != "ao":
    raise ConversionError(f"{where}: objective={objective!r}; {accepted}")
  if not trained_l2r_only(name, kwargs):
    shown = f"{name!r}" + (f" with kwargs {kwargs}" if kwargs else "")
    raise ConversionError(f"{where}: order.name={shown}: the run was not trained left to right "
                          f"only, so its L2R logits are not a GPT's; {accepted}")


def load_l2r(workdir: str, which: str = "ema", *, target: str = "adaln", seed: int = 0):
  from aogpt_jax.checkpoints import store  # pylint: disable=g-import-not-at-top  (Orbax)
  path = os.path.expanduser(workdir)
  if not os.path.isdir(os.path.join(path, "checkpoints")):
    raise ConversionError(f"l2r:{workdir}: no training run there ({os.path.join(path, 'checkpoints')}"
                          f" missing)")
  src, run_cfg = store.load_model(path, which=which)
  check_l2r_run(run_cfg, f"l2r:{workdir}")
  m, cfg = from_l2r(src, target=target, seed=seed, where=f"l2r:{workdir}")
  loaded = run_cfg.loaded.to_dict()
  return m, cfg, {"step": loaded.get("step"), "weights": loaded.get("weights", which)}


# ----------------------------------------------------------------------------- shared


def flatten(tree, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def with_weights(cfg: model_lib.ModelConfig, flat: Mapping[str, Any], seed: int = 0,
                 where: str = "") -> model_lib.AOGPT:
  """A freshly initialised AOGPT(cfg) with ``flat``'s parameters written over it (every name of
  ``flat`` must exist with its shape; the rest keep their initialisation)."""
  m = model_lib.AOGPT(cfg, rngs=nnx.Rngs(seed))
  state = nnx.state(m, nnx.Param)
  pure = nnx.to_pure_dict(state)
  have = flatten(pure)
  pdt = jnp.dtype(cfg.param_dtype)
  for name, value in flat.items():
    if name not in have:
      raise ConversionError(f"{where}: parameter {name!r} has no place in the AO-GPT")
    if tuple(np.shape(value)) != tuple(have[name].shape):
      raise ConversionError(f"{where}: parameter {name!r} has shape {tuple(np.shape(value))}, "
                            f"the AO-GPT needs {tuple(have[name].shape)}")
    node, parts = pure, name.split(".")
    for p in parts[:-1]:
      node = node[int(p) if p.isdigit() and int(p) in node else p]
    node[parts[-1]] = jnp.asarray(value, pdt)
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(m, state)
  return m


def load(spec: str, which: str = "ema", *, target: str = "adaln", seed: int = 0):
  """``gpt2:...`` or ``l2r:...`` -> (AOGPT, ModelConfig, provenance); `from_causal.load_any`
  also takes ``causal:...``."""
  spec = str(spec)
  if spec.startswith("gpt2:"):
    m, cfg, meta = from_gpt2(gpt2_dir(spec[len("gpt2:"):]), target=target, seed=seed)
    return m, cfg, {"source": spec, "step": None, "weights": "gpt2", **meta}
  if spec.startswith("l2r:"):
    m, cfg, meta = load_l2r(spec[len("l2r:"):], which, target=target, seed=seed)
    return m, cfg, {"source": spec, **meta}
  raise ConversionError(f"{spec}: expected gpt2:DIR, gpt2:OWNER/REPO or l2r:WORKDIR")
