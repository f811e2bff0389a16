"""Encoder-only MDM likelihood in the evaluation format: the exact order NLL uses the AO-GPT rows'
orders and equals single-position predictions, the ELBO estimator equals a direct computation
and converges to the exact ELBO (enumeration) inside its interval, and the driver writes the
rows next to an AO-GPT's."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.evaluation import zero_shot as evaluate
from aogpt_jax.evaluation import report
from aogpt_jax.model import encoder as mdm
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.evaluation import encoder_nll as enc
from aogpt_jax.evaluation import perplexity as ppl
from helpers.sampler import encoder_forward, exact_elbo, tiny_encoder

N = 6


@pytest.fixture(scope="module")
def m():
  return tiny_encoder(vocab=8, valid=7, block=N, std=0.5)


def _tokens(rows=3, n=N, valid=7, seed=0):
  return np.random.default_rng(seed).integers(0, valid, (rows, n)).astype(np.int32)


@pytest.mark.slow
def test_order_nll_uses_the_aogpt_orders_and_is_single_position_predictions(m):
  tokens, ids = _tokens(), np.array([4, 17, 9], np.uint32)
  nll, order = enc.order_nll(m, tokens, ids, order="uniform", seed=3, order_index=1)
  nll, order = np.asarray(nll), np.asarray(order)
  aogpt = model_lib.AOGPT(m.cfg.replace(target="adaln"), rngs=nnx.Rngs(0))
  _, ao_order = ppl.token_nll(aogpt, tokens, ids, order="uniform", seed=3, order_index=1)
  np.testing.assert_array_equal(order, np.asarray(ao_order))        # the same scoring orders
  assert not (order == np.arange(N)).all()
  for b in range(3):
    for r in range(N):
      inp = tokens[b].copy()
      inp[order[b, r:]] = mdm.mask_id(m.cfg)
      logits = np.asarray(encoder_forward(m)(jnp.asarray(inp)[None]))[0, order[b, r]]
      logp = logits - np.logaddexp.reduce(logits[np.isfinite(logits)])
      np.testing.assert_allclose(nll[b, r], -logp[tokens[b, order[b, r]]], rtol=1e-5, atol=1e-6)
  l2r, o = enc.order_nll(m, tokens, ids, order="l2r")
  np.testing.assert_array_equal(np.asarray(o), np.broadcast_to(np.arange(N), (3, N)))


def test_elbo_draws_depend_on_block_and_sample_only_and_terms_match_direct(m):
  ids = jnp.array([5, 9, 11], jnp.uint32)
  t, masked = enc.elbo_masks(0, ids, N, 2, num_samples=4, stratified=False)
  t1, masked1 = enc.elbo_masks(0, ids[1:2], N, 2, num_samples=4, stratified=False)
  np.testing.assert_array_equal(t[1:2], t1)
  np.testing.assert_array_equal(masked[1:2], masked1)            # independent of the batch
  t_other, _ = enc.elbo_masks(0, ids, N, 3, num_samples=4, stratified=False)
  assert (np.asarray(t) != np.asarray(t_other)).all()
  tokens = _tokens()
  got = np.asarray(enc.elbo_terms(m, tokens, ids, seed=0, sample_index=2, num_samples=4))
  for b in range(3):
    inp = np.where(masked[b], mdm.mask_id(m.cfg), tokens[b])
    logits = np.asarray(encoder_forward(m)(jnp.asarray(inp)[None]), np.float64)[0]
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    direct = -sum(logp[i, tokens[b, i]] for i in range(N) if masked[b, i]) / float(t[b])
    np.testing.assert_allclose(got[b], direct, rtol=1e-5)


def test_elbo_masks_rates_and_stratified_times():
  ids = jnp.arange(4000, dtype=jnp.uint32)
  t, masked = enc.elbo_masks(1, ids, 64, 0, num_samples=1, stratified=False)
  t, rate = np.asarray(t), np.asarray(masked).mean(1)
  assert t.min() > 0 and t.max() <= 1 and abs(t.mean() - 0.5) < 0.02
  assert np.abs(rate - t).mean() < 0.06                          # each position masked w.p. t
  ts = np.array([np.asarray(enc.elbo_masks(1, ids[:3], 8, k, num_samples=8, stratified=True)[0])
                 for k in range(8)])                              # [K, B]
  np.testing.assert_allclose(np.diff(np.sort(ts, axis=0), axis=0), 1 / 8, atol=1e-6)


def test_elbo_masks_are_the_documented_draw():
  """Sample k of block id: t and mask from the halves of fold_in(fold_in(fold_in(key(seed),
  ELBO_STREAM), id), k); stratified t_k = 1 - ((u_b + k/K) mod 1), u_b from the SHIFT stream."""
  seed, ids, n, k, num = 5, jnp.array([7, 2], jnp.uint32), 6, 3, 4
  for stratified in (False, True):
    t, masked = map(np.asarray, enc.elbo_masks(seed, ids, n, k, num_samples=num,
                                               stratified=stratified))
    for row, bid in enumerate(np.asarray(ids)):
      base = jax.random.fold_in(jax.random.key(seed), enc.ELBO_STREAM)
      k_t, k_m = jax.random.split(jax.random.fold_in(jax.random.fold_in(base, bid), k))
      if stratified:
        shift = jax.random.fold_in(jax.random.key(seed), enc.SHIFT_STREAM)
        u_b = float(jax.random.uniform(jax.random.fold_in(shift, bid), ()))
        want = 1.0 - (u_b + k / num) % 1.0
      else:
        want = 1.0 - float(jax.random.uniform(k_t, ()))
      np.testing.assert_allclose(t[row], want, atol=1e-6)
      np.testing.assert_array_equal(masked[row], np.asarray(jax.random.uniform(k_m, (n,))) < t[row])


@pytest.mark.slow
def test_elbo_row_converges_to_the_exact_elbo_inside_its_interval():
  m4 = tiny_encoder(vocab=4, valid=3, block=4, std=0.5, seed=3)
  tokens = np.array([[1, 2, 0, 2], [2, 2, 1, 0]], np.int32)
  batches = [{"tokens": tokens, "weight": np.array([1.0, 0.5])}]
  exact = exact_elbo(m4, jnp.asarray(tokens))
  want = (exact[0] + 0.5 * exact[1]) / (1.5 * 4)                 # weighted, per token
  k = 400
  res = enc.encoder_perplexity(m4, batches, seed=0, num_samples=k)
  assert res["t_samples"] == k and len(res["per_sample_nll"]) == k and res["tokens"] == 6.0
  lo, hi = res["nll_ci95"]
  se = (hi - lo) / 2 / 1.96
  assert abs(res["nll"] - want) < 4 * se, (res["nll"], want, se)
  assert 0.02 < se < 0.5                                         # a real interval
  np.testing.assert_allclose(res["ppl"], np.exp(res["nll"]))
  strat = enc.encoder_perplexity(m4, batches, seed=0, num_samples=k, stratified=True)
  assert abs(strat["nll"] - want) < 4 * se and "stratified" in strat["ci_method"]
  with pytest.raises(ValueError, match="row 1 of the batch has token weights that differ"):
    enc.encoder_perplexity(m4, [{"tokens": tokens, "weight": np.array([[1.0] * 4,
                                                                       [1, 1, 0, 1]])}])


@pytest.mark.slow
def test_evaluate_encoder_rows_next_to_an_aogpt(m, tmp_path):
  rng = np.random.default_rng(1)
  data = {name: [{"tokens": rng.integers(0, 7, (2, N)).astype(np.int32),
                  "weight": np.array([1.0, w])} for w in (1.0, 0.0)] for name in ("ptb", "lm1b")}
  s = evaluate.EvalSettings(model_kind="encoder", num_orders=2, elbo_samples=3, seed=3)
  res = evaluate.evaluate(m, {k: (lambda v=v: iter(v)) for k, v in data.items()}, s,
                          workdir=str(tmp_path), name="enc")
  saved = json.loads((tmp_path / "eval" / "enc.json").read_text())
  assert saved == res and saved["model_kind"] == "encoder"
  for name, batches in data.items():
    d = saved["datasets"][name]
    assert d["any_order"]["tokens"] == 3 * N and len(d["any_order"]["per_order_nll"]) == 2
    for key, order, k in (("l2r", "l2r", 0), ("any_order", "uniform", 1)):
      total = 0.0
      for b in batches:
        nll, _ = enc.order_nll(m, b["tokens"], ppl.block_ids(b), order=order, seed=3,
                               order_index=k)
        total += float(np.sum(np.asarray(nll, np.float64).sum(1) * b["weight"]))
      got = d[key]["nll"] if key == "l2r" else d[key]["per_order_nll"][1]
      np.testing.assert_allclose(got, total / (3 * N), rtol=1e-6)
    direct = enc.encoder_perplexity(m, batches, seed=3, num_samples=3)
    np.testing.assert_allclose(d["elbo"]["per_sample_nll"], direct["per_sample_nll"], rtol=1e-7)
  table = (tmp_path / "eval" / "enc.md").read_text().splitlines()
  assert [r.split(" |")[0] for r in table[2:]] == [
      "| L2R (exact, n forwards)",
      "| Any-order exact NLL (uniform, 2 order draw(s), seed 3, n forwards, 95% CI)",
      "| ELBO bound (3 t-samples, seed 3, 95% CI)"]
  assert f"{res['datasets']['lm1b']['elbo']['ppl']:.2f}" in table[4]
  # side by side with an AO-GPT of the same size
  aogpt = model_lib.AOGPT(m.cfg.replace(target="adaln"), rngs=nnx.Rngs(0))
  ao = evaluate.evaluate(aogpt, {"ptb": data["ptb"]}, evaluate.EvalSettings(seed=3,
                                                                            ensemble_max_m=2))
  both = report.markdown_comparison({"AO-GPT": ao, "Encoder": res}).splitlines()
  assert both[0] == "| Method: perplexity (nats/token) | ptb | lm1b |"
  labels = [r.split(" |")[0] for r in both[2:]]
  assert labels[:4] == ["| AO-GPT: L2R", "| AO-GPT: Any-order (uniform, 1 order draw(s), seed 3)",
                        "| AO-GPT: Ensemble M=1", "| AO-GPT: Ensemble M=2"]
  assert labels[4].startswith("| Encoder: L2R") and labels[6].startswith("| Encoder: ELBO")
  assert both[2].endswith(" | - |")                               # AO-GPT has no lm1b


def test_settings_and_model_errors(m):
  with pytest.raises(ValueError, match="ensembles do not apply to the encoder"):
    evaluate.EvalSettings(model_kind="encoder", ensemble_max_m=2)
  with pytest.raises(ValueError, match="eval.model_kind must be one of"):
    evaluate.EvalSettings(model_kind="bert")
  with pytest.raises(ValueError, match="eval.elbo_samples"):
    evaluate.EvalSettings(model_kind="encoder", elbo_samples=-1)
  only_elbo = evaluate.EvalSettings(model_kind="encoder", l2r=False, any_order=False)
  assert only_elbo.elbo
  with pytest.raises(ValueError, match="nothing to compute"):
    evaluate.EvalSettings(l2r=False, any_order=False)             # an AO-GPT has no ELBO row
  aogpt = model_lib.AOGPT(m.cfg.replace(target="adaln"), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="model.target='adaln'"):
    evaluate.evaluate(aogpt, {"ptb": []}, only_elbo)
