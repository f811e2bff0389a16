"""The pure train step: learning, EMA, weight-decay mask, schedule, gradient accumulation and
sharding, each checked against an independent computation."""

import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from aogpt_jax import config as config_lib
from aogpt_jax import data as data_lib
from aogpt_jax.train import sharding as sharding_lib
from aogpt_jax.train import step as train_lib
from helpers.trainer import tiny_config


EMA_DECAY = 0.5     # small enough that the cap min(decay, (1+k)/(10+k)) binds from k = 8 on
# Adam with eps=1 acts like momentum SGD on these small gradients: rounding differences between
# layouts are not blown up to +-lr steps (as Adam's sign-like first steps would), so runs on
# different meshes / microbatchings can be compared tightly.
BASE = dict(optimizer__lr=1.0, optimizer__eps=1.0, optimizer__warmup_steps=1,
            optimizer__ema_decay=EMA_DECAY, batch_size=16, total_steps=40)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("data_cache")


@pytest.fixture(scope="module")
def single(cache_dir):
  """One compiled single-device trainer shared by the tests below."""
  cfg = tiny_config(cache_dir, **BASE)
  trainer, mesh = _setup(cfg)
  return cfg, trainer, mesh


def _setup(cfg, devices=1):
  mc = config_lib.resolve(cfg)
  mesh = sharding_lib.make_mesh(cfg, devices=jax.devices()[:devices])
  sharding_lib.check_batch_sizes(cfg, mesh)
  return train_lib.build(cfg, mc, mesh), mesh


def _batches(cfg, n):
  it = data_lib.train_iterator(cfg.data, seq_len=cfg.seq_len, global_batch_size=cfg.batch_size,
                               seed=cfg.seed)
  return [next(it)["tokens"] for _ in range(n)]


def _run(trainer, mesh, batches, keep_params=False):
  with jax.set_mesh(mesh):
    state = trainer.init()
    history, metrics = [], []
    for tokens in batches:
      state, m = trainer.step(state, sharding_lib.global_batch({"tokens": tokens}, mesh))
      metrics.append(jax.device_get(m))
      if keep_params:
        history.append(jax.device_get(state["params"]))
    return state, metrics, history


def _loss(m):
  return m["nll_sum"] / m["token_count"]


@pytest.mark.slow
def test_train_step_decreases_loss(single):
  cfg, trainer, mesh = single
  batches = _batches(cfg, 1) * 30           # memorising one batch must drive the loss down
  _, metrics, _ = _run(trainer, mesh, batches)
  first, last = _loss(metrics[0]), _loss(metrics[-1])
  assert first > 5.0                        # ~log(257) at initialisation
  assert last < first - 1.5, (first, last)
  assert all(np.isfinite(m["grad_norm"]) for m in metrics)


@pytest.mark.slow
def test_ema_follows_the_warmed_up_recursion(single):
  cfg, trainer, mesh = single
  with jax.set_mesh(mesh):
    init_params = jax.device_get(trainer.init()["params"])
  state, _, history = _run(trainer, mesh, _batches(cfg, 10), keep_params=True)
  # Independent recursion in numpy: e_0 = p_0, e_k = d_k e_{k-1} + (1 - d_k) p_k.
  ema = init_params
  for k, params in enumerate(history, start=1):
    d = min(EMA_DECAY, (1 + k) / (10 + k))
    ema = jax.tree.map(lambda e, p: d * np.asarray(e, np.float64) + (1 - d) * p, ema, params)
  got = jax.device_get(state["ema"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, ema)
  assert float(train_lib.ema_decay_at(0.9999, 1)) == pytest.approx(2 / 11)
  assert float(train_lib.ema_decay_at(0.9, 1000)) == pytest.approx(0.9)


def test_no_ema_when_decay_is_zero_or_none(cache_dir):
  for off in (0.0, None):
    cfg = tiny_config(cache_dir, optimizer__ema_decay=off)
    trainer, _ = _setup(cfg)
    assert "ema" not in trainer.abstract_state


def test_weight_decay_on_matrices_embeddings_and_the_start_vector(single):
  # As published: every parameter with ndim >= 2 is decayed, and so is the START vector (the
  # published wnonee is an nn.Embedding(1, d)); biases and norm scales are not.
  cfg, trainer, mesh = single
  with jax.set_mesh(mesh):
    params = jax.device_get(trainer.init()["params"])
  wd_cfg = tiny_config(cfg.data.cache_dir, **BASE)
  wd_cfg.optimizer.weight_decay, wd_cfg.optimizer.grad_clip, wd_cfg.optimizer.eps = 0.5, 0.0, 1e-8
  tx = train_lib.make_optimizer(wd_cfg)
  # With zero gradients Adam's step is exactly 0, so the update is the decoupled decay alone:
  # -lr(step 0) * wd * p on the decayed parameters and 0 elsewhere.
  zeros = jax.tree.map(np.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
  lr0 = float(train_lib.lr_schedule(wd_cfg.optimizer, wd_cfg.total_steps)(0))
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): (p, u) for (path, p), (_, u) in
          zip(jax.tree_util.tree_flatten_with_path(params)[0],
              jax.tree_util.tree_flatten_with_path(jax.device_get(updates))[0])}
  decayed = {name for name, (p, u) in flat.items() if np.any(u != 0)}
  for name, (p, u) in flat.items():
    expected = -lr0 * 0.5 * p if p.ndim >= 2 or name == "wnone" else np.zeros_like(p)
    np.testing.assert_allclose(u, expected, rtol=1e-6, atol=1e-12, err_msg=name)
  for name in ("wnone", "wte/embedding", "wpe/embedding", "wtpe/embedding", "lm_head/kernel",
               "h/0/attn/c_attn/kernel", "h/0/mlp/c_proj/kernel", "h/0/adaLN/kernel"):
    assert name in decayed, name
  for name in ("lm_head/bias", "h/0/ln_1/scale", "h/0/attn/q_norm/scale",
               "h/0/mlp/c_fc/bias", "ln_f/scale"):
    assert name not in decayed, name


def test_lr_schedule_matches_the_formula():
  cfg = config_lib.default_config()
  o = cfg.optimizer
  o.lr, o.warmup_steps, o.decay_steps, o.min_lr_ratio = 1e-3, 10, 110, 0.1
  sched = train_lib.lr_schedule(o, total_steps=500)
  for step in (0, 4, 9, 10, 35, 60, 109, 110, 200):
    if step < 10:
      want = 1e-3 * (step + 1) / 10
    else:
      frac = min((step - 10) / 100, 1.0)
      want = 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + math.cos(math.pi * frac))
    assert float(sched(step)) == pytest.approx(want, rel=1e-5), step


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch(single):
  cfg, trainer, mesh = single
  batches = _batches(cfg, 3)
  s1, m1, _ = _run(trainer, mesh, batches)
  acc_cfg = tiny_config(cfg.data.cache_dir, **BASE)
  acc_cfg.microbatches = 4
  acc_trainer, _ = _setup(acc_cfg)
  s4, m4, _ = _run(acc_trainer, mesh, batches)
  for a, b in zip(m1, m4):
    for k in ("nll_sum", "token_count", "nll_sum_l2r", "token_count_l2r", "grad_norm"):
      np.testing.assert_allclose(a[k], b[k], rtol=2e-5, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               jax.device_get(s1["params"]), jax.device_get(s4["params"]))


@pytest.mark.slow
def test_sharded_step_equals_single_device_step(single):
  """8 devices as data 2 x fsdp 2 x tensor 2 with 2 microbatches (2 rows per device per
  microbatch) against the single-device, single-microbatch trainer."""
  assert jax.device_count() >= 8, "conftest provides 8 fake CPU devices"
  cfg, t1, mesh1 = single
  sharded_cfg = tiny_config(cfg.data.cache_dir, mesh__data=2, mesh__fsdp=2, mesh__tensor=2,
                            microbatches=2, **BASE)
  batches = _batches(cfg, 3)
  t8, mesh8 = _setup(sharded_cfg, devices=8)
  s1, m1, _ = _run(t1, mesh1, batches)
  s8, m8, _ = _run(t8, mesh8, batches)
  # The layout is really sharded: fsdp over embed, tensor over mlp / qkv / vocab.
  kernel = s8["params"]["h"][0]["mlp"]["c_fc"]["kernel"]
  assert kernel.sharding.spec == P("fsdp", "tensor")
  assert kernel.addressable_shards[0].data.shape == (16, 64)
  assert s8["params"]["wte"]["embedding"].sharding.spec == P("tensor", "fsdp")
  mu = s8["opt_state"][1][0].mu["h"][0]["attn"]["c_attn"]["kernel"]
  assert mu.sharding.spec == P("fsdp", "tensor")
  assert s8["ema"]["lm_head"]["kernel"].sharding.spec == P("fsdp", "tensor")
  for a, b in zip(m1, m8):
    for k in ("nll_sum", "grad_norm", "param_norm"):
      np.testing.assert_allclose(a[k], b[k], rtol=2e-5, err_msg=k)
  for key in ("params", "ema"):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 jax.device_get(s1[key]), jax.device_get(s8[key]))
  # The optimizer state really holds the accumulated moments (not a replicated copy of zeros).
  assert float(optax.tree.norm(s8["opt_state"][1][0].nu)) > 0


def test_logical_rules_drop_axes_that_do_not_divide(cache_dir):
  cfg = tiny_config(cache_dir, mesh__data=1, mesh__fsdp=2, mesh__tensor=4)
  mesh = sharding_lib.make_mesh(cfg, devices=jax.devices()[:8])
  rules = config_lib.rules(cfg)
  assert sharding_lib.logical_to_spec(("embed", "mlp"), (32, 128), rules, mesh) == P("fsdp",
                                                                                     "tensor")
  # 6 is not a multiple of tensor=4: that dimension is replicated instead of failing.
  assert sharding_lib.logical_to_spec(("embed", "mlp"), (32, 6), rules, mesh) == P("fsdp", None)
  assert sharding_lib.logical_to_spec(None, (), rules, mesh) == P()


@pytest.mark.slow
def test_heldout_eval_includes_a_fixed_training_order(cache_dir):
  # A run on fixed_random / blockwise orders (the paper's Figure 3a) is also scored under its own
  # order; L2R, uniform and mixture runs are not (the L2R and uniform rows cover them).
  from aogpt_jax.model import aogpt as model_lib
  from aogpt_jax.model import orders as orders_lib
  from flax import nnx
  assert [l for l, _, _ in train_lib.heldout_orders(tiny_config(cache_dir))] == ["l2r", "random"]
  cfg = tiny_config(cache_dir, order__name="blockwise",
                    order__kwargs={"block": 4, "seed": 3})
  assert train_lib.heldout_orders(cfg)[-1] == ("train_order", "blockwise",
                                               (("block", 4), ("seed", 3)))
  trainer, mesh = _setup(cfg)
  tokens = np.asarray(_batches(cfg, 1)[0])
  weight = np.ones((tokens.shape[0],), np.float32)
  with jax.set_mesh(mesh):
    params = trainer.init()["params"]
    out = jax.device_get(trainer.eval_step(
        params, sharding_lib.global_batch({"tokens": tokens, "weight": weight}, mesh),
        jax.random.key(0)))
  m = nnx.merge(trainer.graphdef, jax.device_get(params))
  order = orders_lib.sample("blockwise", jax.random.key(0), *tokens.shape, block=4, seed=3)
  _, per_token = model_lib.loss(m, jnp.asarray(tokens), order)
  np.testing.assert_allclose(out["nll_train_order"], float(jnp.sum(per_token)), rtol=1e-5)
  assert not np.isclose(out["nll_train_order"], out["nll_random"])


@pytest.mark.slow
def test_train_logs_mesh_and_memory_estimate_before_the_first_step(cache_dir, tmp_path, caplog):
  from aogpt_jax.train import loop as train_loop
  caplog.set_level(logging.INFO)
  train_loop.train(tiny_config(cache_dir, total_steps=1, checkpoint_every=0), str(tmp_path / "w"))
  msgs = [r.getMessage() for r in caplog.records]
  mem = [i for i, m in enumerate(msgs) if "train step memory estimate per device (XLA;" in m]
  first = [i for i, m in enumerate(msgs) if m.startswith("first step (compilation included)")]
  assert len(mem) == 1 and first and mem[0] < first[0], msgs
  line = msgs[mem[0]]
  assert f"mesh {{'data': {jax.device_count()}, 'fsdp': 1, 'tensor': 1}}" in line, line
  assert "temporaries" in line and "peak ~" in line and "device limit unknown" in line, line
  assert "remat=off, microbatches=1)" in line, line
