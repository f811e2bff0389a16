"""Prompts (any set of (position, token) pairs per sample) and generation orders.

A prompt is two arrays: ``tokens int32[B, n]`` and ``mask bool[B, n]`` (True where the token is
given); rows may differ. Builders: `pairs_prompt` (explicit pairs), `prefix_prompt` (a
contiguous prefix: ordinary prompting), `infill_prompt` (a prefix and a suffix; the middle is
generated). `validate_prompt` checks shapes, vocabulary and (for pairs) positions.

The generation order sigma of a row puts the prompt positions first (ascending, so a prefix
prompt is read left to right exactly as a GPT reads it) and then the remaining positions in the
requested order: a registered order distribution (``random``/``uniform``, ``l2r``,
``blockwise``, ...; see `aogpt_jax.model.orders`) drawn from the sample's own key, or a given
permutation (int [n] or [B, n]) restricted to the positions still to generate.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from aogpt_jax.model import orders as orders_lib

ORDER_ALIASES = {"random": "uniform"}
Pairs = Mapping[int, int] | Sequence[tuple[int, int]]


def empty_prompt(batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
  return np.zeros((batch, length), np.int32), np.zeros((batch, length), bool)


def pairs_prompt(pairs: Sequence[Pairs], length: int, vocab_size: int | None = None):
  """One row per element of ``pairs`` (a dict or a list of (position, token)); errors name the
  row and the position that is out of range or repeated, or the token outside the vocabulary."""
  tokens, mask = empty_prompt(len(pairs), length)
  for b, row in enumerate(pairs):
    items = list(row.items()) if isinstance(row, Mapping) else [tuple(p) for p in row]
    for item in items:
      if len(item) != 2:
        raise ValueError(f"prompt row {b}: expected (position, token) pairs, got {item!r}")
      pos, tok = int(item[0]), int(item[1])
      if not 0 <= pos < length:
        raise ValueError(f"prompt row {b}: position {pos} is out of range [0, {length})")
      if mask[b, pos]:
        raise ValueError(f"prompt row {b}: position {pos} is given more than once")
      if vocab_size is not None and not 0 <= tok < vocab_size:
        raise ValueError(f"prompt row {b}, position {pos}: token {tok} is outside the "
                         f"vocabulary [0, {vocab_size})")
      tokens[b, pos], mask[b, pos] = tok, True
  return tokens, mask


def prefix_prompt(prefixes: Sequence[Sequence[int]], length: int, vocab_size: int | None = None):
  """Rows whose first ``len(prefix)`` positions are given (prefix prompting)."""
  for b, p in enumerate(prefixes):
    if len(p) > length:
      raise ValueError(f"prompt row {b}: prefix of {len(p)} tokens is longer than length {length}")
  return pairs_prompt([list(enumerate(p)) for p in prefixes], length, vocab_size)


def infill_prompt(prefixes: Sequence[Sequence[int]], suffixes: Sequence[Sequence[int]],
                  length: int, vocab_size: int | None = None):
  """Rows with a given prefix at the start and a given suffix at the end; the positions between
  them are generated (infilling)."""
  if len(prefixes) != len(suffixes):
    raise ValueError(f"infill_prompt: {len(prefixes)} prefixes but {len(suffixes)} suffixes")
  rows = []
  for b, (p, s) in enumerate(zip(prefixes, suffixes)):
    if len(p) + len(s) > length:
      raise ValueError(f"prompt row {b}: prefix ({len(p)}) + suffix ({len(s)}) tokens exceed "
                       f"length {length}")
    rows.append(list(enumerate(p)) + [(length - len(s) + i, t) for i, t in enumerate(s)])
  return pairs_prompt(rows, length, vocab_size)


def validate_prompt(tokens, mask, length: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Returns the prompt as (int32 [B, n], bool [B, n]) numpy arrays or raises naming the problem."""
  tokens, mask = np.asarray(tokens), np.asarray(mask)
  if tokens.ndim != 2 or tokens.shape != mask.shape:
    raise ValueError(f"prompt: tokens {tokens.shape} and mask {mask.shape} must both be "
                     f"[batch, length]")
  if tokens.shape[1] != length:
    raise ValueError(f"prompt: arrays have length {tokens.shape[1]}, sample length is {length}")
  if mask.dtype != bool:
    raise ValueError(f"prompt: mask must be boolean, got {mask.dtype}")
  if not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f"prompt: tokens must be integers, got {tokens.dtype}")
  bad = mask & ((tokens < 0) | (tokens >= vocab_size))
  if bad.any():
    b, p = map(int, np.argwhere(bad)[0])
    raise ValueError(f"prompt row {b}, position {p}: token {int(tokens[b, p])} is outside the "
                     f"vocabulary [0, {vocab_size})")
  return np.where(mask, tokens, 0).astype(np.int32), mask


def check_order(order, batch: int, length: int) -> str | np.ndarray:
  """Validates an order spec: a registered name (or ``random``) or permutation(s) [n] / [B, n]."""
  if isinstance(order, str):
    name = ORDER_ALIASES.get(order, order)
    orders_lib.get(name)            # raises naming the known distributions
    return name
  arr = np.asarray(order)
  if arr.ndim == 1:
    arr = np.broadcast_to(arr, (batch, arr.shape[0]))
  if arr.shape != (batch, length):
    raise ValueError(f"sample.order: a given order must be [{length}] or [{batch}, {length}], "
                     f"got {np.asarray(order).shape}")
  if not (np.sort(arr, axis=1) == np.arange(length)).all():
    b = int(np.argmax(~(np.sort(arr, axis=1) == np.arange(length)).all(axis=1)))
    raise ValueError(f"sample.order: row {b} of the given order is not a permutation of "
                     f"0..{length - 1}")
  return arr.astype(np.int32)


def build_orders(prompt_mask: np.ndarray, base: np.ndarray) -> np.ndarray:
  """int32 [B, n]: per row, the prompt positions (ascending), then the others in the order of
  ``base`` (a permutation per row, e.g. drawn from an order distribution, or given): the layout
  prompt-conditioned training uses (`orders.prompt_first`)."""
  return np.asarray(orders_lib.prompt_first(np.asarray(base), np.asarray(prompt_mask, bool)),
                    np.int32)
