"""Command-line entry point::

    python -m aogpt_jax.main --config=configs/quickstart.py --workdir=/tmp/run [--mode=train]
    python -m aogpt_jax.main --config=configs/experiments/fig8_ema.py:0.999,tiny --workdir=...
    python -m aogpt_jax.main --config=configs/aogpt_small.py --config.batch_size=256 ...

``--config`` is an ml_collections config file with an optional ``:arg`` passed to its
``get_config(arg)``; every field can be overridden as ``--config.a.b=value``. ``--mode`` picks a
function from `MODES` (each takes ``(config, workdir)``): train (`train.loop`), and eval, sample,
genppl and prepare (`modes`). ``jax.distributed.initialize()`` runs first when the config
(``distributed.enabled``) or the environment (AOGPT_DISTRIBUTED=1) asks for it.

Bad input (a missing config file, a misspelt key, a bad ``:arg``, a bad value, an unwritable
folder, a non-finite loss) ends the run with one line on stderr and exit status 1; ``--verbose``
shows the full traceback instead.
"""

from __future__ import annotations

import logging as std_logging
import os
import sys
from typing import Callable

from absl import app, flags, logging
from ml_collections import config_flags

from aogpt_jax import config as config_lib
from aogpt_jax.errors import _root, one_line  # shared by every CLI (aogpt_jax/errors.py)
from aogpt_jax import modes
from aogpt_jax.train import loop as train_loop
from aogpt_jax.train import sharding as sharding_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (optionally file.py:arg); override fields as --config.a.b=v.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder: checkpoints, metrics, config.json.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "On an error, show the full traceback instead of "
                             "one line.")
_MODE = flags.DEFINE_string("mode", "train", "What to do; one of the keys of MODES.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "", "eval/sample/genppl: load this instead of WORKDIR's checkpoint (published "
    ".pt, converted folder, hf:OWNER/REPO/PATH from the local HF cache, hf:/local/hub/folder, "
    "gpt2:DIR (a Hugging Face GPT-2) or l2r:WORKDIR (a model.target=none run), both as AO-GPTs; "
    "see aogpt_jax/checkpoints/spec.py); WORKDIR then only receives outputs.")

# mode name -> function(config, workdir).
MODES: dict[str, Callable[..., object]] = {
    "train": train_loop.train,
    "eval": modes.eval_mode,
    "sample": modes.sample_mode,
    "prepare": modes.prepare_mode,
    "genppl": modes.genppl_mode,
}


class _QuietLibraries:
  """Drops the INFO chatter of orbax and grain (one line per array per checkpoint)."""

  def filter(self, record) -> bool:
    return record.levelno >= std_logging.WARNING or not any(
        f"/{lib}/" in record.pathname for lib in ("orbax", "grain"))


def _verbose(argv) -> bool:
  return any(a in ("--verbose", "--verbose=true", "--verbose=True", "--verbose=1") for a in argv)


def parse_flags(argv):
  """absl's flag parsing, with a one-line error (no traceback unless --verbose) for a missing
  config file, a misspelt ``--config.KEY`` or a bad ``:arg``."""
  for i, a in enumerate(argv[1:], 1):
    value = (a.split("=", 1)[1] if a.startswith("--config=") else
             argv[i + 1] if a == "--config" and i + 1 < len(argv) else None)
    if value is not None:
      path = value.split(":", 1)[0]
      if not os.path.isfile(path):
        sys.exit(f"aogpt_jax: config error: --config: no such file: {path}")
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # noqa: BLE001 - any parse failure is bad input
    if _verbose(argv):
      raise
    sys.exit(f"aogpt_jax: config error: {one_line(_root(e))}")


def main(argv) -> None:
  logging.get_absl_handler().python_handler.addFilter(_QuietLibraries())
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _MODE.value not in MODES:
    raise app.UsageError(f"--mode={_MODE.value}: unknown mode; known: {', '.join(sorted(MODES))}")
  try:
    cfg = _CONFIG.value
  except Exception as e:  # noqa: BLE001 - the config file failed to load
    if _VERBOSE.value:
      raise
    raise SystemExit(f"aogpt_jax: config error: --config: {one_line(_root(e))}"
                     ) from None
  if cfg is None:
    raise app.UsageError("--config is required")
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required")
  try:
    config_lib.check_keys(cfg)
    sharding_lib.maybe_initialize_distributed(cfg)   # before anything touches the devices
    logging.info("mode %s, workdir %s", _MODE.value, _WORKDIR.value)
    if _CHECKPOINT.value:
      if _MODE.value not in ("eval", "sample", "genppl"):
        raise app.UsageError(f"--checkpoint: only for --mode=eval, sample or genppl, "
                             f"not {_MODE.value}")
      MODES[_MODE.value](cfg, _WORKDIR.value, checkpoint=_CHECKPOINT.value)
    else:
      MODES[_MODE.value](cfg, _WORKDIR.value)
  except config_lib.ConfigError as e:
    if _VERBOSE.value:
      raise
    raise SystemExit(f"aogpt_jax: config error: {one_line(e).split(': ', 1)[1]}") from None
  except (ValueError, OSError, FloatingPointError) as e:
    # bad input found before compiling, an unwritable folder, a non-finite loss
    if _VERBOSE.value:
      raise
    raise SystemExit(f"aogpt_jax: {one_line(e)}") from None


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
