"""Config groups owned by other modules, registered by their owners.

`config.default_config()` builds the run-wide groups itself (model, order, optimizer, mesh,
data, checkpoint, distributed) and takes the others from here, so `config.py` imports no
sampler or evaluation code::

    eval    aogpt_jax/evaluation/settings.py   held-out eval during training and --mode=eval
    sample  aogpt_jax/sampling/config.py       --mode=sample (and genppl's sampling)
    rl      aogpt_jax/posttrain/settings.py    --mode=rl (GRPO)

An owner calls ``register(NAME, factory)`` at import time. `groups()` is the one place that
builds them: it imports each owner listed in `OWNERS` first (so a config is complete whoever
asks for it), which is why this module imports nothing of the package at the top: the owners
import it, not the other way round, and the import graph stays acyclic
(tests/test_import_graph.py).
"""

from __future__ import annotations

import importlib
from typing import Callable

# group name -> the module that registers it (imported by `groups()`).
OWNERS = {"eval": "aogpt_jax.evaluation.settings", "sample": "aogpt_jax.sampling.config",
          "rl": "aogpt_jax.posttrain.settings"}

_FACTORIES: dict[str, Callable] = {}


def register(name: str, factory: Callable) -> Callable:
  """Registers ``factory() -> ConfigDict`` as the defaults of the ``name`` group; returns it."""
  if name not in OWNERS:
    raise ValueError(f"config group {name!r}: not in config_groups.OWNERS {sorted(OWNERS)}")
  _FACTORIES[name] = factory
  return factory


def groups() -> dict:
  """``{name: a fresh ConfigDict of defaults}`` for every group in `OWNERS`."""
  for name, owner in OWNERS.items():
    if name not in _FACTORIES:
      importlib.import_module(owner)
    if name not in _FACTORIES:
      raise RuntimeError(f"config group {name!r}: {owner} did not register it")
  return {name: _FACTORIES[name]() for name in OWNERS}
