"""One checks stage per command: `check(mode, cfg, workdir, checkpoint)` is what ``python -m
aogpt_jax.main`` runs, after parsing and before anything is created, loaded or compiled.

Each mode has one function here that takes the config as the command resolved it (task, model,
sampler, rl / dpo groups) and what the run folders record (a WORKDIR's or ``train.init_from``'s
newest checkpoint meta: mode and model fields, read from JSON, no weights), and raises the first
problem as one `ConfigError` line naming the key, the value and what is expected. This is the
one place to read what a command accepts. The functions it calls (``config.resolve``,
``modes.check_solve``, ``posttrain.rl.check``, ...) stay where their code lives, and the layers
below keep their own checks for Python callers; the command path does not rely on those.

What a check cannot see without the weights (a SPEC's model fields, a published checkpoint's
vocabulary) is checked when the mode loads it, with the same one-line errors.
"""

from __future__ import annotations

from typing import Callable

from aogpt_jax import config as config_lib
from aogpt_jax import modes
from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax.train import loop as train_loop
from aogpt_jax.train import sharding as sharding_lib


def _run_folder(workdir: str, mode: str) -> None:
  """A training-like mode's WORKDIR: a folder that can be written (nothing is left created)
  and, where it holds a run, one that this mode wrote."""
  if not workdir:
    raise config_lib.ConfigError("--workdir: required")
  checkpoint_lib.check_writable(workdir, "--workdir", keep=False)
  checkpoint_lib.check_mode(workdir, mode)


def _mesh(cfg) -> None:
  sharding_lib.check_batch_sizes(cfg, sharding_lib.make_mesh(cfg))


def check_train(cfg, workdir: str, checkpoint: str = "") -> None:
  del checkpoint
  mc = config_lib.resolve(cfg)
  config_lib.check_prompt_training(cfg, mc)
  config_lib.check_task(cfg)
  _mesh(cfg)
  _run_folder(workdir, "train")
  train_loop.check_init_from(cfg, mc)


def _posttrain(mode: str, check_group: Callable) -> Callable:
  def check_mode(cfg, workdir: str, checkpoint: str = "") -> None:
    from aogpt_jax.posttrain import run as run_lib  # pylint: disable=g-import-not-at-top
    del checkpoint
    mc = config_lib.resolve(cfg)
    config_lib.check_task(cfg)
    check_group(cfg, mc)
    run_lib.check_loop_config(cfg, mode)
    if not cfg.train.init_from:
      run_lib.starting_model(cfg, mc, mode)   # its one line for the missing key
    _mesh(cfg)
    _run_folder(workdir, mode)
    train_loop.check_init_from(cfg, mc, run_lib.LAYOUT_FIELDS, mode)
  check_mode.__doc__ = f"The checks of --mode={mode} (`posttrain.run`, the {mode} group)."
  return check_mode


def _rl_group(cfg, mc):
  from aogpt_jax.posttrain import rl  # pylint: disable=g-import-not-at-top
  rl.check(cfg, mc)


def _dpo_group(cfg, mc):
  from aogpt_jax.posttrain import dpo_run  # pylint: disable=g-import-not-at-top
  dpo_run.check(cfg, mc)


def check_prepare(cfg, workdir: str, checkpoint: str = "") -> None:
  del workdir, checkpoint
  config_lib.check_data(cfg)
  if int(cfg.seq_len) < 2:
    raise config_lib.ConfigError(f"seq_len: must be >= 2, got {cfg.seq_len}")


def _checks_only(fn: Callable) -> Callable[..., None]:
  """A mode's check whose result the mode computes again itself (cheap): nothing to pass on."""
  def check_mode(cfg, workdir: str, checkpoint: str = "") -> None:
    fn(cfg, workdir, checkpoint)
  check_mode.__doc__ = fn.__doc__
  return check_mode


COMMANDS: dict[str, Callable[..., object]] = {
    "train": check_train,
    "eval": _checks_only(modes.check_eval),
    "sample": modes.check_sample,
    "genppl": _checks_only(modes.check_genppl),
    "prepare": check_prepare,
    "solve": modes.check_solve,
    "rl": _posttrain("rl", _rl_group),
    "dpo": _posttrain("dpo", _dpo_group),
}


def check(mode: str, cfg, workdir: str, checkpoint: str = ""):
  """Raises the first problem of ``--mode=MODE`` with this config, WORKDIR and --checkpoint as
  one `ConfigError` (or the OSError of a folder that cannot be written), before anything is
  created or compiled. The config is checked on a copy: the mode resolves its own. Returns what
  the check prepared for the mode to go on with (``--mode=solve``: its puzzles, so they are not
  read twice), else None."""
  config_lib.check_keys(cfg)
  return COMMANDS[mode](cfg.copy_and_resolve_references(), workdir, checkpoint)

