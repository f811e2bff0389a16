"""The ``data`` config group: defaults, and reading a (possibly partial) config.

`default_config()` is what configs put under ``config.data``. Every reader in this package goes
through `get(data_cfg, key)`, so a ConfigDict or dict that only sets ``source`` / ``tokenizer`` /
``cache_dir`` (the quickstart interface) still works: missing keys take the defaults below.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import ml_collections

DEFAULTS: dict[str, Any] = {
    # What to read.
    "source": "python_stdlib",   # see aogpt_jax.data.sources.SOURCES
    "tokenizer": "byte",         # byte | gpt2 | hf:/path/tokenizer.json
    "cache_dir": "",             # prepared data; "" -> $AOGPT_DATA_DIR or ~/.cache/aogpt_jax
    # Raw text for preparation (never read at training time).
    "path": "",                  # local raw files (a directory in HF layout, or one file) for a
                                 # named source; empty -> download (HF datasets / URL)
    "glob": "",                  # text_files: comma-separated globs of .txt/.jsonl/.json/.parquet
    "validation_glob": "",       # text_files: files of the validation split (else held out)
    "validation_fraction": 0.005,  # openwebtext: share of rows (content hash); text_files: share
                                   # of the text, by position (data/sources.py)
    "text_field": "",            # jsonl/parquet column; "" -> the source's (text; ptb: sentence)
    "txt_rows": "",              # .txt rows: "file" | "line"; "" -> the source's default
    "detokenizer": "",           # "" -> the source's (wikitext/ptb/lm1b/lambada); "none" disables
    "hf_cache_dir": "",          # HF datasets cache for downloads ("" -> HF default)
    "num_proc": 0,               # tokenization processes when preparing; 0 -> all cores
    "auto_prepare": True,        # prepare local sources (python_stdlib, text_files, data.path)
                                 # on first use instead of failing
    "verify": False,             # recompute each prepared split's sha256 when opening it
    # Streaming.
    "worker_count": 0,           # grain worker processes (> 0 needs absl flags parsed)
    "worker_buffer_size": 2,     # batches buffered per worker process
    "read_threads": 4,           # threads reading records in each process / worker
    "prefetch": 4,               # batches prefetched by the reading threads
}


def default_config() -> ml_collections.ConfigDict:
  """A fresh ``data`` ConfigDict with every field this package reads."""
  return ml_collections.ConfigDict(dict(DEFAULTS))


def get(data_cfg, key: str):
  """``data_cfg[key]`` with the default when absent (ConfigDict, dict or attribute object)."""
  if key not in DEFAULTS:
    raise KeyError(f"data.{key} is not a data config field; fields: {sorted(DEFAULTS)}")
  if hasattr(data_cfg, "get"):
    value = data_cfg.get(key, None)
  else:
    value = getattr(data_cfg, key, None)
  return DEFAULTS[key] if value is None else value


def resolve(data_cfg, **overrides) -> ml_collections.ConfigDict:
  """A complete ConfigDict: defaults, then ``data_cfg``'s fields, then ``overrides``."""
  cfg = default_config()
  for key in DEFAULTS:
    cfg[key] = get(data_cfg, key)
  for key, value in overrides.items():
    if key not in DEFAULTS:
      raise KeyError(f"data.{key} is not a data config field; fields: {sorted(DEFAULTS)}")
    cfg[key] = value
  fraction = cfg.validation_fraction
  if (not isinstance(fraction, (int, float)) or isinstance(fraction, bool)
      or not 0 <= fraction < 1):
    raise ValueError(f"data.validation_fraction: must be a number in [0, 1), got {fraction!r}")
  return cfg


def cache_dir(data_cfg) -> pathlib.Path:
  d = get(data_cfg, "cache_dir") or os.environ.get("AOGPT_DATA_DIR", "")
  return pathlib.Path(d or pathlib.Path.home() / ".cache" / "aogpt_jax").expanduser()
