"""Train state, optimizer and the pure, jitted train and held-out evaluation steps.

The train state is a plain pytree (a dict), so jit, sharding and Orbax see ordinary arrays::

    {"params": ..., "opt_state": ..., "ema": ... (only when EMA is on), "step": int32[],
     "rng": uint32[2]}

``params`` and ``ema`` are ``nnx.to_pure_dict`` trees of the model; ``nnx.merge(graphdef,
params)`` rebuilds the model inside jit. Every random draw of step ``s`` (the orders, dropout)
comes from ``fold_in(rng, s)``, so a resumed run draws exactly what an uninterrupted one would.

`build(cfg, model_cfg, mesh)` returns a `Trainer` holding the jitted functions with their
shardings: ``init()`` (a fresh state, created directly in its sharded layout),
``step(state, batch)`` (donates the state) and ``eval_step(params, batch, key)``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

from aogpt_jax import config as config_lib
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import objectives
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.train import sharding as sharding_lib

State = dict[str, Any]


# ----------------------------------------------------------------------------- optimizer


def lr_schedule(opt_cfg, total_steps: int) -> Callable[[jax.Array], jax.Array]:
  """Linear warmup to ``lr`` over ``warmup_steps`` (step s uses lr * (s+1) / warmup), then a
  cosine from ``lr`` to ``lr * min_lr_ratio`` at ``decay_steps`` (0 = total_steps), then flat."""
  peak, warmup = float(opt_cfg.lr), int(opt_cfg.warmup_steps)
  decay = int(opt_cfg.decay_steps) or int(total_steps)
  floor = peak * float(opt_cfg.min_lr_ratio)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = peak * (step + 1.0) / max(warmup, 1)
    frac = jnp.clip((step - warmup) / max(decay - warmup, 1), 0.0, 1.0)
    cos = floor + 0.5 * (peak - floor) * (1.0 + jnp.cos(math.pi * frac))
    return jnp.where(step < warmup, warm, cos)

  return schedule


# Parameters decayed although 1-D: the START vector is the published ``wnonee``, an
# ``nn.Embedding(1, d)`` (2-D there, so decayed by the published ndim >= 2 rule); ours is stored as
# a [d] vector, so checkpoints keep their shape, and is named here.
DECAYED_VECTORS = ("wnone",)


def decay_mask(params):
  """Weight decay on matrices and embeddings (ndim >= 2) and the START vector, as published:
  biases, norm scales and nothing else are left undecayed."""
  def decayed(path, p):
    names = {getattr(k, "key", getattr(k, "name", None)) for k in path}
    return p.ndim >= 2 or not names.isdisjoint(DECAYED_VECTORS)
  return jax.tree_util.tree_map_with_path(decayed, params)


def make_optimizer(cfg) -> optax.GradientTransformation:
  o = cfg.optimizer
  adamw = optax.adamw(lr_schedule(o, cfg.total_steps), b1=o.b1, b2=o.b2, eps=o.eps,
                      weight_decay=o.weight_decay, mask=decay_mask)
  # Always a chain, so the optimizer state has the same structure with or without clipping.
  clip = optax.clip_by_global_norm(o.grad_clip) if o.grad_clip else optax.identity()
  return optax.chain(clip, adamw)


def ema_decay_at(decay: float, k) -> jax.Array:
  """Decay used at the k-th EMA update (k = 1, 2, ...): min(decay, (1 + k) / (10 + k)), the
  warm-up of the released code (score_sde's ExponentialMovingAverage)."""
  k = jnp.asarray(k, jnp.float32)
  return jnp.minimum(decay, (1.0 + k) / (10.0 + k))


def ema_update(ema, params, decay: float, k):
  d = ema_decay_at(decay, k)
  return jax.tree.map(lambda e, p: (d * e + (1.0 - d) * p).astype(e.dtype), ema, params)


# ----------------------------------------------------------------------------- steps


def _grads(params, graphdef, tokens, order, key, microbatches: int, dropout: bool,
           objective: str = "ao", prompt=None):
  """Mean-NLL gradients over the whole batch; with microbatches > 1 accumulated over a
  lax.scan. Microbatch i holds rows i, i + M, i + 2M, ...: every device keeps its own rows.
  With a ``prompt`` every microbatch divides by the whole batch's scored count / M, so the
  accumulated gradient is the one big batch's although rows score different counts."""
  grad_fn = jax.grad(objectives.merged_loss, has_aux=True)
  mask_key, dropout_key = jax.random.split(key)
  if microbatches == 1:
    return grad_fn(params, graphdef, tokens, order, mask_key, dropout_key if dropout else None,
                   objective, prompt)
  b, n = tokens.shape
  denominator = (None if prompt is None
                 else jnp.maximum(jnp.sum(~prompt), 1).astype(jnp.float32) / microbatches)

  def split(x):   # [b, n] -> [M, b / M, n]
    x = x.reshape(b // microbatches, microbatches, n).swapaxes(0, 1)
    return jax.lax.with_sharding_constraint(x, P(None, sharding_lib.BATCH_AXES, None))

  def body(acc, xs):
    i, tok, order_i, prompt_i = xs
    g, sums = grad_fn(params, graphdef, tok, order_i, jax.random.fold_in(mask_key, i),
                      jax.random.fold_in(dropout_key, i) if dropout else None, objective,
                      prompt_i, denominator)
    acc_g, acc_s = acc
    return (jax.tree.map(jnp.add, acc_g, g), jax.tree.map(jnp.add, acc_s, sums)), None

  zeros_g = jax.tree.map(jnp.zeros_like, params)
  part = jax.ShapeDtypeStruct((b // microbatches, n), jnp.float32)
  sums_shape = jax.eval_shape(model_lib.loss_metrics, part, part.update(dtype=order.dtype))
  zeros_s = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape)
  (g, sums), _ = jax.lax.scan(body, (zeros_g, zeros_s),
                              (jnp.arange(microbatches), split(tokens), split(order),
                               None if prompt is None else split(prompt)))
  return jax.tree.map(lambda x: x / microbatches, g), sums


def train_step(state: State, batch: dict[str, jax.Array], *, graphdef, tx, cfg,
               dropout: bool = False) -> tuple[State, dict]:
  """One optimizer update on ``batch["tokens"]`` (int32 [global_batch, seq_len]); a batch with
  ``batch["prompt"]`` (bool, same shape: a task's given cells) trains on the rest given the
  prompt: each row's order puts the prompt first (`orders.prompt_first`) and the loss covers
  only the positions after it."""
  tokens, prompt = batch["tokens"], batch.get("prompt")
  step = state["step"]
  key = jax.random.fold_in(state["rng"], step)
  order_key, dropout_key = jax.random.split(key)
  # Orders for the whole global batch at once, so accumulation equals one big batch.
  order = orders_lib.sample(cfg.order.name, order_key, tokens.shape[0], tokens.shape[1],
                            step=step, **config_lib.order_kwargs(cfg))
  if prompt is not None:
    order = orders_lib.prompt_first(order, prompt)
  grads, sums = _grads(state["params"], graphdef, tokens, order, dropout_key, cfg.microbatches,
                       dropout, cfg.objective, prompt)
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  new = {"params": params, "opt_state": opt_state, "step": step + 1, "rng": state["rng"]}
  decay = config_lib.ema_decay(cfg)
  if decay is not None:
    new["ema"] = ema_update(state["ema"], params, decay, step + 1)
  metrics = dict(sums)
  metrics["grad_norm"] = optax.tree.norm(grads)
  metrics["param_norm"] = optax.tree.norm(params)
  metrics["lr"] = lr_schedule(cfg.optimizer, cfg.total_steps)(step)
  return new, metrics


def heldout_orders(cfg) -> tuple[tuple[str, str, tuple], ...]:
  """(label, order name, sorted kwargs) of the held-out losses: L2R, uniform ("random") and,
  when the run trains on another fixed distribution (``fixed_random``, ``blockwise``, a new one;
  not ``l2r``, ``uniform``, ``mixture`` or ``curriculum``, which the first two cover), that order as
  "train_order", so e.g. the paper's Figure 3a runs can be read from their own held-out loss."""
  out = [("l2r", "l2r", ()), ("random", "uniform", ())]
  if cfg.order.name not in ("l2r", "uniform", "mixture", "curriculum"):
    out.append(("train_order", cfg.order.name,
                tuple(sorted(config_lib.order_kwargs(cfg).items()))))
  return tuple(out)


def eval_step(params, batch: dict[str, jax.Array], key: jax.Array, *, graphdef,
              objective: str = "ao",
              orders: tuple[tuple[str, str, tuple], ...] = (("l2r", "l2r", ()),
                                                            ("random", "uniform", ()))) -> dict:
  """Weighted NLL sums of one held-out batch; padding rows (weight 0) count for nothing.
  ``ao``: ``nll_<label>`` under each of ``orders`` (`heldout_orders`), random ones drawn from
  ``key``; ``mdm``: one ELBO sample (t and masks drawn from ``key``) per block
  (`objectives.Objective.heldout`). A ``batch["prompt"]`` is context: only the rest is scored."""
  return objectives.get(objective).heldout(nnx.merge(graphdef, params), batch["tokens"],
                                           batch["weight"], key, orders, batch.get("prompt"))


# ----------------------------------------------------------------------------- assembly


def init_state(model_cfg: model_lib.ModelConfig, tx, seed: int, with_ema: bool) -> State:
  m = model_lib.AOGPT(model_cfg, rngs=nnx.Rngs(seed))
  params = nnx.to_pure_dict(nnx.state(m, nnx.Param))
  state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32),
           "rng": jax.random.fold_in(jax.random.PRNGKey(seed), 1)}
  if with_ema:
    state["ema"] = jax.tree.map(jnp.copy, params)
  return state


@dataclasses.dataclass
class Trainer:
  """The jitted functions of a run and the shardings they use."""
  cfg: Any
  model_cfg: model_lib.ModelConfig
  mesh: jax.sharding.Mesh
  graphdef: Any
  tx: optax.GradientTransformation
  abstract_state: State            # ShapeDtypeStructs with their shardings (for restoring)
  state_shardings: State
  param_shardings: Any
  init: Callable[[], State]
  step: Callable[[State, dict], tuple[State, dict]]
  eval_step: Callable[[Any, dict, jax.Array], dict]


def build(cfg, model_cfg: model_lib.ModelConfig, mesh) -> Trainer:
  tx = make_optimizer(cfg)
  with_ema = config_lib.ema_decay(cfg) is not None
  abstract_model = nnx.eval_shape(lambda: model_lib.AOGPT(model_cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract_model, nnx.Param)
  rules = config_lib.rules(cfg)
  param_sh = sharding_lib.named(mesh, sharding_lib.param_specs(abstract_params, rules, mesh))
  rep = sharding_lib.replicated(mesh)
  shapes = jax.eval_shape(lambda: init_state(model_cfg, tx, cfg.seed, with_ema))
  state_sh = {
      "params": param_sh,
      "opt_state": optax.tree_map_params(tx, lambda _, s: s, shapes["opt_state"], param_sh,
                                         transform_non_params=lambda _: rep),
      "step": rep, "rng": rep}
  if with_ema:
    state_sh["ema"] = param_sh
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          shapes, state_sh)
  # A task's batches also carry the prompt mask (config.task_of: prompt-conditioned training).
  rows = {k: sharding_lib.batch_sharding(mesh)
          for k in (("tokens", "prompt") if config_lib.task_of(cfg) else ("tokens",))}
  batch_sh = rows
  eval_batch_sh = dict(rows, weight=sharding_lib.batch_sharding(mesh, 1))
  init = jax.jit(lambda: init_state(model_cfg, tx, cfg.seed, with_ema), out_shardings=state_sh)
  dropout = model_cfg.dropout > 0
  def step_fn(s, b):
    with sharding_lib.activation_constraints(mesh, rules):
      return train_step(s, b, graphdef=graphdef, tx=tx, cfg=cfg, dropout=dropout)

  def eval_fn(p, b, k):
    with sharding_lib.activation_constraints(mesh, rules):
      return eval_step(p, b, k, graphdef=graphdef, objective=cfg.objective, orders=ev_orders)

  ev_orders = heldout_orders(cfg)
  step = jax.jit(step_fn,
                 in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, rep),
                 donate_argnums=0)
  ev = jax.jit(eval_fn, in_shardings=(param_sh, eval_batch_sh, rep), out_shardings=rep)
  return Trainer(cfg=cfg, model_cfg=model_cfg, mesh=mesh, graphdef=graphdef, tx=tx,
                 abstract_state=abstract, state_shardings=state_sh, param_shardings=param_sh,
                 init=init, step=step, eval_step=ev)
