"""GRPO's objective (`grpo`'s module docstring): group-relative advantages, the clipped
surrogate per token with an exact KL, and the on-policy form of its gradient.

`grpo_loss` computes the clipped objective of a batch of rollouts under the settings' likelihood
(exact or estimated; with a stochastic order policy, the order's log-probability too).
`on_policy_loss` is its gradient's shortcut for an update's FIRST inner step with the exact
likelihood: the batch was sampled with the very weights being differentiated, so logp_old =
logp_new (the sampler's record is the recompute, to float rounding: tests/test_blank_block.py),
every ratio is 1 and unclipped, and the gradient of the clipped objective is that of the linear
function ``-sum_t c_t logp_new(t)`` (c: the advantages over `token_objective`'s normaliser). Its
coefficients do not depend on logp_new, so the gradient needs the likelihood's passes only in
the backward (their recompute under `jax.checkpoint`), never a forward first: a blank model's
gradient update costs about 15% less (benchmarks/grpo_speed.py; docs/post_training.md,
"Compilation and speed").

Shape suffixes: R rollouts, N sequence length n, K estimates per rank, V vocab.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT
from aogpt_jax.posttrain import estimators, likelihood

ADVANTAGES = ("group", "rloo")
CREDITS = ("sequence", "token")
LOSS_NORMS = ("token", "sequence", "constant")


def group_advantages(rewards: np.ndarray, group_size: int, scale: bool = True,
                     eps: float = 1e-6, kind: str = "group") -> np.ndarray:
  """float32 [R]: ``rewards`` [R] (rows grouped: prompt p's rollouts are rows p G .. p G + G - 1)
  minus their group's mean (``kind`` group) or the mean of the group's OTHER rollouts (rloo:
  RLOO's leave-one-out baseline, G / (G - 1) times the former), divided by the group's std
  (population) + ``eps`` when ``scale``. Per-token rewards [R, n]: the same at each position,
  over the group's rollouts (float32 [R, n])."""
  r = np.asarray(rewards, np.float64)
  r_PxGxK = r.reshape(-1, group_size, *r.shape[1:2] or (1,))
  a_PxGxK = r_PxGxK - r_PxGxK.mean(1, keepdims=True)
  if kind == "rloo":
    a_PxGxK = a_PxGxK * group_size / (group_size - 1)
  if scale:
    a_PxGxK = a_PxGxK / (r_PxGxK.std(1, keepdims=True) + eps)
  return a_PxGxK.reshape(r.shape).astype(np.float32)


def token_objective(logp_new, logp_old, adv, scored, clip_eps: float, kl=None,
                    kl_coef: float = 0.0, norm: str = "token"):
  """(loss, metrics): the clipped surrogate per token (module docstring), minus, over the
  ``scored`` (answer) tokens of the batch; all [R, n] in ORDER space (rank k: the k-th position
  written) but ``adv`` [R] (or [R, n]: per-token advantages, also in order space). ``norm``:
  token (their sum over the batch's answer-token count, DAPO's), sequence (each rollout's mean,
  then the mean over rollouts: GRPO's), constant (their sum over R n, no length normalisation:
  Dr. GRPO's). The metrics are token means."""
  ratio_RxN = jnp.exp(logp_new - logp_old)
  adv_Rx1 = adv[:, None] if adv.ndim == 1 else adv
  surr_RxN = jnp.minimum(ratio_RxN * adv_Rx1,
                         jnp.clip(ratio_RxN, 1 - clip_eps, 1 + clip_eps) * adv_Rx1)
  loss_RxN = -surr_RxN
  if kl is not None:
    loss_RxN = loss_RxN + kl_coef * kl
  count = jnp.maximum(jnp.sum(scored), 1)
  mean = lambda x: jnp.sum(jnp.where(scored, x, 0.0)) / count  # noqa: E731
  if norm == "sequence":
    per_row = jnp.maximum(jnp.sum(scored, axis=1), 1)
    loss = jnp.mean(jnp.sum(jnp.where(scored, loss_RxN, 0.0), axis=1) / per_row)
  elif norm == "constant":
    loss = jnp.sum(jnp.where(scored, loss_RxN, 0.0)) / scored.size
  else:
    loss = mean(loss_RxN)
  metrics = {"ratio": mean(ratio_RxN),
             "ratio_min": jnp.min(jnp.where(scored, ratio_RxN, jnp.inf)),
             "ratio_max": jnp.max(jnp.where(scored, ratio_RxN, -jnp.inf)),
             "clipped": mean((jnp.abs(ratio_RxN - 1) > clip_eps).astype(jnp.float32))}
  if kl is not None:
    metrics["kl"] = mean(kl)
  return loss, metrics


def exact_kl(logits_new, logits_ref):
  """[..]: KL(softmax(new) || softmax(ref)) summed over the vocabulary (padding ids, -inf in
  both, contribute 0)."""
  lp_new = jax.nn.log_softmax(logits_new, axis=-1)
  lp_ref = jax.nn.log_softmax(logits_ref, axis=-1)
  live = jnp.isfinite(lp_new) & jnp.isfinite(lp_ref)     # no inf - inf, in value or gradient
  lp_new, lp_ref = jnp.where(live, lp_new, 0.0), jnp.where(live, lp_ref, 0.0)
  return jnp.sum(jnp.where(live, jnp.exp(lp_new) * (lp_new - lp_ref), 0.0), axis=-1)


def grpo_loss(model: AOGPT, batch: dict, *, clip_eps: float, temperature: float = 1.0,
              reference: AOGPT | None = None, kl_coef: float = 0.0, order: dict | None = None,
              estimator: str = "exact", loss_norm: str = "token", width: int | None = None,
              order_only: bool = False):
  """(loss, metrics) of one batch of rollouts: ``batch`` holds tokens, order, steps, prompt,
  old_logp [R, n], adv [R] and optionally keep [R, n] (mean_field's kept prompt positions) or
  mask_order [R, M, n] and hidden [R, M] (elbo's masks, `estimators.elbo_masks`). ``order``: the
  stochastic policy's `likelihood.order_logp` keywords (policy, policy_temperature, max_steps,
  width, order_head; ``head_kl``: the coefficient of the order head's KL to its heuristic,
  `order_head.step_kl` summed over steps, per answer token): ``logp_new`` then adds the order's
  log-probability (`likelihood.token_and_order_logp`, in bounded memory), and ``old_logp`` must
  hold the recorded sum (``order_only``: the order's log-probability alone, and the recorded
  order values in ``old_logp``). ``estimator``: exact,
  mean_field or elbo (`estimators.conditionals`; without ``order``); the KL is the estimator's
  conditionals', weighted as its log-likelihood. ``loss_norm``: `token_objective`'s ``norm``.
  ``width``: a blank model's queries per step (`estimators.conditionals`). Differentiable in
  ``model``."""
  args = (batch["tokens"], batch["order"], batch["steps"], batch["prompt"])
  est = dict(estimator=estimator, keep=batch.get("keep"), mask_order=batch.get("mask_order"),
             hidden=batch.get("hidden"), width=width)
  hkl = None
  if order is None:
    logits_RxKxNxV, w_RxKxN = estimators.conditionals(model, *args, **est)
    logp_RxN = estimators.weighted_logp(logits_RxKxNxV, w_RxKxN, batch["tokens"],
                                        batch["order"], batch["prompt"], temperature)
  else:
    order = dict(order)
    head_kl = order.pop("head_kl", 0.0)
    logp_RxN, olp_RxN, logits_RxNxV, hkl_R = likelihood.token_and_order_logp(
        model, *args, temperature=temperature, **order)
    logp_RxN = olp_RxN if order_only else logp_RxN + olp_RxN
    logits_RxKxNxV, w_RxKxN = logits_RxNxV[:, None], jnp.ones_like(logp_RxN)[:, None]
    hkl = None if order.get("order_head") is not True else (head_kl, hkl_R)
  kl_RxN = None
  if reference is not None and kl_coef > 0:
    ref_RxKxNxV = jax.lax.stop_gradient(estimators.conditionals(reference, *args, **est)[0])
    kl_RxN = jnp.sum(w_RxKxN * exact_kl(logits_RxKxNxV, ref_RxKxNxV), axis=1)
  scored_RxN = orders_lib.scored_ranks(batch["prompt"])
  loss, metrics = token_objective(logp_RxN, batch["old_logp"], batch["adv"], scored_RxN,
                                  clip_eps, kl_RxN, kl_coef, loss_norm)
  if hkl is not None:   # the order head's pull toward its heuristic
    coef, hkl_R = hkl
    per_token = jnp.sum(hkl_R) / jnp.maximum(jnp.sum(scored_RxN), 1)
    loss = loss + coef * per_token
    metrics = dict(metrics, order_kl=per_token)
  return loss, metrics


def norm_weights(scored, norm: str = "token"):
  """float32 [R, n]: `token_objective`'s normaliser as weights, its loss being ``sum(w * loss per
  token)``: 1 / the batch's answer-token count (token), 1 / (R x the row's count) (sequence), 1
  / (R n) (constant); 0 at unscored ranks."""
  s = scored.astype(jnp.float32)
  if norm == "sequence":
    return s / (jnp.maximum(jnp.sum(s, axis=1, keepdims=True), 1.0) * s.shape[0])
  if norm == "constant":
    return s / s.size
  return s / jnp.maximum(jnp.sum(s), 1.0)


def on_policy_loss(model: AOGPT, batch: dict, *, temperature: float = 1.0,
                   loss_norm: str = "token", width: int | None = None):
  """(surrogate, metrics): for rollouts sampled with ``model``'s own weights and the exact
  likelihood, no KL and no order term (module docstring), the linear function whose gradient is
  `grpo_loss`'s there: ``-sum(stop_gradient(c) * logp_new)``, ``c = adv x`` `norm_weights`, with
  logp_new from `likelihood.sequence_logp` (a blank model's log-probabilities inside its
  checkpointed passes). metrics: ``loss``, the clipped objective's value at ratio 1 (``-sum
  c``); the ratio metrics are not measured (no forward runs)."""
  scored_RxN = orders_lib.scored_ranks(batch["prompt"])
  adv = batch["adv"]
  c_RxN = jax.lax.stop_gradient((adv[:, None] if adv.ndim == 1 else adv)
                                * norm_weights(scored_RxN, loss_norm))
  logp_RxN = likelihood.sequence_logp(model, batch["tokens"], batch["order"], batch["steps"],
                                      batch["prompt"], temperature=temperature, width=width)
  return -jnp.sum(c_RxN * logp_RxN), {"loss": -jnp.sum(c_RxN)}


def check_optimizer(group: str, weight_decay, max_grad_norm) -> None:
  """One-line errors for a post-training run's AdamW settings: ``max_grad_norm < 0`` would flip
  every gradient's sign (``optax.clip_by_global_norm`` of a negative norm), a negative weight
  decay grows the weights."""
  for key, v in (("weight_decay", weight_decay), ("max_grad_norm", max_grad_norm)):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
      raise ValueError(f"{group}.{key}: must be a finite number >= 0"
                       f"{' (0: no clipping)' if key == 'max_grad_norm' else ''}, got {v!r}")
