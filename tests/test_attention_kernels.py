"""Blockwise (online-softmax) attention and the TPU splash kernel against the XLA einsum path:
same outputs and gradients (causal, explicit masks with fully masked rows, full; shapes that do
not divide the block), the same model loss and gradients on both attention paths, less compiled
memory than the XLA path, and the kernel selection (auto / explicit, with reasons)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.model import attention
from aogpt_jax.model import aogpt as model
from aogpt_jax.model import orders


def _qkv(b, s, c, n=2, h=8, seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(k1, (b, s, n, h)), jax.random.normal(k2, (b, c, n, h)),
          jax.random.normal(k3, (b, c, n, h)))


def _mask(b, s, c):
  m = jax.random.bernoulli(jax.random.key(7), 0.4, (b, s, c))
  return m.at[:, 1].set(False)  # a fully masked row (the XLA path: uniform weights)


def _out_and_grads(impl, q, k, v, mask, block=256):
  """Attention output and its vjp with a random cotangent, in one jitted call."""
  w = jax.random.normal(jax.random.key(9), q.shape)
  arr = None if mask is None or isinstance(mask, str) else mask

  @jax.jit
  def f(q, k, v, arr):
    m = mask if arr is None else arr
    out, vjp = jax.vjp(lambda q, k, v: attention.attention(q, k, v, mask=m, impl=impl, block=block),
                       q, k, v)
    return out, vjp(w)
  return f(q, k, v, arr)


@pytest.mark.parametrize("kind,s,c,block", [("causal", 20, 20, 8), ("mask", 12, 19, 5),
                                            ("full", 9, 14, 4)])
def test_blockwise_equals_xla_forward_and_grads(kind, s, c, block):
  q, k, v = _qkv(2, s, c)
  mask = {"causal": None, "mask": _mask(2, s, c), "full": attention.FULL}[kind]
  y0, g0 = _out_and_grads("xla", q, k, v, mask)
  y1, g1 = _out_and_grads("blockwise", q, k, v, mask, block)
  np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
  for a, b in zip(g1, g0):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_blockwise_catches_a_wrong_mask():
  """The comparison above can fail: blockwise with the mask dropped differs from xla."""
  q, k, v = _qkv(1, 12, 12)
  y0, _ = _out_and_grads("xla", q, k, v, _mask(1, 12, 12))
  y1, _ = _out_and_grads("blockwise", q, k, v, attention.FULL, 5)
  assert np.abs(np.asarray(y1) - np.asarray(y0)).max() > 1e-2


@pytest.mark.parametrize("path", ["gather", "mask"])
@pytest.mark.slow
def test_blockwise_model_loss_and_grads(path):
  cfg = model.preset("tiny", block_size=24, n_layer=1, n_head=2, n_embd=32, target_dim=8,
                     vocab_size=64, valid_vocab_size=50, attention=path)
  k1, k2 = jax.random.split(jax.random.key(1))
  tokens = jax.random.randint(k1, (2, 21), 0, 50, dtype=jnp.int32)
  order = orders.sample("uniform", k2, 2, 21)
  gd, params = nnx.split(model.AOGPT(cfg, rngs=nnx.Rngs(0)))
  gd_b = nnx.graphdef(model.AOGPT(cfg.replace(attention_impl="blockwise", attention_block=8),
                                  rngs=nnx.Rngs(0)))

  def f(g):
    return jax.jit(jax.value_and_grad(
        lambda p: model.loss(nnx.merge(g, p), tokens, order)[0]))(params)
  (l0, g0), (l1, g1) = f(gd), f(gd_b)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_blockwise_saves_compiled_memory():
  """The loss gradient at n = 128 no longer keeps [B, heads, n, n] scores per layer."""
  n = 128
  cfg = model.preset("tiny", n_layer=1, block_size=n, vocab_size=64, valid_vocab_size=64,
                     target_dim=8)
  tokens = jax.ShapeDtypeStruct((4, n), jnp.int32)

  def temps(c):
    gd, params = nnx.split(model.AOGPT(c, rngs=nnx.Rngs(0)))
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    order = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (4, n))
    fn = jax.jit(jax.grad(lambda p, t: model.loss(nnx.merge(gd, p), t, order)[0]))
    return fn.lower(params, tokens).compile().memory_analysis().temp_size_in_bytes
  xla, blockwise = temps(cfg.replace(attention_impl="xla")), temps(
      cfg.replace(attention_impl="blockwise", attention_block=32))
  scores = 4 * cfg.n_head * n * n * 4 * cfg.n_layer  # one fp32 [B, N, n, n] per layer
  assert blockwise < xla - scores, (blockwise, xla)


def test_splash_interpret_equals_xla():
  """The Pallas TPU kernel itself, run by the Pallas interpreter on CPU (smallest legal tile)."""
  q, k, v = _qkv(1, 128, 128, n=1, h=64, seed=3)
  y0, g0 = _out_and_grads("xla", q, k, v, None)
  y1, g1 = _out_and_grads("splash_interpret", q, k, v, None)
  np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
  for a, b in zip(g1, g0):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_selection(monkeypatch, caplog):
  bf16 = jnp.bfloat16
  with pytest.raises(ValueError, match="attention_impl='splash' cannot be used: backend is cpu"):
    attention.resolve_attention_impl("splash", bf16, 64, masked=False, seq_q=1024, seq_k=1024)
  assert attention.resolve_attention_impl("auto", bf16, 64, masked=False, seq_q=1024) == "xla"
  assert attention.resolve_attention_impl("blockwise", bf16, 64, masked=True) == "blockwise"
  with pytest.raises(ValueError, match="attention_impl"):
    attention.resolve_attention_impl("flash", bf16, 64, masked=False)
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  attention._logged.clear()
  # auto on TPU: splash where it can (training at n = 1024, head_dim 64).
  assert attention.resolve_attention_impl("auto", bf16, 64, masked=False, seq_q=1024,
                                       seq_k=1024) == "splash"
  assert attention.resolve_attention_impl("splash", bf16, 64, masked=False, seq_q=1024,
                                       seq_k=1024) == "splash"
  with caplog.at_level(logging.INFO):
    # The cached sampler: one query over the whole cache, an explicit mask.
    assert attention.resolve_attention_impl("splash", bf16, 64, masked=True, seq_q=1,
                                         seq_k=1024) == "xla"
  assert "explicit mask array" in caplog.text
  with pytest.raises(ValueError, match="query length 100 is not a multiple of 128"):
    attention.resolve_attention_impl("splash", bf16, 64, masked=False, seq_q=100, seq_k=100)
  with pytest.raises(ValueError, match="head_dim 48 is not a multiple of 64"):
    attention.resolve_attention_impl("splash", bf16, 48, masked=False, seq_q=256, seq_k=256)
  with pytest.raises(ValueError, match="model.attention_impl"):
    model.preset("tiny", attention_impl="pallas")
  with pytest.raises(ValueError, match="model.attention_block"):
    model.preset("tiny", attention_block=0)


@pytest.mark.parametrize("backend,masked,seq_q,seq_k,head_dim,want", [
    # TPU: splash for causal/full attention it can tile ...
    ("tpu", False, 1024, 1024, 64, "splash"),
    ("tpu", False, 2048, 2048, 128, "splash"),
    # ... blockwise where it cannot and the call is long: never the [B, N, n, n] XLA path
    ("tpu", False, 1025, 1025, 64, "blockwise"),      # length not a multiple of 128
    ("tpu", False, 1024, 1024, 48, "blockwise"),      # head_dim not a multiple of 64
    ("tpu", True, 1025, 1025, 64, "blockwise"),       # the mask path's rank mask
    ("tpu", True, 1024, 1024, 64, "blockwise"),       # packed ensemble rows
    # ... and the XLA path for short calls (the cached sampler's few queries, short rows)
    ("tpu", True, 4, 1024, 64, "xla"),
    ("tpu", False, 200, 200, 64, "xla"),
    # GPU: cuDNN for causal/full attention, as before; CPU: XLA
    ("gpu", False, 1024, 1024, 64, "cudnn"),
    ("gpu", True, 1025, 1025, 64, "xla"),
    ("gpu", False, 1024, 1024, 256, "xla"),
    ("cpu", False, 1024, 1024, 64, "xla"),
])
def test_auto_choice_per_backend(backend, masked, seq_q, seq_k, head_dim, want):
  got = attention.choose("auto", backend, jnp.bfloat16, head_dim, masked=masked, seq_q=seq_q,
                         seq_k=seq_k)
  assert got == want


def test_auto_never_materialises_training_attention_on_tpu():
  """Every AO-GPT preset and attention path at n >= 1024 on TPU: splash or blockwise."""
  for name in ("small", "medium"):
    cfg = model.preset(name)
    for n, masked in ((1024, False), (1025, True), (2048, False)):
      got = attention.choose("auto", "tpu", jnp.bfloat16, cfg.head_dim, masked=masked,
                             seq_q=n, seq_k=n)
      assert got in ("splash", "blockwise"), (name, n, masked, got)


def test_splash_runs_per_shard_under_a_mesh():
  """In a sharded step the Pallas call runs inside shard_map (batch over data x fsdp, heads over
  tensor; XLA cannot partition it), with the same numbers as the XLA path on one device."""
  from aogpt_jax import config as config_lib
  from aogpt_jax.train import sharding as sharding_lib
  cfg = config_lib.default_config()
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 2, 2, 2
  mesh = sharding_lib.make_mesh(cfg, devices=jax.devices()[:8])
  rules = config_lib.rules(cfg)
  q, k, v = _qkv(4, 128, 128, n=2, h=64, seed=4)
  y0, g0 = _out_and_grads("xla", q, k, v, None)

  def sharded(q, k, v):
    with sharding_lib.activation_constraints(mesh, rules):
      return _splash_vjp(q, k, v)
  assert "shard_map" in str(jax.make_jaxpr(sharded)(q, k, v))
  y1, g1 = jax.jit(sharded)(q, k, v)
  np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
  for a, b in zip(g1, g0):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _splash_vjp(q, k, v):
  w = jax.random.normal(jax.random.key(9), q.shape)      # the cotangent of _out_and_grads
  out, vjp = jax.vjp(lambda q, k, v: attention.attention(q, k, v, mask=None,
                                                       impl="splash_interpret"), q, k, v)
  return out, vjp(w)
