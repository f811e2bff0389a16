"""``--checkpoint=SPEC``: load a model from somewhere other than a training WORKDIR.

SPEC is one of
* a published PyTorch ``.pt`` (AO-GPT or sigma-GPT): converted on the fly and cached as a
  safetensors folder next to it (``FILE.aogpt_jax/<which>/``), or under ``$AOGPT_JAX_CACHE``
  (default ``~/.cache/aogpt_jax``) when that directory is read-only;
* a folder written by ``python -m aogpt_jax.checkpoints.convert`` (``config.json`` +
  ``model.safetensors``);
* ``hf:OWNER/REPO[@REV]/PATH``: PATH (a ``.pt`` file or a converted / Hub folder) in the
  repository's snapshot in the local Hugging Face cache; ``hf:/local/DIR[/PATH]``: a folder laid
  out like a Hub repository (see `aogpt_jax.checkpoints.hub`; nothing is downloaded at run time);
* ``gpt2:DIR`` / ``gpt2:OWNER/REPO`` (a Hugging Face GPT-2), ``causal:DIR[?block_size=N]`` (a
  Hugging Face Llama / Mistral / Qwen2 / Qwen3 / Gemma causal LM, `from_causal`; its
  ``tokenizer.json`` becomes ``data.tokenizer=causal:DIR``) or ``l2r:WORKDIR`` (this project's
  left-to-right run): converted to the AO-GPT that computes the same logits under the L2R order
  (`aogpt_jax.checkpoints.from_gpt`).

`load` returns ``(model, model_config, provenance)``; provenance is a dict
``{"source": SPEC, "step": ..., "weights": "ema"|"params"}`` for output writers.
`load_any` (what ``aogpt_jax.load`` calls) also takes a training WORKDIR and returns
``(model, run_config)`` for every kind of SPEC.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

from aogpt_jax.checkpoints import convert
from aogpt_jax.checkpoints import from_causal
from aogpt_jax.checkpoints import from_gpt
from aogpt_jax.checkpoints import hub


_RUN = "AdaLN6_NoRep_cond_128_trunc_bs1M_wd_0.03_drop_0.0_CL_0.1_qknorm"
# The released checkpoints (Hugging Face repository Cauthyyy/AO-GPT-MDM) as SPECs.
PUBLISHED = {
    "aogpt_small": f"hf:Cauthyyy/AO-GPT-MDM/124M/124M-{_RUN}/ckpt_250000.pt",
    "aogpt_medium": f"hf:Cauthyyy/AO-GPT-MDM/350M/350M-{_RUN}/ckpt_460000.pt",
    "sigma_gpt_small": "hf:Cauthyyy/AO-GPT-MDM/sigmaGPT/124M/ckpt_1000000.pt",
    "sigma_gpt_medium": "hf:Cauthyyy/AO-GPT-MDM/sigmaGPT/350M/ckpt_740000.pt",
}
# valid_vocab_size -> the tokenizer such a checkpoint was trained with (data.get_tokenizer names).
DEFAULT_TOKENIZERS = {50257: "gpt2", 257: "byte"}


class CheckpointSpecError(ValueError):
  """A --checkpoint SPEC that cannot be loaded; the message names the SPEC and the fix."""


def _cache_dir(pt_path: str, which: str) -> str:
  st = os.stat(pt_path)
  beside = pt_path + ".aogpt_jax"
  parent = os.path.dirname(os.path.abspath(pt_path))
  if os.access(parent, os.W_OK) or os.path.isdir(os.path.join(beside, which)):
    return os.path.join(beside, which)
  key = hashlib.sha256(f"{os.path.abspath(pt_path)}|{st.st_size}|{st.st_mtime_ns}".encode())
  root = os.environ.get("AOGPT_JAX_CACHE", os.path.expanduser("~/.cache/aogpt_jax"))
  return os.path.join(root, key.hexdigest()[:16], which)


def _cache_valid(folder: str, pt_path: str) -> bool:
  try:
    with open(os.path.join(folder, "config.json")) as f:
      meta = json.load(f).get("meta", {})
  except (OSError, ValueError):
    return False
  st = os.stat(pt_path)
  return (meta.get("source_size") == st.st_size and meta.get("source_mtime_ns") == st.st_mtime_ns
          and os.path.exists(os.path.join(folder, "model.safetensors")))


def _from_pt(path: str, which: str, trust_pickle: bool):
  folder = _cache_dir(path, which)
  if _cache_valid(folder, path):
    m, cfg = convert.load_safetensors(folder)
    with open(os.path.join(folder, "config.json")) as f:
      return m, cfg, json.load(f)["meta"].get("iter_num")
  try:
    ck = convert.read_torch_checkpoint(path, trust_pickle)
    m, cfg = convert.convert_checkpoint(ck, which)
  except ImportError as err:
    raise CheckpointSpecError(f"--checkpoint={path}: {err}") from err
  except Exception as err:  # pylint: disable=broad-except  (any unreadable file: one line)
    raise CheckpointSpecError(f"--checkpoint={path}: not a readable published AO-GPT/sigma-GPT "
                              f"checkpoint ({type(err).__name__}: {str(err).splitlines()[0][:300]})"
                              ) from err
  st = os.stat(path)
  try:
    convert.export_safetensors(m, folder, variant=convert.published_variant(cfg), meta={
        "source": os.path.abspath(path), "which": which, "iter_num": ck.get("iter_num"),
        "source_size": st.st_size, "source_mtime_ns": st.st_mtime_ns})
  except OSError:
    pass                                    # no writable cache: converted again next time
  return m, cfg, ck.get("iter_num")


def _from_hf(spec: str) -> str:
  try:
    return hub.resolve(spec)
  except hub.HubError as err:
    raise CheckpointSpecError(f"--checkpoint={err}") from None


def load(spec: str, which: str | None = None, trust_pickle: bool = False):
  """SPEC -> (model, ModelConfig, provenance); see the module docstring. ``which``: "ema" or
  "params"; None (nothing asked): "ema", or the weights a converted folder holds, silently."""
  asked = which is not None
  which = "ema" if which is None else which
  if which not in ("ema", "params"):
    raise CheckpointSpecError(f"--checkpoint={spec}: which must be 'ema' or 'params', "
                              f"got {which!r}")
  if from_gpt.is_spec(spec):
    try:
      return from_causal.load_any(spec, which)
    except from_gpt.ConversionError as err:
      msg = str(err)
      raise CheckpointSpecError(msg if msg.startswith(spec) else f"--checkpoint={spec}: {msg}"
                                ) from None
  path = _from_hf(spec) if spec.startswith("hf:") else os.path.expanduser(spec)
  step = None
  if os.path.isdir(path):
    if os.path.isdir(os.path.join(path, which)) and not os.path.exists(
        os.path.join(path, "config.json")):
      path = os.path.join(path, which)     # the `convert import --out` layout: OUT/{ema,params}
    try:
      m, cfg = convert.load_safetensors(path)
      with open(os.path.join(path, "config.json")) as f:
        meta = json.load(f).get("meta", {})
    except FileNotFoundError as err:
      raise CheckpointSpecError(f"--checkpoint={spec}: {err}") from None
    except Exception as err:  # pylint: disable=broad-except
      raise CheckpointSpecError(f"--checkpoint={spec}: {path} is not a readable converted folder "
                                f"({type(err).__name__}: {str(err).splitlines()[0][:300]}); "
                                f"re-run `python -m aogpt_jax.checkpoints.convert`") from err
    step = meta.get("iter_num")
    weights = meta.get("which", "unknown")
    if asked and weights != which:   # a flat folder holds one set of weights: say which
      logging.warning("--checkpoint=%s: %s holds the %s weights only, not %s as asked; loading "
                      "them (the outputs record weights=%s)", spec, path, weights, which, weights)
  elif os.path.isfile(path):
    m, cfg, step = _from_pt(path, which, trust_pickle)
    weights = which
  else:
    raise CheckpointSpecError(f"--checkpoint={spec}: no such file or folder ({path}); expected a "
                              f"published .pt, a converted folder, or hf:OWNER/REPO/PATH")
  return m, cfg, {"source": spec, "step": step, "weights": weights}


def default_tokenizer(cfg) -> str:
  """The tokenizer name of a checkpoint's vocabulary (GPT-2 for 50257 ids, bytes for 257)."""
  if cfg.valid_vocab_size not in DEFAULT_TOKENIZERS:
    raise CheckpointSpecError(f"valid_vocab_size={cfg.valid_vocab_size}: no default tokenizer; "
                              f"name it (data.tokenizer / tokenizer=NAME)")
  return DEFAULT_TOKENIZERS[cfg.valid_vocab_size]


def check_vocab(cfg, tokenizer_name: str, vocab_size: int, provenance=None) -> None:
  """The tokenizer must fit the checkpoint: a one-line error naming both values (and, for a
  converted GPT-2, the file and tensor the vocabulary comes from)."""
  if vocab_size != cfg.valid_vocab_size:
    src = (provenance or {}).get("weights_file")
    where = f" (tensor 'wte.weight' of {src})" if src else ""
    raise CheckpointSpecError(
        f"data.tokenizer: {tokenizer_name!r} has {vocab_size} ids but the checkpoint has "
        f"valid_vocab_size={cfg.valid_vocab_size}{where}; use the checkpoint's tokenizer")


def load_any(spec: str, which: str = "ema"):
  """``(model, config)`` from a training WORKDIR (its newest readable checkpoint and its run
  config) or any SPEC `load` takes (a config with defaults, the checkpoint's model fields and
  its default tokenizer). ``config.loaded`` says what was loaded (source / checkpoint, step,
  weights)."""
  from aogpt_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from aogpt_jax.checkpoints import store  # pylint: disable=g-import-not-at-top
  path = os.path.expanduser(str(spec))
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return store.load_model(path, which=which)
  m, mc, prov = load(str(spec), which)
  cfg = config_lib.default_config()
  with cfg.unlocked():
    for k, v in mc.to_dict().items():
      if k in cfg.model:
        cfg.model[k] = v
    cfg.seq_len = mc.block_size
    if prov.get("tokenizer"):        # a converted causal LM: its own tokenizer.json
      cfg.data.tokenizer = prov["tokenizer"]
    elif mc.valid_vocab_size in DEFAULT_TOKENIZERS:
      cfg.data.tokenizer = DEFAULT_TOKENIZERS[mc.valid_vocab_size]
    cfg.loaded = prov
  return m, cfg


QUICKSTART_WORKDIR = "/tmp/aogpt_quickstart"   # README's quickstart run


def notebook_model(checkpoint: str | None = None, workdir: str | None = None):
  """The model both notebooks in colabs/ use, found the same way: ``(model, config, trained)``.

  1. ``checkpoint`` (default: $AOGPT_CHECKPOINT, else the published AO-GPT Small unless
     $AOGPT_WORKDIR is set; "" skips it): any SPEC `load_any` takes; on Colab an
     ``hf:Cauthyyy/...`` file is downloaded into the Hugging Face cache first;
  2. else the EMA weights of the training run in ``workdir`` (default: $AOGPT_WORKDIR, else the
     README quickstart's /tmp/aogpt_quickstart);
  3. else an UNTRAINED tiny model (random weights: every code path runs, every number and text
     is meaningless), announced in a banner and a warning.

  ``config`` is the run's config (``config.loaded`` says what was loaded; ``data.tokenizer``,
  ``seq_len``: the trained sequence length); ``trained`` is False only in case 3."""
  import sys  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from aogpt_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from aogpt_jax.model import aogpt as model_lib  # pylint: disable=g-import-not-at-top
  if workdir is None:
    workdir = os.environ.get("AOGPT_WORKDIR", "")
  if checkpoint is None:
    checkpoint = os.environ.get("AOGPT_CHECKPOINT",
                                "" if workdir else PUBLISHED["aogpt_small"])
  workdir = workdir or QUICKSTART_WORKDIR
  why = []
  if checkpoint:
    if "google.colab" in sys.modules and checkpoint.startswith("hf:Cauthyyy/"):
      from huggingface_hub import hf_hub_download  # pylint: disable=g-import-not-at-top
      repo, rev, path = hub.parse(checkpoint)
      hf_hub_download(repo, path, revision=rev)
    try:
      m, cfg = load_any(checkpoint)
      print(f"trained model: {checkpoint} {cfg.loaded.to_dict()}; tokenizer: "
            f"{cfg.data.tokenizer}")
      return m, cfg, True
    except (CheckpointSpecError, FileNotFoundError, ValueError) as e:
      why.append(str(e).splitlines()[0])
      print(f"{why[-1]}\n-> not loaded; trying the training run in {workdir}")
  try:
    m, cfg = load_any(workdir)
    print(f"trained model: the EMA weights of the run in {workdir} (step {cfg.loaded.step}, "
          f"trained on sequences of {cfg.seq_len})")
    return m, cfg, True
  except (CheckpointSpecError, FileNotFoundError, ValueError) as e:
    why.append(str(e).splitlines()[0])
  cfg = config_lib.default_config()
  m = model_lib.AOGPT(model_lib.preset("tiny"), rngs=nnx.Rngs(0))
  with cfg.unlocked():
    cfg.model.preset, cfg.seq_len = "tiny", 128
    cfg.data.source, cfg.data.tokenizer = "python_stdlib", "byte"
    cfg.loaded = {"source": "untrained", "step": None, "weights": "random"}
  rule = "!" * 78
  msg = (f"NO TRAINED MODEL: using an UNTRAINED tiny model (random weights). Every code path "
         f"runs, but every number and sample below is meaningless. Not found: "
         f"{' | '.join(why)}. Train the README quickstart (its run goes to {QUICKSTART_WORKDIR}) "
         f"or set AOGPT_WORKDIR / AOGPT_CHECKPOINT.")
  print(f"{rule}\n{msg}\n{rule}")
  warnings.warn(msg, stacklevel=2)
  return m, cfg, False
