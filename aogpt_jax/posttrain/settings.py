"""The ``rl`` config group (``--mode=rl``, registered in `aogpt_jax.config_groups`) and its
translation into `grpo.GRPOSettings`.

Its keys are every field of `grpo.GRPOSettings` (derived from the dataclass: a field added there
is a key here, with its default) plus the run's own:

    prompts      training puzzles per update (each sampled group_size times)
    reference    the frozen KL reference (a WORKDIR or --checkpoint SPEC; "" = the starting
                 weights, train.init_from); used only when kl_coef > 0
    ema_decay    EMA of the weights (0 = none; the trainer's warm-up); the held-out eval and
                 --mode=solve use it

The loop's keys are the trainer's: ``train.init_from`` (the starting weights, required),
``total_steps`` (updates), ``seed``, ``log_every``, ``eval_every``, ``checkpoint_every``,
``checkpoint.*``, ``task.*`` (the prompts' task; ``task.heldout_count`` puzzles for the held-out
eval).
"""

from __future__ import annotations

import dataclasses

from ml_collections import config_dict

from aogpt_jax import config_groups
from aogpt_jax.posttrain import grpo

GRPO_FIELDS = tuple(f.name for f in dataclasses.fields(grpo.GRPOSettings))
RUN_KEYS = {"prompts": 8, "reference": "", "ema_decay": 0.0}


def rl_config() -> config_dict.ConfigDict:
  """Defaults of the ``rl`` group: `grpo.GRPOSettings`'s fields and `RUN_KEYS`."""
  c = config_dict.ConfigDict()
  for f in dataclasses.fields(grpo.GRPOSettings):
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    c[f.name] = default
  for k, v in RUN_KEYS.items():
    c[k] = v
  return c


config_groups.register("rl", rl_config)


def grpo_settings(group) -> grpo.GRPOSettings:
  """`grpo.GRPOSettings` from the ``rl`` group (its GRPO fields)."""
  values = {k: group[k] for k in GRPO_FIELDS}
  return grpo.GRPOSettings(**{k: v.to_dict() if isinstance(v, config_dict.ConfigDict) else v
                              for k, v in values.items()})
