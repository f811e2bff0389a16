"""Order distributions over token positions, and the helpers that move data between orders.

An *order* is an int32 array ``[batch, length]`` whose row ``b`` is a permutation of
``0..length-1``: ``order[b, r]`` is the original position of the token generated at rank ``r``
(sigma_{r+1} in the paper's 1-indexed notation). Every distribution is a pure function of an
explicit PRNG key, so training and evaluation are reproducible.

Adding a distribution is one function and one name::

    @register("reverse")
    def reverse(key, batch, length):
        return jnp.broadcast_to(jnp.arange(length)[::-1], (batch, length)).astype(jnp.int32)

after which ``sample("reverse", key, batch, length)`` and ``--config.order.name=reverse`` work.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

OrderFn = Callable[..., jax.Array]
_REGISTRY: dict[str, OrderFn] = {}


def register(name: str) -> Callable[[OrderFn], OrderFn]:
  """Registers ``fn(key, batch, length, **kwargs) -> int32[batch, length]`` under ``name``."""

  def deco(fn: OrderFn) -> OrderFn:
    if name in _REGISTRY:
      raise ValueError(f"order distribution {name!r} is already registered")
    _REGISTRY[name] = fn
    return fn

  return deco


def names() -> list[str]:
  return sorted(_REGISTRY)


def get(name: str) -> OrderFn:
  if name not in _REGISTRY:
    raise ValueError(f"unknown order distribution {name!r}; known: {', '.join(names())}")
  return _REGISTRY[name]


def check_kwargs(name: str, kwargs: dict) -> None:
  """Raises a ValueError naming any keyword that ``name`` does not take (before tracing)."""
  params = inspect.signature(get(name)).parameters
  accepted = [p for p in params if p not in ("key", "batch", "length", "step")]
  unknown = sorted(set(kwargs) - set(accepted))
  if unknown:
    raise ValueError(f"order distribution {name!r} takes {accepted or 'no options'}, "
                     f"got unknown option(s) {unknown}")


def takes_step(name: str) -> bool:
  """Whether distribution ``name`` depends on the training step (a curriculum)."""
  return "step" in inspect.signature(get(name)).parameters


def sample(name: str, key: jax.Array, batch: int, length: int, *, step=None,
           **kwargs) -> jax.Array:
  """Draws ``int32[batch, length]`` orders from the distribution registered as ``name``;
  ``step`` (the training step, may be traced) reaches only distributions that take it."""
  check_kwargs(name, kwargs)
  if step is not None and takes_step(name):
    kwargs = dict(kwargs, step=step)
  return get(name)(key, batch, length, **kwargs)


# ----------------------------------------------------------------------------- distributions


@register("l2r")
def l2r(key: jax.Array, batch: int, length: int) -> jax.Array:
  """Left to right: sigma = identity for every row (an ordinary GPT)."""
  del key
  return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


@register("uniform")
def uniform(key: jax.Array, batch: int, length: int) -> jax.Array:
  """Uniform over all length! permutations, independently per row (row b uses fold_in(key, b),
  so a row's order does not depend on the batch size)."""
  keys = jax.vmap(lambda b: jax.random.fold_in(key, b))(jnp.arange(batch))
  return jax.vmap(lambda k: jax.random.permutation(k, length))(keys).astype(jnp.int32)


@register("r2l")
def r2l(key: jax.Array, batch: int, length: int) -> jax.Array:
  """Right to left: sigma = reversal for every row (after a prompt, `prompt_first`, the answer
  written from its end: a star graph's path from the goal back, one edge lookup a step)."""
  del key
  return jnp.broadcast_to(jnp.arange(length - 1, -1, -1, dtype=jnp.int32), (batch, length))


@register("mixture")
def mixture(key: jax.Array, batch: int, length: int, p_l2r: float = 0.1,
            p_r2l: float = 0.0) -> jax.Array:
  """Per row: left to right with probability ``p_l2r``, right to left with ``p_r2l``, else
  uniform (the paper uses p_l2r = 0.1 and no right-to-left rows)."""
  for name, p in (("p_l2r", p_l2r), ("p_r2l", p_r2l)):
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"mixture: {name} must be in [0, 1], got {p}")
  if p_l2r + p_r2l > 1.0:
    raise ValueError(f"mixture: p_l2r + p_r2l must be at most 1, got {p_l2r} + {p_r2l}")
  k_coin, k_perm = jax.random.split(key)
  if not p_r2l:
    coins = jax.random.bernoulli(k_coin, p_l2r, (batch, 1))
    return jnp.where(coins, l2r(key, batch, length), uniform(k_perm, batch, length))
  u = jax.random.uniform(k_coin, (batch, 1))
  return jnp.where(u < p_l2r, l2r(key, batch, length),
                   jnp.where(u < p_l2r + p_r2l, r2l(key, batch, length),
                             uniform(k_perm, batch, length)))


def curriculum_p_l2r(step, steps: int, p_start: float, p_end: float):
  """The L2R probability of `curriculum` at ``step``: linear from ``p_start`` (step 0) to
  ``p_end`` (step ``steps``), then ``p_end``."""
  frac = jnp.clip(jnp.asarray(step, jnp.float32) / float(steps), 0.0, 1.0)
  return p_start + (p_end - p_start) * frac


@register("curriculum")
def curriculum(key: jax.Array, batch: int, length: int, steps: int = 1000, p_start: float = 1.0,
               p_end: float = 0.1, step=0) -> jax.Array:
  """`mixture` whose ``p_l2r`` moves linearly from ``p_start`` to ``p_end`` over the first
  ``steps`` training steps, then stays at ``p_end``: adapting a left-to-right model to every
  order starts from the orders it knows (all L2R) and ends at the paper's 10% mixture."""
  for name, p in (("p_start", p_start), ("p_end", p_end)):
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"curriculum: {name} must be in [0, 1], got {p}")
  if int(steps) < 1:
    raise ValueError(f"curriculum: steps must be >= 1, got {steps}")
  k_coin, k_perm = jax.random.split(key)
  coins = jax.random.uniform(k_coin, (batch, 1)) < curriculum_p_l2r(step, steps, p_start, p_end)
  return jnp.where(coins, l2r(key, batch, length), uniform(k_perm, batch, length))


@functools.lru_cache(maxsize=64)
def _fixed_permutation(seed: int, length: int) -> np.ndarray:
  # Evaluated eagerly even when the first caller is being traced by jit (seed and length are
  # Python ints, so the permutation is a constant of the trace).
  with jax.ensure_compile_time_eval():
    return np.asarray(jax.random.permutation(jax.random.key(seed), length), dtype=np.int32)


@register("fixed_random")
def fixed_random(key: jax.Array, batch: int, length: int, seed: int = 0) -> jax.Array:
  """One permutation drawn once from ``seed``, used for every sequence and every step."""
  del key
  return jnp.broadcast_to(jnp.asarray(_fixed_permutation(int(seed), length)), (batch, length))


@register("blockwise")
def blockwise(key: jax.Array, batch: int, length: int, block: int = 16, seed: int = 0) -> jax.Array:
  """Blocks of ``block`` tokens visited left to right; inside every block the same fixed
  permutation (drawn once from ``seed``). A final partial block keeps the relative order of
  that permutation restricted to the positions it has."""
  del key
  if block < 1:
    raise ValueError(f"blockwise: block must be >= 1, got {block}")
  inner = _fixed_permutation(int(seed), block)
  rows = []
  for start in range(0, length, block):
    size = min(block, length - start)
    rows.append(start + inner[inner < size])
  order = np.concatenate(rows).astype(np.int32)
  return jnp.broadcast_to(jnp.asarray(order), (batch, length))


# ----------------------------------------------------------------------------- helpers


def permute(x: jax.Array, order: jax.Array) -> jax.Array:
  """Original order -> order space: ``out[b, r] = x[b, order[b, r]]`` (trailing dims kept)."""
  idx = order.reshape(order.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


def ranks(order: jax.Array) -> jax.Array:
  """Inverse permutation: ``ranks(order)[b, order[b, r]] = r``."""
  n = order.shape[-1]
  inv = jax.vmap(lambda o: jnp.zeros((n,), jnp.int32).at[o].set(jnp.arange(n, dtype=jnp.int32)))
  return inv(order.reshape(-1, n)).reshape(order.shape)


def unpermute(y: jax.Array, order: jax.Array) -> jax.Array:
  """Order space -> original order: ``out[b, order[b, r]] = y[b, r]``."""
  return permute(y, ranks(order))


def prompt_first(order: jax.Array, prompt: jax.Array) -> jax.Array:
  """int32 [B, n]: per row, the prompt positions (``prompt`` bool [B, n] in ORIGINAL order, True
  where a token is given) first, in ascending position, then the other positions in the order of
  ``order``. The layout of prompt-conditioned training (the prompt's ranks come first and are not
  scored: `scored_ranks`) and of every sampler's generation order (`sampling.prompts`): a prefix
  prompt is read left to right, as a GPT reads it."""
  n = order.shape[-1]
  rank = ranks(order)
  key = jnp.where(prompt, jnp.arange(n, dtype=jnp.int32), n + rank)
  return jnp.argsort(key, axis=-1, stable=True).astype(jnp.int32)


def scored_ranks(prompt: jax.Array) -> jax.Array:
  """bool [B, n] in ORDER space for an order built by `prompt_first`: rank r is scored (is not
  part of the prompt) iff ``r >= `` the row's number of prompt positions."""
  m = jnp.sum(prompt, axis=-1, dtype=jnp.int32)
  return jnp.arange(prompt.shape[-1], dtype=jnp.int32)[None, :] >= m[:, None]


def is_l2r(order: jax.Array) -> jax.Array:
  """bool[batch]: whether each row is the identity order."""
  return jnp.all(order == jnp.arange(order.shape[-1], dtype=order.dtype), axis=-1)


def rank_mask(order: jax.Array) -> jax.Array:
  """Explicit attention mask for the original-order layout ``[START, x_0, ..., x_{n-1}]``.

  START has rank 0, the token at position p has rank ``ranks(order)[p] + 1``, and slot a may
  attend to slot b iff ``rank[b] <= rank[a]``. Returns bool ``[batch, n+1, n+1]``.
  """
  r = slot_ranks(order)
  return mask_from_ranks(r, r)


def slot_ranks(order: jax.Array) -> jax.Array:
  """int32[batch, n+1]: rank of each slot of ``[START, x_0, ..., x_{n-1}]``."""
  batch = order.shape[0]
  return jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), ranks(order) + 1], axis=1)


def mask_from_ranks(query_ranks: jax.Array, key_ranks: jax.Array) -> jax.Array:
  """``allowed[b, a, c] = key_ranks[b, c] <= query_ranks[b, a]``: the general "who may see whom"
  mask of any partial order given by ranks (ties see each other)."""
  return key_ranks[:, None, :] <= query_ranks[:, :, None]


# ----------------------------------------------------------------------------- prompt block
# A bidirectional prompt (`aogpt.ModelConfig.prompt_attention`): the first ``block[b]`` rank-slots
# of row b (START and the prompt's tokens) see each other both ways; every later slot stays causal
# in the order. Written as ranks, the block is one tie: each rank-slot r < block counts as rank
# block - 1, so `mask_from_ranks` of the tied ranks is the mask; a cache-indexed mask (slot r sees
# indices < limit and itself) takes limit = max(r, block). ``block`` None or 0: causal.


def block_ranks(rank: jax.Array, block: jax.Array | None) -> jax.Array:
  """``rank`` [B, S] with the ranks below ``block`` [B] tied at ``block - 1`` (the prompt block as
  one tie of `mask_from_ranks`); also right for slot indices >= block (query slots appended after
  the n rank-slots keep their index). ``block`` None: ``rank`` unchanged."""
  if block is None:
    return rank
  return jnp.maximum(rank, block.astype(rank.dtype)[:, None] - 1)


def block_limit(rank: jax.Array, block: jax.Array | None) -> jax.Array:
  """The cache limit of rank-slots ``rank`` [B, S] (each sees cache indices < limit and its own
  index): ``rank`` (causal), or ``block`` [B] for the slots inside the prompt block."""
  if block is None:
    return rank
  return jnp.maximum(rank, block.astype(rank.dtype)[:, None])


# ----------------------------------------------------------------------------- slot layout
# The index rules of the slot layout (docs/method.md, "Slot layout"), each written once. In the
# paper's 1-indexed notation sigma_i = order[i - 1]. All take ``order`` [..., n] and ranks shaped
# [..., S] with the same leading dims, and return int32 arrays shaped like the ranks.

START = -1      # slot token id meaning "the START vector"
NO_TARGET = -1  # slot target meaning "no conditioning" (zero vector)


def all_ranks(order: jax.Array) -> jax.Array:
  """int32 ``[..., n]``: ranks 0..n-1 in every row (every rank-slot of a full sequence)."""
  return jnp.broadcast_to(jnp.arange(order.shape[-1], dtype=jnp.int32), order.shape)


def rank_slot_source(order: jax.Array, rank: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The rank-slot rule, order part: rank-slot r holds START (r = 0) or the token x_{sigma_r} at
  position ``order[r - 1]``, with position-embedding row 0 (START) or ``order[r - 1] + 1``.
  Returns (source position, position row); the source is meaningless where ``rank == 0``."""
  n = order.shape[-1]
  src = jnp.take_along_axis(order, jnp.clip(rank - 1, 0, n - 1), axis=-1)
  return src.astype(jnp.int32), jnp.where(rank == 0, 0, src + 1).astype(jnp.int32)


def rank_slot_tokens(tokens: jax.Array, src: jax.Array, is_start: jax.Array) -> jax.Array:
  """The rank-slot rule, token part: START where ``is_start`` (rank 0), else ``tokens[src]``
  (``tokens`` in ORIGINAL order, ``src`` from `rank_slot_source`)."""
  return jnp.where(is_start, START, jnp.take_along_axis(tokens, src, axis=-1)).astype(jnp.int32)


def rank_slots(order: jax.Array, tokens: jax.Array, rank: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(token id, position row) of rank-slots ``rank``: `rank_slot_source` + `rank_slot_tokens`."""
  src, pos = rank_slot_source(order, rank)
  return rank_slot_tokens(tokens, src, rank == 0), pos


def slot_target(order: jax.Array, rank: jax.Array) -> jax.Array:
  """The target rule: the slot that predicts the token of rank r (rank-slot r, or a query for
  rank r) is conditioned on its position ``order[r]`` = sigma_{r+1}. Ranks are clipped to
  0..n-1; callers set NO_TARGET where a slot predicts nothing."""
  n = order.shape[-1]
  return jnp.take_along_axis(order, jnp.clip(rank, 0, n - 1), axis=-1).astype(jnp.int32)


def query_ranks(known: jax.Array, first_query: jax.Array, width: int) -> jax.Array:
  """The query-target rule of parallel generation (Figure 10): in a pass over a step with
  ``known`` [B] committed tokens, query j (j < ``width``) predicts the token of rank
  ``known + first_query + j`` (``first_query`` [B] > 0 when a step's queries are split over
  passes); its target is ``slot_target(order, query_ranks(...))``. int32 [B, width]."""
  j = jnp.arange(width, dtype=jnp.int32)[None, :]
  return (known[:, None].astype(jnp.int32) + first_query[:, None].astype(jnp.int32) + j)
