"""Attention: the kernel choice, the plain XLA path (two einsums, fp32 softmax, masked variants)
and the kernels beside it.

`attention` takes ``q [B, S, N, H]``, ``k, v [B, C, N, H]`` and a mask (None = causal, FULL =
bidirectional, or a bool ``[B, S, C]`` array: the parallel-generation mask of the sampler and the
ensembles' packed rows); `resolve_attention_impl` picks the kernel for a call and logs why once.
Kernels:
* `blockwise`: memory-efficient attention in plain JAX (any backend, any mask). Queries are split
  into blocks of ``block`` rows; each query block runs an online softmax over key blocks (fp32
  running max, denominator and accumulator) and is rematerialised in the backward pass, so no
  ``[B, heads, n, n]`` score or probability tensor is ever saved: the backward of one query block
  holds at most ``[B, heads, block, n]`` fp32 at a time. Causal attention skips the key blocks
  past the diagonal. Same numbers as the XLA path up to fp32 summation order.
* `splash`: TPU flash attention (Pallas splash attention; ``auto``'s choice on TPU where its shape
  rules allow) for causal or full attention without a mask array, per shard under a mesh
  (``shard_map``);
  ``interpret=True`` runs the same kernel through the Pallas interpreter (CPU tests).
"""

from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp

from aogpt_jax.model.layers import BATCH, HEADS, activation_placement, check_choice, slot_rows


def query_mask(mask: jax.Array | str | None, query: jax.Array, keys: int) -> jax.Array:
  """The attention mask's rows [B, G, K] of the query slots ``query`` [B, G], for ``mask`` None
  (causal), FULL or a [B, S, K] array (see `attention`)."""
  if mask is None:
    return jnp.arange(keys)[None, None, :] <= query[..., None]
  if isinstance(mask, str):
    return jnp.ones(query.shape + (keys,), bool)
  return slot_rows(mask, query)


# ----------------------------------------------------------------------------- attention

ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash", "blockwise")
# ``mask`` value for bidirectional attention with no mask array (the encoder baseline).
FULL = "full"
_logged: set[tuple] = set()


def _log_once(msg: str, *key) -> None:
  if key not in _logged:
    _logged.add(key)
    logging.info(msg)


# ``auto`` on TPU: at least this many queries attending at least this many keys (the training
# step at n >= 1024, the ensembles' long packed rows) never run the materialising ``xla`` path
# (a [B, heads, S, C] fp32 score tensor per layer): splash where it can, else blockwise.
AUTO_BLOCKWISE_MIN = 1024


def resolve_attention_impl(requested: str, dtype, head_dim: int, *, masked: bool,
                           seq_q: int | None = None, seq_k: int | None = None) -> str:
  """Chooses the attention kernel.

  ``auto``:
  * GPU: ``cudnn`` (flash attention through ``jax.nn.dot_product_attention``) when the compute
    dtype is bf16/fp16, head_dim a multiple of 8 up to 128 and no explicit mask array is given
    (causal or full attention); ``xla`` otherwise, logging the reason once.
  * TPU: ``splash`` (the Pallas flash kernel) for causal or full attention whose lengths are
    multiples of 128 and head_dim a multiple of 64 (`splash_problems`); otherwise ``blockwise``
    when the call is long (``seq_q`` and ``seq_k`` >= `AUTO_BLOCKWISE_MIN`: training at
    n >= 1024, long masked rows), else ``xla`` (short calls, the cached sampler's few queries).
    The choice and its reason are logged once.
  * CPU and others: ``xla`` (the fastest there; README, measured results).
  Asked for by name: ``cudnn`` and ``splash`` raise when their rules do not hold (``splash``
  with an explicit mask array runs ``xla`` for those calls, logged once); ``blockwise`` and
  ``xla`` run everywhere. `choose` is the same rule with the backend as an argument.
  """
  return choose(requested, jax.default_backend(), dtype, head_dim, masked=masked, seq_q=seq_q,
                seq_k=seq_k)


def choose(requested: str, backend: str, dtype, head_dim: int, *, masked: bool,
           seq_q: int | None = None, seq_k: int | None = None) -> str:
  """`resolve_attention_impl` on ``backend`` ("cpu", "gpu", "tpu")."""
  check_choice("model.attention_impl", requested, ATTENTION_IMPLS)
  if requested in ("xla", "blockwise"):
    return requested
  seq_k = seq_k or seq_q
  if requested == "splash" or (requested == "auto" and backend == "tpu"):
    if backend == "tpu" and masked:
      if requested == "splash":
        _log_once("attention: explicit mask array, splash runs causal or full attention only; "
                  "using the XLA kernel for these calls", "splash-masked")
        return "xla"
      return _long_fallback(seq_q, seq_k, "explicit mask array (splash runs causal or full "
                            "attention only)")
    reasons = [] if backend == "tpu" else [f"backend is {backend}, not tpu"]
    if seq_q is not None:
      reasons += splash_problems(seq_q, seq_k, head_dim)
    if requested == "auto" and reasons:
      return _long_fallback(seq_q, seq_k, "; ".join(reasons))
    return _pick("splash", requested, reasons)
  reasons = []
  if backend != "gpu":
    reasons.append(f"backend is {backend}, not gpu")
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    reasons.append(f"compute dtype is {jnp.dtype(dtype).name}, cuDNN needs bfloat16 or float16")
  if head_dim % 8 or head_dim > 128:
    reasons.append(f"head_dim {head_dim} is not a multiple of 8 up to 128")
  if masked and requested == "auto":
    reasons.append("explicit mask array (auto uses cuDNN only for causal or full attention)")
  return _pick("cudnn", requested, reasons)


def _long_fallback(seq_q: int | None, seq_k: int | None, why: str) -> str:
  """``auto`` on TPU without splash: blockwise for long calls, xla for short ones."""
  if seq_q is not None and min(seq_q, seq_k or seq_q) >= AUTO_BLOCKWISE_MIN:
    _log_once(f"attention: using blockwise attention ({why})", "blockwise", why)
    return "blockwise"
  _log_once(f"attention: using the XLA kernel for calls shorter than {AUTO_BLOCKWISE_MIN} "
            f"({why})", "xla-short", why)
  return "xla"


def _pick(kernel: str, requested: str, reasons: list[str]) -> str:
  if requested == kernel:
    if reasons:
      raise ValueError(f"model.attention_impl={kernel!r} cannot be used: " + "; ".join(reasons))
    return kernel
  if reasons:
    _log_once("attention: using the XLA kernel (" + "; ".join(reasons) + ")", "xla", *reasons)
    return "xla"
  _log_once(f"attention: using {kernel} flash attention", kernel)
  return kernel


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mask: jax.Array | str | None,
              impl: str, block: int = 256, mask_causal: bool = False) -> jax.Array:
  """``q [B, S, N, H]``, ``k, v [B, C, N, H]``; ``mask``: None (causal), FULL (bidirectional)
  or bool ``[B, S, C]``.

  ``cudnn`` calls ``jax.nn.dot_product_attention``; ``splash`` the Pallas TPU kernel;
  ``blockwise`` the memory-efficient online-softmax attention with ``block``-row query and key
  blocks (attention.py); ``xla`` is written out as two einsums with the softmax in fp32:
  on CPU a whole train step at n = 1024 ran 3.2x faster than with
  ``jax.nn.dot_product_attention``'s XLA path (README, measured results). ``mask_causal``: the
  caller's mask array lets no query see a key after its own slot (S = C), so ``xla`` skips the
  blocks above the diagonal (`MASK_CHUNKS`); other kernels ignore it."""
  no_array = mask is None or (isinstance(mask, str) and mask == FULL)
  if impl == "cudnn":
    if no_array:
      return jax.nn.dot_product_attention(q, k, v, is_causal=mask is None, implementation=impl)
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, :, :], implementation=impl)
  if impl in ("splash", "splash_interpret"):
    if not no_array:
      raise ValueError("splash attention takes no mask array")
    heads = (BATCH, None, HEADS, None)
    placed = activation_placement(heads, q.shape)   # under a mesh: per shard, in shard_map
    shards = None if placed is None else (
        placed[0], placed[1], activation_placement(heads, k.shape)[1])
    return splash_attention(q, k, v, causal=mask is None, interpret=impl == "splash_interpret",
                            shards=shards)
  if impl == "blockwise":
    return blockwise_attention(q, k, v, mask=mask, block=block)
  if not no_array:
    if mask_causal and q.shape[1] == k.shape[1]:
      return _causal_masked_attention(q, k, v, mask)
    return _masked_attention(q, k, v, mask)
  scores = jnp.einsum("bsnh,bcnh->bnsc", q, k, preferred_element_type=jnp.float32)
  scores = scores * (1.0 / math.sqrt(q.shape[-1]))
  if mask is None:
    s, c = q.shape[1], k.shape[1]
    keep = jnp.arange(c)[None, :] <= jnp.arange(s)[:, None]
    scores = jnp.where(keep, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum("bnsc,bcnh->bsnh", probs, v)


def _masked_attention(q, k, v, mask):
  """The ``xla`` attention under a mask array, on heads-major operands ([B, N, S, H]): XLA:CPU
  ran the ensembles' packed rows (60 rows x 4 heads of 257 x 257) 0.83x the time of the whole
  evaluator program than on [B, S, N, H] (whose probs x V dot it laid out transposed); the
  causal training step was 1.08x slower this way, so it keeps the layout above."""
  q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
  scores = jnp.einsum("bnsh,bnch->bnsc", q, k, preferred_element_type=jnp.float32)
  scores = jnp.where(mask[:, None, :, :], scores * (1.0 / math.sqrt(q.shape[-1])),
                     jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum("bnsc,bnch->bnsh", probs, v).transpose(0, 2, 1, 3)


# Query chunks of `attention(..., mask_causal=True)` on the ``xla`` kernel: chunk c attends only
# the keys up to its last slot, (K + 1) / 2K of the score matrix for K chunks. Four chunks were
# the fastest on the ensembles' packed rows on CPU (docs/performance.md): more chunks add
# per-chunk overhead, fewer compute more of the masked half.
MASK_CHUNKS = 4


def _causal_masked_attention(q, k, v, mask):
  """`_masked_attention` of a mask with no key past its query's slot, by query chunks."""
  s = q.shape[1]
  bounds = [round(s * c / MASK_CHUNKS) for c in range(MASK_CHUNKS + 1)]
  return jnp.concatenate([_masked_attention(q[:, lo:hi], k[:, :hi], v[:, :hi], mask[:, lo:hi, :hi])
                          for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo], axis=1)


# ----------------------------------------------------------------------------- kernels
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
  (`attention.attention` passes it under activation constraints, i.e. in a sharded step): the
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
