"""Token sampling shared by every sampler: temperature, top-p, exact categorical draws.

Exactness. ``jax.random.categorical`` adds float32 Gumbel noise ``-log(-log(u))``: u has 23
random mantissa bits, so the noise is cut off near 16 and coarsely quantised in its upper tail,
which under-samples low-probability tokens (an effectively lower temperature; Zheng et al. 2024,
arXiv:2409.02908). Here a token is drawn by inverting the float64 CDF of the filtered
distribution with ONE float64 uniform per token (52 random bits): token i is chosen when
``cdf[i-1] <= u * cdf[-1] < cdf[i]``, so every token's chance is its probability up to float64
rounding (~V * 2^-53), a token of probability 0 (padding, outside top-p) is never chosen, and no
per-vocabulary-entry noise is generated (Gumbel-max needs V uniforms and 2V logs per token).
float64 must be on while the caller's jit is *traced and lowered* (a scoped x64 inside a trace
fails at lowering), so every sampler jit is called inside `exact_sampling()`; `sample_tokens`
refuses to trace without it rather than silently falling back to float32. The model itself keeps
its explicit dtypes under x64 (the sampler's logits equal plain forwards to 1e-5;
tests/test_sampler_logits.py).

Padding ids have logits -inf (the model sets them) and stay -inf through temperature and top-p,
so they are never drawn. Top-p (`filter_logits`) has two named rules: ``"published"`` (the
released AO-GPT code's ``top_p_sampling_from_probs``, the default) and ``"nucleus"`` (Holtzman
et al.); the cut-off is found without sorting (`top_p_cutoff`); at ``top_p == 1`` nothing is
filtered.

Keys. A sample's stream is ``fold_in(key, sample_index)`` (`sample_keys`); the token at original
position p is drawn with ``fold_in(fold_in(sample_key, TOKEN_STREAM), p)`` (`token_keys`), so a
sample does not depend on the batch it ran in, on the step layout, or on the sampler (the AR
decoder and the diffusion sampler in L2R order with T = n draw identical tokens).

Shape suffixes of local arrays (nanodo style, ``w_NxKxCB`` = [..., K, CB]): a leading N stands
for the caller's leading axes ``...`` (rows, queries), R those axes flattened, B rows, Q queries
per row, V vocabulary; top-p search (one row): U buckets per level (`TOP_P_BUCKETS`), H = U + 2
(plus the sinks above and below the bracket); inverse CDF: K CDF blocks (``nb``), CB tokens per
block (`CDF_BLOCK`), P = K CB the vocabulary padded to whole blocks.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from aogpt_jax import layers

ORDER_STREAM, COUNT_STREAM, TOKEN_STREAM = 0, 1, 2


def exact_sampling() -> contextlib.AbstractContextManager:
  """Context in which sampler jits must be called (float64 available while tracing)."""
  return jax.enable_x64(True)


def sample_keys(key: jax.Array, batch: int, offset: int = 0) -> jax.Array:
  """Per-sample keys ``fold_in(key, offset + b)`` for b in 0..batch-1 (int32 indices)."""
  idx_B = jnp.arange(batch, dtype=jnp.int32) + jnp.int32(offset)
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(idx_B)


def stream(keys: jax.Array, which: int) -> jax.Array:
  """``fold_in(k, which)`` for every per-sample key."""
  return jax.vmap(lambda k: jax.random.fold_in(k, which))(keys)


def token_keys(tok_keys: jax.Array, positions: jax.Array) -> jax.Array:
  """Keys [B, S] for drawing the tokens at ``positions`` int32 [B, S] of each sample."""
  return jax.vmap(lambda k, p: jax.vmap(lambda q: jax.random.fold_in(k, q))(p))(
      tok_keys, positions.astype(jnp.int32))


TOP_P_RULES = ("published", "nucleus")


def filter_logits(logits: jax.Array, *, temperature: float = 1.0, top_p: float = 1.0,
                  top_p_rule: str = "published") -> jax.Array:
  """The distribution a sampler draws from, as float64 logits (softmax of the result).

  Divides by ``temperature``, then sets to -inf every token outside the top-p set:
  - ``"published"``: the published ``top_p_sampling_from_probs`` rule: in descending order, drop
    every token whose cumulative probability (itself included) exceeds ``top_p``; the most likely
    token is always kept.
  - ``"nucleus"`` (Holtzman et al.): the smallest set of most likely tokens whose probability
    reaches ``top_p`` (the token that crosses ``top_p`` is kept).
  Ties at the cut-off value are kept under both rules. Nothing is sorted (`top_p_cutoff`); at
  ``top_p == 1`` nothing is filtered. Must be traced inside `exact_sampling()`.
  """
  x, cut = _scaled_and_cutoff(logits, temperature, top_p, top_p_rule)
  return x if cut is None else jnp.where(x >= cut, x, -jnp.inf)


def _scaled_and_cutoff(logits, temperature, top_p, top_p_rule):
  """float64 ``logits / temperature`` and the top-p cut-off [..., 1] (None at ``top_p == 1``)."""
  if top_p_rule not in TOP_P_RULES:
    raise ValueError(f"top_p_rule: must be one of {TOP_P_RULES}, got {top_p_rule!r}")
  x = logits.astype(jnp.float64) / jnp.float64(temperature)
  if isinstance(top_p, (int, float)) and top_p >= 1.0:     # (a traced top_p is always filtered)
    return x, None
  return x, top_p_cutoff(x, top_p, top_p_rule)


_SIGN = 0x7FFFFFFFFFFFFFFF


def _ordered_key(x: jax.Array) -> jax.Array:
  """int64 keys with ``key(a) < key(b)`` iff ``a < b`` for float64 a, b (-0.0 and 0.0 equal)."""
  b = jax.lax.bitcast_convert_type(x, jnp.int64)
  return jnp.where(b < 0, -(b & jnp.int64(_SIGN)), b)


def _key_value(k: jax.Array) -> jax.Array:
  """The float64 whose `_ordered_key` is ``k``."""
  b = jnp.where(k < 0, (-k) | jnp.int64(~_SIGN), k)
  return jax.lax.bitcast_convert_type(b, jnp.float64)


TOP_P_ROWS = 1   # rows per top-p cut-off search (lax.map): each row stops at its own level count


def top_p_cutoff(x: jax.Array, top_p: float, rule: str) -> jax.Array:
  """`_top_p_cutoff` over groups of `TOP_P_ROWS` rows (``lax.map``): a row stays in cache, and
  its bucket levels stop when it is done (1 row: 12.5 ms for 8 x 50304, 4 rows: 16.7 ms)."""
  lead = x.shape[:-1]
  rows_RxV = x.reshape(-1, x.shape[-1])
  out_Rx1 = jax.lax.map(lambda r: _top_p_cutoff(r, top_p, rule), rows_RxV,
                        batch_size=min(TOP_P_ROWS, rows_RxV.shape[0]))
  return out_Rx1.reshape(*lead, 1)


TOP_P_BUCKETS = 2048   # buckets per level of the top-p cut-off search


def _top_p_cutoff(x: jax.Array, top_p, rule: str) -> jax.Array:
  """The smallest kept value ``c`` [1] of one row of float64 logits ``x`` [V] (kept: ``x >= c``).

  Sort-free (a sort of V = 50k float64 per row costs more than the model's whole step on CPU):
  with ``p = softmax(x)`` and ``S(u) = sum of p_i over key(x_i) > u`` (int64 order keys, S only
  changes at the keys of actual values), "ok" meaning ``S <= top_p`` for "published" and
  ``S < top_p`` for "nucleus", `_smallest_ok_key` finds u, the smallest ok key (always the key
  of an actual value). Nucleus: c is the value whose key is u. Published: c1 is the smallest
  value above u (the smallest v whose tokens with x >= v hold at most top_p); below c1 only the
  next value c0 can still qualify, when it is tied (its first occurrence has cumulative mass
  S(c0 excluded) + p(c0) <= top_p), and the top value is always kept. c1, c0 = value(u) and
  S(u) come out of the search (no further pass over V). Equal to the sorted definition up to
  float64 summation order."""
  mx_1 = jnp.max(x, axis=-1, keepdims=True)
  w_V = jnp.exp(x - mx_1)
  z_1 = jnp.sum(w_V, axis=-1, keepdims=True)
  p_V = w_V / z_1
  k_V = _ordered_key(x)
  u, s_u, above = _smallest_ok_key(x, k_V, p_V, top_p, rule)
  cu_1 = _key_value(u)[None]
  if rule == "nucleus":
    return cu_1
  has_above = above != jnp.iinfo(jnp.int64).max
  c1_1 = jnp.where(has_above, _key_value(above), mx_1)
  tied_ok_1 = has_above & (s_u + jnp.exp(cu_1 - mx_1) / z_1 <= top_p)
  return jnp.where(tied_ok_1, cu_1, c1_1)


def _smallest_ok_key(x, k, p, top_p, rule: str):
  """u of `_top_p_cutoff` for one row, by bucket levels: the keys in a bracket ``(lo, hi]``
  (S(lo) not ok, S(hi) ok) are split into `TOP_P_BUCKETS` monotone buckets (the first level by
  value, later ones by key offset, a power of two apart), and one pass of scatters gives each
  bucket's mass and its smallest and largest key; S just below bucket j is the mass above the
  bracket plus the buckets >= j, so the last bucket j where that is not ok holds u, and the
  next bracket is (its smallest key - 1, its largest key]. Done when that bucket holds one
  distinct key (u = it): about two levels for 50k distinct logits, at most seven. Returns u,
  S(u) and the smallest key above u (int64 max: none), both tracked through the levels."""
  ok = (lambda s: s <= top_p) if rule == "published" else (lambda s: s < top_p)
  nb = TOP_P_BUCKETS
  i64 = jnp.iinfo(jnp.int64)

  def level(bucket, lo, hi, above):
    inside_V = (k > lo) & (k <= hi)
    idx_V = jnp.where(inside_V, bucket, jnp.where(k > hi, nb, nb + 1))
    mass_H = jnp.zeros(nb + 2, p.dtype).at[idx_V].add(p)
    kmin_H = jnp.full(nb + 2, i64.max, k.dtype).at[idx_V].min(k)
    kmax_H = jnp.full(nb + 2, i64.min, k.dtype).at[idx_V].max(k)
    s_U = mass_H[nb] + jnp.cumsum(mass_H[:nb][::-1])[::-1]   # S(smallest key of bucket j - 1)
    live_U = kmin_H[:nb] <= kmax_H[:nb]
    # The lowest live bucket also qualifies (S(lo) recomputed in another summation order).
    pick_U = live_U & (~ok(s_U) | (jnp.arange(nb) == jnp.argmax(live_U)))
    j = nb - 1 - jnp.argmax(pick_U[::-1])
    s_hi = jnp.concatenate([s_U, mass_H[nb:nb + 1]])[j + 1]            # S(largest key of j)
    up = jnp.min(jnp.where(jnp.arange(nb) > j, kmin_H[:nb], i64.max))  # smallest key above j
    return kmin_H[j] - 1, kmax_H[j], kmin_H[j] == kmax_H[j], s_hi, jnp.minimum(up, above)

  fin_V = jnp.isfinite(x)
  vmin = jnp.min(jnp.where(fin_V, x, jnp.inf))
  vmax = jnp.max(x)
  scale = jnp.where(vmax > vmin, (nb - 1) / (vmax - vmin), 0.0)
  by_value_V = jnp.clip(jnp.floor((x - vmin) * scale), 0, nb - 1)
  by_value_V = jnp.where(jnp.isnan(by_value_V), 0, by_value_V).astype(jnp.int32)
  kf_V = jnp.where(fin_V, k, i64.min)
  state = level(by_value_V, jnp.min(jnp.where(fin_V, k, i64.max)) - 1, jnp.max(kf_V),
                jnp.asarray(i64.max, k.dtype))

  def by_key(c):
    lo, hi, done, _, above = c
    span = jax.lax.bitcast_convert_type(hi - lo - 1, jnp.uint64)      # exact: hi > lo
    shift = jnp.sum((span >> jnp.arange(64, dtype=jnp.uint64)) >= nb).astype(jnp.uint64)
    off_V = jax.lax.bitcast_convert_type(k - lo - 1, jnp.uint64) >> shift
    new = level(jnp.minimum(off_V, nb - 1).astype(jnp.int32), lo, hi, above)
    return tuple(jnp.where(done, a, b) for a, b in zip(c, new))

  _, u, _, s_u, above = jax.lax.while_loop(lambda c: ~c[2], by_key, state)
  return u, s_u, above


def sample_tokens(logits: jax.Array, keys: jax.Array, *, temperature: float = 1.0,
                  top_p: float = 1.0, top_p_rule: str = "published",
                  greedy: bool = False) -> jax.Array:
  """Draws one token per row: logits [..., V] (float32, padding ids -inf), keys [...] -> int32.

  The distribution is `filter_logits` (temperature, then the named top-p rule); the draw inverts
  its float64 CDF with one uniform per row. ``greedy`` takes the argmax (temperature and top-p
  ignored). Must be traced inside `exact_sampling()` unless greedy.
  """
  if greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if jax.dtypes.canonicalize_dtype(jnp.float64) != jnp.float64:
    raise RuntimeError("sample_tokens: exact sampling needs float64 (x64) while tracing; call the "
                       "jitted sampler inside aogpt_jax.sampling.tokens.exact_sampling()")
  x_NxV, cut_Nx1 = _scaled_and_cutoff(logits, temperature, top_p, top_p_rule)
  u_R = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float64))(keys.reshape(-1))
  # = inverse_cdf(filter_logits(...), u), without materialising the filtered logits
  return _inverse_cdf(x_NxV, cut_Nx1, u_R.reshape(x_NxV.shape[:-1]))


def commit_tokens(tokens: jax.Array, commit: jax.Array, new: jax.Array) -> jax.Array:
  """Writes drawn tokens ``new`` [B, Q] at original positions ``commit`` [B, Q] of ``tokens``
  [B, n] (index n: dropped)."""
  return layers.row_set(tokens, commit, new)


def draw_and_commit(tokens: jax.Array, logits: jax.Array, keys: jax.Array, commit: jax.Array, *,
                    temperature: float, top_p: float, top_p_rule: str, greedy: bool,
                    debug: bool):
  """The end of a sampler pass, shared by the diffusion (cached and uncached) and encoder
  samplers: draw one token per query from ``logits`` [B, Q, V] with ``keys`` [B, Q]
  (`sample_tokens`), write them at ``commit`` [B, Q] (`commit_tokens`; n: nowhere), and return
  (tokens, the logits if ``debug`` else None) for `jax.lax.scan`."""
  new_BxQ = sample_tokens(logits, keys, temperature=temperature, top_p=top_p,
                          top_p_rule=top_p_rule, greedy=greedy)
  return commit_tokens(tokens, commit, new_BxQ), (logits if debug else None)


CDF_BLOCK = 128   # inverse_cdf: tokens per block of the two-level CDF


def inverse_cdf(x: jax.Array, u: jax.Array) -> jax.Array:
  """The token whose CDF interval holds ``u`` (float64 [...], in [0, 1)) under ``softmax(x)``
  (float64 logits [..., V]), zero-probability tokens (empty intervals) never returned.

  Two-level CDF (XLA:CPU's cumsum over V costs ~7 passes): the CDF at token i of block b is
  ``P[b] + cumsum(w in block b)[i]`` with ``P`` the exclusive cumsum of the `CDF_BLOCK`-token
  block sums; the block is the first one whose end ``P[b + 1]`` exceeds ``u * P[-1]`` (so it holds
  mass), the token the count of its CDF entries ``<= u * P[-1]``, kept on the block's last token
  of positive mass."""
  return _inverse_cdf(x, None, u)


def _inverse_cdf(x: jax.Array, cut: jax.Array | None, u: jax.Array) -> jax.Array:
  """`inverse_cdf` of ``x`` with the values below ``cut`` [..., 1] (None: none) set to -inf, the
  same numbers: ``w = exp(x - max x)`` on the kept values (the maximum is always kept), 0
  elsewhere."""
  lead, v = x.shape[:-1], x.shape[-1]
  nb = -(-v // CDF_BLOCK)
  x = jnp.pad(x, [(0, 0)] * len(lead) + [(0, nb * CDF_BLOCK - v)], constant_values=-jnp.inf)
  w_NxP = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
  if cut is not None:
    w_NxP = jnp.where(x >= cut, w_NxP, 0.0)
  w_NxKxCB = w_NxP.reshape(*lead, nb, CDF_BLOCK)
  mass_NxK = jnp.sum(w_NxKxCB, axis=-1)
  ends_NxK = jnp.cumsum(mass_NxK, axis=-1)                           # P[1..nb]
  target_Nx1 = u[..., None] * ends_NxK[..., -1:]
  # u * total can round up to total when u is within 2^-53 of 1: stay on the last live block.
  last_block_N = nb - 1 - jnp.argmax((mass_NxK > 0)[..., ::-1], axis=-1)
  b_N = jnp.minimum(jnp.sum(ends_NxK <= target_Nx1, axis=-1), last_block_N)
  start_N = jnp.where(b_N > 0, jnp.take_along_axis(
      ends_NxK, jnp.maximum(b_N - 1, 0)[..., None], axis=-1)[..., 0], 0.0)
  wb_NxCB = jnp.take_along_axis(w_NxKxCB, b_N[..., None, None], axis=-2)[..., 0, :]
  idx_N = jnp.sum(start_N[..., None] + jnp.cumsum(wb_NxCB, axis=-1) <= target_Nx1, axis=-1)
  last_N = CDF_BLOCK - 1 - jnp.argmax((wb_NxCB > 0)[..., ::-1], axis=-1)
  return (b_N * CDF_BLOCK + jnp.minimum(idx_N, last_N)).astype(jnp.int32)
