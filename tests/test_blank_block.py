"""The blanks get a place to think (`model.blank_block`, model/blanks.py): the training layout
against a mask written out by hand, the training forward = the sampler's uncached reference,
the KV-cached adaptive sampler = its reference (tokens, orders, logits), the recorded
log-probabilities = `sequence_logp` / `order_logp` (one pass per step), the estimate the loss
makes, and the one-line errors where the option cannot apply."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aogpt_jax.model import blanks
from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.model import objectives
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import NO_TARGET, START
from aogpt_jax.posttrain import likelihood
from aogpt_jax.sampling import sampler
from helpers.sampler import mixed_prompt, mixed_prompt_rows, tiny_model

N, V = 10, 13


@pytest.fixture(scope="module", params=["block", "causal"])
def model(request):
  """The blank block, its queries seeing each other ("block") or causal by position ("causal":
  model.blank_attention, Eso-LM(B)-like): every exactness test below runs on both."""
  return tiny_model(vocab=16, valid=V, block=12, std=0.5, prompt_attention="bidirectional",
                    blank_block=True, blank_attention=request.param)


def _causal(model) -> bool:
  return model.cfg.blank_attention == "causal"


def _prompt():
  return mixed_prompt(N, V)


def _rows(seed=0):
  return mixed_prompt_rows(seed, N, V)


@pytest.mark.parametrize("causal", [False, True])
def test_training_layout_equals_the_hand_written_one(causal):
  """Written slots: the token at its position, no target, causal in the order (the prompt's
  slots see each other); blanks: START at their position, conditioned on it, seeing every slot
  (``causal``: every written slot and the blanks at positions up to its own) but no written slot
  seeing them."""
  tokens, order, _, plen = _rows()
  cut = jnp.asarray([5, 1, 0, 9], jnp.int32)
  tok, pos, tgt, mask = map(np.asarray, blanks.blank_slots(tokens, order, cut,
                                                           jnp.asarray(plen, jnp.int32), causal))
  t, o = np.asarray(tokens), np.asarray(order)
  for b in range(4):
    k, m = int(cut[b]), int(plen[b])
    for r in range(N):
      blank = r >= k
      assert tok[b, r] == (START if blank else t[b, o[b, r]])
      assert pos[b, r] == o[b, r] + 1
      assert tgt[b, r] == (o[b, r] if blank else NO_TARGET)
      for c in range(N):
        sees_blank = o[b, c] <= o[b, r] if causal else True
        want = (c < k or sees_blank) if blank else (c <= r or (r < m and c < m))
        assert mask[b, r, c] == want, (b, r, c)


def test_training_forward_is_the_samplers_reference(model):
  """At a cut after k ranks the blank rows of the training forward are the sampler reference's
  queries (`blanks.query_layout`: the n written slots, then every blank as a query)."""
  tokens, order, _, plen = _rows(1)
  pl = jnp.asarray(plen, jnp.int32)
  for k in (4, 6, 9):
    cut = jnp.maximum(jnp.full((4,), k, jnp.int32), pl)
    tok, pos, tgt, mask = blanks.blank_slots(tokens, order, cut, pl, _causal(model))
    h, _ = model.hidden_slots(tok, pos, tgt, mask=mask)
    train = np.asarray(model.head(h, tgt))
    ranks = np.arange(N)[None, :]
    targets = jnp.where(ranks >= np.asarray(cut)[:, None], order, NO_TARGET)
    tok, pos, tgt, mask = blanks.query_layout(tokens, order, jnp.broadcast_to(cut[:, None],
                                                                              (4, N)), targets, pl,
                                              _causal(model))
    h, _ = model.hidden_slots(tok, pos, tgt, mask=mask)
    ref = np.asarray(model.head(h[:, N:], tgt[:, N:]))
    sel = ranks >= np.asarray(cut)[:, None]
    np.testing.assert_allclose(train[sel][:, :V], ref[sel][:, :V], atol=2e-5)


def test_blanks_see_each_other_and_written_slots_do_not_see_them(model):
  """Hiding the blanks from each other moves every blank's output (they attend to each other),
  no written slot's; swapping two blanks' positions swaps their outputs and leaves the written
  slots as they were."""
  if _causal(model):
    pytest.skip("model.blank_attention='block' only (the causal blanks: the test below)")
  tokens, order, _, plen = _rows(2)
  pl = jnp.asarray(plen, jnp.int32)
  cut = pl + 2
  tok, pos, tgt, mask = blanks.blank_slots(tokens, order, cut, pl)
  h1 = np.asarray(model.hidden_slots(tok, pos, tgt, mask=mask)[0])
  alone = mask & ~((tgt[:, :, None] >= 0) & (tgt[:, None, :] >= 0) & ~jnp.eye(N, dtype=bool))
  h0 = np.asarray(model.hidden_slots(tok, pos, tgt, mask=alone)[0])
  swapped = order.at[:, N - 1].set(order[:, N - 2]).at[:, N - 2].set(order[:, N - 1])
  args = blanks.blank_slots(tokens, swapped, cut, pl)
  h2 = np.asarray(model.hidden_slots(*args[:3], mask=args[3])[0])
  for b in range(4):
    k = int(cut[b])
    np.testing.assert_allclose(h0[b, :k], h1[b, :k], atol=1e-6)
    assert np.abs(h0[b, k:] - h1[b, k:]).max(axis=-1).min() > 1e-4
    np.testing.assert_allclose(h2[b, :k], h1[b, :k], atol=1e-6)
    np.testing.assert_allclose(h2[b, N - 1], h1[b, N - 2], atol=2e-5)


def test_causal_blanks_see_the_blanks_at_lower_positions_only(model):
  """``blank_attention="causal"``: hiding from each blank the blanks at higher positions changes
  nothing; hiding those at lower positions moves the blanks that had one; the written slots are
  the block model's (they never see a blank)."""
  if not _causal(model):
    pytest.skip("model.blank_attention='causal' only")
  tokens, order, _, plen = _rows(2)
  pl = jnp.asarray(plen, jnp.int32)
  cut = pl + 1
  tok, pos, tgt, mask = blanks.blank_slots(tokens, order, cut, pl, causal=True)
  blank = tgt >= 0
  pairs = blank[:, :, None] & blank[:, None, :] & ~jnp.eye(N, dtype=bool)
  higher = pairs & (order[:, None, :] > order[:, :, None])
  lower = pairs & (order[:, None, :] < order[:, :, None])
  assert not np.asarray(mask & higher).any()
  h = np.asarray(model.hidden_slots(tok, pos, tgt, mask=mask)[0])
  h_hi = np.asarray(model.hidden_slots(tok, pos, tgt, mask=mask & ~higher)[0])
  h_lo = np.asarray(model.hidden_slots(tok, pos, tgt, mask=mask & ~lower)[0])
  np.testing.assert_allclose(h_hi, h, atol=1e-6)
  had = np.asarray(lower.any(-1))
  moved = np.abs(h_lo - h).max(-1) > 1e-4
  assert had.any() and (moved == had).all()
  block = blanks.blank_slots(tokens, order, cut, pl)[3]
  h_block = np.asarray(model.hidden_slots(tok, pos, tgt, mask=block)[0])
  np.testing.assert_allclose(h_block[~np.asarray(blank)], h[~np.asarray(blank)], atol=1e-6)


def test_loss_is_the_weighted_blank_nll(model):
  """`blank_loss`: each blank's NLL times (n - m) / (n - k) (every_blank), or rank k's times
  n - m; the mean divides by the answer cells; the cuts are uniform in [m, n - 1]."""
  tokens, order, prompt, plen = _rows(3)
  key = jax.random.key(4)
  cut = np.asarray(blanks.draw_cuts(key, jnp.asarray(plen, jnp.int32), N))
  tok, pos, tgt, mask = blanks.blank_slots(tokens, order, jnp.asarray(cut),
                                           jnp.asarray(plen, jnp.int32), _causal(model))
  h, _ = model.hidden_slots(tok, pos, tgt, mask=mask)
  logp = np.asarray(jax.nn.log_softmax(model.head(h, tgt)))
  target = np.asarray(orders_lib.permute(tokens, order))
  nll = -np.take_along_axis(logp, target[..., None], -1)[..., 0]
  for every in (True, False):
    mean, per = blanks.blank_loss(model, tokens, order, key, prompt=prompt, every_blank=every)
    want = np.zeros((4, N))
    for b in range(4):
      k, m = int(cut[b]), int(plen[b])
      if every:
        want[b, k:] = nll[b, k:] * (N - m) / (N - k)
      else:
        want[b, k] = nll[b, k] * (N - m)
    np.testing.assert_allclose(np.asarray(per), want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(float(mean), want.sum() / (N - plen).sum(), rtol=2e-5)
  many = np.asarray(blanks.draw_cuts(jax.random.key(0), jnp.full((4000,), 3, jnp.int32), N))
  assert many.min() == 3 and many.max() == N - 1
  np.testing.assert_allclose(np.bincount(many)[3:] / 4000, 1 / 7, atol=0.02)


@pytest.mark.parametrize("kw", [
    dict(steps=4, policy="max_prob"), dict(steps=N, policy="margin", greedy=True),
    dict(steps=3, policy="threshold", threshold=0.3),
    dict(steps=5, policy="max_prob", policy_temperature=0.7, temperature=0.9, phases=True)])
def test_cached_sampler_is_its_reference_and_the_likelihood_is_exact(model, monkeypatch, kw):
  """The cached adaptive sampler draws what its uncached reference draws (tokens, order, query
  logits; the prompt kept), and the log-probabilities it recorded are `sequence_logp`'s and
  `order_logp`'s. ``phases``: the late steps on ceil(Q / 2) query slots (`AdaptiveShape.phases`,
  here from Q = 4 on: 10, then 5; tests/test_sampler_adaptive.py checks them against one
  phase)."""
  from aogpt_jax.sampling import adaptive
  if _causal(model) and kw.get("policy") in ("margin", "threshold"):
    pytest.skip("the causal blanks: max_prob, one phase and two (the policies share the code)")
  kw = dict(kw)
  if kw.pop("phases", False):
    monkeypatch.setattr(adaptive, "PHASE_MIN_QUERIES", 4)
  ptok, pmask = _prompt()
  s = sampler.SampleSettings(length=N, method="adaptive", **kw)
  if kw.get("policy_temperature"):
    p = sampler.prepare(model.cfg, jax.random.key(5), s, prompt=(ptok, pmask))
    assert sampler.adaptive_shape(p, s).phases == (10, 5)
  a = sampler.generate(model, jax.random.key(5), s, prompt=(ptok, pmask), debug=True,
                       return_logp=True)
  b = sampler.generate(model, jax.random.key(5), s, prompt=(ptok, pmask), debug=True,
                       reference=True)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.order, b.order)
  np.testing.assert_array_equal(a.tokens[pmask], ptok[pmask])
  fin = np.isfinite(b.logits)
  np.testing.assert_allclose(a.logits[fin], b.logits[fin], atol=2e-5)
  ref = likelihood.sequence_logp(model, a.tokens, a.order, a.step_of_rank, pmask)
  np.testing.assert_allclose(a.model_logp, np.asarray(ref), atol=1e-5, rtol=0)
  if kw.get("policy_temperature"):
    olp = likelihood.order_logp(model, a.tokens, a.order, a.step_of_rank, pmask,
                                policy="max_prob", policy_temperature=0.7, temperature=0.9)
    np.testing.assert_allclose(a.order_logp, np.asarray(olp), atol=1e-5, rtol=0)


def _uncached_logp(model, tokens, order, steps, prompt):
  """`sequence_logp` of a blank model the slow way: for each row and step, one uncached pass of
  `blanks.query_layout` (n written slots, then the step's blanks as queries)."""
  from aogpt_jax.model.aogpt import prompt_block
  b, n = tokens.shape
  block = prompt_block(model.cfg, jnp.sum(jnp.asarray(prompt), -1, dtype=jnp.int32))
  target = orders_lib.permute(jnp.asarray(tokens), jnp.asarray(order))
  rows = []
  for i in range(b):
    plen, out = int(prompt[i].sum()), [jnp.zeros(())] * n
    for t in sorted(set(steps[i, plen:].tolist())):
      m = plen + int(np.argmax(steps[i, plen:] == t))
      tgt = jnp.asarray(order[i:i + 1, m:])
      tok, pos, tg, mask = blanks.query_layout(jnp.asarray(tokens[i:i + 1]),
                                               jnp.asarray(order[i:i + 1]),
                                               jnp.full(tgt.shape, m), tgt, block[i:i + 1],
                                               _causal(model))
      h, _ = model.hidden_slots(tok, pos, tg, mask=mask)
      lp = jax.nn.log_softmax(model.head(h, tg)[0, n:])
      for r in range(m, n):
        if int(steps[i, r]) == t:
          out[r] = lp[r - m, target[i, r]]
    rows.append(jnp.stack(out))
  return jnp.stack(rows)


def test_likelihood_over_cached_written_slots_equals_uncached_passes_with_gradients(model):
  """`sequence_logp` and `order_logp` compute the written slots' keys and values once and run
  each step's blanks against them: the values and the weights' gradients equal one uncached
  `blanks.query_layout` pass per step (several tokens per step, two rows of different prompt
  lengths)."""
  from flax import nnx
  ptok, pmask = _prompt()
  s = sampler.SampleSettings(length=N, method="adaptive", steps=4, policy="max_prob",
                             policy_temperature=0.7)
  a = sampler.generate(model, jax.random.key(3), s, prompt=(ptok, pmask), return_logp=True)
  args = tuple(np.asarray(x)[:2] for x in (a.tokens, a.order, a.step_of_rank, pmask))
  plen = int(pmask[0].sum())
  assert len(set(args[2][0, plen:].tolist())) < N - plen          # several tokens a step
  fast = lambda m: likelihood.sequence_logp(m, *args)  # noqa: E731
  slow = lambda m: _uncached_logp(m, *args)  # noqa: E731
  lp = np.asarray(nnx.jit(fast)(model))
  np.testing.assert_allclose(lp, np.asarray(nnx.jit(slow)(model)), atol=2e-5)
  np.testing.assert_allclose(lp, a.model_logp[:2], atol=2e-5)
  if not _causal(model):   # the gradients' path does not depend on the mask (block: enough)
    g_fast = nnx.jit(nnx.grad(lambda m: jnp.sum(fast(m))))(model)   # the rollout: constants
    g_slow = nnx.jit(nnx.grad(lambda m: jnp.sum(slow(m))))(model)
    for x, y in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_slow)):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-4, rtol=1e-3)
  olp = likelihood.order_logp(model, *args, policy="max_prob", policy_temperature=0.7)
  np.testing.assert_allclose(np.asarray(olp), a.order_logp[:2], atol=2e-5)


def test_folded_passes_equal_one_pass_per_step_with_gradients(model):
  """`likelihood.blank_scan` folds step t and step T - 1 - t into one pass of W + 1 queries when
  they fit (`fold_steps`) and keeps one step a pass where they do not; in one batch of both kinds
  (one token a step, two a step, one then all the rest, uneven steps) its logits, and the
  gradients of `sequence_logp` (log-probabilities taken inside the passes), equal the unfolded
  scan's (`order_scan`: one step per pass, logits outside)."""
  from flax import nnx
  tokens, order, prompt, plen = _rows(7)
  w = int(N - plen.min())
  patterns = [lambda a: np.arange(a), lambda a: np.arange(a) // 2,
              lambda a: np.minimum(np.arange(a), 1), lambda a: np.array([0, 0, 0, 1, 2, 2, 3,
                                                                         4, 5, 5])[:a]]
  steps = np.full((4, N), -1, np.int32)
  for i, f in enumerate(patterns):
    steps[i, plen[i]:] = f(N - plen[i])
  steps = jnp.asarray(steps)
  sq = likelihood.step_queries(steps, orders_lib.scored_ranks(prompt), w, w)
  pass_BxT, _ = likelihood.fold_steps(sq, N, w + 1)
  t_rows = np.asarray(jnp.sum(sq.start < N, axis=1))
  n_pass = np.asarray(jnp.max(jnp.where(sq.start < N, pass_BxT, -1), axis=1)) + 1
  assert n_pass[0] == -(-t_rows[0] // 2) and n_pass[2] == t_rows[2] == 2   # folds; does not
  args = (tokens, order, steps, prompt)
  scored = np.asarray(orders_lib.scored_ranks(prompt))
  fold = np.asarray(likelihood.blank_scan(model, *args, width=w))
  ref = np.asarray(likelihood.order_scan(model, *args, policy="max_prob", policy_temperature=0.0,
                                         width=w)[1])
  np.testing.assert_allclose(fold[scored], ref[scored], atol=2e-5)
  c = jnp.asarray(np.random.default_rng(1).normal(size=(4, N)), jnp.float32)
  g_fold = nnx.jit(nnx.grad(lambda m: jnp.sum(c * likelihood.sequence_logp(m, *args,
                                                                            width=w))))(model)
  g_ref = nnx.jit(nnx.grad(lambda m: jnp.sum(c * likelihood.token_logp(likelihood.order_scan(
      m, *args, policy="max_prob", policy_temperature=0.0, width=w)[1], tokens, order,
      prompt))))(model)
  for x, y in zip(jax.tree.leaves(g_fold), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-4, rtol=1e-3)


def test_a_width_below_the_answer_is_one_line_not_zeros(model):
  """A ``width`` below a row's answer length would drop that row's queries (their
  log-probabilities read 0, a certainty): one line naming the width and what is needed."""
  tokens, order, prompt, plen = _rows(7)
  steps = jnp.broadcast_to(jnp.arange(N), (4, N))
  need = int(N - plen.min())
  with pytest.raises(ValueError, match=f"width={need - 1}: .*expected at least {need}"):
    likelihood.sequence_logp(model, tokens, order, steps, prompt, width=need - 1)
  assert np.asarray(likelihood.sequence_logp(model, tokens, order, steps, prompt,
                                             width=need)).min() < -1e-3


def test_one_token_per_step_likelihood_is_the_next_rank_loss(model):
  """With one token per step, rank r's `sequence_logp` is minus the NLL of the blank query of
  rank r at the cut r (the loss's ``every_blank=False`` term, here at every cut)."""
  tokens, order, prompt, plen = _rows(5)
  steps = jnp.broadcast_to(jnp.arange(N), (4, N))
  lp = np.asarray(likelihood.sequence_logp(model, tokens, order, steps, prompt))
  pl = jnp.asarray(plen, jnp.int32)
  target = np.asarray(orders_lib.permute(tokens, order))
  for r in range(int(plen.max()), N):
    cut = jnp.full((4,), r, jnp.int32)
    tok, pos, tgt, mask = blanks.blank_slots(tokens, order, cut, pl, _causal(model))
    h, _ = model.hidden_slots(tok, pos, tgt, mask=mask)
    logp = np.asarray(jax.nn.log_softmax(model.head(h, tgt)))[:, r]
    np.testing.assert_allclose(lp[:, r], logp[np.arange(4), target[:, r]], atol=2e-5)


def test_options_where_they_cannot_apply_are_one_line_errors(model):
  cfg = model.cfg
  with pytest.raises(ValueError, match=r"model.blank_block=True: the encoder MDM"):
    encoder_model.encoder_config(cfg.replace(prompt_attention="causal"))
  with pytest.raises(ValueError, match=r"model.blank_block: True needs model.prompt_attention"):
    cfg.replace(prompt_attention="bidirectional_target")
  with pytest.raises(ValueError, match=r"model.blank_block: must be True or False, got 'yes'"):
    cfg.replace(blank_block="yes")
  for method, extra in (("diffusion", {}), ("ar", {}), ("adaptive", {"candidates": 3})):
    s = sampler.SampleSettings(length=N, method=method, **extra)
    with pytest.raises(ValueError, match=r"model.blank_block=True predicts from a query block"):
      sampler.generate(model, jax.random.key(0), s, prompt=_prompt())
  tokens, order, prompt, _ = _rows()
  with pytest.raises(ValueError, match=r"model.blank_block=True: this model predicts from a "):
    model(tokens, order)          # the one-pass chain is not what it learned
  chunked = tiny_model(vocab=16, valid=V, block=12, blank_block=True, loss_chunk=8)
  with pytest.raises(ValueError, match=r"model.loss_chunk: model.blank_block trains with plain"):
    objectives.get("ao").loss(chunked, tokens, order, jax.random.key(0), None, None)
  from aogpt_jax import config as config_lib
  from aogpt_jax import recipes
  text = recipes.apply(recipes.quickstart(), {"model.blank_block": True})
  with pytest.raises(config_lib.ConfigError, match=r"^model.blank_block: True is trained for"):
    config_lib.check_prompt_training(text, config_lib.resolve(text))
