"""Command-line entry point::

    python -m aogpt_jax.main --config=configs/quickstart.py --workdir=/tmp/run [--mode=train]
    python -m aogpt_jax.main --config=configs/experiments/fig8_ema.py:0.999,tiny --workdir=...
    python -m aogpt_jax.main --config=configs/aogpt_small.py --config.batch_size=256 ...

``--config`` is an ml_collections config file with an optional ``:arg`` passed to its
``get_config(arg)``; every field can be overridden as ``--config.a.b=value``. ``--mode`` picks a
function from `MODES` (each takes ``(config, workdir)``): train (`train.loop`), and eval, sample,
genppl, prepare, solve, rl and dpo (`modes`). ``jax.distributed.initialize()`` runs first when
the config (``distributed.enabled``) or the environment (AOGPT_DISTRIBUTED=1) asks for it.

Bad input (a missing config file, a misspelt key, a bad ``:arg``, a bad value, an unwritable
folder, a non-finite loss) ends the run with one line on stderr and exit status 1; ``--verbose``
shows the full traceback instead.
"""

from __future__ import annotations

import logging as std_logging
import os
import signal
import sys
from typing import Callable


from aogpt_jax import errors  # the lowest layer: imports nothing heavy

if __name__ == "__main__":
  errors.exit_on_ctrl_c("aogpt_jax")   # the imports below take seconds


def _interrupted(detail: str = "") -> None:
  """Ctrl-C: one line, status 130 (`errors.exit_interrupted`: no interpreter teardown)."""
  from aogpt_jax import errors  # pylint: disable=g-import-not-at-top
  errors.exit_interrupted("aogpt_jax", detail)

from absl import app, flags, logging
from ml_collections import config_flags

from aogpt_jax import config as config_lib
from aogpt_jax.errors import _root, one_line  # shared by every CLI (aogpt_jax/errors.py)
from aogpt_jax import checks
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
    "checkpoint", "", "eval/sample/genppl/solve: load this instead of WORKDIR's checkpoint "
    "(published .pt, converted folder, hf:OWNER/REPO/PATH from the local HF cache, "
    "hf:/local/hub/folder, gpt2:DIR (a Hugging Face GPT-2) or l2r:WORKDIR (a model.target=none run), both as AO-GPTs; "
    "see aogpt_jax/checkpoints/spec.py); WORKDIR then only receives outputs.")

CHECKPOINT_MODES = ("eval", "sample", "genppl", "solve")   # the modes that take --checkpoint

# mode name -> function(config, workdir).
MODES: dict[str, Callable[..., object]] = {
    "train": train_loop.train,
    "eval": modes.eval_mode,
    "sample": modes.sample_mode,
    "prepare": modes.prepare_mode,
    "genppl": modes.genppl_mode,
    "solve": modes.solve_mode,
    "rl": modes.rl_mode,
    "dpo": modes.dpo_mode,
}


class _QuietLibraries:
  """The console's lines: drops the INFO chatter of orbax and grain (one line per array per
  checkpoint), JAX's backend probes ("Unable to initialize backend 'tpu'") and, unless
  --verbose, the details that go to WORKDIR/train.log only: lines marked `train.loop.FILE_ONLY`
  (the model config, the parameter table, the mesh, the compile), the model's notes (which
  attention kernel) and, while training, the data preparation's."""

  def __init__(self, verbose: bool = False, mode: str = "train"):
    self.verbose, self.mode = verbose, mode

  def filter(self, record) -> bool:
    if record.levelno >= std_logging.WARNING:
      return True
    if not self.verbose and (
        getattr(record, "file_only", False) or "/aogpt_jax/model/" in record.pathname
        or (self.mode == "train" and "/aogpt_jax/data/" in record.pathname)):
      return False
    if str(record.msg).startswith("Unable to initialize backend"):
      return False
    return not any(f"/{lib}/" in record.pathname for lib in ("orbax", "grain"))


class _ConsoleFormat(std_logging.Formatter):
  """Lines for a person: the message alone (a warning or an error says so); --verbose keeps
  absl's prefix (level, time, thread, file:line)."""

  def format(self, record) -> str:
    msg = record.getMessage()
    if record.exc_info:
      msg += "\n" + self.formatException(record.exc_info)
    if record.levelno >= std_logging.ERROR:
      return f"error: {msg}"
    return f"warning: {msg}" if record.levelno >= std_logging.WARNING else msg


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
    sys.exit(f"aogpt_jax: config error: {_flag_error(argv, e) or one_line(_root(e))}")


def _config_arg(argv) -> str | None:
  for i, a in enumerate(argv[1:], 1):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _load_config_file(spec: str):
  """The config of ``--config=FILE[:ARG]`` (only to name a bad override's key; None if it
  cannot be loaded)."""
  from aogpt_jax import recipes  # pylint: disable=g-import-not-at-top
  path, _, arg = spec.partition(":")
  try:
    return recipes.config_file(path, arg)
  except Exception:  # noqa: BLE001 - the file's own error is reported by the caller
    return None


def _paths(node, prefix: str = "") -> list[str]:
  out = []
  for k in node.keys():
    v = node[k]
    out += _paths(v, f"{prefix}{k}.") if hasattr(v, "keys") else [prefix + k]
  return out


POSTTRAIN_GROUPS = ("rl", "dpo")   # --mode=rl / dpo: their rollouts read these, not sample.*


def ignored_overrides(argv, mode: str) -> str | None:
  """One line for a ``--config.sample.*`` override under --mode=rl / dpo, which ignore the
  sample group (it was accepted and silently unused), else None."""
  if mode not in POSTTRAIN_GROUPS:
    return None
  bad = next((a for a in argv[1:] if a.startswith("--config.sample.")), None)
  if bad is None:
    return None
  return (f"{bad.split('=')[0]}: --mode={mode} ignores the sample group (its rollouts and "
          f"held-out eval follow the {mode}.* keys: --config.{mode}.KEY); drop it")


def wrong_mode(cfg, mode: str) -> str | None:
  """One line when a post-training config (``train.for_mode``: rl, dpo) runs in another mode
  (``configs/task.py:tiny,rl`` without --mode=rl trained a new model from scratch)."""
  if cfg is None:        # no --config: its own one-line error comes later
    return None
  want = str(cfg.get("train", {}).get("for_mode", "") or "")
  if not want or mode == want or mode not in ("train", "rl", "dpo"):
    return None
  return (f"train.for_mode: this config is for --mode={want} (post-training from "
          f"train.init_from), not --mode={mode}; add --mode={want}, or use the config without "
          f"':{want}' to {'train a model' if mode == 'train' else 'run --mode=' + mode}")


def _flag_error(argv, e: BaseException) -> str | None:
  """One line for a bad ``--config.KEY=VALUE`` (a misspelt key, with the closest key; a value
  of the wrong type, with the expected type), or for a bad ``--config=FILE:ARG``; None when
  ``e`` is something else."""
  import difflib  # pylint: disable=g-import-not-at-top
  chain, x = [], e
  while x is not None and x not in chain:
    chain.append(x)
    x = x.__cause__ or x.__context__
  spec = _config_arg(argv) or ""
  if any(isinstance(x, ValueError) and str(x).startswith("config argument") for x in chain):
    inner = next(x for x in chain if str(x).startswith("config argument"))
    return f"--config={spec}: {str(inner).split(': ', 1)[1]}"
  bad = next((a for a in argv[1:] if a.startswith("--config.") and f"flag {a.split('=')[0]}"
              in str(e)), None)   # absl names the flag whose value failed to parse
  cfg = _load_config_file(spec)
  if cfg is None:
    return None
  overrides = [a[len("--config."):] for a in argv[1:] if a.startswith("--config.")]
  for item in overrides:
    path, _, value = item.partition("=")
    node, parts, kind = cfg, path.split("."), None
    for i, part in enumerate(parts):
      if hasattr(node, "keys") and part in node.keys():
        kind = node.get_type(part) if hasattr(node, "get_type") else type(node[part])
        node = node[part]
        continue
      if not hasattr(node, "keys"):
        break                   # below a leaf: let ml_collections' own message stand
      where = ".".join(parts[:i])
      close = [f"{where + '.' if where else ''}{c}" for c in
               difflib.get_close_matches(part, list(node.keys()), n=1, cutoff=0.6)]
      if not close and parts[0] in POSTTRAIN_GROUPS:   # rl / dpo ignore the other groups' keys
        return (f"--config.{path}: no config key {'.'.join(parts[:i + 1])!r}; the keys of "
                f"{where} are: {', '.join(sorted(node.keys()))}")
      if not close:   # a key of another group? (--config.stpes -> sample.steps)
        leaves = {}
        for p in _paths(cfg):
          leaves.setdefault(p.rsplit(".", 1)[-1], []).append(p)
        close = [p for c in difflib.get_close_matches(part, list(leaves), n=1, cutoff=0.6)
                 for p in leaves[c]][:3]
      key = ".".join(parts[:i + 1])
      hint = (f"did you mean {' or '.join('--config.' + c for c in close)}?" if close else
              f"the keys of {where or 'the config'} are: {', '.join(sorted(node.keys()))}")
      return f"--config.{path}: no config key {key!r}; {hint}"
    if bad is not None and bad.startswith(f"--config.{path}="):
      kind = {bool: "true or false", int: "an integer", float: "a number (float)",
              str: "a string"}.get(kind, getattr(kind, "__name__", str(kind)))
      return f"--config.{path}: expected {kind}, got {value!r}"
  return None


def main(argv) -> None:
  console = logging.get_absl_handler().python_handler
  console.addFilter(_QuietLibraries(_VERBOSE.value, _MODE.value))
  if not _VERBOSE.value:
    console.setFormatter(_ConsoleFormat())
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  ignored = ignored_overrides(sys.argv, _MODE.value)
  if ignored:
    raise SystemExit(f"aogpt_jax: config error: {ignored}")
  wrong = wrong_mode(_CONFIG.value, _MODE.value)
  if wrong:
    raise SystemExit(f"aogpt_jax: config error: {wrong}")
  if _MODE.value not in MODES:   # one line, without absl's usage text
    import difflib  # pylint: disable=g-import-not-at-top
    close = difflib.get_close_matches(_MODE.value, list(MODES), n=1)
    raise SystemExit(f"aogpt_jax: --mode={_MODE.value}: unknown mode; known: "
                     f"{', '.join(sorted(MODES))}" + (f"; did you mean --mode={close[0]}?"
                                                      if close else ""))
  try:
    cfg = _CONFIG.value
  except Exception as e:  # noqa: BLE001 - the config file failed to load
    if _VERBOSE.value:
      raise
    raise SystemExit(f"aogpt_jax: config error: --config: {one_line(_root(e))}"
                     ) from None
  if cfg is None:   # one line, without absl's usage text
    raise SystemExit("aogpt_jax: --config is required (e.g. --config=configs/quickstart.py)")
  if not _WORKDIR.value:
    raise SystemExit("aogpt_jax: --workdir is required (e.g. --workdir=/tmp/aogpt_quickstart: "
                     "the run's folder)")
  try:
    if config_lib.task_module_of_run(cfg, _WORKDIR.value, cfg.train.init_from):
      logging.info("task.module=%s: the run's (its config.json)", cfg.task.module)
    config_lib.import_task_module(cfg)   # a task of one's own, in every mode
    sharding_lib.maybe_initialize_distributed(cfg)   # before anything touches the devices
    logging.info("mode %s, workdir %s", _MODE.value, _WORKDIR.value, extra=train_loop.FILE_ONLY)
    if _CHECKPOINT.value and _MODE.value not in CHECKPOINT_MODES:   # one line, no usage text
      raise SystemExit(f"aogpt_jax: --checkpoint: only for --mode={', '.join(CHECKPOINT_MODES)}"
                       f", not {_MODE.value} (rl and dpo start from --config.train.init_from)")
    # The command's one checks stage, before anything is created, loaded or compiled.
    checked = checks.check(_MODE.value, cfg, _WORKDIR.value, _CHECKPOINT.value)
    kw = {"checkpoint": _CHECKPOINT.value} if _CHECKPOINT.value else {}
    if checked is not None:
      kw["checked"] = checked
    MODES[_MODE.value](cfg, _WORKDIR.value, **kw)
  except config_lib.ConfigError as e:
    if _VERBOSE.value:
      raise
    raise SystemExit(f"aogpt_jax: config error: {one_line(e).split(': ', 1)[1]}") from None
  except (ValueError, OSError, FloatingPointError) as e:
    # bad input found before compiling, an unwritable folder, a non-finite loss
    if _VERBOSE.value:
      raise
    raise SystemExit(f"aogpt_jax: {one_line(e)}") from None
  except KeyboardInterrupt as e:   # Ctrl-C (training saved its checkpoint first): status 130
    if _VERBOSE.value:
      raise
    _interrupted(str(e))


if __name__ == "__main__":
  # KeyboardInterrupt from here on (re-delivered when it lands in a gc callback)
  from aogpt_jax.errors import ctrl_c_handler  # pylint: disable=g-import-not-at-top
  signal.signal(signal.SIGINT, ctrl_c_handler)
  try:
    app.run(main, flags_parser=parse_flags)
  except KeyboardInterrupt:
    if _verbose(sys.argv):
      raise
    _interrupted()
