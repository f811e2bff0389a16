"""The transformer block of AO-GPT: attention (with the KV-cache write), MLP, and the pre-norm
block with its target-position conditioning (adaLN modulation or a per-block target embedding).

`aogpt.AOGPT` stacks these; the parameter names (``attn.c_attn``, ``mlp.c_fc``, ``adaLN``,
``wtpe``) are those of the published checkpoints and must not change. ``cfg`` is always an
`aogpt.ModelConfig` (not imported here: aogpt.py imports this module).
"""

from __future__ import annotations

import math
import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from aogpt_jax.model.attention import attention, query_mask, resolve_attention_impl
from aogpt_jax.model.layers import (BATCH, HEADS, MLP_ACT, Dense, Embed, Norm, constrain,
                                    dense_cols, dense_heads, row_set, slot_rows, take_rows)


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  if key is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def fold_key(key: jax.Array | None, *data: int) -> jax.Array | None:
  if key is None:
    return None
  for d in data:
    key = jax.random.fold_in(key, d)
  return key


def table_lookup(table: jax.Array, ids: jax.Array) -> jax.Array:
  """Rows of ``table`` with ids == NO_TARGET mapped to a zero row (zero conditioning)."""
  full = jnp.concatenate([table, jnp.zeros((1, table.shape[1]), table.dtype)], axis=0)
  return jnp.take(full, jnp.where(ids < 0, table.shape[0], ids), axis=0)


class Attention(nnx.Module):
  """Multi-head attention; with ``model.n_kv_head < n_head`` grouped-query attention (each
  key/value head serves n_head / n_kv_head query heads, as Hugging Face's ``repeat_kv``): the
  cache holds the key/value heads only, repeated for the product. ``c_attn``'s columns are
  ``[q (n_head heads) | k (kv heads) | v (kv heads)]``."""

  def __init__(self, cfg, *, rngs: nnx.Rngs, dtype, param_dtype):
    d, std = cfg.n_embd, cfg.init_std
    kw = dict(rngs=rngs, use_bias=cfg.bias, dtype=dtype, param_dtype=param_dtype,
              truncation=cfg.init_truncation)
    self.n_head, self.head_dim, self.qk_norm = cfg.n_head, cfg.head_dim, cfg.qk_norm
    self.kv_heads = cfg.kv_heads
    qd, kvd = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    # The published layout (q, k, v of n_head heads each, n_head * head_dim = d) projects with
    # one [d, 3, heads, head_dim] view (`dense_heads`); other shapes by column ranges.
    self.split = qd != d or kvd != qd
    self.c_attn = Dense(d, qd + 2 * kvd, axes=("embed", "qkv"), std=std,
                        **dict(kw, use_bias=cfg.bias or cfg.qkv_bias))
    self.c_proj = Dense(qd, d, axes=("heads", "embed"), std=std / math.sqrt(2 * cfg.n_layer),
                        **kw)
    if cfg.qk_norm:
      nk = dict(kind="rmsnorm", eps=cfg.norm_eps, axes=("head_dim",), dtype=dtype)
      self.q_norm = Norm(cfg.head_dim, **nk)
      self.k_norm = Norm(cfg.head_dim, **nk)
    self.impl, self.block, self.dtype = cfg.attention_impl, cfg.attention_block, dtype
    self.rope, self.rope_theta = cfg.rope, float(cfg.rope_theta)
    self.rope_query = cfg.rope_query

  def _qkv(self, x, query, mask):
    """(q, k, v, mask): q at the query slots (all without ``query``), keys and values at all."""
    s = x.shape[1]
    if self.split:
      qd = self.n_head * self.head_dim
      q = dense_cols(self.c_attn, x if query is None else slot_rows(x, query), 0, 1,
                     self.n_head, self.head_dim)[:, :, 0]
      kv = dense_cols(self.c_attn, x, qd, 2, self.kv_heads, self.head_dim)
      return (q, kv[:, :, 0], kv[:, :, 1],
              mask if query is None else query_mask(mask, query, s))
    if query is None:
      qkv = dense_heads(self.c_attn, x, 3, self.n_head, self.head_dim)
      return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], mask
    q = dense_heads(self.c_attn, slot_rows(x, query), 3, self.n_head, self.head_dim,
                    slice(0, 1))[:, :, 0]
    kv = dense_heads(self.c_attn, x, 3, self.n_head, self.head_dim, slice(1, 3))
    return q, kv[:, :, 0], kv[:, :, 1], query_mask(mask, query, s)

  def __call__(self, x, *, mask, cache, write_index, query=None, mask_causal=False,
               positions=None):
    """``query`` int32 [B, G] (no cache): keys and values of every slot, the rest (queries,
    attention, projection: output [B, G, d]) at these slots only. ``mask_causal``: see
    `attention.attention`. ``positions`` (``model.rope``): (query, key) position rows [B, S]."""
    b = x.shape[0]
    if query is not None and cache is not None:
      raise ValueError("Attention: query slots take no cache")
    q, k, v, mask = self._qkv(x, query, mask)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    if positions is not None:
      q_pos, k_pos = positions
      q = rotate(q, q_pos if query is None else slot_rows(q_pos, query), self.rope_theta)
      k = rotate(k, k_pos, self.rope_theta)
    grouped = self.kv_heads != self.n_head
    q = constrain(q, (BATCH, None, HEADS, None))
    if not grouped:   # grouped: the kv heads are pinned once repeated, below
      k, v = (constrain(t, (BATCH, None, HEADS, None)) for t in (k, v))
    new_cache = None
    if cache is not None:
      # Write this block's keys and values into the preallocated cache (indices past its end
      # are dropped), then attend over the whole cache under the caller's mask.
      # The cache is heads-major [B, N, K, H], as attention reads it: a [B, K, N, H] cache made
      # XLA:CPU transpose every layer's whole keys and values in every sampler step (a fifth of
      # a step: docs/performance.md; tests/test_sampler_logits.py checks none comes back).
      ck, cv = cache
      ck, cv = row_set(ck, write_index, k, axis=2), row_set(cv, write_index, v, axis=2)
      new_cache = (ck, cv)
      k, v = (jnp.swapaxes(c, 1, 2).astype(self.dtype) for c in (ck, cv))
    if grouped:       # query head i reads key/value head i // (n_head / kv_heads)
      rep = self.n_head // self.kv_heads
      k, v = (constrain(jnp.repeat(t, rep, axis=2), (BATCH, None, HEADS, None)) for t in (k, v))
    impl = resolve_attention_impl(self.impl, self.dtype, self.head_dim,
                                  masked=not (mask is None or isinstance(mask, str)),
                                  seq_q=q.shape[1], seq_k=k.shape[1])
    y = attention(q, k, v, mask=mask, impl=impl, block=self.block, mask_causal=mask_causal)
    y = checkpoint_name(constrain(y, (BATCH, None, HEADS, None)), "attention")  # remat_policy
    return self.c_proj(y.reshape(b, q.shape[1], self.n_head * self.head_dim)), new_cache


class MLP(nnx.Module):
  """``gelu``: c_proj(gelu(c_fc(x))); gated (``swiglu`` / ``geglu``): c_fc's columns are
  ``[gate | up]`` and the MLP is c_proj(act(gate) * up), act SiLU or GELU (model.gelu)."""

  def __init__(self, cfg, *, rngs: nnx.Rngs, dtype, param_dtype):
    d, h, std = cfg.n_embd, cfg.mlp_width, cfg.init_std
    kw = dict(rngs=rngs, use_bias=cfg.bias, dtype=dtype, param_dtype=param_dtype,
              truncation=cfg.init_truncation)
    self.kind = cfg.mlp
    self.c_fc = Dense(d, h if cfg.mlp == "gelu" else 2 * h, axes=("embed", "mlp"), std=std, **kw)
    self.c_proj = Dense(h, d, axes=("mlp", "embed"), std=std / math.sqrt(2 * cfg.n_layer), **kw)
    self.approximate = cfg.gelu == "tanh"

  def __call__(self, x):
    h = constrain(self.c_fc(x), (BATCH, None, MLP_ACT))
    if self.kind == "gelu":
      return self.c_proj(jax.nn.gelu(h, approximate=self.approximate))
    gate, up = jnp.split(h, 2, axis=-1)
    act = (jax.nn.silu(gate) if self.kind == "swiglu"
           else jax.nn.gelu(gate, approximate=self.approximate))
    return self.c_proj(act * up)


class Block(nnx.Module):
  """Pre-norm block; with ``target='adaln'`` the norms are modulated and the branches gated:
  ``x = x + gate_a * Attn(norm(x) * (1 + scale_a) + shift_a)``, the same for the MLP, where
  ``gate_a = model.gate_offset + g_a`` (``g_a`` projected like shift and scale; offset 0 as
  published; offset 1 with zero-init modulation makes the block the plain GPT block)."""

  def __init__(self, cfg, *, rngs: nnx.Rngs, dtype, param_dtype):
    # Norms return fp32 (the residual stream's dtype); Dense casts its input to ``dtype``.
    nk = dict(kind=cfg.norm, use_bias=cfg.bias, eps=cfg.norm_eps, dtype=jnp.float32,
              param_dtype=param_dtype)
    self.ln_1 = Norm(cfg.n_embd, **nk)
    self.attn = Attention(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.ln_2 = Norm(cfg.n_embd, **nk)
    self.mlp = MLP(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.target, self.dropout = cfg.target, cfg.dropout
    if cfg.target == "adaln":
      self.adaLN = Dense(cfg.target_dim, 6 * cfg.n_embd, axes=("cond", "mod"), rngs=rngs,
                         std=cfg.init_std, zero_init=cfg.zero_init_modulation, dtype=dtype,
                         param_dtype=param_dtype, truncation=cfg.init_truncation)
    elif cfg.target == "per_block":
      self.wtpe = Embed(cfg.block_size, cfg.n_embd, axes=(None, "embed"), rngs=rngs,
                        std=cfg.init_std, dtype=dtype, param_dtype=param_dtype,
                        truncation=cfg.init_truncation)
      if cfg.zero_init_target:
        self.wtpe.embedding[...] = jnp.zeros_like(self.wtpe.embedding[...])
    self.gate_offset = float(cfg.gate_offset)

  def __call__(self, x, slot_tgt, cond_table, *, mask, cache, write_index, dropout_key,
               query=None, mask_causal=False, tables=None, slot_pos=None):
    """``query`` int32 [B, G]: only these slots' outputs [B, G, d] (keys and values of all).
    ``slot_pos``: the slots' position rows, for ``model.rope`` (`rope_positions`).
    ``tables``: this block's six `modulation_tables`, computed by the caller (``cond_table`` is
    then unused)."""
    rows = (lambda a: a) if query is None else (lambda a: slot_rows(a, query))
    kw = dict(mask=mask, cache=cache, write_index=write_index, query=query,
              mask_causal=mask_causal,
              positions=(rope_positions(slot_pos, None if self.target == 'none'
                                        or self.attn.rope_query == 'token' else slot_tgt)
                         if self.attn.rope else None))
    if self.target == "per_block":
      x = x + table_lookup(self.wtpe.embedding[...], slot_tgt).astype(x.dtype)
    if self.target == "adaln":
      if tables is None:
        tables = modulation_tables(self.adaLN, cond_table, 6)
      sa, ca = (condition(t, slot_tgt) for t in tables[:2])
      ga, sm, cm, gm = (condition(t, rows(slot_tgt)) for t in tables[2:])
      if self.gate_offset:     # gate = gate_offset + g (model.gate_offset)
        ga, gm = ga + self.gate_offset, gm + self.gate_offset
      h, new_cache = self.attn(self.ln_1(x) * (1 + ca) + sa, **kw)
      x = rows(x) + ga * dropout(h, self.dropout, fold_key(dropout_key, 0))
      h = self.mlp(self.ln_2(x) * (1 + cm) + sm)
      return x + gm * dropout(h, self.dropout, fold_key(dropout_key, 1)), new_cache
    h, new_cache = self.attn(self.ln_1(x), **kw)
    x = rows(x) + dropout(h, self.dropout, fold_key(dropout_key, 0))
    h = self.mlp(self.ln_2(x))
    return x + dropout(h, self.dropout, fold_key(dropout_key, 1)), new_cache


def modulation_tables(dense: Dense, cond_table: jax.Array, parts: int) -> list[jax.Array]:
  """``dense(SiLU(row))`` for every conditioning row and, last, the zero row (NO_TARGET), split
  into ``parts`` tables [P + 1, ...] along the features (shift, scale, gate, ...); `condition`
  gathers a slot's rows.

  The conditioning depends only on the target position, so the projection is computed once per
  table row (and the zero row) and gathered: a fraction of the FLOPs at training batch sizes,
  and inside the samplers' step loops XLA hoists it out of the loop (it depends on parameters
  only), so a sampler step gathers its rows instead of projecting them; programs called many
  times on the same weights take them precomputed (`AOGPT.modulation_tables`). Each part is
  gathered on its own, so XLA can fuse the gather into the part's one use instead of writing all
  of them out (docs/performance.md has the measured gains). The gather's gradient goes through
  `layers.take_rows` (no scatter-add when a sequence's targets are distinct).
  """
  full = jnp.concatenate([cond_table, jnp.zeros((1, cond_table.shape[1]), cond_table.dtype)])
  return jnp.split(dense(jax.nn.silu(full)), parts, axis=-1)


def condition(table: jax.Array, slot_tgt: jax.Array) -> jax.Array:
  """The rows of a `modulation_tables` table for ``slot_tgt`` (NO_TARGET: the zero row's)."""
  return take_rows(table, jnp.where(slot_tgt < 0, table.shape[0] - 1, slot_tgt))


ROPE_BASE = 10_000.0


def rope_positions(slot_pos: jax.Array, slot_tgt: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """(query, key) rotary positions in the position-row numbering (START 0, position p at p + 1):
  a slot's key sits at its token's row and its query at its target's row, so each score depends
  on target - key position alone. A slot without a target (NO_TARGET; every slot when
  ``slot_tgt`` is None: ``target='none'``, the encoder, ``model.rope_query='token'``) queries
  from its own row."""
  if slot_tgt is None:
    return slot_pos, slot_pos
  return jnp.where(slot_tgt < 0, slot_pos, slot_tgt + 1), slot_pos


def rotate(x: jax.Array, pos: jax.Array, base: float = ROPE_BASE) -> jax.Array:
  """Rotary embedding of x [B, S, N, H] at positions pos int32 [B, S] (halves rotated as pairs,
  as Hugging Face's ``rotate_half``; ``base``: model.rope_theta), computed in fp32 and returned
  in x's dtype."""
  half = x.shape[-1] // 2
  freq = 1.0 / (base ** (jnp.arange(0, 2 * half, 2, dtype=jnp.float32) / (2 * half)))
  angle = pos.astype(jnp.float32)[:, :, None, None] * freq            # [B, S, 1, H/2]
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  a, b = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], -1).astype(x.dtype)


def run_block(block, x, slot_tgt, cond_table, mask, cache, write_index, dropout_key, query=None,
              tables=None, slot_pos=None, *, mask_causal=False):
  return block(x, slot_tgt, cond_table, mask=mask, cache=cache, write_index=write_index,
               dropout_key=dropout_key, query=query, mask_causal=mask_causal, tables=tables,
               slot_pos=slot_pos)


# ----------------------------------------------------------------------------- remat

# model.remat_policy: what a rematerialised block keeps for its backward pass (jax.checkpoint
# policies); everything else is recomputed from the block's inputs.
REMAT_POLICIES = {
    "block": jax.checkpoint_policies.nothing_saveable,          # the block's inputs only
    "attention": jax.checkpoint_policies.save_only_these_names("attention"),  # + attention out
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # + x @ W
    "dots": jax.checkpoint_policies.checkpoint_dots,           # + every matmul's output
}


def late_remat(fn, policy: str):
  """``fn`` (pure: arrays in, arrays out) rematerialised under ``REMAT_POLICIES[policy]``, with
  the recomputation tied to the incoming gradient (`after`).

  ``jax.checkpoint`` alone recomputes a block from inputs that exist since the forward pass, so
  XLA's scheduler is free to run the recomputation early, and XLA:CPU's did: for AO-GPT Small
  at 8 x 1024 tokens every block's recomputed activations were live at once during the loss,
  and full remat saved 0.3 of 10.5 GiB (docs/scaling.md, "What holds the memory"). Here the
  backward pass makes the saved residuals depend on the output gradient (`after`), so a
  block's recomputation cannot start before the gradient of its output exists, i.e. after the
  blocks above it are done: one block's activations are recomputed and live at a time. Same
  numbers as ``jax.checkpoint`` (the same vjp)."""
  saved = jax.checkpoint(fn, policy=REMAT_POLICIES[policy], prevent_cse=True)

  @jax.custom_vjp
  def run(*args):
    return fn(*args)

  def fwd(*args):
    return jax.vjp(saved, *args)   # (output, the vjp closure: its leaves are the residuals)

  def bwd(vjp, g):
    leaves, tree = jax.tree.flatten(vjp)
    return jax.tree.unflatten(tree, after(leaves, g))(g)

  run.defvjp(fwd, bwd)
  return run


def after(residuals: list, g) -> list:
  """``residuals`` made to depend on ``g`` (a pytree with at least one float leaf) without
  changing their values: every float residual plus ``0 * (first element of g)``.

  ``lax.optimization_barrier`` does not order the schedule on XLA:CPU (its pipeline expands the
  barrier away before scheduling), and XLA does not fold ``0 * y`` for floats (NaN, inf), so
  this data dependency holds on every backend. Its cost is an add fused into the first use of
  each residual. A non-finite ``g`` makes the recomputed block non-finite, whose gradients were
  non-finite anyway."""
  first = [leaf.reshape(-1)[:1] for leaf in jax.tree.leaves(g)
           if jnp.issubdtype(leaf.dtype, jnp.inexact) and leaf.size]
  if not first:
    return residuals
  zero = jnp.sum(first[0].astype(jnp.float32)) * 0.0
  return [r + zero.astype(r.dtype) if jnp.issubdtype(r.dtype, jnp.inexact) else r
          for r in residuals]


def remat_module(call, policy: str):
  """``call(module, *args)`` with the module's state and the array arguments as inputs of
  `late_remat` (so their gradients flow); the graph and the other arguments (None, the FULL
  mask string, flags) stay static."""
  def wrapped(module, *args):
    graphdef, state = nnx.split(module)
    leaves, tree = jax.tree.flatten(args)
    is_array = [isinstance(x, jax.Array) or hasattr(x, "dtype") for x in leaves]
    static = [None if a else x for x, a in zip(leaves, is_array)]

    def pure(st, *arrays):
      it = iter(arrays)
      full = [next(it) if a else x for x, a in zip(static, is_array)]
      return call(nnx.merge(graphdef, st), *jax.tree.unflatten(tree, full))
    return late_remat(pure, policy)(state, *[x for x, a in zip(leaves, is_array) if a])
  return wrapped
