"""Zero-shot perplexity: L2R against an independent causal LM, order reproducibility, weights."""

import math

import numpy as np
import pytest
from flax import nnx
from scipy.special import erf

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.checkpoints import convert
from aogpt_jax.evaluation import perplexity as ppl

N = 12


def _model(target="adaln", seed=0):
  cfg = model_lib.preset("tiny", target=target, n_layer=2, n_embd=32, n_head=4, block_size=16,
                         target_dim=8)
  return model_lib.AOGPT(cfg, rngs=nnx.Rngs(seed))


def _rms(x, w):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5) * w


def causal_lm_nll(flat, cfg, x):
  """float64 NLL of x[r] given x[:r] for a target='none' model, straight from its parameters."""
  p = {k: np.asarray(v, np.float64) for k, v in flat.items()}
  n, d, nh = len(x), cfg.n_embd, cfg.n_head
  hd = d // nh
  h = np.concatenate([(p["wnone"] + p["wpe.embedding"][0])[None],
                      p["wte.embedding"][x[:-1]] + p["wpe.embedding"][1:n]])
  causal = np.tril(np.ones((n, n), bool))
  for i in range(cfg.n_layer):
    q_ = f"h.{i}."
    a = _rms(h, p[q_ + "ln_1.scale"])
    qkv = (a @ p[q_ + "attn.c_attn.kernel"] + p[q_ + "attn.c_attn.bias"]).reshape(n, 3, nh, hd)
    q = _rms(qkv[:, 0], p[q_ + "attn.q_norm.scale"])
    k = _rms(qkv[:, 1], p[q_ + "attn.k_norm.scale"])
    s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    s = np.where(causal, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    y = np.einsum("hqk,khd->qhd", w, qkv[:, 2]).reshape(n, d)
    h = h + y @ p[q_ + "attn.c_proj.kernel"] + p[q_ + "attn.c_proj.bias"]
    a = _rms(h, p[q_ + "ln_2.scale"]) @ p[q_ + "mlp.c_fc.kernel"] + p[q_ + "mlp.c_fc.bias"]
    a = 0.5 * a * (1 + erf(a / math.sqrt(2)))
    h = h + a @ p[q_ + "mlp.c_proj.kernel"] + p[q_ + "mlp.c_proj.bias"]
  logits = (_rms(h, p["ln_f.scale"]) @ p["lm_head.kernel"] + p["lm_head.bias"])
  logits = logits[:, :cfg.valid_vocab_size]
  lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  return lse - logits[np.arange(n), x]


def test_l2r_perplexity_equals_independent_causal_lm():
  m = _model("none")
  rng = np.random.default_rng(0)
  x = rng.integers(0, 257, (5, N)).astype(np.int32)
  batches = [{"tokens": x[:3], "weight": np.array([1, 1, 1], np.float32)},
             {"tokens": np.concatenate([x[3:], np.full((1, N), 256)]),
              "weight": np.array([1, 1, 0], np.float32)}]           # a padding row
  res = ppl.perplexity(m, batches, order="l2r")
  flat = convert.model_to_flat(m)
  want = np.mean([causal_lm_nll(flat, m.cfg, row) for row in x])
  np.testing.assert_allclose(res["nll"], want, rtol=1e-5)
  np.testing.assert_allclose(res["ppl"], math.exp(want), rtol=1e-5)
  assert res["tokens"] == 5 * N and res["blocks"] == 5


@pytest.mark.slow
def test_orders_depend_on_block_not_on_batching():
  m = _model()
  x = np.random.default_rng(1).integers(0, 257, (4, N)).astype(np.int32)
  one = ppl.perplexity(m, [{"tokens": x, "weight": np.ones(4)}], num_orders=2)
  two = ppl.perplexity(m, [{"tokens": x[2:][::-1], "weight": np.ones(2)},
                           {"tokens": x[:2], "weight": np.ones(2)}], num_orders=2)
  np.testing.assert_allclose(one["per_order_nll"], two["per_order_nll"], rtol=1e-6)
  ids = ppl.block_ids({"tokens": x})
  o1 = np.asarray(ppl.eval_orders("uniform", 0, ids, N))
  o2 = np.asarray(ppl.eval_orders("uniform", 0, ids[::-1], N))[::-1]
  np.testing.assert_array_equal(o1, o2)
  assert not np.array_equal(o1[0], o1[1])
  for row in o1:
    assert sorted(row) == list(range(N))
  idx = ppl.block_ids({"tokens": x, "index": np.arange(4) + 10})
  np.testing.assert_array_equal(idx, np.arange(10, 14))


def test_several_orders_give_a_confidence_interval():
  m = _model()
  x = np.random.default_rng(2).integers(0, 257, (3, N)).astype(np.int32)
  single = ppl.perplexity(m, [{"tokens": x, "weight": np.ones(3)}], seed=5)
  multi = ppl.perplexity(m, [{"tokens": x, "weight": np.ones(3)}], seed=5, num_orders=4)
  np.testing.assert_allclose(multi["per_order_nll"][0], single["nll"], rtol=1e-7)
  assert len(set(np.round(multi["per_order_nll"], 6))) == 4
  lo, hi = multi["nll_ci95"]
  v = np.array(multi["per_order_nll"])
  half = 3.182 * v.std(ddof=1) / 2
  np.testing.assert_allclose([lo, hi], [v.mean() - half, v.mean() + half], rtol=1e-9)
  np.testing.assert_allclose(multi["ppl_ci95"], np.exp([lo, hi]))
  assert "ppl_ci95" not in single


def test_token_weights_weight_each_token():
  m = _model()
  x = np.random.default_rng(3).integers(0, 257, (2, N)).astype(np.int32)
  w = np.zeros((2, N))
  w[0, :5] = 1
  res = ppl.perplexity(m, [{"tokens": x, "weight": w}], order="l2r")
  nll, order = ppl.token_nll(m, x, ppl.block_ids({"tokens": x}), order="l2r")
  np.testing.assert_allclose(res["nll"], np.asarray(nll)[0, :5].mean(), rtol=1e-6)
  assert res["tokens"] == 5 and res["blocks"] == 1


def test_bad_batches_are_named_before_compiling():
  m = _model()
  with pytest.raises(ValueError, match="token 300 at row 1, position 2"):
    x = np.zeros((2, N), np.int32)
    x[1, 2] = 300
    ppl.perplexity(m, [{"tokens": x}])
  with pytest.raises(ValueError, match="exceed model.block_size 16"):
    ppl.perplexity(m, [{"tokens": np.zeros((1, 17), np.int32)}])
  with pytest.raises(ValueError, match="'weight' must be"):
    ppl.perplexity(m, [{"tokens": np.zeros((2, N), np.int32), "weight": np.ones(3)}])
  with pytest.raises(ValueError, match="no evaluation token"):
    ppl.perplexity(m, [{"tokens": np.zeros((2, N), np.int32), "weight": np.zeros(2)}])
  with pytest.raises(ValueError, match="takes"):
    ppl.perplexity(m, [{"tokens": np.zeros((2, N), np.int32)}], order_kwargs={"bogus": 1})


def test_t_quantiles():
  assert ppl.t_quantile_975(1) == 12.706 and ppl.t_quantile_975(30) == 2.042
  assert abs(ppl.t_quantile_975(500) - 1.96) < 1e-3
