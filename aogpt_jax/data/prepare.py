"""Prepare a source once: raw text -> detokenize -> tokenize (parallel) -> pack -> array_record.

    python -m aogpt_jax.data.prepare --source=openwebtext --tokenizer=gpt2 --block_size=1024
    python -m aogpt_jax.data.prepare --source=wikitext2,wikitext103,ptb,lambada,lm1b \
        --tokenizer=gpt2 --block_size=1024          # the zero-shot sets, each on its SEDD split
    python -m aogpt_jax.data.prepare --source=text_files --glob='~/corpus/**/*.jsonl' ...

From Python: ``prepare(data_cfg, block_size=1024)``. Packing is SEDD's: end-of-text after every row,
rows concatenated in order, cut into ``block_size`` blocks, the remainder dropped; the output is
the same for any number of processes (chunks are tokenized in parallel, written in order).
"""

from __future__ import annotations

import argparse
from typing import Callable, Sequence

from aogpt_jax import errors
from aogpt_jax.data import records, sources
from aogpt_jax.data.build import prepare_split
from aogpt_jax.data.config import DEFAULTS, resolve

__all__ = ["main", "prepare", "prepare_split", "verify"]


def _splits_for(src: sources.Source, split: str | Sequence[str] | None) -> list[str]:
  if split in (None, "", "default"):
    return [sources.ZERO_SHOT[src.name]] if src.name in sources.ZERO_SHOT else list(src.splits)
  if split == "all":
    return list(src.splits)
  names = split.split(",") if isinstance(split, str) else list(split)
  for s in names:
    sources.check_split(src, s)
  return names


def prepare(data_cfg, *, block_size: int, splits: str | Sequence[str] | None = None,
            num_proc: int = 0, overwrite: bool = False, progress: bool = True,
            log: Callable[[str], None] = print) -> list[dict]:
  """Prepares ``data_cfg.source`` (comma-separated names allowed) for sequences of ``block_size``.

  ``splits``: None -> the zero-shot split for the five zero-shot sets, every split otherwise;
  "all"; or names. Returns the metadata of every split."""
  cfg = resolve(data_cfg)
  metas = []
  for name in [s.strip() for s in cfg.source.split(",") if s.strip()]:
    one = resolve(cfg, source=name)
    for split in _splits_for(sources.get_source(name), splits):
      metas.append(prepare_split(one, split, block_size=block_size, num_proc=num_proc,
                                 overwrite=overwrite, progress=progress, log=log))
  return metas


def verify(data_cfg, *, block_size: int, splits=None, log=print) -> None:
  """Re-checks the sha256 of prepared splits."""
  cfg = resolve(data_cfg)
  for name in [s.strip() for s in cfg.source.split(",") if s.strip()]:
    one = resolve(cfg, source=name)
    for split in _splits_for(sources.get_source(name), splits):
      d = records.split_dir(one, split, block_size)
      meta = records.read_metadata(d)
      if meta is None:
        raise FileNotFoundError(f"{d} is not prepared: "
                                f"{records.prepare_command(one, split, block_size)}")
      records.check_metadata(meta, one, split, block_size, d)
      records.verify_checksum(meta, d)
      log(f"{d}: {meta['num_blocks']} blocks, sha256 ok")


def main(argv: Sequence[str] | None = None) -> None:
  """The command line; a bad input ends in one line (`aogpt_jax.errors.run_cli`)."""
  errors.run_cli(_main, argv, prog="aogpt_jax.data.prepare")


def _main(argv: Sequence[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--source", required=True, help=f"comma-separated; {sorted(sources.SOURCES)}")
  p.add_argument("--block_size", type=int, default=1024)
  p.add_argument("--split", default=None, help="comma-separated, 'all', or omitted (default)")
  p.add_argument("--num_proc", type=int, default=0, help="0: all cores")
  p.add_argument("--overwrite", action="store_true")
  p.add_argument("--verify", action="store_true", help="check sha256 of prepared splits only")
  p.add_argument("--no_progress", action="store_true")
  p.add_argument("--verbose", action="store_true", help="on an error, the full traceback")
  for key in ("tokenizer", "cache_dir", "path", "glob", "validation_glob", "text_field",
              "txt_rows", "detokenizer", "hf_cache_dir"):
    p.add_argument(f"--{key}", default=DEFAULTS[key])
  p.add_argument("--validation_fraction", type=float, default=DEFAULTS["validation_fraction"])
  a = p.parse_args(argv)
  if a.block_size < 2:
    raise ValueError(f"--block_size: must be >= 2, got {a.block_size}")
  cfg = resolve({}, **{k: getattr(a, k) for k in DEFAULTS if hasattr(a, k) and
                       k not in ("num_proc",)})
  if a.verify:
    verify(cfg, block_size=a.block_size, splits=a.split)
  else:
    prepare(cfg, block_size=a.block_size, splits=a.split, num_proc=a.num_proc,
            overwrite=a.overwrite, progress=not a.no_progress)


if __name__ == "__main__":
  main()
