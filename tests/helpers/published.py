"""Small checkpoints in the formats a new user meets, built without downloads: a random-weight
converted folder of a tiny AO-GPT (byte vocabulary) and a random GPT-2 evaluator folder in the
Hugging Face layout (numpy + safetensors only, no torch)."""

from __future__ import annotations

import json
import os

import numpy as np
from flax import nnx

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.checkpoints import convert

TINY = dict(n_layer=1, n_embd=32, n_head=2, target_dim=8, block_size=32, dtype="float32")


def tiny_model(seed: int = 0, **kw) -> model_lib.AOGPT:
  return model_lib.AOGPT(model_lib.preset("tiny", **(TINY | kw)), rngs=nnx.Rngs(seed))


def converted_folder(path, seed: int = 0, **kw) -> str:
  """A folder as `convert import` writes it (OUT/ema), from a random tiny model."""
  convert.export_safetensors(tiny_model(seed, **kw), os.path.join(path, "ema"),
                             meta={"which": "ema", "iter_num": 3})
  return str(path)


def gpt2_folder(path, vocab: int = 257, n_positions: int = 32, n_embd: int = 16,
                n_layer: int = 1, n_head: int = 2, seed: int = 0) -> str:
  """A random GPT-2 in the Hugging Face file layout (config.json + model.safetensors)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  r = lambda *s: (0.2 * rng.standard_normal(s)).astype(np.float32)
  d = n_embd
  t = {"wte.weight": r(vocab, d), "wpe.weight": r(n_positions, d),
       "ln_f.weight": 1 + r(d), "ln_f.bias": r(d)}
  for i in range(n_layer):
    p = f"h.{i}."
    for ln in ("ln_1", "ln_2"):
      t[p + ln + ".weight"], t[p + ln + ".bias"] = 1 + r(d), r(d)
    for name, i_, o in (("attn.c_attn", d, 3 * d), ("attn.c_proj", d, d),
                        ("mlp.c_fc", d, 4 * d), ("mlp.c_proj", 4 * d, d)):
      t[p + name + ".weight"], t[p + name + ".bias"] = r(i_, o), r(o)
  os.makedirs(path, exist_ok=True)
  save_file(t, os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(dict(model_type="gpt2", vocab_size=vocab, n_positions=n_positions, n_embd=d,
                   n_layer=n_layer, n_head=n_head), f)
  return str(path)


def hf_cache_repo(cache, repo: str, files: dict, rev: str = "main",
                  commit: str = "0123456789abcdef0123456789abcdef01234567") -> str:
  """Puts ``files`` ({path in repo: source file}) into a Hugging Face hub cache at ``cache`` as
  ``hf download`` leaves them (blobs, snapshot symlinks, refs/REV); returns the
  snapshot folder."""
  import shutil  # pylint: disable=g-import-not-at-top
  root = os.path.join(cache, "models--" + repo.replace("/", "--"))
  snap = os.path.join(root, "snapshots", commit)
  for i, (dst, src) in enumerate(sorted(files.items())):
    blob = os.path.join(root, "blobs", f"{i:040x}")
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    shutil.copyfile(src, blob)
    link = os.path.join(snap, dst)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
  os.makedirs(os.path.join(root, "refs"), exist_ok=True)
  with open(os.path.join(root, "refs", rev), "w") as f:
    f.write(commit)
  return snap


def folder_files(folder, prefix: str = "") -> dict:
  """{prefix/name: path} for the files of ``folder`` (for `hf_cache_repo`)."""
  return {os.path.join(prefix, n) if prefix else n: os.path.join(folder, n)
          for n in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, n))}


def published_pt(path, seed: int = 0, iter_num: int = 250_000, **kw) -> str:
  """A random-weight AO-GPT ``.pt`` in the published format (state dict in the published names,
  EMA shadow list in parameters() order, model_args), GPT-2 vocabulary by default."""
  import torch  # pylint: disable=g-import-not-at-top
  kw = dict(TINY, target_dim=128, vocab_size=50304, valid_vocab_size=50257) | kw
  m = tiny_model(seed, **kw)
  sd = convert.flat_to_state_dict(convert.model_to_flat(m), "aogpt", m.cfg)
  t = {k: torch.tensor(np.asarray(v, np.float32)) for k, v in sd.items()}
  c = m.cfg
  torch.save({"model": t, "iter_num": iter_num,
              "model_args": dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
                                 block_size=c.block_size, bias=c.bias, vocab_size=c.vocab_size,
                                 dropout=0.0),
              "ema_model": {"decay": 0.9999, "num_updates": 3,
                            "shadow_params": [0.5 * v for v in t.values()]}}, path)
  return str(path)
