"""Token sampling: nucleus filter, padding ids, float64 requirement, temperature."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from aogpt_jax.sampling import tokens as tokens_lib


def reference_top_p_support(p, top_p, rule):
  """The kept set by each rule's definition, token by token in descending order (plain Python)."""
  kept, total = [], 0.0
  for i in sorted(range(len(p)), key=lambda i: -p[i]):
    if rule == "published":        # drop every token whose inclusive cumulative sum exceeds top_p
      total += p[i]
      if total <= top_p or not kept:
        kept.append(i)
    else:                          # nucleus: add tokens until their mass reaches top_p
      if total >= top_p:
        break
      kept.append(i)
      total += p[i]
  return sorted(kept)


_FILTER = {r: jax.jit(lambda x, tp, r=r: tokens_lib.filter_logits(x, top_p=tp, top_p_rule=r))
           for r in tokens_lib.TOP_P_RULES}


def _support(logits, top_p, rule):
  if rule not in _FILTER or top_p >= 1:
    with tokens_lib.exact_sampling():
      x = tokens_lib.filter_logits(jnp.asarray(logits), top_p=top_p, top_p_rule=rule)
    return np.flatnonzero(np.isfinite(np.asarray(x)))
  padded = np.full(32, -np.inf)             # one compiled shape for every trial
  padded[:len(logits)] = logits
  with tokens_lib.exact_sampling():
    x = _FILTER[rule](jnp.asarray(padded), jnp.float64(top_p))
  return np.flatnonzero(np.isfinite(np.asarray(x)))


def test_top_p_rules_on_the_published_example():
  # Probabilities [0.05, 0.5, 0.15, 0.3] at p = 0.9: the released code keeps {1, 3}; the
  # nucleus rule also keeps the token that crosses 0.9.
  logits = np.log(np.array([0.05, 0.5, 0.15, 0.3]))
  assert _support(logits, 0.9, "published").tolist() == [1, 3]
  assert _support(logits, 0.9, "nucleus").tolist() == [1, 2, 3]
  assert _support(logits, 0.3, "published").tolist() == [1]      # top token always kept
  assert _support(logits, 1.0, "published").tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("rule", tokens_lib.TOP_P_RULES)
def test_top_p_rules_match_their_definitions_on_random_distributions(rule):
  rng = np.random.default_rng(0)
  for trial in range(200):
    v = int(rng.integers(2, 30))
    p = rng.dirichlet(np.full(v, 0.3))
    top_p = float(rng.uniform(0.05, 0.999))
    got = _support(np.log(p), top_p, rule).tolist()
    assert got == reference_top_p_support(p, top_p, rule), (trial, p, top_p)


def _poisoned_key_search(x, k, p, ok):
  """A wrong `_smallest_ok_key` (u = the largest key): any row that needs it fails."""
  return jnp.max(k), jnp.zeros((), p.dtype)


@pytest.mark.parametrize("path", ["both", "key_search_only"])
@pytest.mark.parametrize("rule", tokens_lib.TOP_P_RULES)
@pytest.mark.slow
def test_top_p_cutoff_with_ties_padding_and_a_large_vocabulary(rule, path, monkeypatch):
  # Ties at the cut-off are all kept (the tied tokens' first occurrence decides), padding (-inf)
  # is never kept, and the search is exact across signs and scales; "key_search_only": every row
  # overflows the sorted candidates and takes the key-bucket search.
  if path == "key_search_only":
    monkeypatch.setattr(tokens_lib, "TOP_P_CANDIDATES", 0)
  rng = np.random.default_rng(1)
  f = jax.jit(lambda x, tp: tokens_lib.filter_logits(x, top_p=tp, top_p_rule=rule),
              static_argnums=1)
  for trial in range(40):
    v = 2000
    x = rng.normal(size=v) * rng.choice([1e-3, 0.5, 8.0])
    if trial % 2:
      x = np.round(x, 1 if trial % 4 == 1 else 3)          # many ties
    x[int(rng.integers(2, v)):] = -np.inf                  # padding ids
    p = np.exp(x - x.max())
    p /= p.sum()
    top_p = float(rng.choice([0.05, 0.3, 0.9, 0.95, 0.999]))
    want = reference_top_p_support(p, top_p, rule)
    want = np.flatnonzero(p >= p[want].min()).tolist()     # ties at the cut-off value kept
    with tokens_lib.exact_sampling():
      got = np.flatnonzero(np.isfinite(np.asarray(f(jnp.asarray(x), top_p)))).tolist()
    assert got == want, (trial, top_p, len(got), len(want))


@pytest.mark.parametrize("rule", tokens_lib.TOP_P_RULES)
def test_sorted_candidates_alone_find_the_cutoff(rule, monkeypatch):
  """With the key-bucket search poisoned, rows whose cut-off bucket holds at most
  `TOP_P_CANDIDATES` values (distinct logits, few ties: the common case) are still exact, at
  the model's vocabulary size, under temperature."""
  monkeypatch.setattr(tokens_lib, "_smallest_ok_key", _poisoned_key_search)
  rng = np.random.default_rng(4)
  v = 50304
  x = rng.normal(size=(12, v)) * np.array([1e-2, 0.5, 3.0, 8.0] * 3)[:, None]
  x[[6, 7, 10, 11]] = np.round(x[[6, 7, 10, 11]], 3)        # a few ties (scales 3 and 8)
  x[:, 50257:] = -np.inf                                    # padding ids
  x = x.astype(np.float32)
  for top_p in (0.3, 0.95):
    with tokens_lib.exact_sampling():
      got = np.isfinite(np.asarray(jax.jit(lambda l: tokens_lib.filter_logits(
          l, temperature=0.8, top_p=top_p, top_p_rule=rule))(jnp.asarray(x))))
    for r in range(12):
      xr = x[r].astype(np.float64) / 0.8
      p = np.exp(xr - xr.max())
      p /= p.sum()
      want = reference_top_p_support(p, top_p, rule)
      want = np.flatnonzero(p >= p[want].min()).tolist()   # ties at the cut-off value kept
      assert np.flatnonzero(got[r]).tolist() == want, (r, top_p)


def test_unknown_top_p_rule_is_named():
  with pytest.raises(ValueError, match="top_p_rule"):
    _support(np.zeros(3), 0.5, "holtzman")


def test_sampling_needs_float64_while_tracing():
  with pytest.raises(RuntimeError, match="x64"):
    tokens_lib.sample_tokens(jnp.zeros((2, 4)), jax.random.split(jax.random.key(0), 2))


@pytest.mark.parametrize("temperature,top_p,rule", [
    (1.0, 1.0, "published"), (3.0, 1.0, "published"), (0.5, 0.9, "nucleus"),
    (1.3, 0.9, "published"), (1.0, 0.97, "published")])
def test_frequencies_and_padding(temperature, top_p, rule):
  logits = jnp.array([1.0, -1.0, 0.5, 2.0, -jnp.inf, -jnp.inf], jnp.float32)
  n = 40000
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(1), i))(jnp.arange(n))
  with tokens_lib.exact_sampling():
    draw = jax.jit(lambda l, k: tokens_lib.sample_tokens(
        jnp.broadcast_to(l, (n, 6)), k, temperature=temperature, top_p=top_p, top_p_rule=rule))
    toks = np.asarray(draw(logits, keys))
  assert toks.max() < 4, "a padding id was sampled"
  p = np.exp(np.asarray(logits[:4], np.float64) / temperature)
  p /= p.sum()
  if top_p < 1:
    mask = np.zeros(4, bool)
    mask[reference_top_p_support(p, top_p, rule)] = True
    p = np.where(mask, p, 0) / p[mask].sum()
  counts = np.bincount(toks, minlength=4)
  assert (counts[p == 0] == 0).all()
  pos = p > 0
  assert stats.chisquare(counts[pos], p[pos] * n).pvalue > 1e-3


def test_inverse_cdf_never_returns_a_zero_probability_token():
  # Zero-probability tokens between, before and after the live ones; u at the ends of [0, 1).
  x = jnp.log(jnp.array([0.0, 0.25, 0.0, 0.75, 0.0, 0.0], jnp.float64))
  with tokens_lib.exact_sampling():
    u = jnp.array([0.0, 0.2499, 0.25, 0.9999999, 1 - 2.0 ** -53], jnp.float64)
    got = np.asarray(tokens_lib.inverse_cdf(jnp.broadcast_to(x, (5, 6)), u))
  assert got.tolist() == [1, 1, 3, 3, 3]


def test_two_level_inverse_cdf_equals_the_full_cdf():
  """The block-sum CDF picks the token a plain float64 cumsum over V picks: V not a multiple of
  the block, whole blocks of zero probability, u near 0 and 1."""
  rng = np.random.default_rng(3)
  v = 5 * tokens_lib.CDF_BLOCK + 37
  x = rng.normal(size=(64, v)) * rng.choice([0.1, 2.0, 9.0], size=(64, 1))
  x[rng.random((64, v)) < 0.4] = -np.inf
  x[:, tokens_lib.CDF_BLOCK:3 * tokens_lib.CDF_BLOCK] = -np.inf
  u = np.concatenate([rng.random(60), [0.0, 1e-12, 1 - 1e-12, 1 - 2.0 ** -53]])
  w = np.exp(x - x.max(-1, keepdims=True))
  cdf = np.cumsum(w, -1)
  want = np.minimum([np.searchsorted(c, t, side="right") for c, t in zip(cdf, u * cdf[:, -1])],
                    [np.flatnonzero(r > 0)[-1] for r in w])
  with tokens_lib.exact_sampling():
    got = np.asarray(tokens_lib.inverse_cdf(jnp.asarray(x), jnp.asarray(u)))
  np.testing.assert_array_equal(got, want)
  assert np.all(w[np.arange(64), got] > 0)


@pytest.mark.parametrize("top_p,rule", [(1.0, "published"), (0.9, "published"), (0.8, "nucleus")])
def test_sample_tokens_draws_what_inverse_cdf_of_filter_logits_draws(top_p, rule):
  """sample_tokens applies the top-p cut-off inside the draw (the filtered logits are never
  materialised): the same token as `inverse_cdf(filter_logits(...))` for the same uniform."""
  rng = np.random.default_rng(5)
  v = 3 * tokens_lib.CDF_BLOCK + 37
  x = rng.normal(size=(64, v)) * rng.choice([0.1, 2.0, 9.0], size=(64, 1))
  x[:, v - 20:] = -np.inf                                   # padding ids
  x = jnp.asarray(x, jnp.float32)
  keys = tokens_lib.sample_keys(jax.random.key(3), 64)
  kw = dict(temperature=0.7, top_p=top_p, top_p_rule=rule)
  with tokens_lib.exact_sampling():
    got = jax.jit(lambda l, k: tokens_lib.sample_tokens(l, k, **kw))(x, keys)
    u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float64))(keys)
    want = jax.jit(lambda l, u: tokens_lib.inverse_cdf(tokens_lib.filter_logits(l, **kw), u))(x, u)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("shape", [(13, 1), (5, 3)])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
@pytest.mark.slow
def test_rows_drawn_in_chunks_equal_all_rows_at_once(shape, top_p, monkeypatch):
  """On CPU `_by_query` draws `DRAW_ROWS` rows at a time (13 rows: two chunks of 7 and one padding
  row; 15: two of 8): the same tokens and cut-offs as every row at once."""
  rng = np.random.default_rng(6)
  v = 2 * tokens_lib.CDF_BLOCK + 5
  x = rng.normal(size=shape + (v,)) * rng.choice([0.1, 3.0], size=shape + (1,))
  x[..., v - 3:] = -np.inf
  x = jnp.asarray(x, jnp.float32)
  keys = tokens_lib.sample_keys(jax.random.key(4), int(np.prod(shape))).reshape(shape)
  kw = dict(temperature=0.8, top_p=top_p, top_p_rule="published")

  def draw(rows):
    monkeypatch.setattr(tokens_lib, "DRAW_ROWS", rows)
    with tokens_lib.exact_sampling():        # a new function per call: traced with this DRAW_ROWS
      got = jax.jit(lambda l, k: tokens_lib.sample_tokens(l, k, **kw))(x, keys)
      cut = jax.jit(lambda l: tokens_lib.top_p_cutoff(l, 0.9, "published"))(x)
    return np.asarray(got), np.asarray(cut)

  assert tokens_lib.DRAW_ROWS == 8
  for a, b in zip(draw(8), draw(10 ** 9)):
    np.testing.assert_array_equal(a, b)
