"""Checkpoint import (published PyTorch AO-GPT / sigma-GPT) and export (safetensors).

The published checkpoints (``ckpt_<iter>.pt`` of the nanoGPT-based training script) hold
``model`` (the state dict), ``ema_model`` = ``{"decay", "num_updates", "shadow_params"}`` where
``shadow_params`` is a list in ``model.parameters()`` order, ``model_args`` and more. The AO-GPT
model is ``model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm.py`` (variant ``aogpt`` -> our
``target="adaln"``: RMSNorm, QK-norm, adaLN with a 128-wide target embedding, untied head with
bias); sigma-GPT is ``model_sigmaGPT.py`` (variant ``sigma_gpt``: LayerNorm, a full-width target
embedding added to the input, head tied to ``wte`` without bias). PyTorch Linear weights are
[out, in]; our Dense kernels are [in, out].

    python -m aogpt_jax.checkpoints.convert import --ckpt ckpt_500000.pt --out converted/
        # -> converted/{ema,params}/{model.safetensors,config.json}
    python -m aogpt_jax.checkpoints.convert export --workdir WORKDIR --which ema --out DIR \\
        [--layout aogpt_jax|published]
    python -m aogpt_jax.checkpoints.convert from-gpt --spec gpt2:~/models/gpt2 --out DIR
        # a GPT-2 (or causal:DIR, l2r:WORKDIR) as the AO-GPT with the same L2R logits
        # (checkpoints/from_gpt.py, checkpoints/from_causal.py)

torch is imported lazily, only to read ``.pt`` files (requirements-extra.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import zipfile
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from aogpt_jax import errors
from aogpt_jax.model import aogpt as model_lib

VARIANTS = ("aogpt", "sigma_gpt")
GPT2_VALID_VOCAB = 50257
_PREFIXES = ("_orig_mod.", "module.")


def published_names(variant: str, n_layer: int, bias: bool) -> list[tuple[str, str, str]]:
  """(published name, our flat name, transform) in ``model.parameters()`` order; transform is
  ``T`` (Linear weight, transposed), ``row`` ([1, d] <-> [d]) or ``=``."""
  if variant not in VARIANTS:
    raise ValueError(f"checkpoint variant must be one of {VARIANTS}, got {variant!r}")
  t = "transformer."
  out = [(t + "wte.weight", "wte.embedding", "="), (t + "wpe.weight", "wpe.embedding", "="),
         (t + "wtpe.weight", "wtpe.embedding", "="), (t + "wnonee.weight", "wnone", "row")]

  def lin(src, dst, with_bias):
    res = [(src + ".weight", dst + ".kernel", "T")]
    return res + ([(src + ".bias", dst + ".bias", "=")] if with_bias else [])

  def norm(src, dst):
    res = [(src + ".weight", dst + ".scale", "=")]
    return res + ([(src + ".bias", dst + ".bias", "=")] if variant == "sigma_gpt" and bias else [])

  for i in range(n_layer):
    p, q = f"{t}h.{i}.", f"h.{i}."
    out += norm(p + "ln_1", q + "ln_1")
    out += lin(p + "attn.c_attn", q + "attn.c_attn", bias)
    out += lin(p + "attn.c_proj", q + "attn.c_proj", bias)
    if variant == "aogpt":
      out += [(p + "attn.q_norm.weight", q + "attn.q_norm.scale", "="),
              (p + "attn.k_norm.weight", q + "attn.k_norm.scale", "=")]
    out += norm(p + "ln_2", q + "ln_2")
    out += lin(p + "mlp.c_fc", q + "mlp.c_fc", bias) + lin(p + "mlp.c_proj", q + "mlp.c_proj", bias)
    if variant == "aogpt":
      out += lin(p + "adaLN.1", q + "adaLN", True)
  if variant == "aogpt":
    out += norm(t + "final_layer.ln_f", "ln_f")
    out += lin(t + "final_layer.adaLN_final.1", "adaLN_final", True) + lin("lm_head", "lm_head", True)
  else:
    out += norm(t + "ln_f", "ln_f")      # lm_head.weight is tied to wte (not a separate parameter)
  return out


def _strip(sd: Mapping[str, Any]) -> dict[str, np.ndarray]:
  out = {}
  for k, v in sd.items():
    for p in _PREFIXES:
      if k.startswith(p):
        k = k[len(p):]
    out[k] = np.asarray(v)
  return out


def detect_variant(sd: Mapping[str, Any]) -> str:
  if "transformer.h.0.adaLN.1.weight" in sd:
    return "aogpt"
  if "transformer.ln_f.weight" in sd:
    return "sigma_gpt"
  raise ValueError("checkpoint state dict is neither AO-GPT (no transformer.h.0.adaLN.1.weight) "
                   "nor sigma-GPT (no transformer.ln_f.weight)")


def infer_config(sd: Mapping[str, np.ndarray], variant: str, model_args: Mapping[str, Any] | None
                 = None, **overrides) -> model_lib.ModelConfig:
  """Our ModelConfig for a published state dict (shapes first, ``model_args`` for n_head)."""
  args = dict(model_args or {})

  def need(name):
    if name not in sd:
      raise ValueError(f"checkpoint state dict has no {name!r} (variant {variant})")
    return sd[name].shape

  vocab, d = need("transformer.wte.weight")
  block, tdim = need("transformer.wtpe.weight")
  if need("transformer.wpe.weight")[0] != block + 1:
    raise ValueError(f"checkpoint: transformer.wpe.weight has {sd['transformer.wpe.weight'].shape[0]}"
                     f" rows, expected block_size + 1 = {block + 1}")
  n_layer = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
  bias = "transformer.h.0.attn.c_attn.bias" in sd
  mlp_ratio = need("transformer.h.0.mlp.c_fc.weight")[0] // d
  if variant == "aogpt":
    n_head = d // need("transformer.h.0.attn.q_norm.weight")[0]
    kw = dict(target="adaln", target_dim=tdim, norm="rmsnorm", qk_norm=True, tie_embeddings=False,
              head_bias=True)
  else:
    if "n_head" not in args and "n_head" not in overrides:
      raise ValueError("sigma-GPT checkpoints do not determine n_head from shapes and this one has "
                       "no model_args['n_head']: pass --n_head")
    n_head = args.get("n_head", overrides.get("n_head"))
    kw = dict(model_lib.SIGMA_GPT_FIELDS)
  if "n_head" in args and args["n_head"] != n_head:
    raise ValueError(f"checkpoint: model_args n_head={args['n_head']} but q_norm implies {n_head}")
  valid = GPT2_VALID_VOCAB if vocab >= GPT2_VALID_VOCAB else vocab
  cfg = dict(vocab_size=vocab, valid_vocab_size=valid, block_size=block, n_layer=n_layer,
             n_head=n_head, n_embd=d, bias=bias, mlp_ratio=mlp_ratio, dropout=0.0, **kw)
  # An override may only fill in what the checkpoint leaves open (valid_vocab_size, a sigma-GPT
  # n_head without model_args); one that contradicts the checkpoint would give wrong logits.
  fixed = set(cfg) - {"valid_vocab_size"}
  if variant == "sigma_gpt" and "n_head" not in args:
    fixed.discard("n_head")
  for k, v in overrides.items():
    if k in fixed and v != cfg[k]:
      why = "model_args" if k in args else "its tensor shapes"
      raise ValueError(f"--{k}={v} conflicts with the checkpoint ({why} give {k}={cfg[k]}); "
                       f"drop --{k}")
  cfg.update(overrides)
  return model_lib.ModelConfig(**cfg)


def published_variant(cfg: model_lib.ModelConfig) -> str:
  """The published model code a config corresponds to: ``sigma_gpt`` or ``aogpt``."""
  return "sigma_gpt" if cfg.target == "sigma_gpt" else "aogpt"


def _flatten(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    name = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(_flatten(v, name + "."))
    else:
      out[name] = v
  return out


def _unflatten(flat: Mapping[str, Any]) -> dict:
  tree: dict = {}
  for name, v in flat.items():
    node = tree
    parts = [int(p) if p.isdigit() else p for p in name.split(".")]
    for p in parts[:-1]:
      node = node.setdefault(p, {})
    node[parts[-1]] = v
  return tree


def _abstract(cfg: model_lib.ModelConfig):
  return nnx.split(nnx.eval_shape(lambda: model_lib.AOGPT(cfg, rngs=nnx.Rngs(0))))


def model_from_flat(flat: Mapping[str, np.ndarray], cfg: model_lib.ModelConfig) -> model_lib.AOGPT:
  """Builds an AOGPT from our flat parameter names; every parameter must be given, once."""
  graphdef, state = _abstract(cfg)
  want = {k: v.shape for k, v in _flatten(nnx.to_pure_dict(state)).items()}
  missing, extra = sorted(set(want) - set(flat)), sorted(set(flat) - set(want))
  if missing or extra:
    raise ValueError(f"parameters do not fit model config: missing {missing[:5]}, "
                     f"unexpected {extra[:5]}")
  for k, shape in want.items():
    if tuple(flat[k].shape) != tuple(shape):
      raise ValueError(f"parameter {k}: shape {tuple(flat[k].shape)}, model needs {tuple(shape)}")
  pdt = jnp.dtype(cfg.param_dtype)
  nnx.replace_by_pure_dict(state, _unflatten({k: jnp.asarray(v, pdt) for k, v in flat.items()}))
  return nnx.merge(graphdef, state)


def model_to_flat(m: model_lib.AOGPT) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in _flatten(nnx.to_pure_dict(nnx.state(m, nnx.Param))).items()}


def _apply(t: np.ndarray, how: str, inverse: bool = False) -> np.ndarray:
  if how == "T":
    return np.ascontiguousarray(t.T)
  if how == "row":
    return t[None] if inverse else t.reshape(-1)
  return t


def state_dict_to_flat(sd: Mapping[str, np.ndarray], variant: str, cfg: model_lib.ModelConfig,
                       tensors: list[np.ndarray] | None = None) -> dict[str, np.ndarray]:
  """Published state dict (or, with ``tensors``, the EMA shadow list in parameters() order,
  shapes checked against ``sd``) -> our flat params. Every tensor is used exactly once."""
  names = published_names(variant, cfg.n_layer, cfg.bias)
  used: set[str] = set()
  flat = {}
  if tensors is not None and len(tensors) != len(names):
    raise ValueError(f"EMA shadow_params has {len(tensors)} tensors; the {variant} model with "
                     f"{cfg.n_layer} layers has {len(names)} parameters")
  for idx, (src, dst, how) in enumerate(names):
    if src not in sd:
      raise ValueError(f"checkpoint state dict has no {src!r} (variant {variant})")
    t = sd[src] if tensors is None else np.asarray(tensors[idx])
    if tuple(t.shape) != tuple(sd[src].shape):
      raise ValueError(f"EMA shadow_params[{idx}] has shape {tuple(t.shape)} but parameter "
                       f"{idx} ({src}) has {tuple(sd[src].shape)}: not in parameters() order?")
    if src in used:
      raise ValueError(f"tensor {src} mapped twice")
    used.add(src)
    flat[dst] = _apply(np.asarray(t, np.float32), how)
  if variant == "sigma_gpt" and "lm_head.weight" in sd:
    if not np.array_equal(sd["lm_head.weight"], sd["transformer.wte.weight"]):
      raise ValueError("sigma-GPT checkpoint: lm_head.weight differs from the tied wte.weight")
    used.add("lm_head.weight")
  buffers = {k for k in sd if k.endswith(".attn.bias") and np.ndim(sd[k]) == 4}
  left = sorted(set(sd) - used - buffers)
  if left:
    raise ValueError(f"checkpoint tensors not used by the {variant} conversion: {left[:5]}")
  return flat


def check_published(cfg: model_lib.ModelConfig, variant: str) -> None:
  """Raises unless ``cfg`` is an architecture the published ``variant`` code can express."""
  # The published code hard-codes the 4x MLP and (AO-GPT) the 128-wide target embedding, and
  # has learned positions only.
  want = (dict(target="adaln", target_dim=128, norm="rmsnorm", qk_norm=True, tie_embeddings=False,
               head_bias=True, mlp_ratio=4, gelu="exact", gate_offset=0.0, rope=False)
          if variant == "aogpt" else
          dict(target="sigma_gpt", norm="layernorm", qk_norm=False, tie_embeddings=True,
               head_bias=False, mlp_ratio=4, gelu="exact", rope=False))
  bad = {k: getattr(cfg, k) for k, v in want.items() if getattr(cfg, k) != v}
  if bad:
    raise ValueError(f"model config {bad} cannot be written in the published {variant} layout "
                     f"(it needs {want})")


def flat_to_state_dict(flat: Mapping[str, np.ndarray], variant: str,
                       cfg: model_lib.ModelConfig) -> dict[str, np.ndarray]:
  """Our flat params -> the published state dict (names, layouts, parameters() order)."""
  check_published(cfg, variant)
  sd = {src: _apply(np.asarray(flat[dst]), how, inverse=True)
        for src, dst, how in published_names(variant, cfg.n_layer, cfg.bias)}
  if variant == "sigma_gpt":
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
  return sd


def _not_a_torch_file(path: str) -> str | None:
  """Why the bytes of ``path`` cannot be a ``torch.save`` file (None: they may be one)."""
  with open(path, "rb") as f:
    head = f.read(4)
  if not head:
    return "is empty"
  if head.startswith(b"PK\x03\x04"):              # torch.save's zip archive
    if not zipfile.is_zipfile(path):
      return ("is truncated or corrupt: its zip archive has no central directory (an "
              "incomplete download or copy?)")
    return None
  if head[:1] == b"\x80":                          # a legacy (pre-1.6) pickle
    return None
  return (f"is not a PyTorch checkpoint (torch.save writes a zip archive; this file starts with "
          f"{head!r})")


def _torch_reason(err: BaseException) -> str:
  """The line of a torch.load error that says what is wrong (torch's are paragraphs)."""
  lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
  for ln in lines:
    if "Unsupported global" in ln:
      return ln.split("Unsupported global:", 1)[1].split(". Please", 1)[0].strip()
  return (lines[0] if lines else type(err).__name__)[:200]


def read_torch_checkpoint(path: str, trust_pickle: bool = False) -> dict:
  """Reads a published ``.pt``; every bad file is a ValueError of one line naming ``path``."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint file {path} does not exist")
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("reading .pt checkpoints needs torch: pip install -r "
                      "requirements-extra.txt (torch==2.13.0, the CPU wheel)") from e
  why = _not_a_torch_file(path)
  if why:
    raise ValueError(f"{path} {why}")
  try:
    ck = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
  except Exception as e:  # pylint: disable=broad-except
    reason = _torch_reason(e)
    if not trust_pickle and "Unsupported global" in str(e):
      raise ValueError(f"{path}: torch.load(weights_only=True) refused to unpickle {reason}; if "
                       f"you trust the file, pass --trust_pickle") from e
    raise ValueError(f"{path} is truncated or corrupt: torch.load failed ({type(e).__name__}: "
                     f"{reason})") from e

  def to_np(t):
    return t.detach().float().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)

  if not isinstance(ck, Mapping) or not isinstance(ck.get("model"), Mapping):
    what = f"keys: {sorted(map(str, ck))[:10]}" if isinstance(ck, Mapping) else type(ck).__name__
    raise ValueError(f"{path}: no 'model' state dict ({what}); not a published AO-GPT/sigma-GPT "
                     f"checkpoint")
  out = dict(ck)
  out["model"] = {k: to_np(v) for k, v in ck["model"].items()}
  ema = ck.get("ema_model", ck.get("ema"))
  if ema is not None:
    out["ema_model"] = dict(ema, shadow_params=[to_np(t) for t in ema["shadow_params"]])
  return out


def convert_checkpoint(ck: Mapping[str, Any], which: str = "ema", variant: str = "auto",
                       **overrides) -> tuple[model_lib.AOGPT, model_lib.ModelConfig]:
  """A read checkpoint dict -> (our model, config); ``which`` is ``ema`` or ``params`` (the live
  weights; ``live`` is accepted too)."""
  sd = _strip(ck["model"])
  variant = detect_variant(sd) if variant == "auto" else variant
  cfg = infer_config(sd, variant, ck.get("model_args"), **overrides)
  if which == "ema":
    if "ema_model" not in ck:
      raise ValueError("checkpoint has no 'ema_model' entry; use which='params'")
    flat = state_dict_to_flat(sd, variant, cfg, ck["ema_model"]["shadow_params"])
  elif which in ("params", "live"):
    flat = state_dict_to_flat(sd, variant, cfg)
  else:
    raise ValueError(f"which must be 'ema' or 'params', got {which!r}")
  return model_from_flat(flat, cfg), cfg


def export_safetensors(m: model_lib.AOGPT, out_dir: str, layout: str = "aogpt_jax",
                       variant: str | None = None, meta: Mapping[str, Any] | None = None) -> str:
  """Writes ``out_dir/model.safetensors`` and ``config.json``; ``layout="published"`` uses the
  published PyTorch names and [out, in] weights (loadable by the published model code).
  ``variant``: the published model code the weights belong to (default: `published_variant`)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  variant = variant or published_variant(m.cfg)
  if layout == "published":
    check_published(m.cfg, variant)      # before anything is written
  os.makedirs(out_dir, exist_ok=True)
  flat = model_to_flat(m)
  if layout == "published":
    tensors = flat_to_state_dict(flat, variant, m.cfg)
    if variant == "sigma_gpt":
      tensors.pop("lm_head.weight")           # the tied head: stored once, as wte
  elif layout == "aogpt_jax":
    tensors = flat
  else:
    raise ValueError(f"export layout must be 'aogpt_jax' or 'published', got {layout!r}")
  save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
            os.path.join(out_dir, "model.safetensors"))
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump({"format": layout, "variant": variant, "model": m.cfg.to_dict(),
               "meta": dict(meta or {})}, f, indent=2)
  return out_dir


def load_safetensors(path: str) -> tuple[model_lib.AOGPT, model_lib.ModelConfig]:
  """Loads a folder written by `export_safetensors` (either layout)."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  for f in ("config.json", "model.safetensors"):
    if not os.path.exists(os.path.join(path, f)):
      raise FileNotFoundError(f"expected {os.path.join(path, f)} (written by "
                              f"`python -m aogpt_jax.checkpoints.convert`)")
  with open(os.path.join(path, "config.json")) as f:
    meta = json.load(f)
  cfg = model_lib.ModelConfig(**meta["model"])
  flat = load_file(os.path.join(path, "model.safetensors"))
  if meta.get("format") == "published":
    if meta["variant"] == "sigma_gpt":
      flat["lm_head.weight"] = flat["transformer.wte.weight"]
    flat = state_dict_to_flat(flat, meta["variant"], cfg)
  return model_from_flat(flat, cfg), cfg


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(prog="python -m aogpt_jax.checkpoints.convert",
                               description="Import published AO-GPT/sigma-GPT checkpoints; "
                                           "export ours to safetensors.")
  common = argparse.ArgumentParser(add_help=False)
  common.add_argument("--verbose", action="store_true",
                      help="on an error, the full traceback instead of one line")
  sub = ap.add_subparsers(dest="cmd", required=True)
  imp = sub.add_parser("import", parents=[common],
                       help="published .pt -> OUT/{ema,params}/ safetensors")
  imp.add_argument("--ckpt", required=True)
  imp.add_argument("--out", required=True)
  imp.add_argument("--which", default="ema,params", help="ema and/or params (live weights)")
  imp.add_argument("--variant", default="auto", choices=("auto",) + VARIANTS)
  imp.add_argument("--n_head", type=int, default=0, help="sigma-GPT without model_args")
  imp.add_argument("--valid_vocab_size", type=int, default=0)
  imp.add_argument("--trust_pickle", action="store_true")
  exp = sub.add_parser("export", parents=[common], help="our checkpoint -> safetensors")
  exp.add_argument("--workdir", required=True)
  exp.add_argument("--which", default="ema", choices=("ema", "params"))
  exp.add_argument("--out", default="", help="the safetensors folder")
  exp.add_argument("--hub-dir", dest="hub_dir", default="",
                   help="a folder ready for the Hugging Face Hub: the safetensors folder plus a "
                        "model card README.md (architecture, training recipe, WORKDIR/eval tables)")
  exp.add_argument("--layout", default="aogpt_jax", choices=("aogpt_jax", "published"))
  gpt = sub.add_parser("from-gpt", parents=[common],
                       help="a left-to-right GPT (gpt2:DIR, gpt2:OWNER/REPO, causal:DIR, "
                            "l2r:WORKDIR) -> an AO-GPT folder that computes the same logits "
                            "under the L2R order")
  gpt.add_argument("--spec", required=True,
                   help="gpt2:DIR, gpt2:OWNER/REPO, causal:DIR[?block_size=N] or l2r:WORKDIR")
  gpt.add_argument("--out", required=True, help="the safetensors folder (new or empty)")
  gpt.add_argument("--which", default="ema", choices=("ema", "params"), help="l2r: weights")
  gpt.add_argument("--target", default="adaln", help="target conditioning of the AO-GPT")
  gpt.add_argument("--seed", type=int, default=0, help="init of the adaLN target table")
  a = ap.parse_args(argv)
  if a.cmd == "export" and not (a.out or a.hub_dir):
    ap.error("export: pass --out DIR and/or --hub-dir DIR")
  where = {"import": getattr(a, "ckpt", ""), "from-gpt": getattr(a, "spec", "")}.get(
      a.cmd, getattr(a, "workdir", ""))
  errors.run_cli(lambda _: _run(a), argv, prog=f"convert {a.cmd}", errors=(Exception,),
                 where=where)


def _check_empty_target(folder: str, flag: str) -> None:
  """An output folder must be new or empty: an export never replaces a run's config.json or an
  earlier export."""
  if os.path.isdir(folder) and os.listdir(folder):
    raise FileExistsError(f"{flag}: {folder} is not empty (holds {sorted(os.listdir(folder))[:5]})"
                          f"; nothing is overwritten: pass a new or empty folder")
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise FileExistsError(f"{flag}: {folder} is a file, not a folder")


def _run(a: argparse.Namespace) -> None:
  if a.cmd == "from-gpt":
    _from_gpt(a)
  elif a.cmd == "import":
    for which in a.which.split(","):
      _check_empty_target(os.path.join(a.out, which), "--out")
    ck = read_torch_checkpoint(a.ckpt, a.trust_pickle)
    over = {k: v for k, v in (("n_head", a.n_head), ("valid_vocab_size", a.valid_vocab_size)) if v}
    for which in a.which.split(","):
      m, cfg = convert_checkpoint(ck, which, a.variant, **over)
      out = export_safetensors(m, os.path.join(a.out, which), variant=published_variant(cfg),
                               meta={
          "source": os.path.abspath(a.ckpt), "which": which, "iter_num": ck.get("iter_num")})
      print(f"wrote {out} ({cfg.n_layer} layers, d={cfg.n_embd}, target={cfg.target})")
  else:
    if a.out and a.hub_dir and os.path.abspath(a.out) == os.path.abspath(a.hub_dir):
      raise ValueError(f"--out and --hub-dir are the same folder {a.out}; pass one of them")
    for out, flag in ((a.out, "--out"), (a.hub_dir, "--hub-dir")):
      if out:
        _check_empty_target(out, flag)
    from aogpt_jax.checkpoints import store  # pylint: disable=g-import-not-at-top  (Orbax: export only)
    m, run_cfg = store.load_model(a.workdir, which=a.which)   # (model, the run's config)
    loaded = run_cfg.loaded.to_dict()
    meta = {"workdir": os.path.abspath(a.workdir), "which": loaded.get("weights", a.which),
            "iter_num": loaded.get("step")}
    for out in (a.out, a.hub_dir):
      if out:
        print(f"wrote {export_safetensors(m, out, a.layout, meta=meta)}")
    if a.hub_dir:
      from aogpt_jax.checkpoints import model_card  # pylint: disable=g-import-not-at-top
      print(f"wrote {model_card.write(a.hub_dir, m.cfg, a.workdir, loaded)}; upload the folder "
            f"with `hf upload OWNER/REPO {a.hub_dir}`")


def _from_gpt(a: argparse.Namespace) -> None:
  """``convert from-gpt``: writes the converted AO-GPT like ``import`` does (never over files)."""
  from aogpt_jax.checkpoints import from_causal  # pylint: disable=g-import-not-at-top
  _check_empty_target(a.out, "--out")   # never over a run's config.json or another export
  m, cfg, prov = from_causal.load_any(a.spec, a.which, target=a.target, seed=a.seed)
  out = export_safetensors(m, a.out, meta={"source": a.spec, "which": prov.get("weights"),
                                           "iter_num": prov.get("step"), "converted_by":
                                           "python -m aogpt_jax.checkpoints.convert from-gpt"})
  print(f"wrote {out} ({cfg.n_layer} layers, d={cfg.n_embd}, target={cfg.target}, the same "
        f"logits as {a.spec} under the L2R order)")


if __name__ == "__main__":
  main()
