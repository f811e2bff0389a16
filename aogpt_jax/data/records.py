"""Prepared datasets on disk: array_record files of packed blocks plus one metadata JSON per split.

Layout: ``{cache_dir}/{source_key}/{tokenizer}/block{B}/{split}/`` holding
``data-00000.array_record`` ... (one record = one block of B tokens, raw little-endian ``uint16``
when the vocabulary fits, else ``uint32``; written with ``group_size:1`` for random access) and
``metadata.json`` (token and block counts, sha256 over the blocks in order, tokenizer, block size,
source and raw origin, the version that created it). ``source_key`` is the source name, plus a
short hash of the options that change its content (glob, detokenizer, text field, ...) when they
differ from the source's defaults; for ``text_files`` the hash also covers the path, size and
modification time of every matched file, so an edited corpus is prepared again.

This is the lightweight equivalent of a TFDS builder: the same array_record files that
``grain.sources.ArrayRecordDataSource`` reads, with no TensorFlow / tensorflow-datasets install.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shlex
from typing import Any

import numpy as np

import aogpt_jax
from aogpt_jax.data import sources
from aogpt_jax.data.config import DEFAULTS, cache_dir, get
from aogpt_jax.data.tokenizers import get_tokenizer, token_dtype

FORMAT = "aogpt_jax.prepared/1"
WRITER_OPTIONS = "group_size:1"
METADATA = "metadata.json"


def content_options(data_cfg) -> dict[str, Any]:
  """The settings that change a source's prepared content (beyond tokenizer and block size)."""
  src = sources.get_source(get(data_cfg, "source"))
  opts = {k: get(data_cfg, k) for k in ("detokenizer", "text_field", "txt_rows")}
  if src.held_out:
    opts["validation_fraction"] = float(get(data_cfg, "validation_fraction"))
  if src.name == "text_files":
    opts.update(glob=get(data_cfg, "glob"), validation_glob=get(data_cfg, "validation_glob"))
    if not get(data_cfg, "validation_glob"):   # the split rule of stripe_held_out
      opts["held_out_rule"] = sources.HELD_OUT_RULE
    # the files' content identity (path, size, mtime): an edited corpus is a new dataset
    opts.update(files=sources.files_identity(get(data_cfg, "glob")),
                validation_files=sources.files_identity(get(data_cfg, "validation_glob")))
  return opts


def source_key(data_cfg) -> str:
  name = get(data_cfg, "source")
  opts = content_options(data_cfg)
  defaults = {k: DEFAULTS.get(k) for k in opts}
  if opts == defaults and name != "text_files":
    return name
  digest = hashlib.sha256(json.dumps(opts, sort_keys=True).encode()).hexdigest()[:10]
  return f"{name}-{digest}"


def split_dir(data_cfg, split: str, block_size: int) -> pathlib.Path:
  tok = get_tokenizer(get(data_cfg, "tokenizer"))
  return (cache_dir(data_cfg) / source_key(data_cfg) / tok.name / f"block{block_size}" / split)


def prepare_command(data_cfg, split: str, block_size: int) -> str:
  """The exact shell command that prepares this split."""
  args = [f"--source={get(data_cfg, 'source')}", f"--tokenizer={get(data_cfg, 'tokenizer')}",
          f"--block_size={block_size}", f"--split={split}"]
  if get(data_cfg, "cache_dir"):
    args.append(f"--cache_dir={get(data_cfg, 'cache_dir')}")
  for key in ("path", "glob", "validation_glob", "text_field", "txt_rows", "detokenizer"):
    if get(data_cfg, key) != DEFAULTS[key]:
      args.append(f"--{key}={get(data_cfg, key)}")
  if get(data_cfg, "validation_fraction") != DEFAULTS["validation_fraction"]:
    args.append(f"--validation_fraction={get(data_cfg, 'validation_fraction')}")
  return "python -m aogpt_jax.data.prepare " + " ".join(shlex.quote(a) for a in args)


class BlockWriter:
  """Packs a token stream into blocks and writes them: SEDD's packing, streamed.

  ``add`` takes consecutive pieces of the stream (rows already followed by end-of-text); every
  full block is written as one record; `finish` drops the remainder shorter than a block."""

  def __init__(self, out_dir: pathlib.Path, block_size: int, dtype: np.dtype,
               records_per_file: int = 0):
    from array_record.python.array_record_module import ArrayRecordWriter
    self._writer_cls = ArrayRecordWriter
    self.out_dir, self.block_size, self.dtype = out_dir, block_size, np.dtype(dtype)
    # ~256 MiB per file by default.
    self.records_per_file = records_per_file or max(1, 2**28 // (block_size * self.dtype.itemsize))
    self.files: list[dict] = []
    self.sha = hashlib.sha256()
    self.pending: list[np.ndarray] = []
    self.pending_len = 0
    self.stream_tokens = 0
    self.num_blocks = 0
    self._writer = None

  def add(self, tokens: np.ndarray) -> None:
    if len(tokens) and (tokens.min() < 0 or tokens.max() > np.iinfo(self.dtype).max):
      raise ValueError(f"token ids outside {self.dtype} in the stream")
    self.pending.append(np.asarray(tokens, self.dtype))
    self.pending_len += len(tokens)
    self.stream_tokens += len(tokens)
    if self.pending_len >= self.block_size:
      stream = np.concatenate(self.pending)
      n = len(stream) // self.block_size
      self._write(stream[: n * self.block_size].reshape(n, self.block_size))
      rest = stream[n * self.block_size:]
      self.pending, self.pending_len = [rest], len(rest)

  def _write(self, blocks: np.ndarray) -> None:
    blocks = np.ascontiguousarray(blocks.astype(self.dtype.newbyteorder("<"), copy=False))
    self.sha.update(blocks.tobytes())
    for block in blocks:
      if self._writer is None or self.files[-1]["records"] >= self.records_per_file:
        self._close_file()
        name = f"data-{len(self.files):05d}.array_record"
        self._writer = self._writer_cls(str(self.out_dir / name), WRITER_OPTIONS)
        self.files.append({"name": name, "records": 0})
      self._writer.write(block.tobytes())
      self.files[-1]["records"] += 1
      self.num_blocks += 1

  def _close_file(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def finish(self) -> dict:
    self._close_file()
    return {"num_blocks": self.num_blocks, "num_tokens": self.num_blocks * self.block_size,
            "stream_tokens": self.stream_tokens,
            "dropped_tokens": self.stream_tokens - self.num_blocks * self.block_size,
            "sha256": self.sha.hexdigest(), "files": self.files}


def metadata(data_cfg, split: str, block_size: int, stats: dict, raw: sources.RawSplit,
             num_rows: int, seconds: float) -> dict:
  tok = get_tokenizer(get(data_cfg, "tokenizer"))
  src = sources.get_source(get(data_cfg, "source"))
  return {
      "format": FORMAT, "source": src.name, "source_key": source_key(data_cfg), "split": split,
      "tokenizer": tok.name, "tokenizer_spec": get(data_cfg, "tokenizer"),
      "vocab_size": tok.vocab_size, "eot_id": tok.eot_id, "block_size": block_size,
      "dtype": token_dtype(tok.vocab_size).name, "num_rows": num_rows, **stats,
      "detokenizer": get(data_cfg, "detokenizer") or src.detokenizer or "none",
      "options": content_options(data_cfg),
      "raw": {"origin": raw.origin, "num_files": len(raw.files), "files": raw.files[:50]},
      "created_by": f"aogpt_jax {aogpt_jax.__version__}", "prepare_seconds": round(seconds, 2),
  }


def read_metadata(d: pathlib.Path) -> dict | None:
  p = d / METADATA
  return json.loads(p.read_text()) if p.exists() else None


def other_block_sizes(data_cfg, split: str) -> list[int]:
  tok_dir = split_dir(data_cfg, split, 0).parent.parent
  return sorted(int(p.parent.name.removeprefix("block")) for p in tok_dir.glob(f"block*/{split}")
                if (p / METADATA).exists())


def check_metadata(meta: dict, data_cfg, split: str, block_size: int, d: pathlib.Path) -> None:
  """Refuses a prepared split that does not match what the config asks."""
  tok = get_tokenizer(get(data_cfg, "tokenizer"))
  where = f"prepared data {d}"
  if meta.get("format") != FORMAT:
    raise ValueError(f"{where}: format {meta.get('format')!r}, expected {FORMAT!r}; re-prepare: "
                     f"{prepare_command(data_cfg, split, block_size)} --overwrite")
  if (meta["tokenizer"], meta["vocab_size"], meta["eot_id"]) != (tok.name, tok.vocab_size,
                                                                  tok.eot_id):
    raise ValueError(f"{where} was prepared with tokenizer {meta['tokenizer']!r} (vocab "
                     f"{meta['vocab_size']}, eot {meta['eot_id']}), but data.tokenizer asks "
                     f"{tok.name!r} (vocab {tok.vocab_size}, eot {tok.eot_id})")
  if meta["block_size"] != block_size:
    raise ValueError(f"{where} was prepared with block size {meta['block_size']}, but the "
                     f"config asks sequences of {block_size}; prepare them with: "
                     f"{prepare_command(data_cfg, split, block_size)}")
  if meta["split"] != split or meta["source"] != get(data_cfg, "source"):
    raise ValueError(f"{where} holds {meta['source']}:{meta['split']}, not "
                     f"{get(data_cfg, 'source')}:{split}")
  for f in meta["files"]:
    if not (d / f["name"]).exists():
      raise FileNotFoundError(f"{where}: {f['name']} is missing; re-prepare with: "
                              f"{prepare_command(data_cfg, split, block_size)} --overwrite")


class BlockReader:
  """Reads blocks by index from array_record files as int32 (picklable for worker processes)."""

  def __init__(self, paths: list[str], dtype: str, block_size: int):
    self.paths, self.block_size = paths, block_size
    self.dtype = np.dtype(dtype).newbyteorder("<")
    self._source = None

  def __getstate__(self):
    return {"paths": self.paths, "block_size": self.block_size, "dtype": self.dtype.str}

  def __setstate__(self, state):
    self.__init__(state["paths"], state["dtype"], state["block_size"])

  def read(self, keys: np.ndarray) -> np.ndarray:
    if len(keys) == 0:
      return np.zeros((0, self.block_size), np.int32)
    if self._source is None:
      from grain.sources import ArrayRecordDataSource
      self._source = ArrayRecordDataSource(self.paths)
    raw = b"".join(self._source.__getitems__([int(k) for k in keys]))  # one batched C++ read
    return np.frombuffer(raw, self.dtype).reshape(len(keys), self.block_size).astype(np.int32)


def read_blocks(paths: list[str], dtype: str, block_size: int, keys) -> np.ndarray:
  """Blocks ``keys`` of the files as int32 ``[len(keys), block_size]``."""
  return BlockReader(paths, dtype, block_size).read(np.asarray(list(keys), np.int64))


def verify_checksum(meta: dict, d: pathlib.Path) -> None:
  """Recomputes the sha256 over every block in order; raises on mismatch."""
  from array_record.python.array_record_module import ArrayRecordReader
  sha = hashlib.sha256()
  count = 0
  for f in meta["files"]:
    reader = ArrayRecordReader(str(d / f["name"]))
    n = reader.num_records()
    for start in range(0, n, 4096):
      for rec in reader.read(list(range(start, min(n, start + 4096)))):
        sha.update(rec)
    reader.close()
    count += n
  if count != meta["num_blocks"] or sha.hexdigest() != meta["sha256"]:
    raise ValueError(f"prepared data {d}: {count} blocks with sha256 {sha.hexdigest()}, but "
                     f"metadata.json records {meta['num_blocks']} with {meta['sha256']}: the "
                     f"files changed; re-prepare with --overwrite")
