"""Post-training with exact likelihoods against estimated ones, on 6x6 Sudoku: one command.

    python benchmarks/post_training.py                    # CPU size (configs/sudoku.py:tiny)
    python benchmarks/post_training.py --size=accel       # one accelerator's size (9x9)
    python benchmarks/post_training.py --runs=exact --seeds=0 --lr=1e-4 --updates=30  # one probe

It trains (or reuses, in --workdir) a deliberately under-trained Sudoku AO-GPT (the config's
model and data, fewer steps, so that GRPO's own sampler starts with headroom), then:

* measures the held-out solved rate (95% Wilson interval) and cell accuracy with every decoding:
  a random order (the adaptive sampler's ``random`` policy, one cell per step) greedily and at
  temperature 1, the best fixed heuristics (max_prob; margin) likewise, and the stochastic order
  policy; and on the held-out puzzles that need search (``difficulty`` "search"), the policy's
  decodings and the fixed heuristics;
* audits the reward (`reward_audit`: training prompts with several solutions, valid rollouts
  that ``cell_accuracy`` scores below 1) and measures how much of one update's gradient is
  signal at the start (`gradient_signal`: GRPO's, per-cell credit's, the supervised one's);
* runs GRPO (`posttrain.grpo`, reward ``rule_cells`` by default, ``--reward``) on the training
  puzzles, for each seed (its training puzzles and rollout keys, the same for every likelihood)
  with EXACT per-token likelihoods, with d1's one-step mean-field estimate
  (`posttrain.estimators`, d1's 15% prompt masking) and with a Monte Carlo ELBO (4 random masks
  per rollout, the LLaDA / VRPO / SPG kind); then GRPO on the stochastic order policy
  (``order_policy``, and ``order_only``: the order's ratio alone; the first seed only: their
  cost). ``--runs`` also takes ``dr_grpo``, ``rloo``, ``token_credit`` (a reward per cell:
  the stored solution's digit), ``valid_credit`` (a reward per cell: any digit that breaks no
  rule), ``hinted`` (the solved reward, IGPO's hint for groups that fail everywhere) and
  ``supervised`` (a control: the supervised gradient on the same batches and
  optimizer). ``--sampler=max_prob_t0.7`` rolls out with the decoding one evaluates (max_prob,
  tokens at temperature 0.7) instead of a random order at 1; ``--hard_frac`` makes that share of
  the training puzzles minimal ones (many need search).
  The held-out rates at a few points along the way, against updates and wall time; each run's
  speed (seconds per compiled update, rollouts per second, the gradient update's share); per run
  and decoding, the final rates of every seed, their mean and how many seeds' intervals lie
  above the start's;
* on the same rollouts, the error of the mean-field estimate against the exact value: of the
  log-likelihood (per token, per sequence) at several numbers of tokens written per step, and
  of the log-ratio between the GRPO-trained policy and the starting one.

It writes benchmarks/results/post_training_SIZE[_NAME]/<machine>.json (every number, the
machine, the load average; ``--name`` for a partial protocol beside the full one), a Markdown
table and a PNG beside it, shown in docs/post_training.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import pathlib
import sys
import time

import common
import order_matters

# The starting model's training steps at CPU size: fewer than the config's 1,200, so that GRPO's
# own sampler (a random order, tokens at T = 1, as `recipes.rl_group` draws) starts with headroom:
# 29% of 500 held-out puzzles solved (50% greedily; max_prob greedy 98%).
TRAIN_STEPS_CPU = 250
SIZES = {
    "cpu": dict(size="cpu", train_steps=TRAIN_STEPS_CPU, updates=30, prompts=8, group=8,
                reward="rule_cells",
                lr=3e-5, eval_at=(15, 30), puzzles=500, error_rows=64, overrides={},
                sampler="random", runs=("exact", "mean_field", "elbo"), seeds=(0, 1, 2),
                first_seed_runs=("order_policy", "order_only"), grad_batches=16,
                search_pool=200_000),
    # one accelerator, meant for about 10 minutes (not yet run): 9x9 and the 8 x 256 model,
    # trained in chunks of 250 steps until a random order at T = 1 solves 20% of training
    # puzzles (at 3,500 steps max_prob solves every held-out one: no headroom), then the exact
    # sequence reward against the reward per cell
    "accel": dict(size="accel", train_steps=0, calibrate=(0.2, 250, 4000), updates=200,
                  prompts=16, group=16, lr=1e-4, reward="rule_cells",
                  eval_at=(50, 100, 150, 200), puzzles=500, error_rows=256, overrides={},
                  sampler="random", runs=("exact", "token_credit"), seeds=(0,),
                  grad_batches=4, search_pool=5000),
    # seconds: a one-layer model, a few updates, a handful of puzzles (tests/test_benchmarks.py)
    "test": dict(size="cpu", train_steps=2, updates=2, prompts=2, group=2, lr=1e-4, eval_at=(2,),
                 reward="rule_cells",
                 puzzles=4, error_rows=4, error_ends_only=True,
                 overrides={"model.n_layer": 1, "model.n_embd": 32, "model.n_head": 2,
                            "batch_size": 8, "eval.batch_size": 8},
                 sampler="max_prob", runs=("exact", "mean_field", "elbo", "order_policy"),
                 seeds=(0,), grad_batches=3, search_pool=2000, audit_prompts=8),
}
# calibrated starts (a size's ``calibrate``): puzzles of the training distribution, their seed
CALIBRATION, CALIBRATION_SEED = 200, 0x5EED
POLICY_TEMPERATURE = 0.1     # the stochastic order policy: softmax(max_prob scores / 0.1)
TOP_K = 5                    # the order head's candidates: max_prob's top 5 (UPO's)
# GRPO's sampler (token temperature 1, one cell per step): name -> GRPOSettings fields, and the
# held-out decodings measured along the way (greedy, and as GRPO draws).
SAMPLERS = {
    "random": (dict(method="adaptive", policy="random"),
               ("random order, greedy", "random order, T=1")),
    "max_prob": (dict(method="adaptive", policy="max_prob"), ("max_prob, greedy", "max_prob, T=1")),
    # the decoding one evaluates (max_prob), tokens below temperature 1 (issue: rollouts under
    # the evaluation decoding)
    "max_prob_t0.7": (dict(method="adaptive", policy="max_prob", temperature=0.7),
                      ("max_prob, greedy", "max_prob, T=0.7")),
}
# The GRPO runs: name -> GRPOSettings fields. Same seeds, prompts and rollout keys for each.
RUNS = {
    "exact": dict(likelihood="exact"),
    "mean_field": dict(likelihood="mean_field", prompt_mask=0.15),
    "elbo": dict(likelihood="elbo", elbo_samples=4),
    "dr_grpo": dict(likelihood="exact", scale_rewards=False, loss_norm="constant"),
    "rloo": dict(likelihood="exact", advantage="rloo", scale_rewards=False),
    "order_policy": dict(likelihood="exact", method="adaptive", policy="max_prob",
                         policy_temperature=POLICY_TEMPERATURE),
    # the order's choices alone in the ratio: the tokens get no credit (`GRPOSettings.order_only`)
    "order_only": dict(likelihood="exact", method="adaptive", policy="max_prob",
                       policy_temperature=POLICY_TEMPERATURE, order_only=True),
    # a reward per answer cell (right or not), advantages per cell over the group
    "token_credit": dict(likelihood="exact", reward="cell_correct", credit="token"),
    # a reward per cell that accepts any digit breaking no rule (not the stored solution's only)
    "valid_credit": dict(likelihood="exact", reward="cell_valid", credit="token"),
    # IGPO: the solved reward, and a group that fails everywhere gets one rollout given half the
    # answer (`GRPOSettings.hint`)
    "hinted": dict(likelihood="exact", reward="solved", hint=0.5),
    # UPO: a learned order head over max_prob's top-5 (`model.order_head`), drawn at tau = 0.05,
    # tokens at 0.8, a KL pull of 1e-4 toward max_prob; only the head moves (tokens frozen)
    "order_head": dict(likelihood="exact", method="adaptive", policy="max_prob",
                       policy_temperature=0.05, temperature=0.8, order_head=TOP_K,
                       head_kl=1e-4, head_only=True),
    # the same, the tokens trained too
    "order_head_tokens": dict(likelihood="exact", method="adaptive", policy="max_prob",
                              policy_temperature=0.05, temperature=0.8, order_head=TOP_K,
                              head_kl=1e-4),
    # a control, not GRPO: the same batches, orders and optimizer with the supervised gradient
    "supervised": dict(likelihood="exact"),
}
POLICY_DECODERS = ("max_prob, greedy", f"max_prob order at tau={POLICY_TEMPERATURE}, greedy")
HEAD_DECODERS = ("max_prob, greedy", "order head, greedy")   # a run with an order head
# the held-out puzzles that need search (`tasks.sudoku.difficulty`): the order policy against the
# fixed heuristics there, at the start and after each run (the order head's, where it has one)
SEARCH_DECODERS = (*POLICY_DECODERS, "margin, greedy", HEAD_DECODERS[1])


def decoders(n: int) -> dict[str, dict]:
  """Held-out decodings, one cell per step: a random order and the best fixed heuristic
  (max_prob: the cell the model is surest of), greedily and at token temperature 1, margin
  greedily, and the stochastic order policy's orders with greedy tokens."""
  return {"random order, greedy": dict(method="adaptive", policy="random", steps=n, greedy=True),
          "random order, T=1": dict(method="adaptive", policy="random", steps=n),
          "max_prob, greedy": dict(method="adaptive", policy="max_prob", steps=n, greedy=True),
          "max_prob, T=1": dict(method="adaptive", policy="max_prob", steps=n),
          "max_prob, T=0.7": dict(method="adaptive", policy="max_prob", steps=n, temperature=0.7),
          "margin, greedy": dict(method="adaptive", policy="margin", steps=n, greedy=True),
          POLICY_DECODERS[1]: dict(method="adaptive", policy="max_prob", steps=n, greedy=True,
                                   policy_temperature=POLICY_TEMPERATURE),
          # the order head's best choice each step (max_prob's top 5 re-scored), greedy tokens
          HEAD_DECODERS[1]: dict(method="adaptive", policy="max_prob", steps=n, greedy=True,
                                 order_head=True)}


def evaluate(model, task, puzzles, seed: int, which=None) -> dict:
  import jax
  from aogpt_jax.evaluation import solve as solve_lib
  from aogpt_jax.model import order_head as order_head_lib
  from aogpt_jax.sampling import SampleSettings
  out = {}
  for name, fields in decoders(task.length).items():
    if which is not None and name not in which:
      continue
    if fields.get("order_head") and order_head_lib.head_of(model) is None:
      continue
    res = solve_lib.solve(model, task, puzzles, SampleSettings(length=task.length, **fields),
                          key=jax.random.key(seed), batch_size=len(puzzles["tokens"]),
                          warm=False)
    out[name] = {"solved": res.summary["solved"], "cell_accuracy": res.summary["cell_accuracy"]}
  return out


def run_grpo(start: str, task, puzzles, name: str, cfg: dict, args, seed: int,
             search=None) -> dict:
  """GRPO run ``name`` (`RUNS`) from the model in ``start`` with ``seed`` (its training prompts
  and rollout keys: the same for every run of that seed); held-out rates at ``cfg.eval_at``
  (every decoding at the last, else the ones of the run's sampler; at the last also the
  ``search`` puzzles with `SEARCH_DECODERS`)."""
  import jax
  import aogpt_jax
  from aogpt_jax import tasks
  from aogpt_jax.posttrain import grpo
  model, _ = aogpt_jax.load(start)
  sampler, along = SAMPLERS[cfg["sampler"]]
  settings = grpo.GRPOSettings(group_size=cfg["group"], lr=cfg["lr"], steps=task.length,
                               **{"reward": cfg["reward"], **sampler, **RUNS[name]})
  along = (HEAD_DECODERS if settings.order_head else POLICY_DECODERS if settings.trains_order
           else along)
  hard = getattr(args, "hard_frac", 0.0)    # the training prompts: that share minimal puzzles
  trainer = grpo.GRPO(model, settings, task=tasks.make(task.name, **{**task.options(),
                                                                    "hard_frac": hard}))
  curve, evals, train_s = [], [], 0.0
  for u in range(cfg["updates"]):
    prompts = trainer.task_prompts(seed=seed, index=u, count=cfg["prompts"])
    t0 = time.perf_counter()
    m = trainer.step(jax.random.fold_in(jax.random.key(seed), u), prompts,
                     functools.partial(supervised_batch, trainer) if name == "supervised" else None)
    train_s += time.perf_counter() - t0
    curve.append({"update": u + 1, "train_s": train_s, **m})
    if u + 1 in cfg["eval_at"]:
      last = u + 1 == cfg["updates"]
      ev = evaluate(model, task, puzzles, seed, None if last else along)
      if last and search is not None:
        ev["search"] = evaluate(model, task, search, seed, SEARCH_DECODERS)
      evals.append({"update": u + 1, "train_s": train_s, "load_avg_1m": common.load_avg_1m(),
                    **ev})
      line = ", ".join(f"{k} {100 * v['solved']['rate']:.1f}%" for k, v in ev.items()
                       if k != "search")
      print(f"[{name}, seed {seed}] update {u + 1}: reward {m['reward']:.3f}; held-out solved: {line} "
            f"({train_s:.0f} s)", flush=True)
  return {"name": name, "seed": seed, "likelihood": settings.likelihood, "settings": {k: v for k, v in vars(settings).items() if k != "reward"},
          "reward": settings.reward, "curve": curve, "evals": evals, "train_s": train_s,
          "speed": speed(curve), "model": model}


def supervised_batch(trainer, batch: dict, puzzles: dict) -> dict:
  """``batch`` (`GRPO.rollout_batch`'s) with the reference answers in the rollouts' orders,
  their current log-likelihood as the old one and advantage 1: the update follows the
  supervised gradient (minus the mean log-likelihood) at ratio 1."""
  import numpy as np
  batch = dict(batch, tokens=np.asarray(puzzles["tokens"], np.int32))
  batch["old_logp"] = np.asarray(trainer.estimate_logp(
      {f: batch[f] for f in ("tokens", "order", "steps", "prompt")}))
  batch["adv"] = np.ones(len(batch["tokens"]), np.float32)
  return batch


def speed(curve: list[dict]) -> dict:
  """Medians over the compiled updates (all but the first): seconds per update (rollouts and
  gradient updates), rollouts per second of sampling, the gradient update's share."""
  import numpy as np
  rows = curve[1:] or curve
  med = lambda k: float(np.median([r[k] for r in rows]))  # noqa: E731
  return {"sec_per_update": float(np.median([r["rollout_sec"] + r["update_sec"] for r in rows])),
          "rollouts_per_sec": med("rollouts_per_sec"), "update_share": med("update_share"),
          "first_update_sec": curve[0]["rollout_sec"] + curve[0]["update_sec"],
          "updates": len(rows)}


def gradient_signal(model, task, cfg: dict, seed: int) -> dict:
  """How much of one update's gradient is signal, at the start. ``cfg.grad_batches`` independent
  batches of the protocol's size (new training prompts and rollout keys each) at the same
  weights; with g_i = mu + noise_i, the mean of g_i . g_j over pairs i != j estimates |mu|^2 and
  the mean of |g_i|^2 estimates |mu|^2 + E|noise|^2: their ratio is the share of one batch's
  squared gradient that is signal (0: pure noise; a batch B times larger has about B times the
  share while it is small), with a jackknife standard error over the batches. For GRPO's own
  gradient (the protocol's reward, one per rollout), per-token credit (``cell_correct``,
  ``credit="token"``) and the supervised gradient: the reference answers in the rollouts'
  orders, the direction SFT on the same puzzles would follow."""
  import jax
  import numpy as np
  from flax import nnx
  from aogpt_jax.posttrain import grpo
  sampler = SAMPLERS[cfg["sampler"]][0]
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params = nnx.to_pure_dict(params)
  out = {}
  for name, kw in (("grpo", dict(reward=cfg["reward"])),
                   ("token_credit", dict(reward="cell_correct", credit="token")),
                   ("supervised", dict(reward=cfg["reward"]))):
    trainer = grpo.GRPO(model, grpo.GRPOSettings(group_size=cfg["group"], steps=task.length,
                                                 **sampler, **kw), task=task)
    width = trainer.answer_width(task.length) if model.cfg.blank_block else None
    grad = jax.jit(jax.grad(lambda p, b: grpo.grpo_loss(nnx.merge(graphdef, p, rest), b,
                                                        clip_eps=0.2, width=width)[0]))
    flat = []
    for k in range(cfg["grad_batches"]):
      batch, _, puzzles = trainer.rollout_batch(
          jax.random.fold_in(jax.random.key(seed + 11), k),
          trainer.task_prompts(seed=seed + 11, index=k, count=cfg["prompts"]))
      if name == "supervised":     # ratio 1, advantage 1: minus the mean log-likelihood
        batch = supervised_batch(trainer, batch, puzzles)
      g = grad(params, batch)
      flat.append(np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(g)]))
    dots = np.stack(flat) @ np.stack(flat).T
    out[name] = {**_signal_share(dots), "rollouts_per_batch": cfg["prompts"] * cfg["group"]}
    print(f"[gradient] {name}: signal share of one batch {out[name]['share']:+.4f} "
          f"+- {out[name]['share_se']:.4f} (mean cosine between batches "
          f"{out[name]['mean_cos']:+.4f})", flush=True)
  return out


def _signal_share(dots) -> dict:
  """`gradient_signal`'s share from the Gram matrix of K gradients, its jackknife standard
  error, and the mean cosine between batches."""
  import numpy as np
  k = len(dots)

  def share(idx):
    d = dots[np.ix_(idx, idx)]
    off = d[~np.eye(len(idx), dtype=bool)]
    return off.mean() / np.diag(d).mean()

  full = share(np.arange(k))
  loo = np.array([share(np.delete(np.arange(k), i)) for i in range(k)])
  norm = np.sqrt(np.diag(dots))
  cos = (dots / np.outer(norm, norm))[~np.eye(k, dtype=bool)]
  se = np.sqrt((k - 1) / k * ((loo - loo.mean()) ** 2).sum())
  return {"share": float(full), "share_se": float(se), "mean_cos": float(cos.mean()),
          "batches": int(k)}


def _stats(x) -> dict:
  import numpy as np
  x = np.asarray(x, np.float64)
  return {"mean": float(x.mean()), "std": float(x.std()), "mean_abs": float(np.abs(x).mean()),
          "p5": float(np.percentile(x, 5)), "p95": float(np.percentile(x, 95)),
          "count": int(x.size)}


def estimator_error(start_model, new_model, task, cfg: dict, args) -> dict:
  """On rollouts of the starting model (training puzzles) written at several numbers of tokens
  per step: mean-field minus exact, per token and per sequence, of the log-likelihood (under the
  starting model) and of the log-ratio (trained / starting model; exact GRPO's trained model)."""
  import jax
  import numpy as np
  from aogpt_jax.model import orders as orders_lib
  from aogpt_jax.posttrain import estimators, likelihood
  from aogpt_jax.sampling import SampleSettings, generate
  puzzles = task.train_batch(args.seed + 1, 0, cfg["error_rows"])
  toks = np.where(puzzles["prompt"], puzzles["tokens"], 0).astype(np.int32)
  prompt = np.asarray(puzzles["prompt"])
  scored = np.asarray(orders_lib.scored_ranks(prompt))
  key = jax.random.key(args.seed + 7)
  keep = estimators.prompt_keep(jax.random.key(args.seed + 8), prompt, 0.15)
  exact_fn = jax.jit(likelihood.sequence_logp)
  mf_fn = jax.jit(lambda m, t, o, p, k: estimators.mean_field_logp(m, t, o, p, keep=k))
  rows = []
  n = task.length                  # steps count the answer's: n is one token per step
  # error_ends_only (the test size): only one token per step and the whole answer in one step
  for steps in sorted({max(1, n // k) for k in ((1, n) if cfg.get("error_ends_only") else
                                                (1, 4, 8, 16, n))}):
    out = generate(start_model, key, SampleSettings(length=task.length, steps=steps,
                                                    method="adaptive", policy="random"),
                   prompt=(toks, prompt), return_logp=True)
    t, o, s = out.tokens, out.order, out.step_of_rank
    ex_old, ex_new = (np.asarray(exact_fn(m, t, o, s, prompt)) for m in (start_model, new_model))
    mf_old, mf_new = (np.asarray(mf_fn(m, t, o, prompt, None)) for m in (start_model, new_model))
    mfk_old = np.asarray(mf_fn(start_model, t, o, prompt, keep))
    written = np.array([len(np.unique(s[b][scored[b]])) for b in range(len(s))])
    per_step = scored.sum(1) / written
    err_tok = (mf_old - ex_old)[scored]
    lr_err_tok = ((mf_new - mf_old) - (ex_new - ex_old))[scored]
    seq = lambda x: np.where(scored, x, 0.0).sum(1)  # noqa: E731
    ex_ratio, mf_ratio = seq(ex_new - ex_old), seq(mf_new - mf_old)
    rows.append({
        "steps": int(steps), "tokens_per_step": float(per_step.mean()),
        "recorded_vs_exact_max": float(np.abs(out.model_logp - ex_old)[scored].max()),
        "exact_token_logp_mean": float(ex_old[scored].mean()),
        "mean_field_token_logp_mean": float(mf_old[scored].mean()),
        "logp_error_token": _stats(err_tok),
        "logp_error_sequence": _stats(seq(mf_old - ex_old)),
        "logp_error_token_prompt_mask_0.15": _stats((mfk_old - ex_old)[scored]),
        "log_ratio_error_token": _stats(lr_err_tok),
        "log_ratio_error_sequence": _stats(mf_ratio - ex_ratio),
        "log_ratio_exact_sequence": _stats(ex_ratio),
        "log_ratio_sign_agreement": float(np.mean(np.sign(ex_ratio) == np.sign(mf_ratio))),
        "log_ratio_correlation": (float(np.corrcoef(ex_ratio, mf_ratio)[0, 1])
                                  if ex_ratio.std() > 0 and mf_ratio.std() > 0 else None),
        "histogram_token_error": np.histogram(err_tok, bins=40)[0].tolist(),
        "histogram_edges": np.histogram(err_tok, bins=40)[1].tolist(),
    })
    e = rows[-1]
    print(f"[error] {steps} steps ({per_step.mean():.1f} tokens/step): mean-field - exact per "
          f"token {e['logp_error_token']['mean']:+.3f} +- {e['logp_error_token']['std']:.3f}; "
          f"log-ratio per sequence {e['log_ratio_error_sequence']['mean']:+.3f} +- "
          f"{e['log_ratio_error_sequence']['std']:.3f}", flush=True)
  return {"rows": cfg["error_rows"], "by_steps": rows}


COLORS = {"exact": "tab:blue", "mean_field": "tab:orange", "order_policy": "tab:green",
          "elbo": "tab:red", "dr_grpo": "tab:purple", "rloo": "tab:brown",
          "order_only": "tab:olive", "token_credit": "tab:cyan", "supervised": "tab:gray",
          "valid_credit": "tab:pink", "hinted": "gold", "order_head": "darkgreen",
          "order_head_tokens": "navy"}
LABELS = {"exact": "GRPO, exact likelihood", "mean_field": "GRPO, d1 mean-field estimate",
          "elbo": "GRPO, Monte Carlo ELBO (M = 4 masks)", "dr_grpo": "Dr. GRPO, exact",
          "rloo": "RLOO advantages, exact",
          "order_policy": f"GRPO, stochastic max_prob order (tau={POLICY_TEMPERATURE}), exact",
          "order_only": f"GRPO, the order's ratio alone (tau={POLICY_TEMPERATURE})",
          "token_credit": "GRPO, per-cell credit (cell_correct), exact",
          "valid_credit": "GRPO, per-cell credit (cell_valid: any digit breaking no rule), exact",
          "hinted": "GRPO, solved reward, half the answer hinted to groups that all fail (IGPO)",
          "order_head": f"GRPO, an order head over max_prob's top {TOP_K} (UPO), head only",
          "order_head_tokens": f"GRPO, an order head over max_prob's top {TOP_K}, tokens too",
          "supervised": "control: the supervised gradient on the same batches"}


def _curve(ax, res: dict, dec: str, names, style="o-") -> None:
  b = res["before"][dec]["solved"]
  for run in res["grpo"]:
    if run["name"] not in names:
      continue
    pts = [(0, b)] + [(e["update"], e[dec]["solved"]) for e in run["evals"] if dec in e]
    x = [p[0] for p in pts]
    first = run["seed"] == res["size"]["seeds"][0]
    ax.plot(x, [100 * p[1]["rate"] for p in pts], style, color=COLORS[run["name"]],
            label=f"{LABELS[run['name']]}: {dec} (each line a seed)" if first else None)
    if first:             # one seed's interval: the others' are as wide
      ax.fill_between(x, [100 * p[1]["low"] for p in pts], [100 * p[1]["high"] for p in pts],
                      color=COLORS[run["name"]], alpha=0.12)


def plot(res: dict, path: pathlib.Path, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(2, 2, figsize=(15, 11))
  along = SAMPLERS[res["size"]["sampler"]][1]
  # every run but the order policies' (their own decodings are drawn apart, below)
  names = [r["name"] for r in res["grpo"] if r["name"] not in ("order_policy", "order_only")]
  for ax, dec in zip(axes[0], along):
    _curve(ax, res, dec, names)
    ax.set_title(f"GRPO runs, held out: {dec}")
    ax.set_xlabel("GRPO updates")
    ax.set_ylabel("held-out puzzles solved (%), 95% interval")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
  ax = axes[1, 0]
  decs = list(res["before"])
  agg = res["findings"]["over_seeds"]
  names = list(dict.fromkeys(r["name"] for r in res["grpo"]))
  rows = [("start", {d: (res["before"][d]["solved"]["rate"], res["before"][d]["solved"]["low"],
                         res["before"][d]["solved"]["high"]) for d in decs})]
  # a decoding a run was not measured with (the order head's, without a head): no bar
  none = (float("nan"),) * 3
  rows += [(name, {d: (agg[f"{name}: {d}"]["mean"], agg[f"{name}: {d}"]["min"],
                       agg[f"{name}: {d}"]["max"]) if f"{name}: {d}" in agg else none
                   for d in decs}) for name in names]
  width = 0.8 / len(rows)
  for i, (name, ev) in enumerate(rows):
    y = [k + (i - (len(rows) - 1) / 2) * width for k in range(len(decs))]
    rate = [100 * ev[d][0] for d in decs]
    err = [[max(0.0, 100 * (ev[d][0] - ev[d][1])) if ev[d][0] == ev[d][0] else 0.0
            for d in decs],
           [max(0.0, 100 * (ev[d][2] - ev[d][0])) if ev[d][0] == ev[d][0] else 0.0
            for d in decs]]
    ax.barh(y, rate, height=width, xerr=err, capsize=2, color=COLORS.get(name, "tab:gray"),
            label=name if name == "start" else LABELS[name])
  ax.set_yticks(list(range(len(decs))), decs)
  ax.invert_yaxis()
  ax.set_xlabel("held-out puzzles solved (%): start with its 95% interval; after GRPO the "
                "mean over seeds, min to max")
  ax.set_title(f"every decoding, before and after {res['size']['updates']} updates "
               f"({len(res['size']['seeds'])} seed{'s' if len(res['size']['seeds']) > 1 else ''})")
  ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
  ax = axes[1, 1]
  err = res["estimator_error"]["by_steps"]
  err_run = res["grpo"][0]["name"]      # the model `estimator_error` compares
  x = [r["tokens_per_step"] for r in err]
  for key, label, color in (("logp_error_token", "log-likelihood (start model)", "tab:red"),
                            ("log_ratio_error_token",
                             f"log-ratio ({err_run}-GRPO model / start)",
                             "tab:purple")):
    ax.errorbar(x, [r[key]["mean"] for r in err], yerr=[r[key]["std"] for r in err], fmt="o-",
                color=color, capsize=3, label=f"{label}, per token: mean +- std")
  ax.axhline(0, color="gray", lw=0.8)
  ax.set_xscale("log")
  ax.set_xlabel("answer tokens written per step (mean; log scale)")
  ax.set_ylabel("mean-field minus exact (nats)")
  ax.set_title("error of d1's mean-field estimate on the same rollouts")
  ax.legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  print(f"wrote {path}", flush=True)


def markdown(res: dict, machine: dict) -> str:
  pct = lambda s: f"{100 * s['rate']:.1f}% ({100 * s['low']:.1f}-{100 * s['high']:.1f}%)"  # noqa: E731
  decs = list(res["before"])
  lines = ["| model | updates | GRPO s | " + " | ".join(f"solved, {d}" for d in decs)
           + " | cell accuracy, random order greedy |", "|---|---|---|" + "---|" * len(decs)
           + "---|"]
  b = res["before"]
  cal = res["train"].get("calibration")
  steps = (f"{res['train']['total_steps']} training steps" if not cal else
           f"{res['train']['total_steps']} training steps, calibrated: "
           + ", ".join(f"{s} -> {100 * r:.0f}%" for s, r in cal))
  lines.append(f"| start ({steps}) | 0 | 0 | "
               + " | ".join(pct(b[d]["solved"]) for d in decs)
               + f" | {100 * b[decs[0]]['cell_accuracy']:.1f}% |")
  for run in res["grpo"]:
    for e in run["evals"]:
      cell = f"{100 * e[decs[0]]['cell_accuracy']:.1f}%" if decs[0] in e else ""
      lines.append(f"| GRPO, {run['name']}, seed {run['seed']} | {e['update']} | "
                   f"{e['train_s']:.0f} | "
                   + " | ".join(pct(e[d]["solved"]) if d in e else "" for d in decs)
                   + f" | {cell} |")
  lines += ["", "| tokens per step | mean-field - exact, log p per token | per sequence "
            "| log-ratio error per token | per sequence | sign agreement of the log-ratio |",
            "|---|---|---|---|---|---|"]
  f = lambda s: f"{s['mean']:+.3f} +- {s['std']:.3f}"  # noqa: E731
  for r in res["estimator_error"]["by_steps"]:
    lines.append(f"| {r['tokens_per_step']:.1f} | {f(r['logp_error_token'])} | "
                 f"{f(r['logp_error_sequence'])} | {f(r['log_ratio_error_token'])} | "
                 f"{f(r['log_ratio_error_sequence'])} | {100 * r['log_ratio_sign_agreement']:.0f}% |")
  lines += ["", "| GRPO run, decoding | start | after, each seed | mean over seeds | seeds "
            "whose interval lies above the start's |", "|---|---|---|---|---|"]
  for key, a in res["findings"]["over_seeds"].items():
    lines.append(f"| {key} | {100 * a['before']:.1f}% | "
                 + ", ".join(f"{100 * x:.1f}%" for x in a["after"])
                 + f" | {100 * a['mean']:.1f}% ({100 * a['mean_gain']:+.1f}) | "
                 f"{a['seeds_beyond_interval']} of {a['seeds']} |")
  if res.get("gradient_signal"):
    lines += ["", "| gradient at the start | signal share of one batch (+- jackknife s.e.) | "
              "mean cosine between batches | batches x rollouts |", "|---|---|---|---|"]
    for name, g in res["gradient_signal"].items():
      lines.append(f"| {name} | {g['share']:+.4f} +- {g['share_se']:.4f} | {g['mean_cos']:+.4f} "
                   f"| {g['batches']} x {g['rollouts_per_batch']} |")
  audit = res.get("reward_audit")
  if audit:
    lines += ["", f"Of {audit['prompts']} training prompts, "
              f"{100 * audit['several_solutions']:.0f}% have several solutions; rollouts "
              f"that are valid solutions which `cell_accuracy` scores below 1 (another "
              f"solution than the stored one): "
              f"{100 * audit['T=1']['solved_but_cell_accuracy_below_1']:.1f}% at T = 1 "
              f"({100 * audit['T=1']['solved']:.1f}% solved), "
              f"{100 * audit['greedy']['solved_but_cell_accuracy_below_1']:.1f}% greedily "
              f"({100 * audit['greedy']['solved']:.1f}% solved)."]
  if res.get("search_before"):
    sdecs = [d for d in SEARCH_DECODERS if d in res["search_before"]]
    lines += ["", f"| on the {res['search_puzzles']} held-out puzzles that need search | "
              + " | ".join(sdecs) + " |", "|---|" + "---|" * len(sdecs)]
    lines.append("| start | " + " | ".join(pct(res["search_before"][d]["solved"])
                                           for d in sdecs) + " |")
    for run in res["grpo"]:
      e = run["evals"][-1].get("search")
      if e:
        lines.append(f"| GRPO, {run['name']}, seed {run['seed']} | "
                     + " | ".join(pct(e[d]["solved"]) if d in e else "" for d in sdecs) + " |")
  lines += ["", "| GRPO run | s per update (median, compiled) | rollouts/s | gradient update's share |",
            "|---|---|---|---|"]
  for run in res["grpo"]:
    sp = run["speed"]
    lines.append(f"| {run['name']}, seed {run['seed']} | {sp['sec_per_update']:.2f} | "
                 f"{sp['rollouts_per_sec']:.0f} | {100 * sp['update_share']:.0f}% |")
  lines.append("")
  lines.append(f"{machine['cores']}-core {machine['cpu']}"
               f"{' with ' + machine['accelerator'] if machine.get('accelerator') else ''}; "
               f"{res['wall_s'] / 60:.0f} min for this command, load average "
               f"{res['load_avg_1m_start']:.1f} at the start, {res['load_avg_1m_end']:.1f} at "
               f"the end.")
  return "\n".join(lines) + "\n"


def start_run(cfg: dict, args) -> tuple[pathlib.Path, dict]:
  """Trains (or reuses) the starting model in --workdir: the size's ``train_steps``, or with its
  ``calibrate`` = (least rate, chunk, most steps) chunks of that many steps until GRPO's own
  sampler (the size's, tokens at T = 1) solves at least the least rate of ``CALIBRATION`` (the
  size's ``calibration_puzzles``) training-distribution puzzles (never the held-out ones; one
  may have several solutions: any valid grid counts), so that GRPO starts with headroom on any
  device. The rates are kept with the run after every chunk: an interrupted calibration goes on
  where it stopped, a finished one is reused. Returns (the run's folder, its training record
  with ``total_steps`` and, calibrated, ``calibration``: [steps, rate] per chunk)."""
  calib = cfg.get("calibrate")
  wd = pathlib.Path(args.workdir) / (f"sudoku-{args.size}-start-" +
                                     ("auto" if calib else str(cfg["train_steps"])))
  print(f"training (or reusing) the starting model in {wd}", flush=True)
  if not calib:
    train = order_matters.train("sudoku", cfg["size"], "", wd, cfg["train_steps"],
                                cfg["overrides"])
    return wd, {**train, "total_steps": cfg["train_steps"]}
  record = wd / "post_training_calibration.json"
  done = json.loads(record.read_text()) if record.exists() else {"calibration": [], "train_s": 0.0}
  if done.get("done"):
    return wd, {**done, "reused": True}
  import aogpt_jax
  from aogpt_jax import tasks
  least, chunk, most = calib
  count = cfg.get("calibration_puzzles", CALIBRATION)
  decoder = SAMPLERS[cfg["sampler"]][1][1]
  rates, train_s = done["calibration"], done["train_s"]
  steps = rates[-1][0] if rates else 0
  while not rates or (rates[-1][1] < least and steps < most):
    steps = min(steps + chunk, most)
    t = order_matters.train("sudoku", cfg["size"], "", wd, steps, cfg["overrides"])
    train_s += t.get("train_s") or 0.0
    model, run_cfg = aogpt_jax.load(str(wd))
    task = tasks.make(run_cfg.task.name, **run_cfg.task.options.to_dict())
    ev = evaluate(model, task, task.train_batch(CALIBRATION_SEED, 0, count), 0, (decoder,))
    rates.append([steps, ev[decoder]["solved"]["rate"]])
    print(f"[calibration] {steps} steps: {decoder} solves {100 * rates[-1][1]:.1f}% of {count} "
          f"training puzzles", flush=True)
    common.write_json(record, {**t, "total_steps": steps, "train_s": train_s,
                               "calibration": rates, "calibrate": list(calib), "done": False})
  train = {**json.loads(record.read_text()), "done": True}
  common.write_json(record, train)
  return wd, {**train, "reused": False}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", choices=sorted(SIZES), default="cpu")
  p.add_argument("--workdir", default="/tmp/aogpt_post_training",
                 help="the starting model's run (trained there, reused when already trained)")
  p.add_argument("--updates", type=int, default=0, help="GRPO updates (0: the size's)")
  p.add_argument("--sampler", choices=sorted(SAMPLERS), default="",
                 help="GRPO's sampler (default: the size's)")
  p.add_argument("--runs", default="", help="comma-separated GRPO runs of " + ", ".join(RUNS)
                 + " (default: the size's)")
  p.add_argument("--lr", type=float, default=0.0, help="GRPO's learning rate (0: the size's)")
  p.add_argument("--reward", default="", help="GRPO's sequence reward (default: the size's, "
                 "rule_cells; cell_accuracy scores other solutions than the stored one below 1)")
  p.add_argument("--hard_frac", type=float, default=0.0,
                 help="the share of GRPO's training puzzles that are minimal (the Sudoku task's "
                 "hard_frac: many need search), the rest random givens as the start's")
  p.add_argument("--prompts", type=int, default=0,
                 help="training puzzles per update (0: the size's; x the group's 8 rollouts)")
  p.add_argument("--seeds", default=None, help="comma-separated GRPO seeds (training prompts and "
                 "rollout keys; default: the size's); the first also seeds the evaluations")
  p.add_argument("--name", default="", help="results go to benchmarks/results/"
                 "post_training_SIZE_NAME/ (a partial protocol beside the full one)")
  p.add_argument("--out", default="", help="the JSON (default: benchmarks/results/...)")
  p.add_argument("--redraw", default="", help="a result JSON: recompute its findings, Markdown "
                 "and PNG from its numbers (nothing runs)")
  args = p.parse_args(argv)
  if args.redraw:
    return redraw(args.redraw)
  common.check_args(p, args, nonnegative=("updates", "lr", "prompts"))
  if not 0.0 <= args.hard_frac <= 1.0:
    common.fail(p, f"--hard_frac={args.hard_frac!r}: expected a number in [0, 1]")
  if args.seeds is not None and not args.seeds.strip():
    common.fail(p, "--seeds='': names no seed; expected comma-separated integers (or leave it "
                   "out: the size's seeds)")
  if args.reward:
    from aogpt_jax.posttrain import grpo
    try:
      grpo.get_reward(args.reward)
    except ValueError as e:
      common.fail(p, f"--reward={args.reward!r}: {str(e).split(': ', 1)[-1]}")
  logging.getLogger().setLevel(logging.WARNING)
  cfg = dict(SIZES[args.size])
  cfg["sampler"] = args.sampler or cfg["sampler"]
  cfg["runs"] = tuple(args.runs.split(",")) if args.runs else cfg["runs"]
  if args.runs:                                # exactly these runs, with every seed
    cfg["first_seed_runs"] = ()
  cfg["lr"] = args.lr or cfg["lr"]
  cfg["reward"] = args.reward or cfg["reward"]
  cfg["prompts"] = args.prompts or cfg["prompts"]
  try:
    cfg["seeds"] = (tuple(int(x) for x in args.seeds.split(",")) if args.seeds is not None
                    else cfg["seeds"])
    args.seeds = args.seeds or ""      # recorded as before (""): the size's seeds
  except ValueError:
    p.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
  args.seed = cfg["seeds"][0]
  unknown = [r for r in cfg["runs"] if r not in RUNS]
  if unknown or not cfg["runs"]:
    p.error(f"--runs: expected some of {', '.join(RUNS)}, got {args.runs!r}")
  if args.updates:
    cfg["updates"] = args.updates
    cfg["eval_at"] = tuple(sorted({max(1, args.updates * k // 4) for k in (1, 2, 3, 4)}))
  load0, t0 = common.load_avg_1m(), time.perf_counter()
  import aogpt_jax
  from aogpt_jax import tasks
  wd, train = start_run(cfg, args)
  start_model, run_cfg = aogpt_jax.load(str(wd))
  task = tasks.make(run_cfg.task.name, **run_cfg.task.options.to_dict())
  puzzles = task.heldout(int(run_cfg.task.heldout_seed), cfg["puzzles"])
  before = evaluate(start_model, task, puzzles, args.seed)
  for k, v in before.items():
    print(f"before: {k}: solved {100 * v['solved']['rate']:.1f}% "
          f"({100 * v['solved']['low']:.1f}-{100 * v['solved']['high']:.1f}%), cell accuracy "
          f"{100 * v['cell_accuracy']:.1f}%", flush=True)
  search = search_puzzles(task, int(run_cfg.task.heldout_seed), cfg["search_pool"])
  search_before = None if search is None else evaluate(start_model, task, search, args.seed,
                                                        SEARCH_DECODERS)
  for k, v in (search_before or {}).items():
    print(f"before, the {len(search['tokens'])} search puzzles: {k}: solved "
          f"{100 * v['solved']['rate']:.1f}%", flush=True)
  grad = gradient_signal(start_model, task, cfg, args.seed) if cfg["grad_batches"] else None
  audit = reward_audit(start_model, task, cfg, args.seed, cfg.get("audit_prompts", 400))
  # runs x seeds, then the costly first_seed_runs (the order policy) with the first seed only
  runs = [run_grpo(str(wd), task, puzzles, name, cfg, args, seed, search)
          for seed in cfg["seeds"] for name in cfg["runs"]]
  runs += [run_grpo(str(wd), task, puzzles, name, cfg, args, cfg["seeds"][0], search)
           for name in cfg.get("first_seed_runs", ()) if name not in cfg["runs"]]
  error = estimator_error(start_model, runs[0].pop("model"), task, cfg, args)   # the first run's
  for r in runs:
    r.pop("model", None)
  wall = time.perf_counter() - t0
  res = {"task": task.name, "options": task.options(), "length": task.length,
         "puzzles": cfg["puzzles"], "heldout_seed": int(run_cfg.task.heldout_seed),
         "size": cfg, "train": train, "before": before, "grpo": runs, "estimator_error": error,
         "search_puzzles": 0 if search is None else len(search["tokens"]),
         "search_before": search_before, "gradient_signal": grad, "reward_audit": audit,
         "wall_s": wall, "load_avg_1m_start": load0, "load_avg_1m_end": common.load_avg_1m(),
         "total_s": None if train.get("train_s") is None else (
             wall + (train["train_s"] if train["reused"] else 0.0)),
         "command": " ".join(["python", "benchmarks/post_training.py", *(argv or sys.argv[1:])])}
  res["findings"] = findings(head_start(res))
  bench = f"post_training_{args.size}" + (f"_{args.name}" if args.name else "")
  path = common.write_result(bench, args, res, out=args.out or None)
  draw(res, path, common.machine())
  print(res["findings"], flush=True)


def draw(res: dict, path: pathlib.Path, machine: dict) -> None:
  """The Markdown table and the PNG beside the JSON at ``path``."""
  path.with_suffix(".md").write_text(markdown(res, machine))
  size = res["options"]["size"]
  plot(res, path.with_suffix(".png"),
       f"GRPO on {size}x{size} Sudoku: "
       f"{', '.join(dict.fromkeys(r['name'] for r in res['grpo']))} ({machine['slug']}, "
       f"{res['wall_s'] / 60:.0f} min)")


def head_start(res: dict) -> dict:
  """``res`` with the order head's decoding at the start where a run trains a head: a new head
  decodes exactly as max_prob (its output starts at zero; tests/test_order_head.py), so its start
  is max_prob's, recorded as such (``same_as``)."""
  if any(r["settings"].get("order_head") for r in res["grpo"]):
    for key in ("before", "search_before"):
      if res.get(key) and HEAD_DECODERS[1] not in res[key]:
        res[key][HEAD_DECODERS[1]] = dict(res[key][HEAD_DECODERS[0]], same_as=HEAD_DECODERS[0])
  return res


def redraw(path: str) -> None:
  """``--redraw=JSON``: a finished result's findings, Markdown and PNG computed again from its
  numbers by this code (no model runs); the JSON records the commit that redrew it."""
  p = pathlib.Path(path)
  rec = json.loads(p.read_text())
  common.check_schema(rec, str(p))
  res = rec["results"]
  res["findings"] = findings(head_start(res))
  res["redrawn_by"] = common.commit()
  common.write_json(p, rec)
  draw(res, p, rec["machine"])
  print(f"redrew {p}", flush=True)


def reward_audit(model, task, cfg: dict, seed: int, count: int = 400) -> dict:
  """What the ``cell_accuracy`` reward scores wrongly: of ``count`` training prompts (random
  givens, as GRPO draws them), the share with several solutions, and of their rollouts with
  GRPO's sampler (T = 1) and greedily, the share that are valid solutions scored below 1 (another
  solution than the stored one); ``rule_cells`` scores those 1."""
  import jax
  import numpy as np
  from aogpt_jax.sampling import SampleSettings, generate
  from aogpt_jax.tasks import sudoku
  rows = task.train_batch(seed + 21, 0, count)
  tokens, prompt = np.asarray(rows["tokens"]), np.asarray(rows["prompt"])
  several = np.array([sudoku.solve(np.where(p, t + 1, 0), limit=2)[0] > 1
                      for t, p in zip(tokens, prompt)])
  out = {"prompts": count, "several_solutions": float(several.mean())}
  for name, greedy in (("T=1", False), ("greedy", True)):
    s = SampleSettings(length=task.length, steps=task.length, greedy=greedy,
                       **SAMPLERS[cfg["sampler"]][0])
    got = generate(model, jax.random.key(seed + 22), s,
                   prompt=(np.where(prompt, tokens, 0).astype(np.int32), prompt))
    v = task.verify(np.asarray(got.tokens), rows)
    out[name] = {"solved": float(v["solved"].mean()),
                 "solved_but_cell_accuracy_below_1": float(
                     (v["solved"] & (v["cell_accuracy"] < 1)).mean())}
  print(f"[reward] {100 * out['several_solutions']:.0f}% of {count} training prompts have several "
        f"solutions; valid rollouts that cell_accuracy scores below 1: "
        f"{100 * out['T=1']['solved_but_cell_accuracy_below_1']:.1f}% at T=1, "
        f"{100 * out['greedy']['solved_but_cell_accuracy_below_1']:.1f}% greedily", flush=True)
  return out


def search_puzzles(task, seed: int, pool: int):
  """The held-out puzzles among the first ``pool`` (``task.heldout(seed, pool)``) that naked and
  hidden singles alone do not solve (`tasks.sudoku.difficulty` "search"), or None (pool 0, or
  none found)."""
  if not pool:
    return None
  import numpy as np
  from aogpt_jax.tasks import sudoku
  t0 = time.perf_counter()
  rows = task.heldout(seed, pool)
  keep = np.array([sudoku.difficulty(np.where(p, t + 1, 0)) == "search"
                   for t, p in zip(rows["tokens"], rows["prompt"])])
  print(f"{int(keep.sum())} of {pool} held-out puzzles need search "
        f"({time.perf_counter() - t0:.0f} s)", flush=True)
  return {k: v[keep] for k, v in rows.items()} if keep.any() else None


def findings(res: dict) -> dict:
  """Per decoding and estimator: the final held-out rate, its gain, and whether the intervals
  before and after are disjoint (the issue's goal: a gain larger than the 95% interval)."""
  out = {}
  for run in res["grpo"]:
    last = run["evals"][-1]
    for dec, b in res["before"].items():
      if dec not in last:
        continue
      a, s = last[dec]["solved"], b["solved"]
      out[f"{run['name']} (seed {run['seed']}): {dec}"] = {
          "before": s["rate"], "after": a["rate"], "gain": a["rate"] - s["rate"],
          "intervals_disjoint": a["low"] > s["high"]}
  out["over_seeds"] = over_seeds(res)
  for name in ("order_policy", "order_only"):
    policy = [r for r in res["grpo"] if r["name"] == name]
    if not policy:
      continue
    # the best fixed heuristic at the start; the trained policy sampled (tau) and its greedy
    # order (argmax of softmax(max_prob scores / tau): max_prob on the trained weights)
    fixed = ("max_prob, greedy", "margin, greedy")
    best = max(res["before"][d]["solved"]["rate"] for d in fixed)
    last = [r["evals"][-1] for r in policy]
    out[f"{name}_vs_best_fixed_heuristic"] = {
        "best_fixed_at_start": best,
        "trained_stochastic_policy": [e[POLICY_DECODERS[1]]["solved"]["rate"] for e in last],
        "trained_greedy_order": [e[POLICY_DECODERS[0]]["solved"]["rate"] for e in last],
        "reaches_it": [e[POLICY_DECODERS[0]]["solved"]["rate"] >= best for e in last]}
    if res.get("search_before"):
      sb = max(res["search_before"][d]["solved"]["rate"] for d in fixed)
      out[f"{name}_vs_best_fixed_heuristic"]["search"] = {
          "puzzles": res["search_puzzles"], "best_fixed_at_start": sb,
          "trained_stochastic_policy": [e["search"][POLICY_DECODERS[1]]["solved"]["rate"]
                                        for e in last],
          "trained_greedy_order": [e["search"][POLICY_DECODERS[0]]["solved"]["rate"]
                                   for e in last],
          "beats_it": [e["search"][POLICY_DECODERS[0]]["solved"]["rate"] > sb for e in last]}
  return out


def over_seeds(res: dict) -> dict:
  """Per run and decoding: the final held-out rate of each seed, their mean, min and max, and
  how many seeds' after-intervals lie above the before-interval."""
  out = {}
  for name in dict.fromkeys(r["name"] for r in res["grpo"]):
    runs = [r for r in res["grpo"] if r["name"] == name]
    for dec, b in res["before"].items():
      after = [r["evals"][-1][dec]["solved"] for r in runs if dec in r["evals"][-1]]
      if not after:
        continue
      rates = [a["rate"] for a in after]
      out[f"{name}: {dec}"] = {
          "before": b["solved"]["rate"], "after": rates, "mean": sum(rates) / len(rates),
          "min": min(rates), "max": max(rates),
          "mean_gain": sum(rates) / len(rates) - b["solved"]["rate"],
          "seeds_beyond_interval": sum(a["low"] > b["solved"]["high"] for a in after),
          "seeds": len(rates)}
  return out


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu") if "--size=accel" not in sys.argv else None
  main()
