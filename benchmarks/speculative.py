"""Speculative decoding (``method="speculative"``) against AR decoding and the T = n sampler.

For a quickstart-size model, trained (``--workdir`` of a run; without one, configs/quickstart.py
is trained here for ``--train_steps`` steps in a temporary workdir through the real command line)
and with random weights, at batch ``--batch`` and length ``--length`` (unconditional, no prompt):

* speed, at every temperature in ``--temperatures`` (top-p ``--top_p``): forward passes per
  token and wall time of AR decoding (L2R), the T = n diffusion sampler (one token per pass; L2R
  and random order) and the speculative sampler with K in ``--drafts`` (L2R and random order)
  and every ``sample.draft_queries`` layout in ``--queries`` (labelled "(all)" in the table).
  All of these are exact samplers of the same distribution (per order and temperature). Wall
  time: best of ``--repeats`` runs after a warm-up, the runs of all configurations of one model
  and temperature (AR included) interleaved round by round (fair on a shared machine), so "vs
  AR" is a ratio measured in the same run; the first call (compile + run) is reported apart.
  Compiles are shared between the two models (same shapes); the load average is recorded
  around every timing.
* quality at equal passes (trained model only): for every speculative row, the parallel
  diffusion sampler (deterministic counts, linear schedule) with T = the speculative row's mean
  passes per sample, same order; the model's own L2R NLL of the samples (nats per token,
  padding ids excluded) and their unigram entropy (per-sample mean). Exact samplers should all
  land at the same NLL (up to noise); the parallel T < n sampler pays for its speed in NLL.

    python benchmarks/speculative.py                       # trains ~300 steps, a few minutes
    python benchmarks/speculative.py --workdir=/tmp/aogpt_quickstart --batch=16

Prints a markdown table and writes JSON (`benchmarks/common.py`'s schema) to ``--out``
(default benchmarks/results/speculative_batch<batch>/<machine>.json).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from aogpt_jax.checkpoints import store as checkpoint  # noqa: E402
from aogpt_jax.sampling import sampler
from aogpt_jax.model import aogpt as model_lib  # noqa: E402
from aogpt_jax.evaluation.genppl import unigram_entropy  # noqa: E402
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import common  # noqa: E402


def train(steps: int, workdir: str) -> float:
  """Trains configs/quickstart.py for ``steps`` steps into ``workdir``; returns seconds."""
  cmd = [sys.executable, "-m", "aogpt_jax.main", "--config=configs/quickstart.py",
         f"--workdir={workdir}", f"--config.total_steps={steps}",
         f"--config.eval_every={steps}", f"--config.checkpoint_every={steps}"]
  t0 = time.perf_counter()
  with open(os.path.join(workdir, "train.log"), "w") as log:
    subprocess.run(cmd, cwd=REPO, check=True, stdout=log, stderr=subprocess.STDOUT,
                   env=dict(os.environ, PYTHONPATH=REPO))
  return time.perf_counter() - t0


_FORWARD = {}


def l2r_nll(m, tokens: np.ndarray) -> float:
  """The model's own L2R NLL of the samples, nats per token (padding ids excluded)."""
  order = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  fwd = _FORWARD.setdefault(id(m), jax.jit(lambda t, o: m(t, o)))
  logits = fwd(jnp.asarray(tokens), order).astype(jnp.float32)
  logits = jnp.where(jnp.arange(logits.shape[-1]) < m.cfg.valid_vocab_size, logits, -jnp.inf)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return float(-jnp.mean(jnp.take_along_axis(logp, jnp.asarray(tokens)[..., None], -1)))


def build(m, args, *, method, order, temperature, steps=None, draft=None, queries="taper"):
  s = sampler.SampleSettings(length=args.length, steps=steps or args.length, method=method,
                             order=order, draft=draft if draft is not None else "auto",
                             draft_queries=queries, temperature=temperature, top_p=args.top_p)
  p = sampler.prepare(m.cfg, jax.random.key(args.seed), s, batch=args.batch)
  pl = None if method in sampler.PLANLESS_METHODS else sampler.plan([p], method=method)[0]
  run = lambda: sampler.sample_batch(m, p, pl, s)            # jit-cached: shared by models of one shape
  t0 = time.perf_counter()
  out = run()                                        # compile (first of its shape) + warm-up
  row = {"method": method, "order": order, "temperature": temperature,
         "compile_and_first_run_s": round(time.perf_counter() - t0, 2)}
  if method == "speculative":
    row["draft"], row["queries"] = draft, queries
  if method == "diffusion":
    row["steps"] = s.steps
  toks, passes = out.tokens, out.passes
  toks = np.asarray(toks)
  n_tok = args.batch * args.length
  if method == "speculative":
    row["passes_per_token"] = round(float(passes.sum()) / n_tok, 4)
  else:
    row["passes_per_token"] = round((args.length if method == "ar" else s.steps) / args.length, 4)
  return row, run, toks


def time_all(built, args) -> list[float]:
  """Best-of-``repeats`` wall time of every configuration, interleaved; returns the 1-minute
  load averages before and after."""
  load = [common.load_avg_1m()]
  best = common.best_of({i: run for i, (_, run, _) in enumerate(built)}, args.repeats)
  for i, (row, _, _) in enumerate(built):
    row["run_s"] = round(best[i], 4)
  return load + [common.load_avg_1m()]


def bench_model(m, args, *, quality: bool, temperature: float) -> list[dict]:
  drafts = [d if d == "auto" else int(d) for d in args.drafts.split(",")]
  mk = functools.partial(build, m, args, temperature=temperature)
  built = [mk(method="ar", order="l2r")]
  for order in args.orders.split(","):
    built.append(mk(method="diffusion", order=order))
    for q in args.queries.split(","):
      for d in drafts:
        if d == 2 and q == "all" and "taper" in args.queries:
          continue                                      # K = 2: the same layout either way
        built.append(mk(method="speculative", order=order, draft=d, queries=q))
        print(json.dumps(built[-1][0]), flush=True)
  load = time_all(built, args)
  ar = built[0][0]["run_s"]
  rows = []
  for row, _, toks in built:
    row["vs_ar_time"] = round(row["run_s"] / ar, 3)
    row["load_avg_1m"] = load
    if quality:
      row["l2r_nll"] = round(l2r_nll(m, toks), 4)
      row["entropy"] = round(unigram_entropy(toks)["per_sample_mean"], 4)
    rows.append(row)
  if quality:      # the parallel sampler at the speculative rows' passes
    for row in [r for r in rows if r["method"] == "speculative"]:
      steps = max(1, min(args.length, round(row["passes_per_token"] * args.length)))
      prow, _, toks = mk(method="diffusion", order=row["order"], steps=steps)
      row["parallel_same_passes"] = {"steps": steps, "l2r_nll": round(l2r_nll(m, toks), 4),
                                     "entropy": round(unigram_entropy(toks)["per_sample_mean"],
                                                      4)}
  return rows


def table(result) -> str:
  out = ["| weights | temp | sampler | order | passes/token | run s | vs AR | L2R NLL | entropy | "
         "parallel at same passes: T, L2R NLL, entropy |", "|" + "---|" * 10]
  for name, rows in result["models"].items():
    for r in rows:
      label = {"ar": "AR", "diffusion": f"T={r.get('steps')}"}.get(
          r["method"], f"spec K={r.get('draft')}" + (" (all)" if r.get("queries") == "all"
                                                     else ""))
      par = r.get("parallel_same_passes")
      par_s = f"T={par['steps']}, {par['l2r_nll']}, {par['entropy']}" if par else ""
      out.append(f"| {name} | {r['temperature']} | {label} | {r['order']} | "
                 f"{r['passes_per_token']} | {r['run_s']} | "
                 f"{r['vs_ar_time']} | {r.get('l2r_nll', '')} | {r.get('entropy', '')} | "
                 f"{par_s} |")
  return "\n".join(out)


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", default="", help="a trained run (else train one here)")
  ap.add_argument("--train_steps", type=int, default=300)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--length", type=int, default=128)
  ap.add_argument("--drafts", default="2,4,8,auto")
  ap.add_argument("--orders", default="l2r,random")
  ap.add_argument("--queries", default="taper",
                  help="sample.draft_queries values, comma-separated (taper, all)")
  ap.add_argument("--temperatures", default="1.0,0.7", help="comma-separated")
  ap.add_argument("--top_p", type=float, default=1.0)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--no_quality", action="store_true",
                  help="skip the NLL / parallel-at-equal-passes columns (saves their compiles)")
  ap.add_argument("--out", default="", help="default: results/speculative_batch<batch>/"
                                             "<machine>.json")
  args = ap.parse_args(argv)
  result = {"benchmark": "speculative", "models": {}}
  with tempfile.TemporaryDirectory() as tmp:
    workdir = args.workdir
    if not workdir:
      workdir = tmp
      result["train_s"] = round(train(args.train_steps, workdir), 1)
    m, cfg = checkpoint.load_model(workdir, which="ema")
    result["trained"] = {"workdir": args.workdir or f"(temporary, {args.train_steps} steps)",
                         "step": cfg.loaded.step}
  if args.length > m.cfg.block_size:
    ap.error(f"--length {args.length} exceeds the model's block_size {m.cfg.block_size}")
  result["params"] = model_lib.count_params(m)
  temps = [float(t) for t in args.temperatures.split(",")]
  rand = model_lib.AOGPT(m.cfg, rngs=nnx.Rngs(args.seed))
  for name, mod, quality in [("trained", m, not args.no_quality), ("random", rand, False)]:
    result["models"][name] = [r for t in temps
                              for r in bench_model(mod, args, quality=quality, temperature=t)]
  result["table"] = table(result)
  print(result["table"])
  common.write_result(f"speculative_batch{args.batch}", args, result, out=args.out or None)
  return result


if __name__ == "__main__":
  main()
