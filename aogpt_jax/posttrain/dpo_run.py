"""``--mode=dpo``: DPO (`dpo.DPO`) as a run of the post-training loop (`run.run`).

`build(cfg, mc)` checks the ``dpo`` group (`dpo.dpo_config`: every field of `dpo.DPOSettings`
plus ``pairs``, ``reference``, ``ema_decay``) and loads the starting weights
(``train.init_from``) and the frozen reference (``dpo.reference``, else a copy of the starting
weights), with one-line `ConfigError`s before anything compiles. `DPOAlgorithm` is the loop's
algorithm: update ``s`` takes ``dpo.pairs`` training pairs ``dpo.preferences(task, seed,
index=s, count)`` (the ``preferences`` task's text pairs, or another task's training rows with
corrupted copies as rejected) and, for ``dpo.order="random"``, draws its orders from the key
``fold_in(rng, s)``: a resumed run continues bitwise. Metrics (metrics.jsonl, TensorBoard), per
update, under ``dpo/``:

    loss, accuracy (pairs whose implicit reward margin is > 0), margin (its mean),
    chosen_reward, rejected_reward (beta times the policy / reference log-ratios),
    chosen_logp, rejected_logp (the policy's sequence log-likelihoods), grad_norm, update_sec

and under ``eval/`` the same (but grad_norm, update_sec) on ``task.heldout_count`` held-out pairs
(random orders: a fixed key, the same at every eval).
"""

from __future__ import annotations

import time

import jax
import numpy as np
from absl import logging

from aogpt_jax import config as config_lib
from aogpt_jax.posttrain import dpo
from aogpt_jax.posttrain import run as run_lib
from aogpt_jax.train import sharding as sharding_lib

ConfigError = config_lib.ConfigError
METRICS = ("loss", "accuracy", "margin", "chosen_reward", "rejected_reward", "chosen_logp",
           "rejected_logp")


def check(cfg, mc):
  """The checks of ``--mode=dpo`` that need no weights (one line each; `aogpt_jax.checks` runs
  them before anything is created or compiled): (task, settings, EMA decay, how many pairs have chosen equal to
  rejected)."""
  del mc
  task = config_lib.task_of(cfg)
  if task is None:
    raise ConfigError("task.name: --mode=dpo needs a task (its pairs: the 'preferences' task's "
                      "text, or a puzzle task's rows); configs/dpo_sudoku.py sets one")
  g = cfg.dpo
  if not isinstance(g.pairs, int) or isinstance(g.pairs, bool) or g.pairs < 1:
    raise ConfigError(f"dpo.pairs: must be an integer >= 1, got {g.pairs!r}")
  d = run_lib.check_ema_decay(g.ema_decay, "dpo.ema_decay")
  try:
    settings = dpo.settings_from_config(g)
    settings.validate(None)        # the settings alone (the reference's shape: in build)
  except TypeError as err:
    raise ConfigError(f"dpo: {err}") from None
  except ValueError as err:
    raise ConfigError(str(err) if str(err).startswith("dpo.") else f"dpo: {err}") from None
  dp = run_lib.data_parallel(cfg)
  if g.pairs % dp:
    raise ConfigError(f"dpo.pairs: {g.pairs} pairs must split evenly over the {dp} "
                      f"data-parallel devices (mesh.data * mesh.fsdp)")
  try:
    same = dpo.check_distinct(task)
  except ValueError as err:
    raise ConfigError(str(err)) from None
  return task, settings, d, same


def build(cfg, mc) -> "DPOAlgorithm":
  """`check`, then the starting model, the reference and the algorithm."""
  task, settings, d, same = check(cfg, mc)
  if same:
    logging.warning("dpo: %d of the %d training pairs have chosen equal to rejected (after "
                    "encoding): they add nothing to the gradient", same, len(task.train_index))
  g = cfg.dpo
  model = run_lib.starting_model(cfg, mc, "dpo")
  reference = run_lib.load_reference(str(g.reference or ""), model, "dpo.reference")
  try:
    settings.validate(model, reference)
    seed = int(cfg.seed)
    heldout = dpo.heldout_preferences(task, int(cfg.task.heldout_seed),
                                      int(cfg.task.heldout_count), settings.max_changes)
    algorithm = DPOAlgorithm(model, settings, task, reference, pairs=int(g.pairs),
                             ema_decay=float(d), seed=seed, heldout=heldout)
    dpo.check_pairs(dpo.preferences(task, seed, 0, int(g.pairs), settings.max_changes),
                    model.cfg.block_size, model.cfg.valid_vocab_size)
    dpo.check_pairs(heldout, model.cfg.block_size, model.cfg.valid_vocab_size)
  except ValueError as err:
    raise ConfigError(str(err) if str(err).startswith("dpo.") else f"dpo: {err}") from None
  return algorithm


class DPOAlgorithm:
  """`run.Algorithm` for DPO (module docstring)."""

  name = "dpo"

  def __init__(self, model, settings: dpo.DPOSettings, task, reference, *, pairs: int,
               ema_decay: float, seed: int, heldout: dict):
    self.model, self.settings, self.task = model, settings, task
    self.trainer = dpo.DPO(model, settings, reference=reference)
    self.pairs, self.ema_decay, self.seed, self.heldout = pairs, ema_decay, seed, heldout
    self.mesh = None   # set by the loop (run.run): the pairs are sharded over it
    self._placed = None

  def init_opt_state(self, params):
    return self.trainer.tx.init(params)

  def _device(self, pairs: dict) -> dict:
    if self.mesh is None:
      return jax.tree.map(jax.numpy.asarray, pairs)
    if self._placed is not self.mesh:   # the model's other state and the reference: replicated
      rep = sharding_lib.replicated(self.mesh)
      self.trainer.rest = jax.device_put(self.trainer.rest, rep)
      self.trainer.ref_state = jax.device_put(self.trainer.ref_state, rep)
      self._placed = self.mesh
    return {k: jax.device_put(v, sharding_lib.batch_sharding(self.mesh, v.ndim))
            for k, v in pairs.items()}

  def update(self, params, opt_state, step: int, key):
    t = time.perf_counter()
    pairs = dpo.preferences(self.task, self.seed, step, self.pairs, self.settings.max_changes)
    params, opt_state, m = self.trainer.update(params, opt_state, self._device(pairs), key)
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    m["update_sec"] = time.perf_counter() - t
    return params, opt_state, m

  def evaluate(self, params):
    held = self.heldout
    rows = len(held["chosen"])
    # the held-out pairs in batches of dpo.pairs (the last one wraps: one shape), summed per
    # row; their orders drawn once for all of them (the same at every eval)
    s = self.settings
    orders_MxRxN = np.asarray(dpo.pair_orders(jax.random.key(self.seed),
                                              jax.numpy.asarray(held["prompt"]), s.order,
                                              s.orders))
    sums = {k: 0.0 for k in METRICS}
    for start in range(0, rows, self.pairs):
      idx = np.arange(start, start + self.pairs) % rows
      batch = self._device({k: v[idx] for k, v in held.items()})
      orders = jax.numpy.asarray(orders_MxRxN[:, idx]) if self.mesh is None else (
          jax.device_put(orders_MxRxN[:, idx], sharding_lib.replicated(self.mesh)))
      m = self.trainer.evaluate(batch, params=params, per_row=True, orders=orders)
      keep = min(self.pairs, rows - start)
      for k in METRICS:
        sums[k] += float(np.sum(m[k][:keep]))
    out = {k: v / rows for k, v in sums.items()}
    line = (f"held-out preference accuracy {100 * out['accuracy']:.1f}% of {rows} pairs, margin "
            f"{out['margin']:.3f}, loss {out['loss']:.4f}, logp chosen {out['chosen_logp']:.2f} "
            f"rejected {out['rejected_logp']:.2f} (order {s.order}"
            + (f", {s.orders} orders: an estimate" if s.order == "random" else ": exact") + ")")
    return out, line

  def progress(self, means: dict[str, float]) -> str:
    return " | ".join([
        f"loss {means['loss']:.4f}", f"accuracy {100 * means['accuracy']:.1f}%",
        f"margin {means['margin']:.3f}",
        f"reward chosen {means['chosen_reward']:.3f} rejected {means['rejected_reward']:.3f}",
        f"logp chosen {means['chosen_logp']:.2f} rejected {means['rejected_logp']:.2f}",
        f"gnorm {means['grad_norm']:.3f}",
        f"update {means['update_sec']:.2f}s" if "update_sec" in means
        else "first update (compiling): not timed"])

  def summary(self, last: dict[str, float]) -> str:
    out = f"last loss {last.get('dpo/loss', float('nan')):.4f}"
    if "eval/accuracy" in last:
      out += (f", held-out preference accuracy {100 * last['eval/accuracy']:.1f}%, margin "
              f"{last['eval/margin']:.3f}")
    return out


def dpo_mode(cfg, workdir: str) -> dict[str, float]:
  """``--mode=dpo``: DPO from ``train.init_from`` with the ``dpo`` group (module docstring)."""
  mc = config_lib.resolve(cfg)
  config_lib.check_task(cfg)   # a task's rows and verifier, before anything loads or compiles
  algorithm = build(cfg, mc)
  return run_lib.run(cfg, workdir, algorithm, mc=mc, mode="dpo")
