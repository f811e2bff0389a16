"""Zero-shot perplexity: left-to-right and any-order NLL of evaluation blocks.

Every evaluation block gets its orders from its own *block id* (the batch's ``"index"`` entry
when the data layer provides one, else the CRC-32 of the block's tokens), so the numbers do not
depend on the batch size, the number of processes or the iteration order:

    order of block b, order index k = orders.sample(name, fold_in(fold_in(fold_in(
        key(seed), BASE_STREAM), block_id(b)), k), 1, n)[0]

``name="l2r"`` is the identity (an ordinary GPT); ``"uniform"`` (default) is the any-order NLL
of the paper; any registered order distribution works. The jitted per-batch function returns
per-token NLLs (in order space); weighting by the batch's ``"weight"`` (per row ``[B]`` or per
token ``[B, n]``) and the sums happen on the host in float64, and are summed across JAX
processes at the end, so every block counts exactly once.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Iterable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.model import jit as model_jit
from aogpt_jax.model import orders as orders_lib

BASE_STREAM = 0xBA5E      # fold-in tag of the base (scoring) orders
ENSEMBLE_STREAM = 0xE45E  # fold-in tag of the ensemble context orderings (ensembles.py)

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (beyond: the normal 1.96).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def block_ids(batch: Mapping[str, Any]) -> np.ndarray:
  """uint32 [B]: the batch's ``"index"`` if present, else the CRC-32 of each row's tokens."""
  if "index" in batch:
    return np.asarray(batch["index"]).astype(np.uint32)
  tokens = np.asarray(batch["tokens"], np.int32)
  return np.array([zlib.crc32(np.ascontiguousarray(r).tobytes()) for r in tokens], np.uint32)


def check_eval_batch(batch: Mapping[str, Any], cfg: model_lib.ModelConfig
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Validates an eval batch (before anything compiles); returns (tokens, token weights)."""
  if "tokens" not in batch:
    raise ValueError(f"eval batch has no 'tokens' entry (keys: {sorted(batch)})")
  tokens = np.asarray(batch["tokens"])
  if tokens.ndim != 2:
    raise ValueError(f"eval batch 'tokens' must be [batch, n], got shape {tokens.shape}")
  b, n = tokens.shape
  if n > cfg.block_size:
    raise ValueError(f"eval blocks of {n} tokens exceed model.block_size {cfg.block_size}")
  bad = np.argwhere((tokens < 0) | (tokens >= cfg.valid_vocab_size))
  if len(bad):
    r, c = bad[0]
    raise ValueError(f"eval batch token {tokens[r, c]} at row {r}, position {c} is outside the "
                     f"model's valid vocabulary [0, {cfg.valid_vocab_size})")
  weight = np.asarray(batch.get("weight", np.ones((b,), np.float32)), np.float64)
  if weight.shape == (b,):
    weight = np.broadcast_to(weight[:, None], (b, n))
  if weight.shape != (b, n):
    raise ValueError(f"eval batch 'weight' must be [batch] or [batch, n]; got {weight.shape} "
                     f"for tokens {tokens.shape}")
  return tokens.astype(np.int32), weight


def eval_orders(name: str, seed, ids: jax.Array, n: int, order_index=0,
                order_kwargs: tuple = ()) -> jax.Array:
  """int32 [B, n]: the scoring order of each block (see the module docstring)."""
  base = jax.random.fold_in(jax.random.key(seed), BASE_STREAM)

  def one(bid):
    key = jax.random.fold_in(jax.random.fold_in(base, bid), order_index)
    return orders_lib.sample(name, key, 1, n, **dict(order_kwargs))[0]

  return jax.vmap(one)(ids).astype(jnp.int32)


@model_jit.jit("order_name", "order_kwargs", "encoder")
def _token_nll(m, tokens, ids, seed, order_index, *, order_name, order_kwargs, encoder):
  order = eval_orders(order_name, seed, ids, tokens.shape[1], order_index, order_kwargs)
  if encoder:   # the encoder-only MDM baseline: n bidirectional forwards (aogpt_jax.model.encoder)
    return encoder_model.exact_order_nll(m, tokens, order), order
  _, per_token = model_lib.loss(m, tokens, order)
  return per_token, order


def token_nll(m: model_lib.AOGPT, tokens, ids, *, order: str = "uniform", seed: int = 0,
              order_index: int = 0, order_kwargs: Mapping[str, Any] | None = None,
              encoder: bool = False):
  """(per-token NLL [B, n] in ORDER space, order [B, n]) for the blocks ``tokens``/``ids``;
  ``encoder=True`` scores an encoder-only MDM model on the same orders."""
  kw = tuple(sorted((order_kwargs or {}).items()))
  orders_lib.check_kwargs(order, dict(kw))
  return model_jit.call(_token_nll, m, jnp.asarray(tokens, jnp.int32), jnp.asarray(ids),
                        jnp.uint32(seed), jnp.int32(order_index), order_name=order,
                        order_kwargs=kw, encoder=encoder)


def eval_blocks(batches: Iterable[Mapping[str, Any]], cfg: model_lib.ModelConfig,
                max_batches: int = 0) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
  """The evaluation batch loop, written once: (batch index, tokens [B, n], token weights [B, n],
  block ids [B]) of each batch of ``{"tokens", "weight"[, "index"]}``, checked before anything
  compiles (`check_eval_batch`); at most ``max_batches`` batches (0: all)."""
  for bi, batch in enumerate(batches):
    if max_batches and bi >= max_batches:
      return
    tokens, weight = check_eval_batch(batch, cfg)
    yield bi, tokens, weight, block_ids(batch)


def sum_across_processes(x: np.ndarray) -> np.ndarray:
  """Sums a float64 host array over JAX processes exactly (bits travel as uint32)."""
  x = np.ascontiguousarray(x, np.float64)
  if jax.process_count() == 1:
    return x
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  bits = multihost_utils.process_allgather(x.view(np.uint32))
  return np.asarray(bits).reshape(jax.process_count(), -1).view(np.float64).sum(0).reshape(
      x.shape)


class NLLSum:
  """Weighted NLL and token count, accumulated in float64 on the host."""

  def __init__(self, size: int = 1):
    self.nll = np.zeros((size,), np.float64)
    self.tokens = 0.0
    self.blocks = 0.0

  def add(self, per_token_orig: np.ndarray, weight: np.ndarray, slot: int = 0) -> None:
    """``per_token_orig`` [B, n] NLLs in ORIGINAL position order, ``weight`` [B, n]."""
    self.nll[slot] += float(np.sum(np.asarray(per_token_orig, np.float64) * weight))

  def count(self, weight: np.ndarray) -> None:
    self.tokens += float(np.sum(weight))
    self.blocks += float(np.sum(np.any(weight > 0, axis=1)))

  def reduce(self) -> None:
    tot = sum_across_processes(np.concatenate([self.nll, [self.tokens, self.blocks]]))
    self.nll, self.tokens, self.blocks = tot[:-2], float(tot[-2]), float(tot[-1])

  def means(self) -> np.ndarray:
    if self.tokens <= 0:
      raise ValueError("no evaluation token had positive weight (empty dataset or split?)")
    return self.nll / self.tokens


def to_original(per_token: np.ndarray, order: np.ndarray) -> np.ndarray:
  """Order space -> original positions on the host: ``out[b, order[b, r]] = x[b, r]``."""
  out = np.empty_like(per_token)
  np.put_along_axis(out, np.asarray(order), per_token, axis=1)
  return out


def t_quantile_975(df: int) -> float:
  return _T975[df - 1] if 1 <= df <= len(_T975) else 1.959964


def summarize(nll_per_order: np.ndarray, tokens: float, blocks: float, **settings) -> dict:
  """Perplexity summary over K order draws: mean NLL, exp of it, and (K > 1) a 95% Student-t
  confidence interval over the K per-order mean NLLs (also given as perplexities)."""
  k = len(nll_per_order)
  mean = float(np.mean(nll_per_order))
  out = dict(settings, nll=mean, ppl=math.exp(mean), tokens=tokens, blocks=blocks,
             num_orders=k, per_order_nll=[float(v) for v in nll_per_order],
             per_order_ppl=[math.exp(float(v)) for v in nll_per_order])
  if k > 1:
    half = t_quantile_975(k - 1) * float(np.std(nll_per_order, ddof=1)) / math.sqrt(k)
    out.update(nll_ci95=[mean - half, mean + half],
               ppl_ci95=[math.exp(mean - half), math.exp(mean + half)],
               ci_method=f"95% Student-t over {k} order draws ({k - 1} dof)")
  return out


def perplexity(m: model_lib.AOGPT, batches: Iterable[Mapping[str, Any]], *,
               order: str = "uniform", seed: int = 0, num_orders: int = 1,
               order_kwargs: Mapping[str, Any] | None = None, max_batches: int = 0) -> dict:
  """Zero-shot perplexity of ``m`` over ``batches`` of ``{"tokens", "weight"}``.

  ``order="l2r"`` gives the left-to-right perplexity; ``"uniform"`` the any-order one, averaged
  over ``num_orders`` independent order draws per block (with a 95% CI over draws).
  """
  if num_orders < 1:
    raise ValueError(f"eval.num_orders must be >= 1, got {num_orders}")
  acc = NLLSum(num_orders)
  for _, tokens, weight, ids in eval_blocks(batches, m.cfg, max_batches):
    acc.count(weight)
    for k in range(num_orders):
      per_token, o = token_nll(m, tokens, ids, order=order, seed=seed, order_index=k,
                               order_kwargs=order_kwargs)
      acc.add(to_original(np.asarray(per_token), np.asarray(o)), weight, k)
  acc.reduce()
  return summarize(acc.means(), acc.tokens, acc.blocks, order=order, seed=seed,
                   order_kwargs=dict(order_kwargs or {}))
