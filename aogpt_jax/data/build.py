"""Building one prepared split: raw rows -> detokenize -> tokenize (processes) -> pack -> write.

`prepare_split` is the unit of work behind ``prepare.prepare`` and the pipeline's auto-prepare;
`token_stream` tokenizes a split in this process (for checks). Chunks of rows are tokenized in
``spawn`` worker processes (safe under a running JAX) with bounded in-flight work, and written in
order, so the output is identical for any number of processes.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import pathlib
import shutil
import socket
import time
import uuid
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from aogpt_jax.data import records, sources
from aogpt_jax.data.config import get, resolve
from aogpt_jax.data.detokenizers import get_detokenizer
from aogpt_jax.data.tokenizers import get_tokenizer, token_dtype

CHUNK_CHARS = 1 << 20   # rows are sent to workers in chunks of about this many characters
CHUNK_ROWS = 4096

_WORKER: dict = {}


def _init_worker(tokenizer: str, detokenizer: str) -> None:
  _WORKER["tok"] = get_tokenizer(tokenizer)
  _WORKER["detok"] = get_detokenizer(detokenizer)
  _WORKER["dtype"] = token_dtype(_WORKER["tok"].vocab_size)


def encode_rows(texts: Sequence[str]) -> np.ndarray:
  """The rows' tokens, each row followed by end-of-text, concatenated (worker side)."""
  tok, detok, dtype = _WORKER["tok"], _WORKER["detok"], _WORKER["dtype"]
  if detok is not None:
    texts = [detok(t) for t in texts]
  parts = tok.encode_np(texts)
  out = np.empty(sum(len(p) for p in parts) + len(parts), dtype)
  pos = 0
  for p in parts:
    out[pos: pos + len(p)] = p
    pos += len(p)
    out[pos] = tok.eot_id
    pos += 1
  return out


def _chunks(rows: Iterable[str]) -> Iterator[list[str]]:
  chunk, chars = [], 0
  for text in rows:
    chunk.append(text)
    chars += len(text)
    if chars >= CHUNK_CHARS or len(chunk) >= CHUNK_ROWS:
      yield chunk
      chunk, chars = [], 0
  if chunk:
    yield chunk


def encoded_chunks(rows: Iterable[str], tokenizer: str, detokenizer: str,
                   num_proc: int) -> Iterator[tuple[int, np.ndarray]]:
  """(rows in chunk, tokens) per chunk, in order; ``num_proc > 1`` tokenizes in processes."""
  if num_proc <= 1:
    _init_worker(tokenizer, detokenizer)
    for chunk in _chunks(rows):
      yield len(chunk), encode_rows(chunk)
    return
  # spawn: safe when the caller already runs JAX threads; bounded in-flight work keeps memory flat.
  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(num_proc, initializer=_init_worker, initargs=(tokenizer, detokenizer)) as pool:
    pending: collections.deque = collections.deque()
    for chunk in _chunks(rows):
      pending.append((len(chunk), pool.apply_async(encode_rows, (chunk,))))
      if len(pending) >= 4 * num_proc:
        n, res = pending.popleft()
        yield n, res.get()
    while pending:
      n, res = pending.popleft()
      yield n, res.get()


def token_stream(data_cfg, split: str) -> np.ndarray:
  """The whole split tokenized in this process: rows + end-of-text, concatenated (int32)."""
  cfg = resolve(data_cfg)
  src = sources.get_source(cfg.source)
  raw = sources.raw_split(cfg, split)
  parts = [t for _, t in encoded_chunks(raw.rows, cfg.tokenizer,
                                        cfg.detokenizer or src.detokenizer, 1)]
  if not parts:
    raise ValueError(f"data.source {cfg.source!r}: split {split!r} is empty")
  return np.concatenate(parts).astype(np.int32)


TMP_MARK = ".tmp-"   # .{split}.tmp-{host}-{pid}-{random}: a split being written by that process
OLD_TMP_SECONDS = 3600   # a folder without host and pid in its name: stale once untouched this long


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[-1].split()[0] != "Z"   # a zombie is gone
  except OSError:
    return True


def remove_stale_tmp(parent: pathlib.Path, split: str, log: Callable[[str], None] = print
                     ) -> list[pathlib.Path]:
  """Removes the temporary folders of ``split`` left in ``parent`` by a preparation that was
  killed (kill -9, a lost machine): those whose process, on this host, is gone, and those
  without host and pid in their name (an older version's) untouched for `OLD_TMP_SECONDS`.
  A preparation still running, here or on another host, keeps its folder. Returns the removed."""
  removed, host = [], socket.gethostname()
  for p in parent.glob(f".{split}{TMP_MARK}*"):
    parts = p.name[len(f".{split}{TMP_MARK}"):].rsplit("-", 2)
    try:
      if len(parts) == 3 and parts[1].isdigit():
        stale = parts[0] == host and not _alive(int(parts[1]))
      else:
        stale = time.time() - p.stat().st_mtime > OLD_TMP_SECONDS
    except OSError:   # removed meanwhile
      continue
    if stale and p.is_dir():
      shutil.rmtree(p, ignore_errors=True)
      removed.append(p)
      log(f"removed {p}: left by a preparation that was killed")
  return removed


def prepare_split(data_cfg, split: str, *, block_size: int, num_proc: int = 0,
                  overwrite: bool = False, progress: bool = True,
                  log: Callable[[str], None] = print) -> dict:
  """Prepares one split (or returns the metadata of an existing one); returns its metadata."""
  cfg = resolve(data_cfg)
  if block_size <= 0:
    raise ValueError(f"block_size must be positive, got {block_size}")
  src = sources.get_source(cfg.source)
  sources.check_split(src, split)
  out = records.split_dir(cfg, split, block_size)
  meta = records.read_metadata(out)
  if meta is not None and not overwrite:
    records.check_metadata(meta, cfg, split, block_size, out)
    log(f"{out}: already prepared ({meta['num_blocks']} blocks of {block_size}); "
        f"--overwrite re-prepares it")
    return meta
  num_proc = num_proc or get(cfg, "num_proc") or os.cpu_count() or 1
  tok = get_tokenizer(cfg.tokenizer)
  detok = cfg.detokenizer or src.detokenizer
  get_detokenizer(detok)  # unknown names fail here, before any work
  if out.parent.is_dir():
    remove_stale_tmp(out.parent, split, log)
  tmp = out.parent / (f".{split}{TMP_MARK}{socket.gethostname()}-{os.getpid()}-"
                      f"{uuid.uuid4().hex[:8]}")
  tmp.mkdir(parents=True)
  start = time.time()
  try:
    raw = sources.raw_split(cfg, split)
    writer = records.BlockWriter(tmp, block_size, token_dtype(tok.vocab_size))
    from tqdm.auto import tqdm
    bar = tqdm(total=raw.total_rows, unit=" rows", disable=not progress,
               desc=f"{cfg.source}:{split} ({tok.name})", mininterval=1.0)
    num_rows = 0
    for n, tokens in encoded_chunks(raw.rows, cfg.tokenizer, detok, num_proc):
      writer.add(tokens)
      num_rows += n
      bar.update(n)
      bar.set_postfix(tokens=writer.stream_tokens, refresh=False)
    bar.close()
    stats = writer.finish()
    if num_rows == 0:
      raise ValueError(f"data.source {cfg.source!r}: split {split!r} is empty ({raw.origin})")
    if stats["num_blocks"] == 0:
      raise ValueError(f"data.source {cfg.source!r}: split {split!r} has {stats['stream_tokens']} "
                       f"tokens, fewer than one block of {block_size}")
    meta = records.metadata(cfg, split, block_size, stats, raw, num_rows, time.time() - start)
    (tmp / records.METADATA).write_text(json.dumps(meta, indent=1))
    if out.exists() and overwrite:
      shutil.rmtree(out)
    try:
      os.rename(tmp, out)
    except OSError:
      if records.read_metadata(out) is None:
        raise
      shutil.rmtree(tmp)  # another process prepared it meanwhile: keep theirs
      return records.read_metadata(out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  log(f"wrote {out}: {meta['num_blocks']} blocks x {block_size} = {meta['num_tokens']} tokens "
      f"({meta['num_rows']} rows, {meta['stream_tokens']} tokens before packing, "
      f"{meta['dropped_tokens']} dropped), {len(meta['files'])} file(s), sha256 "
      f"{meta['sha256'][:16]}..., {meta['prepare_seconds']} s")
  return meta
