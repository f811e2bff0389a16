"""The speed-quality frontier of every sampler: AR, diffusion (T steps), speculative (K drafts)
and adaptive order (each policy at T steps, threshold at several values, a capped candidate set).

For one AO-GPT sampling model (``--workdir`` of a run; without one, configs/quickstart.py is
trained here for ``--train_steps`` steps through the real command line) and a separately trained,
larger left-to-right judge (``--judge_workdir``; without one, the quickstart recipe on the same
corpus with every row L2R and ``--judge_layers`` x ``--judge_width``), it samples ``--batch``
unconditional rows of ``--length`` tokens with every configuration and reports

* wall time of one batch (best of ``--repeats`` after a compiled warm-up, all configurations
  interleaved round by round: fair on a shared machine) and the compile time apart;
* model passes per row (AR: n; diffusion: T; speculative: its mean passes; adaptive: its mean
  steps per row, the threshold policy's adapting);
* quality: the judge's exact L2R NLL of the samples (nats per token), their unigram entropy
  (per-sample mean, nats) and repeated-4-gram rate (the fraction of a sample's 4-grams that
  already occurred earlier in it, mean over samples: confidence orders degenerate into
  repetition);
* adaptive rows: Kendall's tau between the chosen order and left to right (1: exactly L2R).

Writes JSON (`benchmarks/common.py`'s schema) to ``--out`` (default
benchmarks/results/sampling_frontier/<machine>.json) and a PNG of judge NLL and unigram entropy
against wall time, one curve per sampler, to ``--png`` (default: the JSON's path with .png).

    python benchmarks/sampling_frontier.py                     # trains both models, ~20 min CPU
    python benchmarks/sampling_frontier.py --workdir=/tmp/aogpt_quickstart --judge_workdir=J
    python benchmarks/sampling_frontier.py --tiny              # random tiny models, seconds
    python benchmarks/sampling_frontier.py --report=benchmarks/results/sampling_frontier/X.json

``--report`` prints the markdown table of a results JSON (and redraws its PNG) without sampling.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import common  # noqa: E402

POLICIES = ("max_prob", "confidence", "margin", "entropy", "random")


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--workdir", default="", help="the sampling model's run (default: train one)")
  ap.add_argument("--judge_workdir", default="", help="the L2R judge's run (default: train one)")
  ap.add_argument("--train_steps", type=int, default=600)
  ap.add_argument("--judge_steps", type=int, default=600)
  ap.add_argument("--judge_layers", type=int, default=6)
  ap.add_argument("--judge_width", type=int, default=192)
  ap.add_argument("--length", type=int, default=128)
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--steps", default="16,32,64,128", help="T of diffusion / adaptive")
  ap.add_argument("--drafts", default="2,4,8", help="K of speculative")
  ap.add_argument("--thresholds", default="0.5,0.7,0.9,0.97")
  ap.add_argument("--candidates", type=int, default=16,
                  help="C of the capped max_prob curve (0: none)")
  ap.add_argument("--temperature", type=float, default=1.0)
  ap.add_argument("--top_p", type=float, default=1.0)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--tiny", action="store_true",
                  help="random-weight tiny models, length 16, a few configurations (a smoke run)")
  ap.add_argument("--out", default=None)
  ap.add_argument("--png", default=None)
  ap.add_argument("--report", default="", help="a results JSON: print its table, redraw its PNG")
  return ap.parse_args(argv)


def title(rec: dict) -> str:
  a, m = rec["args"], rec["machine"]
  return (f"sampling frontier: n={a['length']}, batch {a['batch']}, temperature "
          f"{a['temperature']}, top-p {a['top_p']}; {m.get('cpu')}, {m.get('cores')} cores")


def table(rows: list[dict]) -> str:
  """Markdown: one line per configuration."""
  head = ("| sampler | T / K / threshold | passes per row | wall s | judge NLL | unigram entropy "
          "| repeated 4-grams | Kendall tau vs L2R |\n|---|---|---|---|---|---|---|---|")
  lines = [head]
  for r in rows:
    knob = r.get("steps", r.get("draft", r.get("threshold", "")))
    lines.append(f"| {r['sampler']} | {knob} | {r['passes_per_row']:g} | {r['run_s']:.3f} | "
                 f"{r['judge_nll']:.3f} | {r['unigram_entropy']:.3f} | "
                 f"{r['repeat_4gram_rate']:.3f} | {r.get('kendall_tau_l2r', '')} |")
  return "\n".join(lines)


def train(workdir: str, steps: int, length: int, extra: list[str]) -> float:
  """Trains configs/quickstart.py for ``steps`` steps into ``workdir`` on sequences of ``length``
  tokens (the quickstart's 2,048 tokens per step; ``extra`` overrides)."""
  cmd = [sys.executable, "-m", "aogpt_jax.main", "--config=configs/quickstart.py",
         f"--workdir={workdir}", f"--config.total_steps={steps}", f"--config.seq_len={length}",
         f"--config.batch_size={max(1, 2048 // length)}",
         f"--config.eval_every={steps}", f"--config.checkpoint_every={steps}", *extra]
  t0 = time.perf_counter()
  with open(os.path.join(workdir, "train.log"), "w") as log:
    subprocess.run(cmd, cwd=REPO, check=True, stdout=log, stderr=subprocess.STDOUT,
                   env=dict(os.environ, PYTHONPATH=REPO))
  return time.perf_counter() - t0


def judge_nll(judge, tokens: np.ndarray) -> float:
  """The judge's L2R NLL of the samples, nats per token."""
  order = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  logits = jax.jit(lambda t, o: judge(t, o))(jnp.asarray(tokens), order).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return float(-jnp.mean(jnp.take_along_axis(logp, jnp.asarray(tokens)[..., None], -1)))


def repeat_rate(tokens: np.ndarray, n: int = 4) -> float:
  """Mean over samples of the fraction of 4-grams already seen earlier in the sample."""
  rates = []
  for row in np.asarray(tokens):
    seen, rep = set(), 0
    grams = [tuple(row[i:i + n]) for i in range(len(row) - n + 1)]
    for g in grams:
      rep += g in seen
      seen.add(g)
    rates.append(rep / max(1, len(grams)))
  return float(np.mean(rates))


def kendall_l2r(order: np.ndarray) -> float:
  from scipy import stats
  return float(np.mean([stats.kendalltau(np.arange(len(o)), o)[0] for o in order]))


def configs(args, n: int) -> list[dict]:
  steps = [int(t) for t in args.steps.split(",") if int(t) <= n]
  out = [dict(sampler="ar", method="ar", order="l2r")]
  out += [dict(sampler="diffusion", method="diffusion", steps=t) for t in steps]
  out += [dict(sampler="speculative", method="speculative", draft=int(k))
          for k in args.drafts.split(",")]
  for pol in POLICIES:
    out += [dict(sampler=f"adaptive {pol}", method="adaptive", policy=pol, steps=t) for t in steps]
  out += [dict(sampler="adaptive threshold", method="adaptive", policy="threshold",
               threshold=float(v)) for v in args.thresholds.split(",")]
  if args.candidates:
    out += [dict(sampler=f"adaptive max_prob C={args.candidates}", method="adaptive",
                 policy="max_prob", candidates=args.candidates, steps=t)
            for t in steps if n // t <= args.candidates]
  return out


def build(model, args, conf: dict):
  from aogpt_jax.sampling import sampler
  kw = {k: v for k, v in conf.items() if k != "sampler"}
  s = sampler.SampleSettings(length=args.length, temperature=args.temperature, top_p=args.top_p,
                             **kw)
  p = sampler.prepare(model.cfg, jax.random.key(args.seed), s, batch=args.batch)
  pl = None if s.method in sampler.PLANLESS_METHODS else sampler.plan([p], method=s.method)[0]
  t0 = time.perf_counter()
  run = sampler.compile_sampler(model, p, pl, s)
  out = jax.block_until_ready(run())
  row = dict(conf, compile_and_first_run_s=round(time.perf_counter() - t0, 2))
  toks = np.asarray(out[0])
  n = args.length
  if s.method == "ar":
    passes = np.full(args.batch, n)
  elif s.method == "diffusion":
    passes = np.full(args.batch, pl.steps)
  elif s.method == "speculative":
    passes = np.asarray(out[1][0])
  else:
    order, steps = np.asarray(out[1][0]), np.asarray(out[1][1])
    passes = steps
    row["kendall_tau_l2r"] = round(kendall_l2r(order), 4)
    row["loop_passes"] = int(steps.max())
  row["passes_per_row"] = round(float(np.mean(passes)), 2)
  return row, run, toks


def plot(rows: list[dict], path: str, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
  names = list(dict.fromkeys(r["sampler"] for r in rows))
  for ax, key, label in ((axes[0], "judge_nll", "judge L2R NLL (nats/token, lower is better)"),
                         (axes[1], "unigram_entropy", "unigram entropy per sample (nats)")):
    for name in names:
      rs = sorted((r for r in rows if r["sampler"] == name), key=lambda r: r["run_s"])
      style = "o-" if len(rs) > 1 else "*"
      ax.plot([r["run_s"] for r in rs], [r[key] for r in rs], style, label=name,
              markersize=9 if style == "*" else 4)
    ax.set_xscale("log")
    ax.set_xlabel("wall time per batch (s, log)")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
  ar = [r for r in rows if r["method"] == "ar"]
  if ar:
    axes[1].axhspan(0.95 * ar[0]["unigram_entropy"], 1.05 * ar[0]["unigram_entropy"],
                    color="grey", alpha=0.15, label="AR entropy +-5%")
  axes[1].legend(fontsize=7, loc="best")
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main(argv=None) -> None:
  args = parse_args(argv)
  if args.report:
    rec = json.load(open(args.report))
    plot(rec["results"]["rows"], args.png or args.report[:-len(".json")] + ".png", title(rec))
    print(table(rec["results"]["rows"]))
    print(json.dumps(rec["results"]["goals"], indent=1))
    return
  import aogpt_jax
  from aogpt_jax.evaluation.genppl import unigram_entropy
  from aogpt_jax.model import aogpt as model_lib
  from flax import nnx
  info = {}
  if args.tiny:
    args.length, args.batch, args.steps, args.drafts = 16, 4, "4", "2"
    args.thresholds, args.candidates, args.repeats = "0.5", 8, 1
    cfg = model_lib.preset("tiny", block_size=16)
    model = model_lib.AOGPT(cfg, rngs=nnx.Rngs(0))
    judge = model_lib.AOGPT(cfg.replace(n_layer=2), rngs=nnx.Rngs(1))
  else:
    tmp = tempfile.mkdtemp(prefix="sampling_frontier_")
    if not args.workdir:
      args.workdir = os.path.join(tmp, "sampler")
      os.makedirs(args.workdir)
      info["train_sampler_s"] = round(train(args.workdir, args.train_steps, args.length, []), 1)
    if not args.judge_workdir:
      args.judge_workdir = os.path.join(tmp, "judge")
      os.makedirs(args.judge_workdir)
      info["train_judge_s"] = round(train(args.judge_workdir, args.judge_steps, args.length, [
          "--config.order.kwargs.p_l2r=1.0", f"--config.model.n_layer={args.judge_layers}",
          f"--config.model.n_embd={args.judge_width}"]), 1)
    model, _ = aogpt_jax.load(args.workdir)
    judge, _ = aogpt_jax.load(args.judge_workdir)
  info["sampler_params"] = model_lib.count_params(model)
  info["judge_params"] = model_lib.count_params(judge)
  built = []
  for conf in configs(args, args.length):
    built.append(build(model, args, conf))
    print(json.dumps(built[-1][0]), flush=True)
  load = [common.load_avg_1m()]
  best = common.best_of({i: run for i, (_, run, _) in enumerate(built)}, args.repeats,
                        sync=jax.block_until_ready)
  load.append(common.load_avg_1m())
  rows = []
  for i, (row, _, toks) in enumerate(built):
    row["run_s"] = round(best[i], 4)
    row["judge_nll"] = round(judge_nll(judge, toks), 4)
    row["unigram_entropy"] = round(unigram_entropy(toks)["per_sample_mean"], 4)
    row["repeat_4gram_rate"] = round(repeat_rate(toks), 4)
    rows.append(row)
  info["load_avg_1m"] = load
  summary = goals(rows, args.length)
  results = {"info": info, "goals": summary, "rows": rows}
  path = common.write_result("sampling_frontier", vars(args), results, out=args.out)
  png = args.png or str(path)[:-len(".json")] + ".png"
  plot(rows, png, title(json.load(open(path))))
  print(table(rows))
  print(json.dumps(summary, indent=1))
  print(f"wrote {path} and {png}")


def goals(rows: list[dict], n: int) -> dict:
  """The issue's two goals, measured: at T <= n/8, the adaptive policies that beat random-order
  diffusion's judge NLL with unigram entropy within 5% of AR's; adaptive (all candidates) wall
  time over diffusion's at the same T."""
  ar = next(r for r in rows if r["method"] == "ar")
  diff = {r["steps"]: r for r in rows if r["method"] == "diffusion"}
  out = {"ar_entropy": ar["unigram_entropy"], "wins_at_small_T": [], "time_ratio": {}}
  for r in rows:
    if r["method"] != "adaptive" or "steps" not in r or r["steps"] not in diff:
      continue
    d = diff[r["steps"]]
    if not r.get("candidates"):
      out["time_ratio"][f"{r['policy']} T={r['steps']}"] = round(r["run_s"] / d["run_s"], 2)
    if (r["steps"] <= n // 8 and r["judge_nll"] < d["judge_nll"]
        and abs(r["unigram_entropy"] / ar["unigram_entropy"] - 1) <= 0.05):
      out["wins_at_small_T"].append(f"{r['sampler']} T={r['steps']}")
  return out


if __name__ == "__main__":
  main()
