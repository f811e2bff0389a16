"""Attention kernels beside the plain XLA einsums in `layers.attention`.

* `blockwise`: memory-efficient attention in plain JAX (any backend, any mask). Queries are split
  into blocks of ``block`` rows; each query block runs an online softmax over key blocks (fp32
  running max, denominator and accumulator) and is rematerialised in the backward pass, so no
  ``[B, heads, n, n]`` score or probability tensor is ever saved: the backward of one query block
  holds at most ``[B, heads, block, n]`` fp32 at a time. Causal attention skips the key blocks
  past the diagonal. Same numbers as the XLA path up to fp32 summation order.
* `splash`: TPU flash attention (Pallas splash attention, opt-in: ``model.attention_impl=splash``)
  for causal or full attention without a mask array, per shard under a mesh (``shard_map``);
  ``interpret=True`` runs the same kernel through the Pallas interpreter (CPU tests).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

NEG = float(jnp.finfo(jnp.float32).min)  # the XLA path's masked score


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                        mask: jax.Array | str | None, block: int) -> jax.Array:
  """``q [B, S, N, H]``, ``k, v [B, C, N, H]``; ``mask``: None (causal), a string (full) or
  bool ``[B, S, C]``. Shapes need not divide ``block``: queries and keys are padded (padded keys
  get -inf, so they never receive weight) and the output is cut back to ``S`` rows."""
  if block < 1:
    raise ValueError(f"model.attention_block must be >= 1, got {block}")
  b, s, _, _ = q.shape
  c = k.shape[1]
  causal = mask is None
  arr = mask if not (mask is None or isinstance(mask, str)) else None
  if causal and s != c:
    raise ValueError(f"blockwise attention: causal needs as many queries as keys, got {s} / {c}")
  qb, kb = min(block, s), min(block, c)
  sp, cp = -(-s // qb) * qb, -(-c // kb) * kb
  if sp != s:
    q = jnp.pad(q, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
  if cp != c:
    k = jnp.pad(k, ((0, 0), (0, cp - c), (0, 0), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, cp - c), (0, 0), (0, 0)))
  if arr is not None and (sp, cp) != (s, c):
    arr = jnp.pad(arr, ((0, 0), (0, sp - s), (0, cp - c)))
  fn = jax.checkpoint(functools.partial(_query_block, qb=qb, kb=kb, nk=cp // kb,
                                        causal=causal, keys=c))
  # A scan over query blocks (not a Python loop): XLA may not overlap the rematerialised
  # backward of two blocks, so at most one block's [B, N, qb, C] residuals are live at a time.
  _, out = jax.lax.scan(lambda carry, i: (carry, fn(q, k, v, arr, i * qb)), None,
                        jnp.arange(sp // qb))
  out = jnp.moveaxis(out, 0, 1).reshape(b, sp, *q.shape[2:])
  return out[:, :s]


def _query_block(q, k, v, arr, q0, *, qb, kb, nk, causal, keys):
  """Online softmax of queries ``[q0, q0 + qb)`` over the key blocks; causal attention skips
  (lax.cond) the blocks that lie wholly past the diagonal."""
  b, _, n, h = q.shape
  qi = jax.lax.dynamic_slice_in_dim(q, q0, qb, axis=1)
  scale = 1.0 / math.sqrt(h)
  rows = q0 + jnp.arange(qb)

  def step(carry, j):
    m, l, acc = carry
    kj = jax.lax.dynamic_slice_in_dim(k, j * kb, kb, axis=1)
    vj = jax.lax.dynamic_slice_in_dim(v, j * kb, kb, axis=1)
    sc = jnp.einsum("bsnh,bcnh->bnsc", qi, kj, preferred_element_type=jnp.float32) * scale
    cols = j * kb + jnp.arange(kb)
    if causal:
      sc = jnp.where(cols[None, :] <= rows[:, None], sc, NEG)
    elif arr is not None:
      mj = jax.lax.dynamic_slice(arr, (0, q0, j * kb), (b, qb, kb))
      sc = jnp.where(mj[:, None], sc, NEG)
    sc = jnp.where(cols < keys, sc, -jnp.inf)  # padded keys: never any weight
    m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(sc, axis=-1)))
    p = jnp.exp(sc - m_new[..., None])
    corr = jnp.exp(m - m_new)
    l = l * corr + jnp.sum(p, axis=-1)
    pv = jnp.einsum("bnsc,bcnh->bsnh", p.astype(v.dtype), vj,
                    preferred_element_type=jnp.float32)
    acc = acc * jnp.transpose(corr, (0, 2, 1))[..., None] + pv
    return m_new, l, acc

  def body(carry, j):
    if not causal:
      return step(carry, j), None
    return jax.lax.cond(j * kb <= q0 + qb - 1, step, lambda c, _: c, carry, j), None

  init = (jnp.full((b, n, qb), NEG, jnp.float32), jnp.zeros((b, n, qb), jnp.float32),
          jnp.zeros((b, qb, n, h), jnp.float32))
  (_, l, acc), _ = jax.lax.scan(body, init, jnp.arange(nk))
  return (acc / jnp.transpose(l, (0, 2, 1))[..., None]).astype(v.dtype)


# ----------------------------------------------------------------------------- TPU splash

SPLASH_BLOCK = 512  # the kernel's default tile; shorter sequences use their own length


def splash_blocks(seq: int) -> int:
  return min(SPLASH_BLOCK, seq)


def splash_problems(seq_q: int, seq_k: int, head_dim: int) -> list[str]:
  """Reasons the splash kernel cannot run causal or full attention of these shapes (empty: it
  can)."""
  out = []
  for name, n in (("query", seq_q), ("key", seq_k)):
    if n % 128:
      out.append(f"{name} length {n} is not a multiple of 128")
  if head_dim % 64:
    out.append(f"head_dim {head_dim} is not a multiple of 64")
  return out


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
                     interpret: bool = False, shards=None) -> jax.Array:
  """``q [B, S, N, H]``, ``k, v [B, C, N, H]`` -> ``[B, S, N, H]`` with the Pallas TPU splash
  kernel (causal or full attention), vmapped over the batch. The kernel does not scale the
  scores, so the queries are scaled by 1/sqrt(H) first. ``shards = (mesh, q spec, k/v spec)``
  (`layers.attention` passes it under activation constraints, i.e. in a sharded step): the
  kernel runs per shard in ``shard_map`` (XLA cannot partition a Pallas call), batch over the
  batch axes and heads over ``tensor``. Never run on a real TPU so far."""
  if shards is None:
    return _splash(q, k, v, causal=causal, interpret=interpret)
  mesh, spec, kv_spec = shards
  return jax.shard_map(functools.partial(_splash, causal=causal, interpret=interpret),
                       mesh=mesh, in_specs=(spec, kv_spec, kv_spec), out_specs=spec,
                       check_vma=False)(q, k, v)


def _splash(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
            interpret: bool) -> jax.Array:
  from jax.experimental.pallas.ops.tpu import splash_attention as sa

  b, s, n, h = q.shape
  c = k.shape[1]
  shape = (s, c)
  head = sa.CausalMask(shape) if causal else sa.FullMask(shape)
  bq, bk = splash_blocks(s), splash_blocks(c)
  sizes = sa.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq,
                        block_kv_dkv=bk, block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk)
  kernel = sa.make_splash_mha(sa.MultiHeadMask([head] * n), block_sizes=sizes, head_shards=1,
                              q_seq_shards=1, interpret=interpret)
  qt = jnp.transpose(q * jnp.asarray(1.0 / math.sqrt(h), q.dtype), (0, 2, 1, 3))
  kt, vt = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))
  out = jax.vmap(kernel)(qt, kt, vt)
  return jnp.transpose(out, (0, 2, 1, 3)).astype(v.dtype)
