"""Grain iterators over prepared data (the interface the trainer and evaluator use).

* `train_iterator(...)`: an infinite, checkpointable (``get_state``/``set_state``, works with
  ``grain.checkpoint.CheckpointSave``) iterator of ``{"tokens": int32[local_batch, seq_len]}``.
  Block order is a fresh permutation every epoch, drawn from ``seed``; global batch ``b`` is blocks
  ``perm[b*G:(b+1)*G]`` and process ``p`` of ``P`` reads only rows ``[p*G/P, (p+1)*G/P)`` of it, so
  the union over processes is exactly the single-process global batch. ``data.worker_count > 0``
  reads in grain worker processes (needs absl flags parsed, as inside ``absl.app.run``).
* `eval_batches(...)`: every block of a split exactly once, in order, padded to whole global batches
  with rows of weight 0; ``split`` may name another source as ``"wikitext103:test"``.
* `pack(stream, seq_len)`: SEDD's cut of a stream into blocks, remainder dropped.

A split that is not prepared yet is prepared on first use when its raw text is local
(``python_stdlib``, ``text_files``, or ``data.path`` set) and ``data.auto_prepare`` is on; otherwise
the error names the exact command that prepares it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pathlib
import threading
import time

import grain
import numpy as np

from aogpt_jax.data import records, sources
from aogpt_jax.data.build import prepare_split, token_stream
from aogpt_jax.data.config import get, resolve
from aogpt_jax.data.records import BlockReader

__all__ = ["eval_batches", "open_prepared", "pack", "token_stream", "train_iterator"]


def pack(stream: np.ndarray, seq_len: int) -> np.ndarray:
  """``[len(stream) // seq_len, seq_len]`` blocks; the remainder is dropped."""
  n = len(stream) // seq_len
  return np.asarray(stream[: n * seq_len], np.int32).reshape(n, seq_len)


def _parse_split(data_cfg, split: str):
  """``"name:split"`` reads another source with the same tokenizer and cache."""
  if ":" in split:
    name, split = split.split(":", 1)
    return resolve(data_cfg, source=name), split
  return resolve(data_cfg), split


def open_prepared(data_cfg, split: str, seq_len: int) -> tuple[dict, list[str]]:
  """(metadata, array_record paths) of a prepared split, preparing it first when allowed."""
  cfg = resolve(data_cfg)
  src = sources.get_source(cfg.source)
  sources.check_split(src, split)
  d = records.split_dir(cfg, split, seq_len)
  meta = records.read_metadata(d)
  if meta is None:
    if get(cfg, "auto_prepare") and not sources.needs_download(cfg):
      # In-process unless data.num_proc asks for workers (the CLI uses every core).
      meta = prepare_split(cfg, split, block_size=seq_len, num_proc=int(get(cfg, "num_proc")) or 1,
                           progress=False, log=logging.getLogger("aogpt_jax.data").info)
    else:
      other = records.other_block_sizes(cfg, split)
      hint = (f" (prepared there for block sizes {other}, not {seq_len})" if other else "")
      raise FileNotFoundError(
          f"data.source {cfg.source!r} split {split!r} is not prepared under {d}{hint}; "
          f"prepare it once with:\n  {records.prepare_command(cfg, split, seq_len)}")
  records.check_metadata(meta, cfg, split, seq_len, d)
  if get(cfg, "verify"):
    records.verify_checksum(meta, d)
  return meta, [str(d / f["name"]) for f in meta["files"]]


def _local_rows(global_batch_size: int, process_index: int, process_count: int) -> slice:
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} is not in [0, {process_count})")
  if global_batch_size % process_count:
    raise ValueError(f"batch_size {global_batch_size} is not divisible by the {process_count} "
                     f"JAX processes")
  local = global_batch_size // process_count
  return slice(process_index * local, (process_index + 1) * local)


class _LocalBatch:
  """Global batch of block indices -> this process's rows, read."""

  def __init__(self, reader: BlockReader, rows: slice):
    self.reader, self.rows = reader, rows

  def __call__(self, keys: np.ndarray) -> dict:
    return {"tokens": self.reader.read(np.asarray(keys)[self.rows])}


def _plain(batch: dict) -> dict:
  return {k: np.array(v) for k, v in batch.items()}  # out of worker shared memory


def _check_flags_parsed(worker_count: int) -> None:
  from absl import flags
  if not flags.FLAGS.is_parsed():
    raise RuntimeError(f"data.worker_count={worker_count} starts grain worker processes, which "
                       f"read absl flags: run inside absl.app.run (main.py does), or call "
                       f"absl.flags.FLAGS.mark_as_parsed() first, or set data.worker_count=0")


def die_with_parent(worker_index: int = 0, worker_count: int = 0, poll: float = 0.5) -> None:
  """In a data worker process: exit as soon as the process that started it is gone (a trainer
  killed with kill -9 leaves no worker behind, re-parented to PID 1). A daemon thread watches
  the parent id; grain calls this first in every worker (``worker_init_fn``)."""
  del worker_index, worker_count
  started_by = multiprocessing.parent_process()   # spawn/forkserver children know it
  parent = started_by.pid if started_by is not None else os.getppid()

  def watch():
    while os.getppid() == parent:
      time.sleep(poll)
    os._exit(1)   # the trainer is gone: nothing to flush, nobody to read the batches

  threading.Thread(target=watch, name="aogpt-die-with-parent", daemon=True).start()


def train_iterator(data_cfg, *, seq_len: int, global_batch_size: int, seed: int,
                   process_index: int = 0, process_count: int = 1):
  """Infinite, checkpointable iterator of this process's ``{"tokens": int32[G/P, seq_len]}``."""
  cfg = resolve(data_cfg)
  rows = _local_rows(global_batch_size, process_index, process_count)
  meta, paths = open_prepared(cfg, "train", seq_len)
  n = meta["num_blocks"]
  if n < global_batch_size:
    raise ValueError(f"data.source {cfg.source!r}: {n} training blocks of {seq_len} tokens, fewer "
                     f"than one global batch ({global_batch_size}); add data or lower the batch")
  reader = BlockReader(paths, meta["dtype"], seq_len)
  ds = (grain.MapDataset.range(n).shuffle(seed=int(seed) % 2**32).repeat()
        .batch(global_batch_size, drop_remainder=True).map(_LocalBatch(reader, rows)))
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=max(1, int(get(cfg, "read_threads"))),
                                            prefetch_buffer_size=int(get(cfg, "prefetch"))))
  workers = int(get(cfg, "worker_count"))
  if workers > 0:
    _check_flags_parsed(workers)
    it = it.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=workers, per_worker_buffer_size=int(get(cfg, "worker_buffer_size"))),
        worker_init_fn=die_with_parent)
    it = it.map(_plain)
  return iter(it)


def eval_batches(data_cfg, *, split: str, seq_len: int, global_batch_size: int,
                 process_index: int = 0, process_count: int = 1, max_blocks: int = 0):
  """Yields ``{"tokens", "weight"}`` local batches covering every block of ``split`` once.

  Batch ``b`` holds blocks ``[b*G, (b+1)*G)``; process ``p`` gets its rows of it; rows past the last
  block are padding (tokens 0, weight 0). ``max_blocks > 0`` scores only the first blocks."""
  cfg, split = _parse_split(data_cfg, split)
  rows = _local_rows(global_batch_size, process_index, process_count)
  meta, paths = open_prepared(cfg, split, seq_len)
  n = meta["num_blocks"] if max_blocks <= 0 else min(meta["num_blocks"], max_blocks)
  reader = BlockReader(paths, meta["dtype"], seq_len)

  def gen():
    for b in range(-(-n // global_batch_size)):
      keys = np.arange(b * global_batch_size, (b + 1) * global_batch_size)[rows]
      valid = keys < n
      tokens = np.zeros((len(keys), seq_len), np.int32)
      tokens[valid] = reader.read(keys[valid])
      yield {"tokens": tokens, "weight": valid.astype(np.float32)}
  return _Sized(gen(), -(-n // global_batch_size), seq_len)


class _Sized:
  """An iterator that knows its length (for progress lines with an ETA) and its blocks' length
  (``seq_len``, for the evaluation's cost estimate)."""

  def __init__(self, it, n: int, seq_len: int | None = None):
    self._it, self._n, self.seq_len = it, n, seq_len

  def __iter__(self):
    return self

  def __next__(self):
    return next(self._it)

  def __len__(self) -> int:
    return self._n


def prepared_path(data_cfg, split: str, seq_len: int) -> pathlib.Path:
  """Where ``split`` of ``data.source`` lives (prepared or not)."""
  cfg, split = _parse_split(data_cfg, split)
  return records.split_dir(cfg, split, seq_len)
