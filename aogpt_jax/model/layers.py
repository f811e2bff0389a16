"""Small NNX building blocks with the published AO-GPT initialisation and logical axis names.

Every parameter carries ``logical_axes`` metadata (e.g. ``('embed', 'mlp')``); `sharding.py`
maps those names to mesh axes with the rules in the config, so this file never sees a mesh.
Parameters are stored in ``param_dtype`` (fp32); computation runs in the module's ``dtype``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

Axes = tuple[str | None, ...]


def trunc_normal(key: jax.Array, shape: Sequence[int], std: float, dtype=jnp.float32,
                 truncation: float = 3.0) -> jax.Array:
  """PyTorch's ``trunc_normal_(std=std, a=-3*std, b=3*std)``: a normal of standard deviation
  ``std`` (before truncation) cut at ``truncation`` standard deviations; ``truncation=0`` is a
  plain ``normal_(std=std)`` (the published sigma-GPT's init)."""
  if not truncation:
    return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
  return (std * jax.random.truncated_normal(key, -truncation, truncation, shape, jnp.float32)
          ).astype(dtype)


def grid_shape(spec: str) -> tuple[int, int, int, int]:
  """``"grid:R,C,BR,BC"`` -> (rows, columns, box rows, box columns); boxes tile the grid."""
  name, _, rest = str(spec).partition(":")
  try:
    r, c, br, bc = (int(v) for v in rest.split(","))
  except ValueError:
    r = c = br = bc = 0
  if name != "grid" or min(r, c, br, bc) < 1 or r % br or c % bc:
    raise ValueError(f"expected 'grid:ROWS,COLS,BOX_ROWS,BOX_COLS' with boxes tiling the grid "
                     f"(Sudoku 9x9: 'grid:9,9,3,3'), got {spec!r}")
  return r, c, br, bc


def grid_codes(key: jax.Array, shape: tuple[int, int, int, int], width: int, std: float,
               truncation: float = 3.0) -> jax.Array:
  """float32 [R*C, width]: cell p (row-major) gets ``row[p // C] + col[p % C] + box[...]``, three
  fresh random tables: a structured start for grid tasks, where the cells that constrain each
  other share a code (learned positions alone learned no Sudoku constraint at CPU size)."""
  r, c, br, bc = shape
  kr, kc, kb = jax.random.split(key, 3)
  p = jnp.arange(r * c)
  row, col = p // c, p % c
  box = (row // br) * (c // bc) + col // bc
  tables = [trunc_normal(k, (m, width), std, jnp.float32, truncation)
            for k, m in ((kr, r), (kc, c), (kb, (r // br) * (c // bc)))]
  return tables[0][row] + tables[1][col] + tables[2][box]


class Dense(nnx.Module):
  """``y = x @ kernel + bias`` with kernel ``[in, out]``."""

  def __init__(self, din: int, dout: int, *, axes: Axes, rngs: nnx.Rngs, use_bias: bool = True,
               std: float = 0.02, zero_init: bool = False, dtype=jnp.float32,
               param_dtype=jnp.float32, truncation: float = 3.0):
    init = (jnp.zeros((din, dout), param_dtype) if zero_init else
            trunc_normal(rngs.params(), (din, dout), std, param_dtype, truncation))
    self.kernel = nnx.Param(init, logical_axes=axes)
    self.bias = (nnx.Param(jnp.zeros((dout,), param_dtype), logical_axes=(axes[1],))
                 if use_bias else None)
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    y = matmul(x.astype(self.dtype), self.kernel[...].astype(self.dtype))
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


def matmul(x: jax.Array, w: jax.Array, **kw) -> jax.Array:
  """``x [..., din] @ w [din, dout]`` as ONE 2-D matrix product: XLA:CPU runs a 3-D dot_general
  much slower than the same GEMM on the flattened rows (the output head's forward and backward
  at 8 x 256 tokens: 2.4 s against 1.7 s), and on accelerators it is the same program."""
  y = jnp.dot(x.reshape(-1, x.shape[-1]), w, **kw)
  return y.reshape(*x.shape[:-1], w.shape[-1])


class Embed(nnx.Module):
  """A lookup table ``[num, features]``."""

  def __init__(self, num: int, features: int, *, axes: Axes, rngs: nnx.Rngs, std: float = 0.02,
               dtype=jnp.float32, param_dtype=jnp.float32, truncation: float = 3.0):
    self.embedding = nnx.Param(trunc_normal(rngs.params(), (num, features), std, param_dtype,
                                            truncation),
                               logical_axes=axes)
    self.dtype = dtype

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)


NORMS = ("rmsnorm", "layernorm")


def check_choice(key: str, value, choices: tuple) -> None:
  """The one check of a setting with named choices (model.norm, model.attention_impl,
  sample.schedule, ...): raises ``KEY: must be one of CHOICES, got VALUE``."""
  if value not in choices:
    raise ValueError(f"{key}: must be one of {choices}, got {value!r}")


class Norm(nnx.Module):
  """RMSNorm (weight only) or LayerNorm (weight and, if ``use_bias``, bias), computed in fp32.
  ``eps`` 1e-5 as ``torch.nn.functional.rms_norm`` / ``layer_norm`` in the published code."""

  def __init__(self, features: int, *, kind: str = "rmsnorm", use_bias: bool = True,
               eps: float = 1e-5, axes: Axes = ("norm",), dtype=jnp.float32,
               param_dtype=jnp.float32):
    check_choice("model.norm", kind, NORMS)
    self.kind, self.eps, self.dtype = kind, eps, dtype
    self.scale = nnx.Param(jnp.ones((features,), param_dtype), logical_axes=axes)
    self.bias = (nnx.Param(jnp.zeros((features,), param_dtype), logical_axes=axes)
                 if kind == "layernorm" and use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    if self.kind == "layernorm":
      x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    y = y * self.scale[...]
    if self.bias is not None:
      y = y + self.bias[...]
    return y.astype(self.dtype)


# ----------------------------------------------------------------------------- activations

# Logical names of activation dimensions; `sharding.activation_constraints` maps them to mesh
# axes while a step is traced (outside it `constrain` does nothing).
BATCH, HEADS, MLP_ACT, VOCAB_ACT = "act_batch", "act_heads", "act_mlp", "act_vocab"
_constrain_fn: list = []


@contextlib.contextmanager
def activation_sharding(fn):
  """While active, `constrain(x, axes)` calls ``fn(x, axes)`` (a sharding constraint)."""
  _constrain_fn.append(fn)
  try:
    yield
  finally:
    _constrain_fn.pop()


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
  """Pins activation ``x`` to the mesh axes of its logical ``axes`` (no-op without a mesh)."""
  return _constrain_fn[-1](x, axes) if _constrain_fn else x


def activation_placement(axes: Axes, shape) -> tuple[Any, Any] | None:
  """``(mesh, PartitionSpec)`` of an activation with logical ``axes`` and ``shape`` under the
  active constraints (None outside them): what a kernel XLA cannot partition (Pallas) needs to
  run per shard under ``shard_map``."""
  placement = getattr(_constrain_fn[-1], "placement", None) if _constrain_fn else None
  return None if placement is None else placement(axes, shape)


def row_set(x: jax.Array, index: jax.Array, update: jax.Array, axis: int = 1) -> jax.Array:
  """``x[b, index[b, q]] = update[b, q]`` for every row b (indices past the end are dropped),
  written per row (vmap) so the scatter keeps the batch as a batching dimension: with rows
  split over the data axes every device writes its own rows, no all-gather of the updates
  (a scatter indexed by an explicit row iota makes XLA's SPMD partitioner gather them).
  ``axis`` > 1: the indexed axis of ``x`` is ``axis`` (``x[b, :, index[b, q]] = update[b, q]``
  for axis 2), written in place, without moving ``x``'s axes."""
  lead = (slice(None),) * (axis - 1)

  def one(r, i, u):
    return r.at[lead + (i,)].set(jnp.moveaxis(u, 0, axis - 1).astype(r.dtype), mode="drop")
  return jax.vmap(one)(x, index, update)


@jax.custom_vjp
def take_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
  """``table[ids]`` (rows of a ``[R, D]`` table, ``ids`` in ``[0, R)`` of any shape), with a
  backward that avoids the scatter-add when every row of ``ids`` (its last axis) holds distinct
  indices, as the target positions of one training sequence do.

  The plain gather's gradient scatter-adds ``B x S`` rows into ``R``: on a GPU every batch row
  hits the same ``R`` table rows, and the atomics serialise (on an H100 they were a sixth of the
  AO-GPT Small train step: docs/performance.md). With distinct indices per
  row, row ``b``'s contribution is a gather of its gradient by the inverse map (table row ->
  slot), and the batch rows are summed (in fp32). Rows with a repeated index (padding slots, say)
  make the whole backward take the scatter-add, chosen at run time: the gradient is exact
  either way. Rows much shorter than the table (over `INVERSE_MAX_ROWS_PER_SLOT` table rows per
  slot) always take the scatter-add: the inverse map touches every table row of every batch row
  (32-byte rows on the 257-row tables of the CPU quickstart: 3.2x the whole adaLN gradient's time
  on 2 CPU cores)."""
  return jnp.take(table, ids, axis=0)


INVERSE_MAX_ROWS_PER_SLOT = 2   # past this many table rows per slot: the scatter-add (take_rows)


def _take_rows_fwd(table, ids):
  # Residuals must be arrays: a [R, 0] one carries the table's row count and dtype.
  return jnp.take(table, ids, axis=0), (ids, jnp.zeros((table.shape[0], 0), table.dtype))


def _take_rows_bwd(res, g):
  ids, shape_of = res
  n_rows, dtype = shape_of.shape[0], shape_of.dtype
  if ids.ndim == 0:
    return jnp.zeros((n_rows,) + g.shape, dtype).at[ids].add(g.astype(dtype)), None
  s = ids.shape[-1]
  ids2 = ids.reshape(-1, s)
  g2 = g.reshape(ids2.shape + g.shape[ids.ndim:])
  slot = jnp.arange(s, dtype=jnp.int32)
  # Per row (vmap: the batch stays a batching dimension under a mesh, see row_set).
  inv = jax.vmap(lambda i: jnp.full((n_rows,), s, jnp.int32).at[i].set(slot))(ids2)
  distinct = jnp.all(jnp.take_along_axis(inv, ids2, axis=1) == slot)

  def by_inverse(_):
    padded = jnp.concatenate([g2, jnp.zeros_like(g2[:, :1])], axis=1)   # slot s: no slot
    rows = jax.vmap(lambda gb, ib: jnp.take(gb, ib, axis=0))(padded, inv)
    return rows.astype(jnp.float32).sum(0).astype(dtype)

  def by_scatter(_):
    return jnp.zeros((n_rows,) + g2.shape[2:], dtype).at[ids2].add(g2.astype(dtype))
  if n_rows > INVERSE_MAX_ROWS_PER_SLOT * s:
    return by_scatter(None), None
  return jax.lax.cond(distinct, by_inverse, by_scatter, None), None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def dense_heads(dense: Dense, x: jax.Array, groups: int, n_head: int, head_dim: int,
                select: slice = slice(None)) -> jax.Array:
  """``dense(x)`` [B, S, groups * heads * head_dim] as [B, S, groups, heads, head_dim], with the
  kernel viewed as [d, groups, heads, head_dim] BEFORE the product and pinned to the heads'
  mesh axes: under tensor parallelism XLA then reshards the (small) kernel by heads instead of
  the [B, S, 3d] activations, whose contiguous column blocks (q|k|v) do not line up with the
  head shards (collective-permutes and all-to-alls of activations in every layer). ``select``
  computes only those groups (e.g. ``slice(1, 3)``: keys and values)."""
  dt = dense.dtype
  w = dense.kernel[...].astype(dt).reshape(x.shape[-1], groups, n_head, head_dim)[:, select]
  w = constrain(w, (None, None, HEADS, None))
  y = jnp.einsum("nd,dthe->nthe", x.astype(dt).reshape(-1, x.shape[-1]), w)
  if dense.bias is not None:
    y = y + dense.bias[...].astype(dt).reshape(groups, n_head, head_dim)[select]
  return y.reshape(*x.shape[:-1], w.shape[1], n_head, head_dim)


def dense_cols(dense: Dense, x: jax.Array, col0: int, groups: int, n_head: int,
               head_dim: int) -> jax.Array:
  """``dense(x)``'s columns ``[col0, col0 + groups * n_head * head_dim)`` as
  [B, S, groups, heads, head_dim] (`dense_heads` for projections whose q, k and v differ in
  width: grouped-query attention, heads not n_embd / n_head wide)."""
  dt, width = dense.dtype, groups * n_head * head_dim
  w = dense.kernel[...].astype(dt)[:, col0:col0 + width].reshape(x.shape[-1], groups, n_head,
                                                                 head_dim)
  w = constrain(w, (None, None, HEADS, None))
  y = jnp.einsum("nd,dthe->nthe", x.astype(dt).reshape(-1, x.shape[-1]), w)
  if dense.bias is not None:
    y = y + dense.bias[...].astype(dt)[col0:col0 + width].reshape(groups, n_head, head_dim)
  return y.reshape(*x.shape[:-1], groups, n_head, head_dim)


def slot_rows(x: jax.Array, idx: jax.Array) -> jax.Array:
  """``x[b, idx[b, g]]``: the rows [B, G, ...] of ``x`` [B, S, ...] at the slots ``idx`` [B, G]."""
  return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)
