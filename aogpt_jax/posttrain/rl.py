"""``--mode=rl``: GRPO (`grpo.GRPO`) as a run of the post-training loop (`run.run`).

`build(cfg, mc)` checks the ``rl`` group and loads the starting weights (``train.init_from``) and
the KL reference, raising one-line `ConfigError`s before anything compiles; `GRPOAlgorithm` is
the loop's algorithm: update ``s`` samples ``rl.group_size`` rollouts of each of ``rl.prompts``
training puzzles ``task.train_batch(seed, index=s, count)`` with the key ``fold_in(rng, s)``,
scores them with ``rl.reward`` and takes ``rl.inner_steps`` clipped-ratio updates; its held-out
eval solves ``task.heldout_count`` held-out puzzles greedily with the rollouts' sampler
(`evaluation.solve.solve`). Metrics (metrics.jsonl, TensorBoard), per update, under ``rl/``:

    reward, reward_std (the rollouts' rewards), solved (the rollouts' solved rate), loss,
    grad_norm, kl (kl_coef > 0), clipped (the fraction of clipped ratios), ratio, ratio_min,
    ratio_max (over the answer tokens of the last inner step; not measured when that step
    took the on-policy gradient: inner_steps 1, exact likelihood, no KL, no order term,
    `grpo.GRPOSettings.on_policy_shortcut`), rollout_sec, update_sec, rollouts_per_sec
    (rollouts over rollout_sec), update_share (update_sec over the two), hinted (rl.hint > 0:
    the share of the groups that got a hinted rollout, `grpo.GRPO.hinted`)

and under ``eval/``: solved, solved_low, solved_high (95% Wilson interval), cell_accuracy.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
from flax import nnx

from aogpt_jax import config as config_lib
from aogpt_jax.evaluation import solve as solve_lib
from aogpt_jax.posttrain import grpo
from aogpt_jax.posttrain import run as run_lib
from aogpt_jax.posttrain import settings as settings_lib
from aogpt_jax.sampling import prompts as prompts_lib
from aogpt_jax.sampling import sampler as sampler_lib
from aogpt_jax.tasks import base as tasks_base
from aogpt_jax.train import sharding as sharding_lib

ConfigError = config_lib.ConfigError
EVAL_BATCH = 64   # held-out puzzles per sampler batch (the results do not depend on it)
GRPO_KEYS = {f.name for f in dataclasses.fields(grpo.GRPOSettings)}   # rl.* keys of the sampler


def _int(group, key: str, low: int) -> int:
  v = group[key]
  if not isinstance(v, int) or isinstance(v, bool) or v < low:
    raise ConfigError(f"rl.{key}: must be an integer >= {low}, got {v!r}")
  return v


def load_reference(cfg, start_model):
  """The frozen KL reference: ``rl.reference`` (a WORKDIR or SPEC), or a copy of the starting
  weights when it is ""; None when ``rl.kl_coef`` is 0."""
  spec = str(cfg.rl.reference or "")
  if not cfg.rl.kl_coef:
    if spec:
      raise ConfigError(f"rl.reference: {spec!r} is used only by the KL term, and rl.kl_coef is "
                        f"0; set rl.kl_coef > 0 or leave rl.reference \"\"")
    return None
  return run_lib.load_reference(spec, start_model, "rl.reference")


def check(cfg, mc):
  """The checks of ``--mode=rl`` that need no weights (one line each; `aogpt_jax.checks` runs
  them before anything is created or compiled): (task, settings, prompts, EMA decay)."""
  task = config_lib.task_of(cfg)
  if task is None:
    raise ConfigError("task.name: --mode=rl needs a task (its training puzzles are the prompts "
                      "and its verifier the reward); configs/rl_sudoku.py sets one")
  rl = cfg.rl
  if isinstance(rl.reward, str) and ":" in rl.reward.strip(":"):   # MODULE:FUNCTION, recorded
    module, _, fn = rl.reward.rpartition(":")                      # with a .py file absolute
    rl.reward = f"{tasks_base.canonical(module)}:{fn}"
  prompts = _int(rl, "prompts", 1)
  d = run_lib.check_ema_decay(rl.ema_decay, "rl.ema_decay")
  try:
    settings = settings_lib.grpo_settings(rl)
    settings.validate(None)        # the settings alone (the reference's shape: in build)
    if not isinstance(settings.steps, int) or isinstance(settings.steps, bool) or settings.steps < 1:
      raise ValueError(f"rl.steps: must be an integer >= 1 (sampling steps per rollout), got "
                       f"{settings.steps!r}")
    if isinstance(settings.group_size, int) and settings.group_size >= 2:
      dp = run_lib.data_parallel(cfg)
      if (prompts * settings.group_size) % dp:
        raise ConfigError(f"rl.prompts: {prompts} prompts x rl.group_size {settings.group_size} "
                          f"rollouts must split evenly over the {dp} data-parallel devices "
                          f"(mesh.data * mesh.fsdp)")
    check_sampler(settings, task, mc)
  except ConfigError:
    raise
  except (ValueError, TypeError) as err:
    raise ConfigError(str(err) if str(err).startswith("rl.") else f"rl: {err}") from None
  return task, settings, prompts, d


def build(cfg, mc) -> "GRPOAlgorithm":
  """`check`, then the starting model and the algorithm."""
  task, settings, prompts, d = check(cfg, mc)
  model = run_lib.starting_model(cfg, mc, "rl")
  reference = load_reference(cfg, model)
  try:
    algorithm = GRPOAlgorithm(model, settings, task, reference, prompts=prompts,
                              ema_decay=float(d), seed=int(cfg.seed),
                              heldout=task.heldout(int(cfg.task.heldout_seed),
                                                   int(cfg.task.heldout_count)))
    first = task.train_batch(int(cfg.seed), 0, prompts)
    algorithm.trainer.check_prompts(first)
    grpo.check_finite(grpo.reward_values(algorithm.trainer.reward_fn, first["tokens"], first,
                                         task, "the reference answers of the first prompts",
                                         per_token=settings.credit == "token"),
                      settings.reward, "reference answer")
    solve_lib.check_puzzles(task, algorithm.heldout, eval_settings(settings, task))
  except ValueError as err:
    raise ConfigError(str(err) if str(err).startswith("rl.") else f"rl: {err}") from None
  return algorithm


def check_sampler(settings: grpo.GRPOSettings, task, mc) -> None:
  """The rollouts' and the held-out eval's sampler settings, checked as ``--mode=sample``
  checks its own, with the ``rl.*`` key that sets each named (not ``sample.*``). A method that
  records no log-probabilities is `grpo.GRPOSettings.validate`'s to refuse."""
  if settings.method not in sampler_lib.LOGP_METHODS:
    return
  try:
    for s in (settings.sample_settings(task.length), eval_settings(settings, task)):
      s.validate(mc)
      if s.method != "ar" and isinstance(s.order, str):
        try:
          prompts_lib.check_order(s.order, 1, s.length)
        except ValueError as err:
          raise ValueError(f"sample.order: {err}") from None
  except ValueError as err:
    msg = str(err)
    key = msg.split(":", 1)[0].removeprefix("sample.")
    if msg.startswith("sample.") and key in GRPO_KEYS:
      msg = msg.replace("(greedy=True for argmax decoding)", "(the rollouts are drawn at it; "
                        "the held-out eval decodes greedily)")
      raise ValueError(f"rl.{msg.removeprefix('sample.')}") from None
    raise ValueError(f"rl.method: the rollouts' sampler ({settings.method!r}, order "
                     f"{settings.order!r}, steps {settings.steps}) is refused: {msg}") from None


def eval_settings(settings: grpo.GRPOSettings, task):
  """The held-out eval's sampler: the rollouts' (method, order, steps), greedy."""
  return dataclasses.replace(settings.sample_settings(task.length), greedy=True)


class GRPOAlgorithm:
  """`run.Algorithm` for GRPO (module docstring)."""

  name = "rl"

  def __init__(self, model, settings: grpo.GRPOSettings, task, reference, *, prompts: int,
               ema_decay: float, seed: int, heldout: dict):
    self.model, self.settings, self.task = model, settings, task
    self.trainer = grpo.GRPO(model, settings, task=task, reference=reference)
    self.prompts, self.ema_decay, self.seed, self.heldout = prompts, ema_decay, seed, heldout
    self._eval_model = None
    self._ref_placed = False
    self.mesh = None   # set by the loop (run.run): the batch rows are sharded over it

  def init_opt_state(self, params):
    return self.trainer.tx.init(params)

  def update(self, params, opt_state, step: int, key):
    t = time.perf_counter()
    nnx.update(self.model, params)          # the rollouts sample with the current weights
    prompts = self.task.train_batch(self.seed, step, self.prompts)
    batch, rewards, puzzles = self.trainer.rollout_batch(key, prompts)
    solved = np.asarray(tasks_base.verify(self.task, batch["tokens"], puzzles,
                                          "the rollouts")["solved"], np.float64)
    t_rollout = time.perf_counter() - t
    t = time.perf_counter()
    if self.mesh is None:
      batch = jax.tree.map(jax.numpy.asarray, batch)
    else:   # the rows over the data axes (build checked that they split evenly)
      if self.trainer.ref_state is not None and not self._ref_placed:   # replicated, as params
        self.trainer.ref_state = jax.device_put(self.trainer.ref_state,
                                                sharding_lib.replicated(self.mesh))
        self._ref_placed = True
      batch = {k: jax.device_put(v, sharding_lib.batch_sharding(self.mesh, v.ndim))
               for k, v in batch.items()}
    params, opt_state, m = self.trainer.update(params, opt_state, batch, on_policy=True)
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    t_update = time.perf_counter() - t
    m.update(reward=float(rewards.mean()), reward_std=float(rewards.std()),
             solved=float(solved.mean()), **self.trainer.hint_metrics(),
             **grpo.timing(len(rewards), t_rollout, t_update))
    return params, opt_state, m

  def evaluate(self, params):
    if self._eval_model is None:
      self._eval_model = nnx.clone(self.model)   # not the policy: evaluated with EMA weights
    nnx.update(self._eval_model, params)
    s = eval_settings(self.settings, self.task)
    res = solve_lib.solve(self._eval_model, self.task, self.heldout, s,
                          key=jax.random.key(self.seed), batch_size=EVAL_BATCH, warm=False)
    sv = res.summary["solved"]
    out = {"solved": sv["rate"], "solved_low": sv["low"], "solved_high": sv["high"],
           "cell_accuracy": float(res.summary["cell_accuracy"])}
    line = (f"held-out solved {100 * out['solved']:.1f}% [{100 * out['solved_low']:.1f}, "
            f"{100 * out['solved_high']:.1f}] of {res.summary['rows']} puzzles, cell accuracy "
            f"{out['cell_accuracy']:.3f} ({decoding_label(s)})")
    return out, line

  def progress(self, means: dict[str, float]) -> str:
    parts = [f"reward {means['reward']:.3f} (std {means['reward_std']:.3f})",
             f"solved {100 * means['solved']:.1f}%", f"loss {means['loss']:.4f}"]
    if "kl" in means:
      parts.append(f"kl {means['kl']:.4f}")
    if "ratio_min" in means:     # measured unless the last inner step was on-policy
      parts += [f"clipped {100 * means['clipped']:.1f}%",
                f"ratio [{means['ratio_min']:.3f}, {means['ratio_max']:.3f}]"]
    parts.append(f"gnorm {means['grad_norm']:.3f}")
    if "rollout_sec" in means:    # absent on a line of the first (compiling) update alone
      parts.append(f"rollout {means['rollout_sec']:.2f}s ({means['rollouts_per_sec']:.0f}/s) "
                   f"update {means['update_sec']:.2f}s")
    else:
      parts.append("first update (compiling): not timed")
    return " | ".join(parts)

  def summary(self, last: dict[str, float]) -> str:
    out = f"last reward {last.get('rl/reward', float('nan')):.3f}"
    if "eval/solved" in last:
      out += f", held-out solved {100 * last['eval/solved']:.1f}%"
    return out


def rl_mode(cfg, workdir: str) -> dict[str, float]:
  """``--mode=rl``: GRPO from ``train.init_from`` with the ``rl`` group (module docstring)."""
  mc = config_lib.resolve(cfg)
  config_lib.check_task(cfg)   # a task's rows and verifier, before anything loads or compiles
  algorithm = build(cfg, mc)
  return run_lib.run(cfg, workdir, algorithm, mc=mc, mode="rl")


def decoding_label(s) -> str:
  """How the held-out eval decodes: an adaptive sampler names its policy (it ignores the
  order), the others their order."""
  how = f"policy {s.policy}" if s.method == "adaptive" else f"order {s.order}"
  return f"greedy {s.method}, {how}, {s.steps} steps"
