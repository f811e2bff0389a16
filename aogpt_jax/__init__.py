"""aogpt_jax: Any-Order GPT (AO-GPT) in JAX / Flax NNX.

The few names most users need, imported on first use (``import aogpt_jax`` loads no JAX)::

    model, cfg = aogpt_jax.load(SPEC)     # a training WORKDIR, a converted folder, a published
                                          # .pt or hf:OWNER/REPO/PATH (see checkpoints/spec.py)
    aogpt_jax.AOGPT, aogpt_jax.ModelConfig                      # aogpt_jax.model.aogpt
    aogpt_jax.SampleSettings, aogpt_jax.generate                # aogpt_jax.sampling
    aogpt_jax.EvalSettings, aogpt_jax.evaluate                  # aogpt_jax.evaluation

Packages, lower to higher (a lower one never imports a higher one): ``data`` and ``model``;
``config`` (config.py, config_groups.py, recipes.py); ``checkpoints`` and ``train``;
``sampling``; ``evaluation``; ``modes`` and ``main`` (the command line).
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "AOGPT": "aogpt_jax.model.aogpt", "ModelConfig": "aogpt_jax.model.aogpt",
    "SampleSettings": "aogpt_jax.sampling.sampler", "generate": "aogpt_jax.sampling.sampler",
    "EvalSettings": "aogpt_jax.evaluation.settings", "evaluate": "aogpt_jax.evaluation.zero_shot",
}

__all__ = sorted(_EXPORTS) + ["load", "lazy_exports"]


def load(spec: str, which: str = "ema"):
  """``(model, config)`` from SPEC: a training WORKDIR (its newest readable checkpoint; ``config``
  is the run's config), or anything ``--checkpoint`` accepts: a folder written by
  ``python -m aogpt_jax.checkpoints.convert``, a published PyTorch ``.pt``, ``hf:OWNER/REPO/PATH``
  in the local Hugging Face cache. ``which``: ``ema`` (default) or ``params``. ``config.loaded``
  says what was loaded; ``config.data.tokenizer`` names the tokenizer."""
  return importlib.import_module("aogpt_jax.checkpoints.spec").load_any(spec, which)


def lazy_exports(package: str, exports: dict[str, str], modules: tuple[str, ...] = ()):
  """``(__getattr__, __dir__, __all__)`` for a package whose names are imported on first use:
  ``exports`` maps a name to the module (relative to ``package``, or absolute) that defines it;
  ``modules`` are submodules reachable as attributes. Keeps ``import aogpt_jax.x`` free of JAX
  until a name that needs it is used."""
  def module(name: str) -> str:
    return name if name.startswith("aogpt_jax") else f"{package}.{name}"

  def getattr_(name):
    if name in exports:
      return getattr(importlib.import_module(module(exports[name])), name)
    if name in modules:
      return importlib.import_module(module(name))
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

  names = sorted(exports) + list(modules)
  return getattr_, lambda: sorted(set(names) | set(vars(importlib.import_module(package)))), names


_getattr, __dir__, _ = lazy_exports("aogpt_jax", _EXPORTS)


def __getattr__(name):
  return _getattr(name)
