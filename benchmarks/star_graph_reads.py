"""What a trained star-graph model reads: for each answer cell of held-out graphs, the model's
probability of the right node (a) with every other answer cell written (the truth), (b) with
none of the middle cells written (the prompt, the start and the goal only), and (c) with the
cell after it (nearer the goal) written WRONG, another node of the graph: the probability of the
truth and of the wrong node's parent. A model that walks back from the goal by reading the
written path follows the wrong node ((c) high on "parent of the wrong node"); a model that
computes each cell from the prompt alone ignores it ((b) as high as (a)).

    python benchmarks/star_graph_reads.py --workdir=/tmp/star_parents [--workdir=/tmp/star_mdm]

Each ``--workdir`` is a trained run of ``configs/star_graph.py`` (any encoding; AO-GPT, with or
without the blank block, or the encoder MDM). AO-GPT's probabilities are its exact conditionals
(`posttrain.likelihood.rollout_logits`, one cell a step, the cell scored last or after the start
and goal); the MDM's are its forward with the other cells shown or [MASK]ed. Writes
benchmarks/results/star_graph_reads[_NAME]/<machine>.{json,md} (``--name``; or ``--out``).
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

import common


def parents_of(task, tokens) -> np.ndarray:
  """int [B, num_nodes]: each row's parent of every node (``num_nodes`` where none)."""
  edges = task.edge_pairs(tokens)
  out = np.full((len(tokens), task.num_nodes), task.num_nodes, np.int64)
  np.put_along_axis(out, edges[:, :, 1], edges[:, :, 0], axis=1)
  return out


def corrupt_next(task, tokens, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
  """``tokens`` with answer position ``k + 1`` set to another node of each row's graph (not the
  truth, whose parent is not the truth at ``k``), and that node's parent [B]."""
  t, par = tokens.copy(), parents_of(task, tokens)
  follow = np.zeros(len(t), np.int64)
  for b in range(len(t)):
    cands = [v for v in range(task.num_nodes) if par[b, v] != task.num_nodes
             and v != t[b, k + 1] and par[b, v] != t[b, k]]
    v = int(rng.choice(cands))
    t[b, k + 1], follow[b] = v, par[b, v]
  return t, follow


def conditionals(model, task, tokens, k: int, written) -> np.ndarray:
  """float [B, V]: the model's distribution at answer position ``k`` given the prompt and the
  answer positions ``written`` (original order)."""
  import jax
  import jax.numpy as jnp
  from aogpt_jax.model import encoder
  b, n = tokens.shape
  p = task.prompt_length
  if encoder.is_encoder(model.cfg):
    masked = np.ones((b, n), bool)
    masked[:, :p] = False
    masked[:, list(written)] = False
    logits = encoder.encoder_logits(model, encoder.masked_tokens(model.cfg, jnp.asarray(tokens),
                                                                 jnp.asarray(masked)))
    return np.asarray(jax.nn.softmax(logits[:, k], -1))
  from aogpt_jax.posttrain import likelihood
  rest = [a for a in range(p, n) if a != k and a not in written]
  order = np.array(list(range(p)) + list(written) + [k] + rest)[None].repeat(b, 0)
  steps = np.concatenate([np.full(p, -1), np.arange(n - p)])[None].repeat(b, 0)
  prompt = np.zeros((b, n), bool)
  prompt[:, :p] = True
  logits = likelihood.rollout_logits(model, jnp.asarray(tokens), jnp.asarray(order),
                                     jnp.asarray(steps), jnp.asarray(prompt))
  return np.asarray(jax.nn.softmax(logits[:, p + len(written)], -1))


def measure(workdir: str, count: int, seed: int) -> dict:
  from aogpt_jax import tasks
  from aogpt_jax.checkpoints import store
  model, cfg = store.load_model(workdir, which="ema")
  task = tasks.make(cfg.task.name, **dict(cfg.task.options))
  if cfg.task.name != "star_graph":
    raise SystemExit(f"--workdir={workdir!r}: a run of task {cfg.task.name!r}; expected "
                     f"star_graph")
  tokens = np.asarray(task.heldout(seed, count)["tokens"])
  p, n, b = task.prompt_length, task.length, len(tokens)
  rows, rng = {}, np.random.default_rng(seed)
  idx = np.arange(b)
  for k in range(p + 1, n - 1):       # the middle cells (the start and the goal are copies)
    others = [a for a in range(p, n) if a != k]
    truth = tokens[:, k]
    given = conditionals(model, task, tokens, k, others)[idx, truth].mean()
    alone = conditionals(model, task, tokens, k, [p, n - 1])[idx, truth].mean()
    bad, follow = corrupt_next(task, tokens, k, rng)
    c = conditionals(model, task, bad, k, others)
    rows[f"cell {k - p}"] = {"given": float(given), "alone": float(alone),
                             "corrupt_truth": float(c[idx, truth].mean()),
                             "corrupt_follow": float(c[idx, follow].mean())}
    print(f"{workdir} cell {k - p}: {rows[f'cell {k - p}']}", flush=True)
  return {"workdir": workdir, "task_options": task.options(),
          "model": {"objective": cfg.objective, "n_layer": cfg.model.n_layer,
                    "blank_block": bool(cfg.model.get("blank_block", False)),
                    "order": cfg.order.to_dict()},
          "graphs": b, "cells": rows}


def markdown(res: dict) -> str:
  lines = ["| run | cell | all others written | none written | next cell wrong: truth | "
           "next cell wrong: its parent |", "|---|---|---|---|---|---|"]
  for r in res["runs"]:
    for cell, v in r["cells"].items():
      lines.append(f"| {r['workdir']} | {cell} | {v['given']:.3f} | {v['alone']:.3f} | "
                   f"{v['corrupt_truth']:.3f} | {v['corrupt_follow']:.3f} |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--workdir", dest="workdirs", action="append", required=True,
                  help="a trained run (repeat)")
  ap.add_argument("--count", type=int, default=200, help="held-out graphs")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--name", default="", help="results go to benchmarks/results/star_graph_reads_NAME/")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  common.check_args(ap, args, positive=("count",))
  for wd in args.workdirs:
    if not (pathlib.Path(wd).expanduser() / "checkpoints").is_dir():
      common.fail(ap, f"--workdir={wd!r}: no checkpoints/ there; expected a trained run of "
                      f"configs/star_graph.py")
  res = {"runs": [measure(wd, args.count, args.seed) for wd in args.workdirs]}
  common.write_with_markdown("star_graph_reads", args, res, markdown(res))


if __name__ == "__main__":
  main()
