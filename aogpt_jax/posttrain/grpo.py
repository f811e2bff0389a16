"""GRPO with verifiable rewards and EXACT per-token ratios (issue #43).

Each update draws P prompts (a task's training puzzles: ``task.train_batch``), samples G
rollouts of each with the model (`sampling.generate(..., return_logp=True)`: every rollout
carries its order, its steps and the log-probability of every written token under the
distribution it was drawn from), scores them with a reward (a NaN or inf is a one-line error
naming it), and takes group-relative advantages ``A = (R - mean_group R) / (std_group R + eps)``
(``scale_rewards=False``: no division; ``advantage="rloo"``: the mean of the group's other
rollouts as the baseline). The loss, per answer token t of rollout i, averaged over all answer
tokens of the batch (``loss_norm``: or per rollout, GRPO's; or summed over R n, Dr. GRPO's):

    -min(ratio A_i, clip(ratio, 1 - eps, 1 + eps) A_i) + beta KL_t,
    ratio = exp(logp_new(t) - logp_old(t))

``logp_new`` is `likelihood.sequence_logp` (one teacher-forced pass, exact, with gradients) at
the sampling temperature; ``logp_old`` is what the sampler recorded (no extra pass; the two are
equal to ~1e-6 at the same weights: tests/test_posttrain_likelihood.py). ``KL_t`` (``beta`` > 0,
a frozen reference model of the same shape) is the exact KL(new || ref) of the two models'
conditionals at token t, summed over the vocabulary (no k3 estimator: both conditionals are
exact; ``reference`` None: a frozen copy of the starting weights). ``inner_steps`` > 1 reuses a
batch of rollouts for several updates (PPO-style; the clip then matters). A batch's first update
is on-policy (ratio 1, no clip): with the exact likelihood and no KL or order term it takes the
same gradient without running the likelihood forward first (`objective.on_policy_loss`;
``on_policy_gradient=False``: the objective in full, its ratios measured).

``likelihood="mean_field"`` replaces both log-likelihoods by d1's one-step mean-field estimate
(`estimators.mean_field_logp`: every answer token given the prompt only), as diffu-GRPO does:
``logp_old`` is then that estimate recomputed at rollout time (one extra pass without
gradients; the sampler's records are exact), the KL uses the mean-field conditionals, and
``prompt_mask`` > 0 drops each prompt token from the context with that probability (d1: 0.15),
a fresh draw for each inner update, shared by its old and new values. ``likelihood="elbo"``:
the Monte Carlo ELBO of `estimators.elbo_masks` (``elbo_samples`` random masks per rollout, fresh
for each inner update, shared by its old and new values), the estimate LLaDA / VRPO / SPG use.
They exist to measure what the estimates cost (benchmarks/post_training.py); the exact default
is what AO-GPT offers.

``method="adaptive"`` rolls out with an adaptive ``policy``. A deterministic policy's order is
taken as given (the ratio is the tokens'). A stochastic one (``policy_temperature`` > 0,
`sampling.adaptive`) draws the order, and the ratio of token t becomes the joint probability of
writing that token at that position at that step: ``exp((logp_new + order_logp_new) -
(logp_old + order_logp_old))`` with `likelihood.order_logp` (exact, in the same pass as the
tokens': `likelihood.token_and_order_logp`, in bounded memory), so GRPO trains the order too.
``order_only=True`` keeps the order's terms alone (``exp(order_logp_new - order_logp_old)``):
the tokens' choices get no credit, and the weights move only as far as the order's scores (the
model's own confidences, for max_prob / margin / entropy) need. The KL term stays the tokens'.
(The estimates are for diffusion rollouts: no order term.) ``order_head=K`` > 0 (UPO, arXiv
2510.05725): the order is drawn from an `model.order_head.OrderHead` over the policy's top K (a
new head, which starts as the heuristic, attached when the model has none), ``head_kl`` pulls
each step's choice toward the heuristic's (an exact KL, per answer token) and ``head_only``
trains the head alone (every other gradient zero).

``hint`` > 0 (IGPO, arXiv 2509.10396): a group whose every rollout scores below its reference
answer has no signal (all advantages 0); its last rollout is replaced by one given that share of
the reference answer, the rest sampled, with its exact teacher-forced log-probabilities as the
old ones (`GRPO.hinted`). AO-GPT computes them exactly, hinted cells included; the first batch
with a hint compiles that pass once.

Rewards are a registry (`rewards.py`: `REWARDS`, `register_reward`, re-exported here) of
``fn(tokens, puzzles, task) -> [R]`` float: ``tokens`` int [R, n] the rollouts (original
order), ``puzzles`` the prompts' rows repeated per rollout (``{"tokens", "prompt"}`` [R, n], the
task's reference answers in ``tokens``), ``task`` the task (or None). Built in: ``solved``,
``cell_accuracy`` and (Sudoku) ``rule_cells``, fields of the task's verifier. A user reward,
worked example (the fraction of answer cells that are 0)::

    from aogpt_jax.posttrain import grpo

    @grpo.register_reward("zeros")
    def zeros(tokens, puzzles, task):
      answer = ~puzzles["prompt"]
      return ((tokens == 0) & answer).sum(1) / np.maximum(answer.sum(1), 1)

    trainer = grpo.GRPO(model, grpo.GRPOSettings(reward="zeros", group_size=8), task=task)
    for i in range(50):
      metrics = trainer.step(jax.random.key(i), trainer.task_prompts(seed=0, index=i))
    # metrics["reward"]: the batch's mean reward before the update; the model is updated in place

(or pass the function itself: ``GRPOSettings(reward=zeros)``; from the command line,
``--config.rl.reward=MODULE:FUNCTION`` imports it from a module of one's own).

Shape suffixes: G rollouts per prompt, P prompts, R = P G rollouts, N sequence length n, V vocab.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from aogpt_jax.model import order_head as order_head_lib
from aogpt_jax.model.aogpt import AOGPT
from aogpt_jax.posttrain import estimators
from aogpt_jax.posttrain.objective import (  # noqa: F401 - re-exported: grpo.grpo_loss, ...
    check_optimizer,
    ADVANTAGES, CREDITS, LOSS_NORMS, exact_kl, group_advantages, grpo_loss, on_policy_loss,
    token_objective)
from aogpt_jax.posttrain.rewards import (  # noqa: F401 - re-exported: grpo.register_reward, ...
    REWARDS, RewardFn, cell_correct, check_finite, get_reward, register_reward, reward_name,
    reward_values)
from aogpt_jax.sampling import adaptive as adaptive_lib
from aogpt_jax.sampling import sampler as sampler_lib
from aogpt_jax.sampling import schedules


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
  reward: Any = "solved"           # a REWARDS name or fn(tokens, puzzles, task) -> [R]
  group_size: int = 8              # G rollouts per prompt (>= 2: advantages are group-relative)
  clip_eps: float = 0.2            # ratio clip
  kl_coef: float = 0.0             # beta: exact per-token KL to the reference model (> 0: needed)
  scale_rewards: bool = True       # divide advantages by the group's std (False: Dr. GRPO)
  advantage: str = "group"         # group: R - the group's mean | rloo: R - the others' mean
  loss_norm: str = "token"         # token | sequence | constant (Dr. GRPO): `token_objective`
  inner_steps: int = 1             # updates per batch of rollouts
  lr: float = 1e-5
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0       # 0: no clipping
  steps: int = 64                  # sampling: steps per rollout (parallel generation below n)
  order: Any = "random"            # sampling: generation order
  method: str = "diffusion"        # diffusion | ar | uncached | adaptive (record logp)
  temperature: float = 1.0
  likelihood: str = "exact"        # exact | mean_field (d1's one-step estimate) | elbo (MC)
  prompt_mask: float = 0.0         # mean_field: d1's random prompt masking probability (0.15)
  elbo_samples: int = 4            # elbo: M random masks per rollout (estimators.elbo_masks)
  policy: str = "max_prob"         # adaptive: the order policy (sampling.adaptive)
  policy_temperature: float = 0.0  # adaptive: > 0 a stochastic policy, its order trained too
  credit: str = "sequence"         # sequence: one reward per rollout | token: one per position
  order_only: bool = False         # with a stochastic policy: the ratio is the order's alone
  on_policy_gradient: bool = True  # a batch's first update: the gradient at ratio 1, no forward
  hint: float = 0.0                # IGPO: a group all below the reference's reward gets one
                                   # rollout given this share of the reference answer (`hinted`)
  order_head: int = 0              # adaptive, k > 0: an order head re-scores the policy's top k
                                   # (`model.order_head`, UPO; a new one attached if the model
                                   # has none); trained with the order
  head_kl: float = 0.0             # order_head: KL(head || heuristic) per answer token (UPO 1e-4)
  head_only: bool = False          # order_head: only the head's weights move (tokens frozen)

  @property
  def on_policy_shortcut(self) -> bool:
    """Whether a batch's first inner update takes `objective.on_policy_loss`'s gradient (exact
    likelihood, no KL, no order term; ``on_policy_gradient``): the same gradient, without the
    likelihood's forward; its ratio metrics are then not measured."""
    return (self.on_policy_gradient and self.likelihood == "exact" and not self.kl_coef > 0
            and not self.trains_order)

  @property
  def trains_order(self) -> bool:
    """Whether the ratio includes the order's log-probability (a stochastic adaptive policy)."""
    return self.method == "adaptive" and self.policy_temperature > 0

  def sample_settings(self, length: int) -> sampler_lib.SampleSettings:
    adaptive = self.method == "adaptive"
    return sampler_lib.SampleSettings(
        length=length, steps=min(int(self.steps), length), order=self.order, method=self.method,
        temperature=float(self.temperature), policy=str(self.policy),
        policy_temperature=float(self.policy_temperature) if adaptive else 0.0,
        order_head=self.order_head > 0)

  def order_steps(self, length: int) -> int:
    """The most steps a rollout takes (`likelihood.order_pass`'s T)."""
    return length if self.policy == "threshold" else min(int(self.steps), length)

  def validate(self, model: AOGPT, reference: AOGPT | None = None) -> None:
    """One-line ValueErrors naming the key, before anything compiles."""
    get_reward(self.reward)
    estimators.check_estimator(self.likelihood)
    if not 0 <= self.prompt_mask < 1:
      raise ValueError(f"rl.prompt_mask: must be in [0, 1), got {self.prompt_mask!r}")
    if self.prompt_mask > 0 and self.likelihood != "mean_field":
      raise ValueError(f"rl.prompt_mask: {self.prompt_mask} > 0 masks the prompt of the "
                       f"mean-field estimate; expected rl.likelihood='mean_field', got "
                       f"{self.likelihood!r}")
    if self.order_only and not self.trains_order:
      raise ValueError("rl.order_only: trains the order's choices alone; expected a stochastic "
                       "order policy (rl.method='adaptive', rl.policy_temperature > 0), got "
                       f"method={self.method!r}, policy_temperature={self.policy_temperature!r}")
    h = self.hint
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 1:
      raise ValueError(f"rl.hint: the share of the reference answer a hinted rollout is given; "
                       f"expected a number in [0, 1), got {h!r}")
    if h > 0 and (self.likelihood != "exact" or self.trains_order):
      raise ValueError(f"rl.hint: a hinted rollout's old log-probabilities are recomputed "
                       f"exactly and its order is not the policy's; expected rl.likelihood="
                       f"'exact' and no stochastic order policy, got likelihood="
                       f"{self.likelihood!r}, policy_temperature={self.policy_temperature!r}")
    if self.likelihood != "exact" and self.trains_order:
      raise ValueError(f"rl.likelihood: {self.likelihood!r} has no order term; a stochastic "
                       f"order policy (rl.policy_temperature > 0) needs rl.likelihood='exact'")
    m = self.elbo_samples
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
      raise ValueError(f"rl.elbo_samples: must be an int >= 1 (masks per rollout), got {m!r}")
    if self.advantage not in ADVANTAGES:
      raise ValueError(f"rl.advantage: expected one of {', '.join(ADVANTAGES)}, got "
                       f"{self.advantage!r}")
    if self.advantage == "rloo" and self.scale_rewards:
      raise ValueError("rl.scale_rewards: RLOO advantages are not divided by the group's std; "
                       "expected rl.scale_rewards=False with rl.advantage='rloo', got True")
    if self.credit not in CREDITS:
      raise ValueError(f"rl.credit: expected one of {', '.join(CREDITS)}, got {self.credit!r}")
    if self.loss_norm not in LOSS_NORMS:
      raise ValueError(f"rl.loss_norm: expected one of {', '.join(LOSS_NORMS)}, got "
                       f"{self.loss_norm!r}")
    g = self.group_size
    if isinstance(g, bool) or not isinstance(g, int) or g < 2:
      raise ValueError(f"rl.group_size: must be an int >= 2 (advantages are relative to the "
                       f"group), got {g!r}")
    if not 0 < self.clip_eps < 1:
      raise ValueError(f"rl.clip_eps: must be in (0, 1), got {self.clip_eps!r}")
    if not self.kl_coef >= 0:
      raise ValueError(f"rl.kl_coef: must be >= 0, got {self.kl_coef!r}")
    if int(self.inner_steps) < 1:
      raise ValueError(f"rl.inner_steps: must be >= 1, got {self.inner_steps!r}")
    if not self.lr > 0:
      raise ValueError(f"rl.lr: must be > 0, got {self.lr!r}")
    check_optimizer("rl", self.weight_decay, self.max_grad_norm)
    if self.method not in sampler_lib.LOGP_METHODS:
      raise ValueError(f"rl.method: must be one of {sampler_lib.LOGP_METHODS} (the samplers "
                       f"that record log-probabilities), got {self.method!r}")
    if self.method == "adaptive":
      adaptive_lib.check_stochastic(self.policy, self.policy_temperature, None, key="rl")
    elif self.policy_temperature != 0:
      raise ValueError(f"rl.policy_temperature: a stochastic order policy needs "
                       f"rl.method='adaptive', got {self.policy_temperature!r} with "
                       f"method={self.method!r}")
    self.check_order_head(model)
    if reference is not None:
      shape = lambda m: jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(m, nnx.Param))  # noqa: E731
      if reference.cfg.vocab_size != model.cfg.vocab_size or shape(reference) != shape(model):
        raise ValueError("rl.reference: the reference model's parameters differ in shape from "
                         "the policy's (expected the same architecture, e.g. the SFT model)")

  def check_order_head(self, model: AOGPT | None) -> None:
    """One-line errors for the order head's settings (``order_head``, ``head_kl``,
    ``head_only``) and a head the model has already (its top-k must be ``order_head``)."""
    k, h = self.head_kl, self.order_head
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not (math.isfinite(k) and k >= 0):
      raise ValueError(f"rl.head_kl: the order head's KL coefficient; expected a finite number "
                       f">= 0, got {k!r}")
    if isinstance(h, bool) or not isinstance(h, int) or h < 0:
      raise ValueError(f"rl.order_head: the order head's top-k candidates; expected an int >= 0 "
                       f"(0: no head), got {h!r}")
    if not h:
      for key, v in (("head_kl", k > 0), ("head_only", self.head_only)):
        if v:
          raise ValueError(f"rl.{key}: is for an order head; expected rl.order_head=K > 0 (its "
                           f"top-k), got 0")
      return
    if not self.trains_order:
      raise ValueError(f"rl.order_head: trains the order; expected a stochastic policy "
                       f"(rl.method='adaptive', rl.policy_temperature > 0), got method="
                       f"{self.method!r}, policy_temperature={self.policy_temperature!r}")
    if self.hint > 0:
      raise ValueError(f"rl.hint: a hinted rollout's order is not the head's; expected rl.hint=0 "
                       f"with an order head, got {self.hint!r}")
    if self.policy == "threshold":
      raise ValueError("rl.policy: the threshold policy commits by probability, not score; "
                       "expected max_prob, margin or entropy under an order head")
    if model is None:          # the command's checks, before the model is loaded
      return
    if h > model.cfg.block_size:
      raise ValueError(f"rl.order_head: top_k={h} is more than the model's "
                       f"{model.cfg.block_size} positions")
    head = order_head_lib.head_of(model)
    if head is not None and head.top_k != h:
      raise ValueError(f"rl.order_head: the model's order head re-scores the top "
                       f"{head.top_k}; expected rl.order_head={head.top_k}, got {h}")


PROBE = 256   # training prompts a task's trainer sizes its compiled programs on (`GRPO.reserve`)


def _in_head(path) -> bool:
  """Whether a parameter's tree path lies in the model's ``order_head``."""
  return bool(path) and getattr(path[0], "key", None) == "order_head"


def hint_count(answer, share: float):
  """How many answer cells a hinted rollout is given: ``ceil(share * answer)``, at most
  ``answer - 1`` (one cell is always left to sample); int or int array as ``answer``."""
  a = np.asarray(answer)
  return np.minimum(np.ceil(share * a).astype(np.int64), np.maximum(a - 1, 0))


def _answer_mean(rewards: np.ndarray, prompt: np.ndarray) -> np.ndarray:
  """[R]: a rollout's reward, or its per-position rewards' mean over its answer."""
  if rewards.ndim == 1:
    return rewards
  free = ~prompt
  return (rewards * free).sum(1) / np.maximum(free.sum(1), 1)


def timing(rollouts: int, rollout_sec: float, update_sec: float) -> dict[str, float]:
  """The loop's speed metrics of one GRPO step."""
  total = max(rollout_sec + update_sec, 1e-9)
  return {"rollout_sec": rollout_sec, "update_sec": update_sec,
          "rollouts_per_sec": rollouts / max(rollout_sec, 1e-9), "update_share": update_sec / total}


class GRPO:
  """The GRPO loop's state: the policy (updated in place), the optimizer and a frozen reference
  (``kl_coef`` > 0; None: a copy of the starting weights). `step(key, prompts)` = rollouts,
  rewards, advantages and ``inner_steps`` jitted updates.

  Every program compiles once: the sampler's and the update's static sizes follow the prompt
  lengths, and are kept at the largest seen; with a ``task`` they are sized at construction for
  the prompt lengths of `PROBE` of its training puzzles (`reserve`), so that no later update
  recompiles (a batch outside that range grows them once more)."""

  def __init__(self, model: AOGPT, settings: GRPOSettings, *, task=None,
               reference: AOGPT | None = None):
    if settings.kl_coef > 0 and reference is None:
      reference = nnx.clone(model)     # the starting weights (the policy moves)
    settings.validate(model, reference)
    probe = None if task is None else np.asarray(task.train_batch(0, 0, PROBE)["prompt"],
                                                 bool).sum(1)
    if probe is not None and settings.order_head >= task.length - int(probe.min()):
      raise ValueError(f"rl.order_head: top_k={settings.order_head} is at least every training "
                       f"row's free cells (at most {task.length - int(probe.min())}): the head "
                       f"would choose among all of them; expected a smaller top_k")
    if settings.order_head and order_head_lib.head_of(model) is None:
      order_head_lib.attach(model, top_k=settings.order_head)   # a new head: the heuristic
    self.model, self.settings, self.task = model, settings, task
    self.reward_fn = get_reward(settings.reward)
    self.reference = reference if settings.kl_coef > 0 else None
    chain = [optax.clip_by_global_norm(settings.max_grad_norm)] if settings.max_grad_norm else []
    self.tx = optax.chain(*chain, optax.adamw(settings.lr, b1=0.9, b2=0.95,
                                              weight_decay=settings.weight_decay))
    self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
    # params: nnx.to_pure_dict trees. Every leaf committed to where it lies, as the update's
    # outputs are: otherwise the second update compiles again (committed arguments).
    self.opt_state = jax.tree.map(lambda x: jax.device_put(x, x.sharding),
                                  self.tx.init(nnx.to_pure_dict(params)))
    self.ref_graphdef, self.ref_state = (None, None) if self.reference is None else nnx.split(
        self.reference)
    self._update = jax.jit(self._update_fn, static_argnames=("order_sizes", "width",
                                                             "on_policy"))
    self._estimate = jax.jit(self._estimate_fn)
    self._plan_sizes = None
    self._answer_max = 0          # the most answer positions of a row seen (the order pass's W)
    self.last_hinted = 0          # groups hinted in the last `rollout_batch` (``hint`` > 0)
    self._last_groups = 0
    if probe is not None:
      self.reserve(int(probe.min()), int(probe.max()), task.length)

  def _update_fn(self, params, rest, opt_state, ref_state, batch, order_sizes=None, width=None,
                 on_policy=False):
    s = self.settings
    ref = None if ref_state is None else nnx.merge(self.ref_graphdef, ref_state)
    order = None if order_sizes is None else dict(
        policy=s.policy, policy_temperature=float(s.policy_temperature),
        max_steps=order_sizes[0], width=order_sizes[1], order_head=s.order_head > 0,
        head_kl=float(s.head_kl))

    def loss_fn(p):
      m = nnx.merge(self.graphdef, p, rest)
      return grpo_loss(m, batch, clip_eps=s.clip_eps, temperature=s.temperature, reference=ref,
                       kl_coef=s.kl_coef, order=order, estimator=s.likelihood,
                       loss_norm=s.loss_norm, width=width, order_only=s.order_only)

    if on_policy:     # the surrogate's value would need the forward: grad only, loss in metrics
      grads, metrics = jax.grad(lambda p: on_policy_loss(
          nnx.merge(self.graphdef, p, rest), batch, temperature=s.temperature,
          loss_norm=s.loss_norm, width=width), has_aux=True)(params)
    else:
      (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      metrics = dict(metrics, loss=loss)
    head_only = lambda t: jax.tree_util.tree_map_with_path(  # noqa: E731
        lambda path, x: x if _in_head(path) else jnp.zeros_like(x), t)
    if s.head_only:       # the tokens frozen: no gradient (clipping) or update (weight decay)
      grads = head_only(grads)       # outside the order head
    updates, opt_state = self.tx.update(grads, opt_state, params)
    if s.head_only:
      updates = head_only(updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
    return optax.apply_updates(params, updates), opt_state, metrics

  def _estimate_fn(self, params, rest, batch):
    m = nnx.merge(self.graphdef, params, rest)
    return estimators.estimate_logp(m, batch["tokens"], batch["order"], batch["steps"],
                                    batch["prompt"], estimator=self.settings.likelihood,
                                    keep=batch.get("keep"),
                                    mask_order=batch.get("mask_order"),
                                    hidden=batch.get("hidden"),
                                    temperature=self.settings.temperature)

  def estimate_logp(self, batch: dict) -> jax.Array:
    """[R, n]: the current policy's log-likelihood of ``batch``'s rollouts (tokens, order,
    steps, prompt, optional keep / mask_order and hidden) under the settings' estimator, without
    gradients."""
    return self._estimate(nnx.state(self.model, nnx.Param), self.rest, batch)

  def order_sizes(self, length: int) -> tuple[int, int] | None:
    """(T, W) of the order's log-probability pass (`likelihood.order_scan`: the most steps and
    answer positions of a row seen so far), or None without a stochastic order policy."""
    if not self.settings.trains_order:
      return None
    w = self.answer_width(length)
    return min(self.settings.order_steps(length), w), w

  def answer_width(self, length: int) -> int:
    """The most answer positions of a row seen so far (or ``length``): the queries a step of the
    order pass, and of a blank model's likelihood, need."""
    return max(1, min(self._answer_max or length, length))

  def reserve(self, min_prompt: int, max_prompt: int, length: int) -> None:
    """Sizes the compiled sampler and update for every prompt of ``min_prompt`` ..
    ``max_prompt`` positions in rows of ``length`` (the sizes only grow; the samples do not
    depend on them): one compile for every batch in that range."""
    if self.settings.hint > 0:     # a hinted rollout's prompt holds part of the answer too
      max_prompt = max_prompt + int(hint_count(length - max_prompt, self.settings.hint))
    rows = np.arange(length)[None, :] < np.array([[min_prompt], [max_prompt]])
    s = self.settings.sample_settings(length)
    if s.method not in sampler_lib.PLANLESS_METHODS or s.method == "adaptive":
      p = sampler_lib.prepare(self.model.cfg, jax.random.key(0), s,
                              prompt=(np.zeros(rows.shape, np.int32), rows))
      self._sizes(p, s)
    self._answer_max = max(self._answer_max, length - int(min_prompt))

  def _sizes(self, p, s):
    """(step plan, adaptive shape) of batch ``p`` at the kept static sizes, grown to cover it."""
    if s.method == "adaptive":
      shape = sampler_lib.adaptive_shape(p, s)
      keys = ("queries", "catchup", "prefill", "max_steps")
      if self._plan_sizes is not None:
        shape = dataclasses.replace(shape, **{k: max(getattr(shape, k), self._plan_sizes[k])
                                              for k in keys})
      self._plan_sizes = {k: getattr(shape, k) for k in keys}
      return None, shape
    if self._plan_sizes is None:
      block = sampler_lib.plan([p], method=s.method)[0].block
      self._plan_sizes = dict(block=block, min_passes=0, min_queries=1, min_prefill=0)
    first = schedules.plan_steps(p.counts, p.prompt_len, **self._plan_sizes)
    self._plan_sizes.update(min_passes=first.steps, min_queries=first.queries,
                            min_prefill=first.prefill)
    return schedules.plan_steps(p.counts, p.prompt_len, **self._plan_sizes), None

  def task_prompts(self, seed: int, index: int, count: int = 4) -> dict:
    """``count`` of the task's training puzzles (``task.train_batch(seed, index, count)``)."""
    if self.task is None:
      raise ValueError("rl.task: task_prompts needs a task, got None")
    return self.task.train_batch(seed, index, count)

  def check_prompts(self, prompts: dict) -> None:
    tokens, prompt = np.asarray(prompts["tokens"]), np.asarray(prompts["prompt"])
    if tokens.ndim != 2 or tokens.shape != prompt.shape:
      raise ValueError(f"rl.prompts: tokens {tokens.shape} and prompt {prompt.shape} must both "
                       f"be [P, n]")
    n = tokens.shape[1]
    if n > self.model.cfg.block_size:
      raise ValueError(f"rl.prompts: sequence length {n} exceeds model.block_size "
                       f"{self.model.cfg.block_size}")
    full = prompt.all(axis=1)
    if full.any():
      raise ValueError(f"rl.prompts: row {int(np.argmax(full))} is all prompt ({n} of {n} "
                       f"positions given); expected a prompt shorter than the sequence")

  def rollouts(self, key: jax.Array, prompts: dict) -> tuple[sampler_lib.Samples, dict]:
    """G samples per prompt row (rows repeated: prompt p's are rows p G .. p G + G - 1) and the
    repeated puzzles."""
    self.check_prompts(prompts)
    g = self.settings.group_size
    rep = {k: np.repeat(np.asarray(prompts[k]), g, axis=0) for k in ("tokens", "prompt")}
    self._answer_max = max(self._answer_max, int((~rep["prompt"]).sum(1).max()))
    return self._sample(key, rep["tokens"], rep["prompt"]), rep

  def _sample(self, key: jax.Array, tokens: np.ndarray, prompt: np.ndarray) -> sampler_lib.Samples:
    """The settings' sampler on rows ``tokens`` [R, n] given at ``prompt`` [R, n], logp recorded."""
    toks = np.where(prompt, tokens, 0).astype(np.int32)
    s = self.settings.sample_settings(toks.shape[1])
    if s.method in sampler_lib.PLANLESS_METHODS and s.method != "adaptive":
      return sampler_lib.generate(self.model, key, s, prompt=(toks, prompt), return_logp=True)
    # One compiled sampler for every batch (`_sizes`; the samples do not depend on the sizes).
    p = sampler_lib.prepare(self.model.cfg, key, s, prompt=(toks, prompt))
    plan, shape = self._sizes(p, s)
    return sampler_lib.sample_batch(self.model, p, plan, s, adaptive=shape, return_logp=True)

  def hinted(self, key: jax.Array, batch: dict, puzzles: dict, rewards: np.ndarray
             ) -> tuple[dict, int]:
    """IGPO's hint (``hint`` > 0): in each group whose every rollout's (mean) reward is below
    its reference answer's, the last rollout is replaced by a *hinted* one: ``hint_count`` of
    its answer cells, drawn at random, are the reference's, the others sampled by the settings'
    sampler given them. Its order is the prompt, the hinted cells (one step each), then the
    sampled ranks; its old log-probabilities are its exact ones at the current weights
    (`likelihood.sequence_logp`, teacher-forced: the hinted cells were not drawn from the
    policy), so its advantage lifts the answer the group could not find. Returns the batch (a
    copy, those rows replaced) and how many groups were hinted."""
    s, g = self.settings, self.settings.group_size
    prompt, ref_tokens = np.asarray(puzzles["prompt"], bool), np.asarray(puzzles["tokens"])
    ref = reward_values(self.reward_fn, ref_tokens, puzzles, self.task, "the reference answers",
                        per_token=s.credit == "token")
    fail = (_answer_mean(rewards, prompt) < _answer_mean(ref, prompt) - 1e-9).reshape(-1, g)
    groups = np.nonzero(fail.all(1))[0]
    if not len(groups):
      return batch, 0
    r, n = prompt.shape
    free = ~prompt
    u = np.where(free, np.asarray(jax.random.uniform(jax.random.fold_in(key, 2), (r, n))), 2.0)
    k = hint_count(free.sum(1), s.hint)
    wide = prompt | (np.argsort(np.argsort(u, axis=1), axis=1) < k[:, None])
    out = self._sample(jax.random.fold_in(key, 3), ref_tokens, wide)   # every row: one shape
    b = {f: np.array(v) for f, v in batch.items()}
    rows = groups * g + g - 1
    for i in rows:
      m, mw = int(prompt[i].sum()), int(wide[i].sum())
      given = out.order[i, :mw]
      order = np.concatenate([given[prompt[i, given]], given[~prompt[i, given]],
                              out.order[i, mw:]])
      b["tokens"][i], b["order"][i] = out.tokens[i], order
      b["steps"][i] = np.concatenate([np.full(m, -1), np.arange(mw - m),
                                      out.step_of_rank[i, mw:] + (mw - m)])
    old = np.asarray(self.estimate_logp({f: b[f] for f in ("tokens", "order", "steps",
                                                          "prompt")}))
    b["old_logp"][rows] = old[rows]
    return b, len(groups)

  def rollout_batch(self, key: jax.Array, prompts: dict) -> tuple[dict, np.ndarray, dict]:
    """Rollouts of ``prompts`` with the model's current weights, scored: (the update's batch,
    the rewards [R] (per-token rewards: their mean over each rollout's answer), the repeated
    puzzles). With an estimated likelihood the batch carries each inner update's old values
    (``old_logp_steps`` [R, I, n]) and random masks (``keep_steps``, ``mask_order_steps``,
    ``hidden_steps``), drawn from ``key`` and computed here at the rollouts' weights: the old
    and new values of an inner update share its masks. Per-token advantages are moved to order
    space (the rank that wrote each position), as the loss takes them."""
    s = self.settings
    out, puzzles = self.rollouts(key, prompts)
    score = lambda t: check_finite(reward_values(  # noqa: E731
        self.reward_fn, t, puzzles, self.task, "the rollouts", per_token=s.credit == "token"),
        s.reward)
    rewards = score(out.tokens)
    batch = {"tokens": np.asarray(out.tokens), "order": np.asarray(out.order),
             "steps": np.asarray(out.step_of_rank), "prompt": np.asarray(puzzles["prompt"]),
             "old_logp": np.asarray(out.logp if out.order_logp is None else
                                     out.order_logp if s.order_only else
                                     out.logp + out.order_logp)}
    self.last_hinted, self._last_groups = 0, len(rewards) // s.group_size
    if s.hint > 0:
      batch, self.last_hinted = self.hinted(key, batch, puzzles, rewards)
      if self.last_hinted:
        rewards = score(batch["tokens"])
    batch["adv"] = group_advantages(rewards, s.group_size, s.scale_rewards, kind=s.advantage)
    if rewards.ndim == 2:      # per-token: position p's advantage to the rank that wrote it,
      batch["adv"] = np.take_along_axis(batch["adv"], batch["order"], axis=1)
      rewards = _answer_mean(rewards, batch["prompt"])  # a rollout's: the mean over its answer
    if s.likelihood != "exact":
      batch.update(self._estimated_old(jax.random.fold_in(key, 1), batch))
    return batch, rewards, puzzles

  def _estimated_old(self, key: jax.Array, batch: dict) -> dict:
    """The estimator's masks and old values for each inner update (rows first)."""
    s, steps = self.settings, []
    for k in jax.random.split(key, int(s.inner_steps)):
      masks = {}
      if s.likelihood == "mean_field" and s.prompt_mask > 0:
        masks["keep"] = estimators.prompt_keep(k, batch["prompt"], s.prompt_mask)
      elif s.likelihood == "elbo":
        masks["mask_order"], masks["hidden"] = estimators.elbo_masks(
            k, batch["order"], batch["prompt"], int(s.elbo_samples))
      old = self.estimate_logp({**{f: batch[f] for f in ("tokens", "order", "steps", "prompt")},
                                **masks})
      steps.append({"old_logp": old, **masks})
    return {f"{f}_steps": np.stack([np.asarray(x[f]) for x in steps], axis=1) for f in steps[0]}

  def update(self, params, opt_state, batch: dict, on_policy: bool = False):
    """``inner_steps`` jitted updates of ``params`` (an ``nnx.to_pure_dict`` tree) on one batch
    of rollouts: (params, opt_state, the last update's device metrics). ``on_policy``: the
    batch's ``old_logp`` are ``params``' own (its rollouts were sampled with them): the first
    update takes `objective.on_policy_loss`'s gradient when the settings allow
    (`GRPOSettings.on_policy_shortcut`)."""
    metrics = {}
    n = batch["tokens"].shape[1]
    sizes = self.order_sizes(n)
    # a blank model's likelihood: one query per answer position a step, not one per position
    width = self.answer_width(n) if self.model.cfg.blank_block else None
    for i in range(int(self.settings.inner_steps)):
      b = {k: v for k, v in batch.items() if not k.endswith("_steps")}
      b.update({k[:-len("_steps")]: v[:, i] for k, v in batch.items() if k.endswith("_steps")})
      params, opt_state, metrics = self._update(
          params, self.rest, opt_state, self.ref_state, b, order_sizes=sizes, width=width,
          on_policy=bool(on_policy and i == 0 and self.settings.on_policy_shortcut))
    return params, opt_state, metrics

  def step(self, key: jax.Array, prompts: dict, transform=None) -> dict[str, float]:
    """One GRPO step on ``prompts`` ({"tokens", "prompt"} [P, n]); returns host metrics (reward:
    the rollouts' mean reward, before the update; `timing`'s speed). ``transform(batch,
    puzzles) -> batch``, when given, edits the update's batch first (a control experiment: e.g.
    the reference answers in the rollouts' orders, benchmarks/post_training.py)."""
    t = time.perf_counter()
    batch, rewards, puzzles = self.rollout_batch(key, prompts)
    if transform is not None:
      batch = transform(batch, puzzles)
    t_rollout, t = time.perf_counter() - t, time.perf_counter()
    batch = jax.tree.map(jnp.asarray, batch)
    params = nnx.to_pure_dict(nnx.state(self.model, nnx.Param))
    # a transform may change old_logp: then the clipped objective in full
    params, self.opt_state, metrics = self.update(params, self.opt_state, batch,
                                                  on_policy=transform is None)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    nnx.update(self.model, params)
    return dict(metrics, reward=float(rewards.mean()), reward_std=float(rewards.std()),
                **self.hint_metrics(), **timing(len(rewards), t_rollout, time.perf_counter() - t))

  def hint_metrics(self) -> dict[str, float]:
    """``hinted``: the share of the last batch's groups that got a hinted rollout (``hint`` >
    0; no key otherwise)."""
    if not self.settings.hint > 0:
      return {}
    return {"hinted": self.last_hinted / max(1, self._last_groups)}
