"""The project's results table (Markdown), generated from the JSONs in benchmarks/results.

    python benchmarks/results_table.py                      # print it
    python benchmarks/results_table.py --write README.md docs/performance.md

One row per current result: what was measured, the number, the machine, the command
that reruns it and the JSON it comes from. Every number is read from a field of that JSON (ROWS
below names the fields); a missing file or key stops the script with one line naming both.
``--write FILE...`` replaces the text between the lines ``<!-- results-table -->`` and
``<!-- /results-table -->`` in each FILE (each must hold both markers once) and leaves the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
from typing import Any, Callable

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
START, END = "<!-- results-table -->", "<!-- /results-table -->"


class TableError(Exception):
  """One line: the file and the key that is missing."""


def _show(path) -> str:
  out = ""
  for k in path:
    if isinstance(k, dict):
      out += "[" + ",".join(f"{a}={b}" for a, b in k.items()) + "]"
    elif isinstance(k, int):
      out += f"[{k}]"
    else:
      out += (f".{k}" if out else k) if k.replace("_", "").isalnum() else f"[{k!r}]"
  return out


class Result:
  """One JSON of benchmarks/results; ``get(*path)`` reads a field or raises TableError."""

  def __init__(self, results_dir: pathlib.Path, rel: str):
    self.rel = rel
    self.shown = f"benchmarks/results/{rel}"
    path = results_dir / rel
    try:
      self.data = json.loads(path.read_text())
    except FileNotFoundError:
      raise TableError(f"{self.shown}: no such file") from None
    except ValueError as e:
      raise TableError(f"{self.shown}: not JSON ({e})") from None

  def get(self, *path) -> Any:
    """A key path: str keys, int indices, or {field: value} to pick the one list item that
    matches (e.g. a sampler row by method and steps)."""
    node = self.data
    for i, k in enumerate(path):
      try:
        if isinstance(k, dict):
          hits = [x for x in node if isinstance(x, dict) and all(x.get(a) == b
                                                                 for a, b in k.items())]
          if len(hits) != 1:
            raise LookupError
          node = hits[0]
        else:
          node = node[k]
      except (LookupError, TypeError):
        raise TableError(f"{self.shown}: missing key {_show(path[:i + 1])}") from None
    if node is None:
      raise TableError(f"{self.shown}: key {_show(path)} is null")
    return node

  def r(self, *path) -> Any:
    return self.get("results", *path)

  def machine(self) -> str:
    m = self.get("machine")
    # The JSON keeps the date and commit; README and docs show no dated history.
    return m.get("accelerator") or f"{m.get('cores')}-core {m.get('cpu')} CPU"


def _x(a: float) -> str:
  return f"{a:.1f}x"


# (what, JSON under benchmarks/results, number from the JSON, command)
Row = tuple[str, str, Callable[[Result], str], str]
CPU = "cpu-2core-amd-epyc.json"
VS = "python benchmarks/vs_published.py --published=DIR"


def _vs_sampling(top_p: str) -> Callable[[Result], str]:
  def f(j: Result) -> str:
    ups = [j.r("best_s", f"sample T={t} top_p={top_p}", "published") /
           j.r("best_s", f"sample T={t} top_p={top_p}", "ours") for t in (16, 64, 256)]
    return (" / ".join(_x(u) for u in ups) + " faster than the published code (T = 16 / 64 / "
            "256)")
  return f


XEON = "cpu-2core-intel-xeon.json"


def _order_matters(j: Result) -> str:
  """Per task: the best adaptive decoding, a random order and the L2R model, solved %."""
  parts = []
  for name in ("sudoku", "star_graph"):
    f = j.r("tasks", name, "findings")
    parts.append(f"{name.replace('_', ' ')}: AO-GPT {f['best_adaptive'].split(', ')[1]} "
                 f"{100 * f['best_adaptive_rate']:.0f}% vs random order "
                 f"{100 * f['random_order_rate']:.0f}%, L2R model "
                 f"{100 * f['l2r_model_rate']:.0f}%, encoder MDM "
                 f"{f['mdm_best_adaptive'].split(', ')[1]} {100 * f['mdm_best_adaptive_rate']:.0f}%"
                 f" / random {100 * f['mdm_random_order_rate']:.0f}%")
  loads = [r["load_avg_1m_end"] for name in ("sudoku", "star_graph")
           for r in j.r("tasks", name, "train").values()]
  return "; ".join(parts) + (f" ({j.r('total_s') / 60:.0f} min training and solving, load "
                             f"average {min(loads):.0f}-{max(loads):.0f})")


def _reasoning_gap(j: Result) -> str:
  """Sudoku: the best adaptive solved rate of the task configs' default (``blanks``: the query
  block over the blanks), of the bidirectional prompt alone, the causal prompt and the encoder
  MDM, and their held-out losses per blank."""
  f = j.r("tasks", "sudoku", "findings")
  best, loss = f["best_adaptive"], f["heldout_loss_per_blank"]
  loads = [r["load_avg_1m_end"] for r in j.r("tasks", "sudoku", "train").values()]
  rate = lambda v: f"{100 * best[v]['rate']:.1f}%"  # noqa: E731
  return (f"AO-GPT with a query block over the blanks {best['blanks']['decoding']} "
          f"{rate('blanks')}, random order {100 * f['random_order']['blanks']:.1f}%; "
          f"bidirectional prompt alone {rate('bidirectional')}, causal prompt {rate('causal')}, "
          f"encoder MDM {rate('mdm')}; held-out loss per blank {loss['blanks']:.3f} / "
          f"{loss['bidirectional']:.3f} / {loss['causal']:.3f}, MDM bound {loss['mdm']:.3f} "
          f"({j.r('total_s') / 60:.0f} min, load average {min(loads):.0f}-{max(loads):.0f})")


def _gap_pair(task: str, ours: str) -> Callable[[Result], str]:
  """An accelerator-size reasoning gap: AO-GPT variant ``ours`` against the encoder MDM, the
  best adaptive and the random-order solved rates, held-out losses, steps and minutes."""
  def number(j: Result) -> str:
    f = j.r("tasks", task, "findings")
    best, loss = f["best_adaptive"], f["heldout_loss_per_blank"]
    steps = j.r("tasks", task, "train", ours, "total_steps")
    rate = lambda v: f"{best[v]['decoding']} {100 * best[v]['rate']:.1f}%"  # noqa: E731
    lo = lambda v: "n/a" if loss.get(v) is None else f"{loss[v]:.3f}"  # noqa: E731
    return (f"AO-GPT {ours} {rate(ours)}, random order {100 * f['random_order'][ours]:.1f}%; "
            f"encoder MDM {rate('mdm')}, random order {100 * f['random_order']['mdm']:.1f}%; "
            f"held-out loss per blank {lo(ours)} vs MDM bound {lo('mdm')} ({steps:,} steps "
            f"each, {j.r('total_s') / 60:.0f} min training and solving)")
  return number


def _gpu_quick(j: Result) -> str:
  """gpu_suite --quick: the Small train step, where its time goes, and the sampler."""
  t = j.r("raw", "train_small_cudnn")
  prof, groups = t["profile"], t["profile"]["groups_ms_per_step"]
  row = j.r("raw", "sample_speed", "rows", {"method": "diffusion", "steps": 1024})
  return (f"train step {1e3 * t['step_s_median']:.1f} ms, MFU {100 * t['mfu']:.1f}%, peak "
          f"{t['measured_peak_bytes'] / 2**30:.1f} GiB (kernels per step: matmuls "
          f"{groups['matmul']:.1f} ms, attention {groups['attention']:.1f} ms, other fusions "
          f"{groups['other']:.1f} ms; idle {prof['idle_ms_per_step']:.1f} ms); sampling "
          f"{row['run_s']:.3f} s, {_x(row['encoder_over_diffusion_speedup'])} faster than the "
          f"encoder MDM")


def _post_training(j: Result) -> str:
  """GRPO's held-out solved rate before / after under GRPO's own sampler (greedy tokens), the
  mean over seeds of each likelihood, how many seeds end beyond the start's interval, and d1's
  estimate's error at one token per step."""
  agg = j.r("findings", "over_seeds")
  dec = {"random": "random order, greedy", "max_prob": "max_prob, greedy"}[j.r("size", "sampler")]
  names = [k.split(": ")[0] for k in agg if k.endswith(": " + dec) and "order_policy" not in k]
  after = ", ".join(f"{name} {100 * agg[f'{name}: {dec}']['mean']:.1f}% "
                    f"({agg[f'{name}: {dec}']['seeds_beyond_interval']} of "
                    f"{agg[f'{name}: {dec}']['seeds']} seeds beyond the start's interval)"
                    for name in names)
  one = j.r("estimator_error", "by_steps", {"tokens_per_step": 1.0}, "logp_error_token")
  return (f"{dec} {100 * agg[f'{names[0]}: {dec}']['before']:.1f}% before; after "
          f"{j.r('size', 'updates')} GRPO updates, mean over seeds: {after}; d1's "
          f"mean-field estimate {one['mean']:+.2f} nats/token (std {one['std']:.2f}) off the "
          f"exact log-likelihood at one token per step ({j.r('wall_s') / 60:.0f} min, load "
          f"average {j.r('load_avg_1m_start'):.0f}-{j.r('load_avg_1m_end'):.0f})")


def _token_credit(j: Result) -> str:
  """The per-cell GRPO run: held-out solved before -> after with 95% intervals, at temperature 1
  (GRPO's own sampler: random order; and max_prob) and greedily, the updates, their GRPO time."""
  run = j.r("grpo")[0]
  last = run["evals"][-1]
  pct = lambda s: f"{100 * s['rate']:.1f}% ({100 * s['low']:.1f}-{100 * s['high']:.1f}%)"  # noqa: E731
  parts = [f"{dec}: {pct(j.r('before', dec, 'solved'))} -> {pct(last[dec]['solved'])}"
           for dec in ("random order, T=1", "max_prob, T=1", "random order, greedy",
                       "max_prob, greedy")]
  return (f"{'; '.join(parts)} after {last['update']} updates ({run['train_s'] / 60:.0f} min of "
          f"GRPO, lr {run['settings']['lr']:g}, load average {j.r('load_avg_1m_start'):.0f}-"
          f"{j.r('load_avg_1m_end'):.0f})")


def _token_credit_seeds(j: Result) -> str:
  """The per-cell GRPO run on more seeds: held-out solved before -> after, each seed, and how
  many seeds' 95% intervals end above the start's."""
  over = j.r("findings", "over_seeds")
  run = j.r("grpo")[0]
  parts = []
  for dec in ("random order, T=1", "max_prob, T=1", "random order, greedy", "max_prob, greedy"):
    o = over[f"token_credit: {dec}"]
    parts.append(f"{dec}: {100 * o['before']:.1f}% -> "
                 + " / ".join(f"{100 * a:.1f}%" for a in o["after"])
                 + f" ({o['seeds_beyond_interval']} of {o['seeds']} above the start's interval)")
  seeds = ", ".join(str(r["seed"]) for r in j.r("grpo"))
  minutes = " / ".join(f"{r['train_s'] / 60:.0f}" for r in j.r("grpo"))
  return (f"seeds {seeds}: {'; '.join(parts)} after {run['evals'][-1]['update']} updates "
          f"({minutes} min of GRPO, load average "
          f"{j.r('load_avg_1m_start'):.0f}-{j.r('load_avg_1m_end'):.0f})")


def _grpo_speed(j: Result) -> str:
  """The GRPO loop's seconds per compiled update, rollouts and gradient update apart, against
  the same loop with its levers off, measured in the same run."""
  v = j.r("variants")
  d = v["default"]
  out = (f"{d['sec_per_update']:.2f} s ({d['rollout_sec']:.2f} s of rollouts, "
         f"{d['update_sec']:.2f} s of gradient update), {d['compiles_after_first']} compiles "
         f"after the first update")
  if "before" in v:
    b = v["before"]
    out += (f"; {b['sec_per_update']:.2f} s without folding, the on-policy gradient and the "
            f"sampler's phases ({_x(b['sec_per_update'] / d['sec_per_update'])} slower)")
  return out + f" (load average {j.r('load_avg_1m_start'):.0f}-{j.r('load_avg_1m_end'):.0f})"


ROWS: list[Row] = [
    ("CPU quickstart: the whole command (start-up, data, compile, training, evals, checkpoints)",
     f"quickstart/{CPU}",
     lambda j: f"{j.r('wall_s'):.0f} s wall, {j.r('final_step')} steps (load average "
               f"{j.r('machine', 'loadavg_before')[0]:.1f} on 2 cores at the start); held-out "
               f"any-order / L2R loss {j.r('heldout_loss_any_order'):.3f} / "
               f"{j.r('heldout_loss_l2r'):.3f} nats/byte vs unigram "
               f"{j.r('heldout_unigram_cross_entropy'):.3f}",
     "python benchmarks/quickstart.py"),
    ("CPU train step vs the published PyTorch code (4 layers, d 256, n 256, batch 8, fp32)",
     f"vs_published_cpu/{CPU}",
     lambda j: f"{j.r('best_s', 'train', 'ours'):.2f} s vs {j.r('best_s', 'train', 'published'):.2f}"
               f" s: {_x(j.r('best_s', 'train', 'published') / j.r('best_s', 'train', 'ours'))}"
               " faster",
     f"{VS} --repeats=2 --runs=2"),
    ("CPU sampling vs the published code, top-p 1.0 (same sizes)", f"vs_published_cpu/{CPU}",
     _vs_sampling("1.0"), f"{VS} --repeats=2 --runs=2"),
    ("CPU sampling vs the published code, top-p 0.95", f"vs_published_cpu/{CPU}",
     _vs_sampling("0.95"), f"{VS} --repeats=2 --runs=2"),
    ("CPU context-order ensembles (Eq. 4, M = 8, n = 256) vs the published estimator",
     f"vs_published_cpu/{CPU}",
     lambda j: f"{_x(j.r('best_s', 'ensembles', 'published') / j.r('best_s', 'ensembles', 'ours'))}"
               f" warm ({j.r('best_s', 'ensembles', 'ours'):.2f} s vs "
               f"{j.r('best_s', 'ensembles', 'published'):.0f} s), "
               f"{_x(j.r('best_s', 'ensembles', 'published') / j.r('best_s', 'ensembles', 'ours_first_call_s'))}"
               " counting compilation",
     f"{VS} --repeats=2 --runs=2"),
    ("CPU ensemble estimator (prefixes) vs the naive one (tiny, n = 256, M = 8, 128 ranks)",
     f"eval_cost/{CPU}",
     lambda j: f"{j.r('speedup_wall'):.2f}x ({j.r('fast', 'wall_s'):.2f} s vs "
               f"{j.r('naive', 'wall_s'):.2f} s); max abs log-p diff {j.r('max_abs_logp_diff'):.1e}",
     "python benchmarks/eval_cost.py --repeats=5 --rank_stride=2"),
    ("CPU sampling, KV-cached diffusion vs encoder MDM and AR (tiny, batch 8, n = T = 256)",
     f"sample_speed_tiny/{CPU}",
     lambda j: f"{j.r('rows', {'method': 'diffusion', 'steps': 256}, 'run_s'):.3f} s: "
               f"{_x(j.r('rows', {'method': 'diffusion', 'steps': 256}, 'encoder_over_diffusion_speedup'))}"
               f" faster than encoder MDM, "
               f"{j.r('rows', {'method': 'diffusion', 'steps': 256}, 'vs_ar_time_ratio'):.2f}x AR's time",
     "python benchmarks/sample_speed.py --steps=64,256 --repeats=3"),
    ("adaLN cost: AO-GPT vs plain GPT forward+backward (tiny, n = 256, batch 8, gather path)",
     f"model_step_tiny_n256/{CPU}",
     lambda j: f"{j.r('ratios', 'adaln_over_none/gather'):.2f}x the plain GPT's step "
               f"({j.r('results', 'adaln/gather', 'ms_per_step'):.0f} vs "
               f"{j.r('results', 'none/gather', 'ms_per_step'):.0f} ms)",
     "python benchmarks/model_step.py"),
    ("H100: AO-GPT Small train step, 16 x 1024 tokens, bf16, cuDNN attention",
     "train_step_aogpt_small/h100.json",
     lambda j: f"{1e3 * j.r('step_s_median'):.1f} ms, {j.r('tokens_per_s') / 1e3:.0f}k tokens/s, "
               f"MFU {100 * j.r('mfu'):.1f}%, peak {j.r('measured_peak_bytes') / 1e9:.1f} GB",
     "python benchmarks/train_step.py --config=configs/aogpt_small.py "
     "--config.model.dtype=bfloat16 --config.seq_len=1024 --config.batch_size=16 "
     "--config.microbatches=1 --config.model.attention_impl=cudnn --steps=20"),
    ("H100: GPT-2 Small train step (no adaLN, L2R), same flags", "train_step_gpt2_small/h100.json",
     lambda j: f"{1e3 * j.r('step_s_median'):.1f} ms, MFU {100 * j.r('mfu'):.1f}%",
     "python benchmarks/train_step.py --config=configs/gpt2_small.py "
     "--config.model.dtype=bfloat16 --config.seq_len=1024 --config.batch_size=16 "
     "--config.microbatches=1 --config.model.attention_impl=cudnn --steps=20"),
    ("H100: sampling n = T = 1024, batch 32, KV-cached diffusion vs encoder MDM and AR",
     "sample_speed_small/h100.json",
     lambda j: f"{j.r('rows', {'method': 'diffusion', 'steps': 1024}, 'run_s'):.3f} s: "
               f"{_x(j.r('rows', {'method': 'diffusion', 'steps': 1024}, 'encoder_over_diffusion_speedup'))}"
               f" faster than encoder MDM, "
               f"{j.r('rows', {'method': 'diffusion', 'steps': 1024}, 'vs_ar_time_ratio'):.2f}x AR's time",
     "python benchmarks/sample_speed.py --preset=small --batch=32 --length=1024 "
     "--steps=256,1024 --methods=diffusion,ar,encoder --dtype=bfloat16 --repeats=2"),
    ("H100: vs the published code, bf16 (train step; sampling T = 256, top-p 1.0; ensembles)",
     "vs_published_gpu/h100.json",
     lambda j: f"train {_x(j.r('best_s', 'train', 'published') / j.r('best_s', 'train', 'ours'))}, "
               f"sampling {_x(j.r('best_s', 'sample T=256 top_p=1.0', 'published') / j.r('best_s', 'sample T=256 top_p=1.0', 'ours'))}, "
               f"ensembles {j.r('best_s', 'ensembles', 'published') / j.r('best_s', 'ensembles', 'ours'):.0f}x"
               f" warm / {_x(j.r('best_s', 'ensembles', 'published') / j.r('best_s', 'ensembles', 'ours_first_call_s'))}"
               " counting compilation",
     f"{VS} --device=gpu --repeats=1 --runs=2"),
    ("H200: AO-GPT Small train step (16 x 1024, bf16, cuDNN, every block rematerialised) and "
     "sampling n = T = 1024, batch 32", "gpu_suite/h200.json", _gpu_quick,
     "benchmarks/gpu_suite.sh --quick"),
    ("H200: the reasoning gap at accelerator size, held-out 9x9 Sudoku (30-40 givens), the "
     "8 x 256 model (solved, of 200)", "reasoning_gap_accel_sudoku9/h200.json",
     _gap_pair("sudoku9", "blanks"), "RG_STEPS=3500 benchmarks/accel_session.sh"),
    ("H200: star graph (degree 5, path 8, 64 nodes), the 8 x 256 model (solved, of 200)",
     "reasoning_gap_accel_star_graph/h200.json", _gap_pair("star_graph", "blanks_r2l"),
     "RG_STEPS=3500 benchmarks/accel_session.sh"),
    ("Memory per device, AO-GPT Small / Medium train step, 16 x 1024 per rank, 64-way FSDP "
     "(XLA:CPU estimate, simulated mesh)", f"scale_sim_pods/{CPU}",
     lambda j: " / ".join(
         f"{j.r('rows', {'program': 'train', 'size': s, 'mesh': {'data': 1, 'fsdp': 64, 'tensor': 1}}, 'peak_bytes') / 2**30:.1f}"
         for s in ("small", "medium")) + " GiB peak",
     "python benchmarks/scale_sim.py --name=scale_sim_pods"),
    ("Memory per device, paper recipe (remat, chunked loss; blockwise attention as the flash "
     "stand-in), AO-GPT Small / Medium train step, 16 x 1024 per rank, 64-way FSDP (XLA:CPU "
     "estimate; a v5e core has 16 GB)", f"scale_sim_paper/{CPU}",
     lambda j: " / ".join(
         f"{j.r('rows', {'program': 'train', 'size': s, 'mesh': {'data': 1, 'fsdp': 64, 'tensor': 1}}, 'peak_bytes') / 2**30:.1f}"
         for s in ("small", "medium")) + " GiB peak",
     "python benchmarks/scale_sim.py --meshes=8:fsdp,64:fsdp,256:data+fsdp --programs=train "
     "--name=scale_sim_paper"),
    ("Data: prepare GPT-2 tokens (1 process) / stream 512 x 1024 batches (worker_count 0)",
     f"data_throughput/{CPU}",
     lambda j: f"{j.r('prepare', {'tokenizer': 'gpt2', 'num_proc': 1}, 'tokens_per_s_per_core') / 1e6:.2f}M"
               f" tokens/s per core / "
               f"{j.r('stream', {'worker_count': 0}, 'tokens_per_s') / 1e6:.1f}M tokens/s",
     "python benchmarks/data_throughput.py --worker_counts=0,2"),
    ("Speculative decoding, an earlier quickstart model (trained on 128-byte rows), batch 8, "
     "length 128, random order, K = 4, temperature 1",
     f"speculative_batch8/{CPU}",
     lambda j: (lambda r: f"{r['passes_per_token']:.2f} passes/token ({1 / r['passes_per_token']:.1f}x"
                          f" fewer than AR), wall {r['vs_ar_time']:.2f}x AR's time")(
         j.r('models', 'trained', {'method': 'speculative', 'order': 'random', 'temperature': 1.0,
                                   'draft': 4, 'queries': 'taper'})),
     "python benchmarks/speculative.py --workdir=RUN"),
    ("CPU: where the order matters, held-out 6x6 Sudoku and star graphs, greedy, the same "
     "size for every model (solved, of 200)", f"order_matters_cpu/{XEON}", _order_matters,
     "python benchmarks/order_matters.py"),
    ("CPU: the reasoning gap, held-out 6x6 Sudoku, greedy, every variant 1,200 steps like the "
     "encoder MDM (solved, of 200)", f"reasoning_gap_cpu/{XEON}", _reasoning_gap,
     "python benchmarks/reasoning_gap.py"),
    ("CPU: GRPO on held-out 6x6 Sudoku, exact likelihoods vs d1's mean-field and a Monte Carlo "
     "ELBO (solved, of 500)", f"post_training_cpu/{XEON}", _post_training,
     "python benchmarks/post_training.py --reward=cell_accuracy"),
    ("CPU: GRPO with a reward per cell (`rl.credit=token`, `cell_correct`), held-out 6x6 "
     "Sudoku, seed 0 (solved, of 500)", f"post_training_cpu_token_credit/{XEON}", _token_credit,
     "python benchmarks/post_training.py --runs=token_credit --seeds=0 --lr=1e-4 --updates=300 "
     "--name=token_credit"),
    ("CPU: the same per-cell GRPO on two more seeds (solved, of 500)",
     f"post_training_cpu_token_credit_seeds12/{XEON}", _token_credit_seeds,
     "python benchmarks/post_training.py --runs=token_credit --seeds=1,2 --lr=1e-4 "
     "--updates=300 --name=token_credit_seeds12"),
    ("CPU: one compiled GRPO update of 64 rollouts (8 puzzles x 8, 6x6 Sudoku, the 4 x 128 "
     "blank-block model, exact likelihood)", f"grpo_speed_cpu/{XEON}", _grpo_speed,
     "python benchmarks/grpo_speed.py"),
]


def table(results_dir: pathlib.Path = RESULTS) -> str:
  lines = ["| what | number | machine | command | JSON |", "|---|---|---|---|---|"]
  cache: dict[str, Result] = {}
  for what, rel, number, command in ROWS:
    j = cache.get(rel) or cache.setdefault(rel, Result(results_dir, rel))
    lines.append(f"| {what} | {number(j)} | {j.machine()} | `{command}` | `{j.shown}` |")
  return "\n".join(lines)


def replace_between_markers(text: str, body: str, where: str = "file") -> str:
  """``text`` with the lines between the START and END marker lines replaced by ``body``."""
  lines = text.splitlines(keepends=True)
  starts = [i for i, l in enumerate(lines) if l.strip() == START]
  ends = [i for i, l in enumerate(lines) if l.strip() == END]
  if len(starts) != 1 or len(ends) != 1 or starts[0] > ends[0]:
    raise TableError(f"{where}: needs exactly one '{START}' line followed by one '{END}' line "
                     f"(found {len(starts)} and {len(ends)})")
  return "".join(lines[:starts[0] + 1]) + body.rstrip("\n") + "\n" + "".join(lines[ends[0]:])


def write(path: pathlib.Path, body: str) -> None:
  new = replace_between_markers(path.read_text(), body, str(path))
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
  with os.fdopen(fd, "w") as f:
    f.write(new)
  os.replace(tmp, path)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--write", nargs="+", metavar="FILE",
                  help=f"replace the lines between {START} and {END} in each FILE")
  ap.add_argument("--results", default=str(RESULTS), help="the results folder")
  a = ap.parse_args(argv)
  try:
    body = table(pathlib.Path(a.results))
    if not a.write:
      print(body)
      return
    for f in a.write:
      write(pathlib.Path(f), body)
      print(f"results_table: wrote {f}")
  except (TableError, OSError) as e:
    sys.exit(f"results_table: {e}")


if __name__ == "__main__":
  main()
