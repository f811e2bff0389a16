"""Direct Preference Optimization with exact sequence log-likelihoods under a stated order.

For a prompt x and two responses, chosen y_w and rejected y_l, with the policy pi (trained) and
a frozen reference model (a copy of the starting weights, or another model of the same shape):

    loss = -log sigmoid(beta * ((log pi(y_w|x) - log ref(y_w|x)) - (log pi(y_l|x) - log ref(y_l|x))))

averaged over the pairs. The sequence log-likelihoods come from `likelihood.sequence_logp`
(one teacher-forced pass, one token per step) under an ORDER of the response positions (the
prompt always comes first, `orders.prompt_first`):

* ``order="l2r"``: the response left to right. ``log p_l2r(y|x)``, the sum of its per-token
  conditionals, is EXACT: the probability the model assigns to y when it writes it left to right
  (what the ``l2r`` samplers draw from).
* ``order="random"``, ``orders=M``: M uniformly random orders sigma_1..sigma_M of the response
  positions, drawn per batch and shared by chosen and rejected and by policy and reference;
  the value is ``(1/M) sum_m log p_sigma_m(y|x)``, each term exact. It is an unbiased ESTIMATE of
  ``E_sigma[log p_sigma(y|x)]``, the expected per-order log-likelihood (the quantity any-order
  training maximises), which by Jensen is a LOWER BOUND of ``log E_sigma[p_sigma(y|x)]``, the
  log-likelihood of the order-marginal model (the mixture over uniform orders). The loss is then
  a Monte Carlo estimate of DPO on the expected per-order log-ratio, biased for finite M (the
  sigmoid is not linear); neither side is the exact likelihood of the order-marginal model.

Pairs: ``{"chosen", "rejected": int [B, n], "prompt": bool [B, n]}`` in original order, the two
rows equal on the prompt, each row encoded as `tasks.text_pairs.encode_pair` does (end-of-text
padding scored as part of the response). Sources (`preferences`): the ``preferences`` task (a
JSONL of ``{"prompt", "chosen", "rejected"}`` text, or a ``datasets`` dataset), or any task's
training rows as chosen and, as rejected, the same rows with 1 to ``max_changes`` answer cells
changed to another id (`corrupt`: a Sudoku grid with a changed cell breaks a rule, so the
rejected answer always fails the verifier).

    trainer = dpo.DPO(model, dpo.DPOSettings(beta=0.1, order="l2r", lr=1e-4))
    for i in range(100):
      metrics = trainer.step(dpo.preferences(task, seed=0, index=i, count=16))
    # metrics: loss, accuracy (pairs with a positive margin), margin, chosen_reward,
    # rejected_reward (beta times the log-ratios), chosen_logp, rejected_logp (the policy's)

Shape suffixes: B pairs, M orders, N sequence length n.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from ml_collections import config_dict

from aogpt_jax import config_groups
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT
from aogpt_jax.posttrain import likelihood, objective
from aogpt_jax.tasks import base as tasks_base

ORDERS = ("l2r", "random")


@dataclasses.dataclass(frozen=True)
class DPOSettings:
  beta: float = 0.1                # the inverse temperature of the implicit reward
  order: str = "l2r"               # l2r (exact) | random (the mean over `orders` orders: estimate)
  orders: int = 4                  # M, random orders per batch (order="random" only)
  lr: float = 1e-5
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0       # 0: no clipping
  max_changes: int = 2             # task pairs: answer cells changed in a rejected row (1..this)

  def validate(self, model: AOGPT, reference: AOGPT | None = None) -> None:
    """One-line ValueErrors naming the key, before anything compiles."""
    if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not (
        math.isfinite(self.beta) and self.beta > 0):
      raise ValueError(f"dpo.beta: must be a finite number > 0, got {self.beta!r}")
    if self.order not in ORDERS:
      raise ValueError(f"dpo.order: must be one of {ORDERS} (l2r: exact; random: the mean over "
                       f"dpo.orders random orders, an estimate), got {self.order!r}")
    for key in ("orders", "max_changes"):
      v = getattr(self, key)
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"dpo.{key}: must be an integer >= 1, got {v!r}")
    if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not self.lr > 0:
      raise ValueError(f"dpo.lr: must be a number > 0, got {self.lr!r}")
    objective.check_optimizer("dpo", self.weight_decay, self.max_grad_norm)
    if reference is not None:
      shape = lambda m: jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(m, nnx.Param))  # noqa: E731
      if reference.cfg.vocab_size != model.cfg.vocab_size or shape(reference) != shape(model):
        raise ValueError("dpo.reference: the reference model differs in shape from the policy "
                         "(expected the same architecture, e.g. the SFT model it starts from)")


# The ``dpo`` config group (``--mode=dpo``, posttrain/dpo_run.py): every field of DPOSettings,
# plus the run's own keys.
RUN_KEYS = {"pairs": 16,        # preference pairs per update
            "reference": "",    # the frozen reference: a WORKDIR or SPEC; "" = the starting weights
            "ema_decay": 0.0}   # EMA of the weights (0: none); the held-out eval uses it


def dpo_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  for f in dataclasses.fields(DPOSettings):
    c[f.name] = f.default
  for k, v in RUN_KEYS.items():
    c[k] = v
  return c


config_groups.register("dpo", dpo_config)


def settings_from_config(group) -> DPOSettings:
  return DPOSettings(**{f.name: group[f.name] for f in dataclasses.fields(DPOSettings)})


# ----------------------------------------------------------------------------- likelihoods


def pair_orders(key: jax.Array | None, prompt: jax.Array, order: str, m: int) -> jax.Array:
  """int32 [M, B, n]: the prompt first, then the response left to right (``l2r``, M = 1) or in
  M uniformly random orders (``random``)."""
  b, n = prompt.shape
  if order == "l2r":
    base_MBxN = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
    m = 1
  else:
    base_MBxN = orders_lib.sample("uniform", key, m * b, n)
  prompt_MBxN = jnp.tile(prompt, (m, 1))
  return orders_lib.prompt_first(base_MBxN, prompt_MBxN).astype(jnp.int32).reshape(m, b, n)


def sequence_logps(model: AOGPT, tokens: jax.Array, prompt: jax.Array,
                   orders_MxBxN: jax.Array) -> jax.Array:
  """float32 [B]: the response's log-likelihood under each of the M orders (one token per step:
  `likelihood.sequence_logp` summed over the answer ranks), averaged over the orders."""
  m, b, n = orders_MxBxN.shape
  tokens_MBxN = jnp.tile(tokens, (m, 1))
  prompt_MBxN = jnp.tile(prompt, (m, 1))
  steps_MBxN = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (m * b, n))
  logp_MBxN = likelihood.sequence_logp(model, tokens_MBxN, orders_MxBxN.reshape(m * b, n),
                                       steps_MBxN, prompt_MBxN)
  return logp_MBxN.sum(-1).reshape(m, b).mean(0)


def dpo_rows(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta: float) -> dict:
  """Per pair [B]: loss, accuracy (margin > 0), margin (beta times the difference of the
  log-ratios), chosen_reward, rejected_reward (beta times each log-ratio), chosen_logp,
  rejected_logp (the policy's), from the four sequence log-likelihoods [B]."""
  r_chosen_B = beta * (pi_chosen - ref_chosen)
  r_rejected_B = beta * (pi_rejected - ref_rejected)
  z_B = r_chosen_B - r_rejected_B
  return {"loss": -jax.nn.log_sigmoid(z_B), "accuracy": (z_B > 0).astype(jnp.float32),
          "margin": z_B, "chosen_reward": r_chosen_B, "rejected_reward": r_rejected_B,
          "chosen_logp": pi_chosen, "rejected_logp": pi_rejected}


def dpo_objective(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta: float):
  """(loss, metrics): `dpo_rows` averaged over the pairs (module docstring)."""
  rows = dpo_rows(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta)
  metrics = {k: jnp.mean(v) for k, v in rows.items()}
  return metrics.pop("loss"), metrics


def both(batch: dict, orders_MxBxN: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """chosen and rejected stacked: tokens and prompt [2B, n], orders [M, 2B, n]."""
  return (jnp.concatenate([batch["chosen"], batch["rejected"]]),
          jnp.concatenate([batch["prompt"], batch["prompt"]]),
          jnp.concatenate([orders_MxBxN, orders_MxBxN], axis=1))


def pair_logps(model: AOGPT, reference: AOGPT, batch: dict, orders_MxBxN: jax.Array):
  """(policy chosen, policy rejected, reference chosen, reference rejected), each [B]; the
  reference under stop_gradient."""
  tokens, prompt, orders2 = both(batch, orders_MxBxN)
  b = batch["chosen"].shape[0]
  pi_2B = sequence_logps(model, tokens, prompt, orders2)
  ref_2B = jax.lax.stop_gradient(sequence_logps(reference, tokens, prompt, orders2))
  return pi_2B[:b], pi_2B[b:], ref_2B[:b], ref_2B[b:]


def dpo_loss(model: AOGPT, reference: AOGPT, batch: dict, orders_MxBxN: jax.Array,
             beta: float):
  """(loss, metrics) of a batch of pairs under the given orders; differentiable in ``model``
  (the reference gets no gradient)."""
  return dpo_objective(*pair_logps(model, reference, batch, orders_MxBxN), beta)


# ----------------------------------------------------------------------------- pairs


def check_pairs(pairs: dict, block_size: int | None = None, vocab_size: int | None = None):
  """One-line ValueErrors for host pairs before anything compiles."""
  c, r, p = (np.asarray(pairs[k]) for k in ("chosen", "rejected", "prompt"))
  if c.ndim != 2 or c.shape != r.shape or c.shape != p.shape:
    raise ValueError(f"dpo.pairs: chosen {c.shape}, rejected {r.shape} and prompt {p.shape} "
                     f"must all be [B, n]")
  n = c.shape[1]
  if block_size is not None and n > block_size:
    raise ValueError(f"dpo.pairs: sequence length {n} exceeds model.block_size {block_size}")
  if vocab_size is not None and (min(c.min(), r.min()) < 0 or max(c.max(), r.max()) >= vocab_size):
    raise ValueError(f"dpo.pairs: token ids must be in [0, {vocab_size})")
  p = p.astype(bool)
  full = p.all(1)
  if full.any():
    raise ValueError(f"dpo.pairs: row {int(np.argmax(full))} is all prompt ({n} of {n} "
                     f"positions); expected a prompt shorter than the sequence")
  differ = ((c != r) & p).any(1)
  if differ.any():
    raise ValueError(f"dpo.pairs: row {int(np.argmax(differ))}: chosen and rejected differ "
                     f"inside the prompt; expected the same prompt")


def corrupt(tokens: np.ndarray, prompt: np.ndarray, vocab_size: int, rng: np.random.Generator,
            max_changes: int) -> np.ndarray:
  """A copy of ``tokens`` [B, n] with k ~ U{1..max_changes} (at most the row's answer cells)
  answer cells of each row changed, each to a uniformly drawn OTHER id below ``vocab_size``."""
  out = np.array(tokens, copy=True)
  answer = ~np.asarray(prompt, bool)
  for b in range(out.shape[0]):
    cells = np.flatnonzero(answer[b])
    k = min(int(rng.integers(1, max_changes + 1)), len(cells))
    pick = rng.choice(cells, size=k, replace=False)
    out[b, pick] = (out[b, pick] + rng.integers(1, vocab_size, size=k)) % vocab_size
  return out


def _task_pairs(task, rows: dict, rng: np.random.Generator, max_changes: int) -> dict:
  tokens = np.asarray(rows["tokens"], np.int32)
  prompt = np.asarray(rows["prompt"], bool)
  return {"chosen": tokens, "prompt": prompt,
          "rejected": corrupt(tokens, prompt, task.vocab_size, rng, max_changes).astype(np.int32)}


def check_distinct(task) -> int:
  """For a task with its own pairs (``preferences``): how many of its training pairs have the
  chosen row equal to the rejected one (after encoding; such a pair has loss log 2 and no
  gradient); a ValueError when every one has. 0 for other tasks (their rejected rows are
  corrupted copies)."""
  if not hasattr(task, "preferences") or not hasattr(task, "rows"):
    return 0
  chosen, rejected = task.rows[task.chosen_key], task.rows[task.rejected_key]
  same = (chosen == rejected).all(1)[task.train_index]
  if same.all():
    raise ValueError(f"task.options: every one of the {len(same)} training pairs of "
                     f"{task.path or task.dataset} has {task.chosen_key!r} equal to "
                     f"{task.rejected_key!r} (after encoding): DPO learns nothing from them "
                     f"(loss log 2, gradient 0); expected pairs whose responses differ")
  return int(same.sum())


def preferences(task, seed: int, index: int, count: int, max_changes: int = 2) -> dict:
  """Training pairs number ``index`` (deterministic): the ``preferences`` task's own, or any
  other task's ``train_batch(seed, index, count)`` as chosen with `corrupt` rows as rejected."""
  if hasattr(task, "preferences"):
    return task.preferences(seed, index, count)
  rng = tasks_base.seeds(0xD90, seed, index)
  return _task_pairs(task, task.train_batch(seed, index, count), rng, max_changes)


def heldout_preferences(task, seed: int, count: int, max_changes: int = 2) -> dict:
  """Held-out pairs: the task's held-out rows, made into pairs as `preferences` does."""
  if hasattr(task, "heldout_preferences"):
    return task.heldout_preferences(seed, count)
  rng = tasks_base.seeds(0x4E1D, 0xD90, seed)
  return _task_pairs(task, task.heldout(seed, count), rng, max_changes)


# ----------------------------------------------------------------------------- the trainer


class DPO:
  """The DPO state: the policy (updated in place by `step`), the optimizer and the frozen
  reference (``reference``, else a copy of ``model``'s starting weights). `step(pairs, key)` is
  one jitted update; `evaluate(pairs, key)` the same metrics without one. ``key`` draws the
  random orders (``order="random"``; unused for l2r)."""

  def __init__(self, model: AOGPT, settings: DPOSettings, *, reference: AOGPT | None = None):
    settings.validate(model, reference)
    self.model, self.settings = model, settings
    self.reference = nnx.clone(model) if reference is None else reference
    chain = [optax.clip_by_global_norm(settings.max_grad_norm)] if settings.max_grad_norm else []
    self.tx = optax.chain(*chain, optax.adamw(settings.lr, b1=0.9, b2=0.95,
                                              weight_decay=settings.weight_decay))
    self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
    self.ref_graphdef, self.ref_state = nnx.split(self.reference)
    # params: nnx.to_pure_dict trees. Every leaf committed to where it lies, as the update's
    # outputs are: otherwise the second update compiles again (committed arguments).
    self.opt_state = jax.tree.map(lambda x: jax.device_put(x, x.sharding),
                                  self.tx.init(nnx.to_pure_dict(params)))
    self._update = jax.jit(self.update_fn)
    self._rows = jax.jit(self.rows_fn)

  def _merged(self, params, rest, ref_state, batch, key, orders_MxBxN=None):
    if orders_MxBxN is None:
      orders_MxBxN = pair_orders(key, batch["prompt"], self.settings.order, self.settings.orders)
    return (nnx.merge(self.graphdef, params, rest), nnx.merge(self.ref_graphdef, ref_state),
            batch, orders_MxBxN)

  def _loss(self, params, rest, ref_state, batch, key):
    return dpo_loss(*self._merged(params, rest, ref_state, batch, key), self.settings.beta)

  def update_fn(self, params, rest, opt_state, ref_state, batch, key):
    """(params, opt_state, metrics): one AdamW update on ``batch`` (traceable)."""
    (loss, metrics), grads = jax.value_and_grad(self._loss, has_aux=True)(
        params, rest, ref_state, batch, key)
    updates, opt_state = self.tx.update(grads, opt_state, params)
    metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
    return optax.apply_updates(params, updates), opt_state, metrics

  def update(self, params, opt_state, pairs: dict, key: jax.Array):
    """One jitted update of ``params`` (an ``nnx.to_pure_dict`` tree) on device ``pairs``:
    (params, opt_state, device metrics of the batch before the update)."""
    return self._update(params, self.rest, opt_state, self.ref_state, pairs, key)

  def rows_fn(self, params, rest, ref_state, batch, key, orders_MxBxN=None):
    """`dpo_rows` of ``batch`` under ``params`` (traceable); the orders drawn from ``key``
    unless given."""
    return dpo_rows(*pair_logps(*self._merged(params, rest, ref_state, batch, key,
                                              orders_MxBxN)), self.settings.beta)

  def device_pairs(self, pairs: dict) -> dict:
    check_pairs(pairs, self.model.cfg.block_size, self.model.cfg.valid_vocab_size)
    return {"chosen": jnp.asarray(pairs["chosen"], jnp.int32),
            "rejected": jnp.asarray(pairs["rejected"], jnp.int32),
            "prompt": jnp.asarray(pairs["prompt"], bool)}

  def step(self, pairs: dict, key: jax.Array | None = None) -> dict[str, float]:
    """One update on ``pairs``; host metrics of the batch BEFORE the update."""
    key = jax.random.key(0) if key is None else key
    params = nnx.to_pure_dict(nnx.state(self.model, nnx.Param))
    params, self.opt_state, metrics = self.update(params, self.opt_state,
                                                  self.device_pairs(pairs), key)
    nnx.update(self.model, params)
    return {k: float(v) for k, v in metrics.items()}

  def evaluate(self, pairs: dict, key: jax.Array | None = None, params=None,
               per_row: bool = False, orders=None) -> dict:
    """The metrics of ``pairs`` under the current policy (or ``params``), no update: their
    means (floats), or with ``per_row`` the `dpo_rows` arrays [B]. ``orders`` [M, B, n]: these
    orders instead of ones drawn from ``key`` (`pair_orders`)."""
    key = jax.random.key(0) if key is None else key
    params = nnx.to_pure_dict(nnx.state(self.model, nnx.Param)) if params is None else params
    if not isinstance(pairs["chosen"], jax.Array):   # host pairs: checked and moved
      pairs = self.device_pairs(pairs)
    rows = jax.device_get(self._rows(params, self.rest, self.ref_state, pairs, key, orders))
    if per_row:
      return {k: np.asarray(v, np.float64) for k, v in rows.items()}
    return {k: float(np.mean(v)) for k, v in rows.items()}
