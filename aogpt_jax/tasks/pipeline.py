"""A task's rows as the trainer's batches: the task counterpart of `aogpt_jax.data.pipeline`.

* `train_iterator(task, ...)`: an infinite, checkpointable (grain: ``get_state``/``set_state``,
  saved with the run's checkpoints) iterator of ``{"tokens": int32 [G/P, n], "prompt": bool
  [G/P, n]}``. Global batch ``i`` is ``task.train_batch(seed, i, G)``: a pure function of the seed
  and the batch index, so a resumed run reads exactly what an uninterrupted one would, and process
  ``p`` of ``P`` keeps rows ``[p*G/P, (p+1)*G/P)`` of it.
* `eval_batches(task, ...)`: the held-out puzzles ``task.heldout(seed, count)`` once, in order,
  padded to whole global batches with rows of weight 0 (the layout of `data.eval_batches`).
"""

from __future__ import annotations

import grain
import numpy as np

from aogpt_jax.data.pipeline import _local_rows, _Sized
from aogpt_jax.tasks import base


class TaskBatchError(ValueError):
  """A training batch the task made does not fit it (or its ``train_batch`` raised): one line
  naming the task, the batch index and the problem."""


class _TaskBatch:
  """Global batch index -> this process's rows of ``task.train_batch(seed, index, G)``, every
  batch checked (`base.check_rows`: shapes, integer ids in [0, vocab_size), a bool prompt; and G
  rows): a batch that breaks the task at index 1000 is one line naming it, not a traceback or a
  silently truncated float."""

  def __init__(self, task, seed: int, global_batch_size: int, rows: slice):
    self.task, self.seed, self.size, self.rows = task, int(seed), int(global_batch_size), rows

  def __call__(self, index) -> dict:
    what = f"train_batch(seed={self.seed}, index={int(index)}, batch={self.size})"
    try:
      batch = self.task.train_batch(self.seed, int(index), self.size)
    except Exception as e:  # noqa: BLE001 - a task's own code may raise anything
      raise TaskBatchError(f"task {self.task.name!r}: {what} raised {type(e).__name__}: "
                           f"{base._first_line(e)}") from e
    try:
      got = base.check_rows(self.task, batch, what)
    except ValueError as e:
      raise TaskBatchError(str(e)) from None
    if got != self.size:
      raise TaskBatchError(f"task {self.task.name!r}: {what} returned {got} rows; expected "
                           f"{self.size}")
    return {"tokens": np.asarray(batch["tokens"], np.int32)[self.rows],
            "prompt": np.asarray(batch["prompt"], bool)[self.rows]}


def train_iterator(task, *, global_batch_size: int, seed: int, process_index: int = 0,
                   process_count: int = 1, prefetch: int = 2):
  """Infinite, checkpointable iterator of this process's ``{"tokens", "prompt"}`` rows."""
  rows = _local_rows(global_batch_size, process_index, process_count)
  ds = grain.MapDataset.range(2**62).map(_TaskBatch(task, seed, global_batch_size, rows))
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1,
                                                   prefetch_buffer_size=int(prefetch))))


def eval_batches(task, *, seed: int, count: int, global_batch_size: int, process_index: int = 0,
                 process_count: int = 1):
  """Yields ``{"tokens", "prompt", "weight"}`` local batches covering ``task.heldout(seed,
  count)`` once; rows past the last puzzle are padding (weight 0)."""
  rows = _local_rows(global_batch_size, process_index, process_count)
  held = task.heldout(int(seed), int(count))
  tokens, prompt = np.asarray(held["tokens"], np.int32), np.asarray(held["prompt"], bool)
  n_rows = tokens.shape[0]

  def gen():
    for b in range(-(-n_rows // global_batch_size)):
      keys = np.arange(b * global_batch_size, (b + 1) * global_batch_size)[rows]
      valid = keys < n_rows
      idx = np.where(valid, keys, 0)
      yield {"tokens": np.where(valid[:, None], tokens[idx], 0).astype(np.int32),
             "prompt": np.where(valid[:, None], prompt[idx], True),
             "weight": valid.astype(np.float32)}
  return _Sized(gen(), -(-n_rows // global_batch_size))
