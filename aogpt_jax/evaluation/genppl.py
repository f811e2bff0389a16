"""Generative perplexity: samples scored by a GPT-2 evaluator, with their unigram entropy.

Protocol (the paper's Table 1, following SEDD/MDLM): each sample (GPT-2 token ids, typically
1024 long) is scored by GPT-2 Large as a causal LM. By default the first token is only context
(tokens 1..L-1 are scored); ``prepend_eot=True`` puts end-of-text (50256) in front and scores
all L tokens (the sample must then fit in n_positions - 1). Two aggregations, both reported and
named:
  * ``corpus``: exp(total NLL / total scored tokens);
  * ``per_sample_mean``: mean over samples of exp(mean NLL of the sample).
Beside it the samples' unigram entropy (nats): the mean over samples of the entropy of each
sample's token histogram (``per_sample_mean``) and the entropy of the pooled histogram
(``corpus``). Low entropy with low perplexity means repetitive samples, not good ones.

``GRID`` is the paper's sampling grid; `run_grid` runs a sampler callable over it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from aogpt_jax.checkpoints import hub
from aogpt_jax.config import ConfigError
from aogpt_jax.evaluation import gpt2 as gpt2_lib
from aogpt_jax.sampling import sampler as sampler_lib

GRID: dict[str, Any] = {
    "sampling": [{"top_p": 1.0, "temperature": 1.0},
                 {"top_p": 0.95, "temperature": 0.9},
                 {"top_p": 0.95, "temperature": 0.7}],
    "steps": [64, 128, 256, 512, 1024],
}
EOT = 50256


def unigram_entropy(samples: np.ndarray) -> dict[str, float]:
  """Unigram entropy (nats) of each sample's tokens, averaged, and of all tokens pooled."""
  samples = np.asarray(samples)
  per = []
  for row in samples:
    _, c = np.unique(row, return_counts=True)
    p = c / c.sum()
    per.append(float(-(p * np.log(p)).sum()))
  _, c = np.unique(samples, return_counts=True)
  p = c / c.sum()
  return {"per_sample_mean": float(np.mean(per)), "corpus": float(-(p * np.log(p)).sum())}


class GPT2Scorer:
  """Per-token NLLs of token sequences under a GPT-2 loaded from a local HF folder."""

  def __init__(self, params: dict, cfg: gpt2_lib.GPT2Config):
    self.params, self.cfg = params, cfg

  @classmethod
  def from_pretrained(cls, path: str, dtype: str = "float32") -> "GPT2Scorer":
    """``path``: a local Hugging Face GPT-2 folder, or ``hf:OWNER/REPO`` (e.g.
    ``hf:openai-community/gpt2-large``) read from the local Hugging Face cache
    (`aogpt_jax.checkpoints.hub`; nothing is downloaded)."""
    if path.startswith("hf:"):
      path = hub.resolve(path, files=("config.json", "model.safetensors"))
    return cls(*gpt2_lib.load(path, dtype))

  def token_nll(self, tokens: np.ndarray, *, prepend_eot: bool = False,
                batch_size: int = 8, eot: int = EOT) -> np.ndarray:
    """float64 [N, L'] NLL of each scored token (L' = L - 1, or L with ``prepend_eot``: the
    end-of-text id ``eot`` in front)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
      raise ValueError(f"samples must be [num_samples, length], got shape {tokens.shape}")
    bad = np.argwhere((tokens < 0) | (tokens >= self.cfg.vocab_size))
    if len(bad):
      r, c = bad[0]
      raise ValueError(f"sample {r} has token {tokens[r, c]} at position {c}, outside the "
                       f"evaluator's vocabulary [0, {self.cfg.vocab_size})")
    if prepend_eot:
      if not 0 <= eot < self.cfg.vocab_size:
        raise ValueError(f"prepend_eot: end-of-text id {eot} is outside the evaluator's "
                         f"vocabulary [0, {self.cfg.vocab_size})")
      tokens = np.concatenate([np.full((len(tokens), 1), eot, tokens.dtype), tokens], axis=1)
    if tokens.shape[1] > self.cfg.n_positions:
      raise ValueError(f"samples of {tokens.shape[1]} tokens (with EOT: {prepend_eot}) exceed the "
                       f"evaluator's context of {self.cfg.n_positions}")
    if tokens.shape[1] < 2:
      raise ValueError("samples need at least 2 tokens to be scored")
    out = []
    for a in range(0, len(tokens), batch_size):
      chunk = tokens[a:a + batch_size]
      pad = batch_size - len(chunk)
      x = jnp.asarray(np.concatenate([chunk, np.repeat(chunk[:1], pad, 0)]), jnp.int32)
      out.append(np.asarray(_nll(self.params, x, cfg=self.cfg), np.float64)[:len(chunk)])
    return np.concatenate(out)


@jax.jit
def _shift_nll(lg, x):
  lse = jax.nn.logsumexp(lg[:, :-1], axis=-1)
  return lse - jnp.take_along_axis(lg[:, :-1], x[:, 1:, None], axis=-1)[..., 0]


def _nll(params, x, *, cfg):
  return _shift_nll(gpt2_lib.logits(params, x, cfg=cfg), x)


def generative_perplexity(samples: np.ndarray, scorer: GPT2Scorer, *, prepend_eot: bool = False,
                          batch_size: int = 8, eot: int = EOT) -> dict:
  """Scores ``samples`` [N, L]: both perplexity aggregations and the unigram entropy."""
  nll = scorer.token_nll(samples, prepend_eot=prepend_eot, batch_size=batch_size, eot=eot)
  per_sample = nll.mean(axis=1)
  return {
      "gen_ppl": {"corpus": math.exp(float(nll.sum() / nll.size)),
                  "per_sample_mean": float(np.mean(np.exp(per_sample)))},
      "mean_nll": {"corpus": float(nll.sum() / nll.size),
                   "per_sample_mean": float(per_sample.mean())},
      "unigram_entropy": unigram_entropy(samples),
      "num_samples": int(len(samples)), "length": int(np.asarray(samples).shape[1]),
      "scored_tokens": int(nll.size), "prepend_eot": prepend_eot,
      "evaluator": {"n_layer": scorer.cfg.n_layer, "n_embd": scorer.cfg.n_embd},
  }


SampleFn = Callable[..., np.ndarray]


def run_grid(sample_fn: SampleFn, scorer: GPT2Scorer, *, num_samples: int, seed: int = 0,
             grid: dict[str, Any] | None = None, prepend_eot: bool = False,
             batch_size: int = 8, eot: int = EOT) -> list[dict]:
  """For every (top_p, temperature) x steps of ``grid`` (default `GRID`): draws samples with
  ``sample_fn(num_samples=, steps=, top_p=, temperature=, seed=) -> int [N, L]`` and scores them."""
  grid = grid or GRID
  unknown = sorted(set(grid) - {"sampling", "steps"})
  if unknown:
    raise ValueError(f"generative perplexity grid: unknown keys {unknown}")
  rows = []
  for s in grid["sampling"]:
    for steps in grid["steps"]:
      samples = np.asarray(sample_fn(num_samples=num_samples, steps=int(steps),
                                     top_p=float(s["top_p"]),
                                     temperature=float(s["temperature"]), seed=seed))
      res = generative_perplexity(samples, scorer, prepend_eot=prepend_eot,
                                  batch_size=batch_size, eot=eot)
      rows.append(dict(res, steps=int(steps), top_p=float(s["top_p"]),
                       temperature=float(s["temperature"]), seed=seed))
  return rows


def grid_table(rows: Sequence[dict]) -> str:
  """Markdown: one row per (top_p, temperature, steps); both perplexities and the entropy."""
  lines = ["| top-p | temperature | steps | gen. PPL (corpus) | gen. PPL (per-sample mean) | "
           "unigram entropy |", "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['top_p']} | {r['temperature']} | {r['steps']} | "
                 f"{r['gen_ppl']['corpus']:.2f} | {r['gen_ppl']['per_sample_mean']:.2f} | "
                 f"{r['unigram_entropy']['per_sample_mean']:.3f} |")
  return "\n".join(lines)


def grid_from_config(g, sample) -> dict:
  """The (top_p, temperature) x steps grid of the ``genppl`` group (see config.genppl_group);
  empty entries take the ``sample`` group's values, ``paper`` is `GRID`."""
  raw = str(g.sampling).strip()
  if raw == "paper":
    sampling = GRID["sampling"]
  elif raw:
    sampling = []
    for item in raw.split(","):
      try:
        p, t = (float(v) for v in item.split("/"))
      except ValueError:
        raise ConfigError(f"genppl.sampling: expected 'TOP_P/TEMPERATURE,...' or 'paper', got "
                          f"{item!r}") from None
      sampling.append({"top_p": p, "temperature": t})
  else:
    sampling = [{"top_p": float(sample.top_p), "temperature": float(sample.temperature)}]
  raw = str(g.steps).strip()
  try:
    steps = (GRID["steps"] if raw == "paper" else
             [int(v) for v in raw.split(",")] if raw else
             [None if sample.steps is None else int(sample.steps)])   # None: the sample length
  except ValueError:
    raise ConfigError(f"genppl.steps: expected '64,128,...' or 'paper', got {raw!r}") from None
  method, policy = str(sample.get("method", "") or ""), str(sample.get("policy", "max_prob"))
  # "" follows the objective (diffusion / encoder: both take steps)
  if len(set(steps)) > 1 and method and not sampler_lib.uses_steps(method, policy):
    what = f"sample.method={method!r}" + (f" with sample.policy={policy!r}"
                                          if method == "adaptive" else "")
    raise ConfigError(f"genppl.steps: {raw!r} varies sample.steps, which {what} ignores (it "
                      f"chooses its own number of steps): every row would be the same samples; "
                      f"give one value, or a method that takes steps (diffusion)")
  return {"sampling": sampling, "steps": steps}
