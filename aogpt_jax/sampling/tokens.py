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
et al.); the cut-off is found without sorting the vocabulary (`top_p_cutoff`); at ``top_p == 1``
nothing is filtered. Rows are drawn from their float32 logits a few rows at a time on CPU
(`_by_query`: float64 copies of all rows would cost more than the draw), and per shard of the batch under a mesh, with no collective (tests/test_sampler_sharded.py).

Keys. A sample's stream is ``fold_in(key, sample_index)`` (`sample_keys`); the token at original
position p is drawn with ``fold_in(fold_in(sample_key, TOKEN_STREAM), p)`` (`token_keys`), so a
sample does not depend on the batch it ran in, on the step layout, or on the sampler (the AR
decoder and the diffusion sampler in L2R order with T = n draw identical tokens).

Shape suffixes of local arrays (nanodo style, ``w_NxKxCB`` = [..., K, CB]): a leading N stands
for the caller's leading axes ``...`` (rows, queries), R those axes flattened, B rows, Q queries
per row, V vocabulary, C rows drawn together; top-p search: U buckets per level
(`TOP_P_BUCKETS`), H = U + 2 (plus the sinks above and below the bracket), J candidates of a
row, G blocks holding candidates, E their entries; inverse CDF: K CDF blocks (``nb``), CB
tokens per block (`CDF_BLOCK`), P = K CB the vocabulary padded to whole blocks.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from aogpt_jax.model import layers

ORDER_STREAM, COUNT_STREAM, TOKEN_STREAM, POLICY_STREAM = 0, 1, 2, 3


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
  Ties at the cut-off value are kept under both rules. V is not sorted (`top_p_cutoff`); at
  ``top_p == 1`` nothing is filtered. Must be traced inside `exact_sampling()`.
  """
  x = _scaled(logits, temperature, top_p_rule)
  if not _filters(top_p):
    return x
  return jnp.where(x >= top_p_cutoff(logits, top_p, top_p_rule, temperature), x, -jnp.inf)


def _scaled(logits, temperature, top_p_rule):
  """float64 ``logits / temperature`` (and the rule's name checked)."""
  layers.check_choice("top_p_rule", top_p_rule, TOP_P_RULES)
  return logits.astype(jnp.float64) / jnp.float64(temperature)


def _filters(top_p) -> bool:
  """Whether top-p removes anything (a traced top_p always filters)."""
  return not (isinstance(top_p, (int, float)) and top_p >= 1.0)


_SIGN = 0x7FFFFFFFFFFFFFFF


def _ordered_key(x: jax.Array) -> jax.Array:
  """int64 keys with ``key(a) < key(b)`` iff ``a < b`` for float64 a, b (-0.0 and 0.0 equal)."""
  b = jax.lax.bitcast_convert_type(x, jnp.int64)
  return jnp.where(b < 0, -(b & jnp.int64(_SIGN)), b)


def _key_value(k: jax.Array) -> jax.Array:
  """The float64 whose `_ordered_key` is ``k``."""
  b = jnp.where(k < 0, (-k) | jnp.int64(~_SIGN), k)
  return jax.lax.bitcast_convert_type(b, jnp.float64)


TOP_P_BUCKETS = 4096      # value buckets of the top-p cut-off search
TOP_P_CANDIDATES = 64     # cut-off bucket members sorted exactly (more: `_smallest_ok_key`)


def top_p_cutoff(logits: jax.Array, top_p: float, rule: str,
                 temperature: float = 1.0) -> jax.Array:
  """The smallest value kept by top-p, [..., 1] (kept: ``x >= cut`` with x = `_scaled` logits),
  from logits [..., V]: `_top_p_cutoffs` a few rows at a time (`_by_query`)."""
  return _by_query(lambda l_CxV: _top_p_cutoffs(l_CxV, temperature, top_p, rule)[0],
                   logits)[..., None]


# Rows drawn together on CPU (`_by_query_local`): in chunks of 4 or 8 rows the top-p draw's
# float64 temporaries stay in the cache; all rows at once (128 in a speculative round) took about
# twice the time per row.
DRAW_ROWS = 8


def _by_query(f, logits: jax.Array, *rest: jax.Array) -> jax.Array:
  """``f(logits [C, V], *rest [C]) -> [C]``, vectorised over C rows, applied to ``logits`` [..., V]
  and ``rest`` [...]. Under a mesh (`layers.activation_placement`, i.e. a sharded sampler) it
  runs per shard of the batch in ``shard_map``: the draw's searches (top-k, conditionals and
  loops over rows) would otherwise make XLA gather rows or all-reduce predicates across
  devices (tests/test_sampler_sharded.py). On CPU the rows go `DRAW_ROWS` at a time
  (``lax.map``), so the float64 temporaries stay a few rows whatever the rows per step (128 rows
  of V = 50304: 51 MB each); on accelerators all rows at once."""
  lead = logits.shape[:-1]
  placed = layers.activation_placement((layers.BATCH,) + (None,) * len(lead), logits.shape)
  if placed is not None:
    mesh, spec = placed
    row_spec = P(*spec[:len(lead)])
    return jax.shard_map(lambda l, *r: _by_query_local(f, l, *r), mesh=mesh,
                         in_specs=(spec,) + (row_spec,) * len(rest), out_specs=row_spec,
                         check_vma=False)(logits, *rest)
  return _by_query_local(f, logits, *rest)


def _by_query_local(f, logits: jax.Array, *rest: jax.Array) -> jax.Array:
  """`_by_query` on one device: on CPU, more than `DRAW_ROWS` rows go in equal chunks of at most
  that many (``lax.map``; padded by repeating row 0)."""
  lead, v = logits.shape[:-1], logits.shape[-1]
  l_RxV, rest_R = logits.reshape(-1, v), [r.reshape(-1) for r in rest]
  rows = l_RxV.shape[0]
  if rows <= DRAW_ROWS or jax.default_backend() != "cpu":
    return f(l_RxV, *rest_R).reshape(lead)
  chunks = -(-rows // DRAW_ROWS)
  size = -(-rows // chunks)                                       # padding < one row per chunk
  pad = chunks * size - rows
  split = lambda a: jnp.concatenate(
      [a, jnp.broadcast_to(a[:1], (pad,) + a.shape[1:])]).reshape(chunks, size, *a.shape[1:])
  out_KxC = jax.lax.map(lambda args: f(*args), (split(l_RxV), *(split(r) for r in rest_R)))
  return out_KxC.reshape(-1)[:rows].reshape(lead)


def _top_p_cutoffs(logits: jax.Array, temperature, top_p,
                   rule: str) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The smallest kept value (float64 [C]; kept: ``x >= cut``) of each row of ``x =
  _scaled(logits)`` [C, V], with x and ``w = exp(x - max x)`` (float64 [C, V], reused by the draw).

  Sort-free over V (a sort of V = 50k float64 costs more than the model's step on CPU): with
  ``p = w / sum w`` and ``S(v) = sum of p_i over x_i > v``, "ok" meaning ``S <= top_p``
  ("published") or ``S < top_p`` ("nucleus"), u is the smallest value whose S is ok (S is
  non-increasing in v). Nucleus keeps ``x >= u``. Published keeps ``x > u`` (the tokens whose
  inclusive cumulative mass is at most top_p), plus the values equal to u when their first
  occurrence still fits (``S(u) + p(u) <= top_p``), and the top value always.

  Finding u: one scatter sums w into `TOP_P_BUCKETS` buckets per row by value (monotone in x),
  so S just below bucket j is a suffix sum; u lies in the highest bucket whose suffix sum is
  not ok (the lowest live bucket when every one is ok). Its finite members, at most
  `TOP_P_CANDIDATES` of them, are compacted (`_first_members`) and sorted, and S is
  accumulated over them in descending order. When a row's bucket holds more (many equal or
  near-equal values), the key-bucket search `_smallest_ok_key` runs for the rows. Equal to the
  sorted definition up to float64 summation order (tests/test_sampler_tokens.py). The row
  maximum and minimum come from the logits in their own dtype (``_scaled`` is monotone, so they
  are the same values), and the whole search is vectorised over the C rows."""
  ok = (lambda s: s <= top_p) if rule == "published" else (lambda s: s < top_p)
  nb, (c, v) = TOP_P_BUCKETS, logits.shape
  cap = min(TOP_P_CANDIDATES + 1, v)
  fin_CxV = jnp.isfinite(logits)
  hi_C = jnp.max(logits, axis=-1)
  lo_C = jnp.min(jnp.where(fin_CxV, logits, jnp.inf), axis=-1)
  mx_C = _scaled(hi_C, temperature, rule)
  x_CxV = _scaled(logits, temperature, rule)
  w_CxV = jnp.exp(x_CxV - mx_C[:, None])
  z_C = jnp.sum(w_CxV, axis=-1)
  # Buckets from the logits in their own dtype (monotone in x); row r's are r * nb + bucket,
  # non-finite entries (weight 0) go to a spare slot c * nb that no row reads.
  bucket_CxV = _value_buckets(logits, fin_CxV, lo_C[:, None], hi_C[:, None])
  flat_CxV = jnp.where(fin_CxV, bucket_CxV + (jnp.arange(c, dtype=jnp.int32) * nb)[:, None],
                       c * nb)
  mass_CxU = jnp.zeros(c * nb + 1, w_CxV.dtype).at[flat_CxV.reshape(-1)].add(
      w_CxV.reshape(-1), mode="promise_in_bounds")[:-1].reshape(c, nb)
  s_CxU = jnp.flip(jnp.cumsum(jnp.flip(mass_CxU, -1), axis=-1), -1)    # w above bucket j - 1
  pick_CxU = ((mass_CxU > 0) & ~ok(s_CxU / z_C[:, None])) | (jnp.arange(nb) == 0)
  j_C = nb - 1 - jnp.argmax(jnp.flip(pick_CxU, -1), axis=-1)
  s_hi_C = jnp.take_along_axis(jnp.pad(s_CxU, ((0, 0), (0, 1))), (j_C + 1)[:, None], -1)[:, 0]
  idx_CxJ, live_CxJ = jax.vmap(lambda m: _first_members(m, cap))(
      flat_CxV == (j_C + jnp.arange(c) * nb)[:, None])
  overflow_C = live_CxJ[:, -1] if cap > TOP_P_CANDIDATES else jnp.zeros(c, bool)
  # The bucket's largest value has S = s_hi / z: when that is ok, u is in the bucket.
  fast_C = live_CxJ[:, 0] & ~overflow_C & ok(s_hi_C / z_C)
  take = lambda a: jnp.take_along_axis(a, idx_CxJ, axis=-1)
  xs_CxJ, ws_CxJ = jax.lax.sort((-jnp.where(live_CxJ, take(x_CxV), -jnp.inf),
                                 jnp.where(live_CxJ, take(w_CxV), 0.0)), num_keys=1)
  xs_CxJ = -xs_CxJ                                        # descending; dead ones last (-inf)
  excl_CxJ = jnp.cumsum(ws_CxJ, axis=-1) - ws_CxJ
  s_CxJ = (s_hi_C[:, None] + excl_CxJ) / z_C[:, None]     # S(xs[i]) at a value's first entry
  first_CxJ = live_CxJ & jnp.pad(xs_CxJ[:, 1:] != xs_CxJ[:, :-1], ((0, 0), (1, 0)),
                                 constant_values=True)
  i_C = cap - 1 - jnp.argmax(jnp.flip(first_CxJ & ok(s_CxJ), -1), axis=-1)
  cu_C = jnp.take_along_axis(xs_CxJ, i_C[:, None], -1)[:, 0]
  s_C = jnp.take_along_axis(s_CxJ, i_C[:, None], -1)[:, 0]

  def key_search(_):
    u_C, s_u_C = jax.vmap(lambda r, p: _smallest_ok_key(r, _ordered_key(r), p, ok))(
        x_CxV, w_CxV / z_C[:, None])
    return jnp.where(fast_C, cu_C, _key_value(u_C)), jnp.where(fast_C, s_C, s_u_C)

  cu_C, s_C = jax.lax.cond(jnp.all(fast_C), lambda _: (cu_C, s_C), key_search, None)
  if rule == "nucleus":
    return cu_C, x_CxV, w_CxV
  keep_tied_C = (cu_C == mx_C) | (s_C + jnp.exp(cu_C - mx_C) / z_C <= top_p)
  return jnp.where(keep_tied_C, cu_C, jnp.nextafter(cu_C, jnp.inf)), x_CxV, w_CxV  # >= next(u)


def _first_members(member: jax.Array, count: int) -> tuple[jax.Array, jax.Array]:
  """The indices of the first ``count`` True entries of ``member`` [V] (in index order) and
  whether each is one, int32 [count] and bool [count]. Two float32 top-ks over exact integer
  keys: first the first ``count`` blocks of `CDF_BLOCK` entries holding a member, then the
  first ``count`` members inside them (no pass over V but the block test)."""
  v = member.shape[0]
  nblk = -(-v // CDF_BLOCK)
  rows_KxCB = jnp.pad(member, (0, nblk * CDF_BLOCK - v)).reshape(nblk, CDF_BLOCK)
  kb = min(count, nblk)
  key_G, blk_G = jax.lax.top_k(jnp.where(jnp.any(rows_KxCB, axis=1),
                                         (nblk - jnp.arange(nblk)).astype(jnp.float32), 0.0), kb)
  idx_E = (blk_G[:, None] * CDF_BLOCK + jnp.arange(CDF_BLOCK)).reshape(-1)
  live_E = (rows_KxCB[blk_G] & (key_G > 0)[:, None]).reshape(-1)
  key_C, pos_C = jax.lax.top_k(
      jnp.where(live_E, (idx_E.shape[0] - jnp.arange(idx_E.shape[0])).astype(jnp.float32), 0.0),
      count)
  return idx_E[pos_C], key_C > 0


def _value_buckets(x, fin, lo, hi):
  """int32 bucket in [0, `TOP_P_BUCKETS`) of each finite value, monotone in x: equal value ranges
  from ``lo`` (the smallest finite value) to ``hi`` (the largest), computed in x's dtype
  (``(x - lo) / (hi - lo)`` cannot overflow); non-finite values, and every value when the span
  is 0 or overflows: bucket 0."""
  span = hi - lo
  good = jnp.isfinite(span) & (span > 0)
  frac = (x - lo) / jnp.where(good, span, 1)
  b = jnp.floor(frac * (TOP_P_BUCKETS - 1)).astype(jnp.int32)
  return jnp.where(fin & good, jnp.clip(b, 0, TOP_P_BUCKETS - 1), 0)


def _smallest_ok_key(x, k, p, ok):
  """u of `_top_p_cutoffs` for one row, by bucket levels: the keys in a bracket ``(lo, hi]``
  (S(lo) not ok, S(hi) ok) are split into `TOP_P_BUCKETS` monotone buckets (the first level by
  value, later ones by key offset, a power of two apart), and one pass of scatters gives each
  bucket's mass and its smallest and largest key; S just below bucket j is the mass above the
  bracket plus the buckets >= j, so the last bucket j where that is not ok holds u, and the
  next bracket is (its smallest key - 1, its largest key]. Done when that bucket holds one
  distinct key (u = it): about two levels for 50k distinct logits, at most seven. ``ok``: the
  rule's test of S. Returns u and S(u)."""
  nb = TOP_P_BUCKETS
  i64 = jnp.iinfo(jnp.int64)

  def level(bucket, lo, hi):
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
    return kmin_H[j] - 1, kmax_H[j], kmin_H[j] == kmax_H[j], s_hi

  fin_V = jnp.isfinite(x)
  kf_V = jnp.where(fin_V, k, i64.min)
  first = _value_buckets(x, fin_V, jnp.min(jnp.where(fin_V, x, jnp.inf)), jnp.max(x))
  state = level(first, jnp.min(jnp.where(fin_V, k, i64.max)) - 1, jnp.max(kf_V))

  def by_key(c):
    lo, hi, done, _ = c
    span = jax.lax.bitcast_convert_type(hi - lo - 1, jnp.uint64)      # exact: hi > lo
    shift = jnp.sum((span >> jnp.arange(64, dtype=jnp.uint64)) >= nb).astype(jnp.uint64)
    off_V = jax.lax.bitcast_convert_type(k - lo - 1, jnp.uint64) >> shift
    new = level(jnp.minimum(off_V, nb - 1).astype(jnp.int32), lo, hi)
    return tuple(jnp.where(done, a, b) for a, b in zip(c, new))

  _, u, _, s_u = jax.lax.while_loop(lambda c: ~c[2], by_key, state)
  return u, s_u


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
  u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float64))(
      keys.reshape(-1)).reshape(keys.shape)
  filters = _filters(top_p)

  def rows(logits_CxV, u_C):      # = inverse_cdf(filter_logits(...), u) for C rows
    if not filters:
      return inverse_cdf(_scaled(logits_CxV, temperature, top_p_rule), u_C)
    cut_C, x_CxV, w_CxV = _top_p_cutoffs(logits_CxV, temperature, top_p, top_p_rule)
    return _cdf_draw(jnp.where(x_CxV >= cut_C[:, None], w_CxV, 0.0), u_C)

  # A few rows at a time, entering in their own dtype: float64 copies of all rows cost more
  # than the draw.
  return _by_query(rows, logits, u)


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


def drawn_logp(logits: jax.Array, new: jax.Array, *, temperature: float, top_p: float,
               top_p_rule: str, greedy: bool) -> jax.Array:
  """float32 [..., 2]: the log-probability of each drawn token ``new`` [...] (from ``logits``
  [..., V]) under [0] the distribution it was drawn from (`filter_logits`: temperature, top-p;
  0 when ``greedy``, a point mass) and [1] the model's own (temperature 1, top-p 1), each
  computed as a float32 log-softmax where that is the same distribution."""
  take = lambda x: jnp.take_along_axis(x, new[..., None].astype(jnp.int32), axis=-1)[..., 0]
  l32 = logits.astype(jnp.float32)
  model_lp = take(l32) - jax.nn.logsumexp(l32, axis=-1)
  if greedy:
    drawn_lp = jnp.zeros_like(model_lp)
  elif temperature == 1.0 and not _filters(top_p):
    drawn_lp = model_lp
  else:
    x = filter_logits(logits, temperature=temperature, top_p=top_p, top_p_rule=top_p_rule)
    drawn_lp = (take(x) - jax.nn.logsumexp(x, axis=-1)).astype(jnp.float32)
  return jnp.stack([drawn_lp, model_lp], axis=-1)


def draw_commit_record(tokens: jax.Array, record: jax.Array | None, logits: jax.Array,
                       keys: jax.Array, commit: jax.Array, *, temperature: float, top_p: float,
                       top_p_rule: str, greedy: bool, debug: bool):
  """`draw_and_commit` that also records: with ``record`` (float32 [B, n, 2], ORIGINAL order; or
  None) each drawn token's `drawn_logp` is written at its position ``commit`` (n: nowhere).
  Returns (tokens, the logits if ``debug`` else None, record)."""
  new_BxQ = sample_tokens(logits, keys, temperature=temperature, top_p=top_p,
                          top_p_rule=top_p_rule, greedy=greedy)
  if record is not None:
    lp_BxQx2 = drawn_logp(logits, new_BxQ, temperature=temperature, top_p=top_p,
                          top_p_rule=top_p_rule, greedy=greedy)
    record = layers.row_set(record, commit, lp_BxQx2)
  return commit_tokens(tokens, commit, new_BxQ), (logits if debug else None), record


def new_record(tokens: jax.Array, on: bool) -> jax.Array | None:
  """The zeroed log-probability record of `draw_commit_record` (None when not recording)."""
  return jnp.zeros(tokens.shape + (2,), jnp.float32) if on else None


CDF_BLOCK = 128   # inverse_cdf: tokens per block of the two-level CDF


def inverse_cdf(x: jax.Array, u: jax.Array) -> jax.Array:
  """The token whose CDF interval holds ``u`` (float64 [...], in [0, 1)) under ``softmax(x)``
  (float64 logits [..., V]), zero-probability tokens (empty intervals) never returned.

  Two-level CDF (XLA:CPU's cumsum over V costs ~7 passes): the CDF at token i of block b is
  ``P[b] + cumsum(w in block b)[i]`` with ``P`` the exclusive cumsum of the `CDF_BLOCK`-token
  block sums; the block is the first one whose end ``P[b + 1]`` exceeds ``u * P[-1]`` (so it holds
  mass), the token the count of its CDF entries ``<= u * P[-1]``, kept on the block's last token
  of positive mass."""
  return _cdf_draw(jnp.exp(x - jnp.max(x, axis=-1, keepdims=True)), u)


def _cdf_draw(w: jax.Array, u: jax.Array) -> jax.Array:
  """`inverse_cdf` from the weights ``w = exp(x - max x)`` [..., V] (0: never drawn)."""
  lead, v = w.shape[:-1], w.shape[-1]
  nb = -(-v // CDF_BLOCK)
  w_NxP = jnp.pad(w, [(0, 0)] * len(lead) + [(0, nb * CDF_BLOCK - v)])
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
