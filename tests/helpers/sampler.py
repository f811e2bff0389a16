"""Helpers shared by the sampler and encoder tests: tiny models and exact distributions (and the
encoder's exact ELBO) by enumeration."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from scipy import stats

from aogpt_jax.model import encoder as mdm
from aogpt_jax.model import aogpt as model_lib


def mixed_prompt(n: int = 10, vocab: int = 13):
  """Four prompt rows of length ``n`` with 3, 1, 0 and 4 given positions (an infill, a single
  token, none, a scatter): (tokens, mask) as `sampling.prompts.pairs_prompt`."""
  from aogpt_jax.sampling import prompts
  return prompts.pairs_prompt([{1: 3, 7: 5, 9: 2}, {4: 1}, {}, {0: 1, 2: 2, 3: 3, 8: 4}], n,
                              vocab)


def mixed_prompt_rows(seed: int = 0, n: int = 10, vocab: int = 13):
  """`mixed_prompt`'s rows filled with random tokens, with a random prompt-first order: (tokens,
  order, prompt mask) as jax arrays and the prompt lengths (numpy)."""
  from aogpt_jax.sampling import prompts
  ptok, pmask = mixed_prompt(n, vocab)
  rng = np.random.default_rng(seed)
  tokens = np.where(pmask, ptok, rng.integers(0, vocab, ptok.shape)).astype(np.int32)
  base = np.stack([rng.permutation(n) for _ in range(len(ptok))]).astype(np.int32)
  order = prompts.build_orders(pmask, base)
  return jnp.asarray(tokens), jnp.asarray(order), jnp.asarray(pmask), pmask.sum(1)


def tiny_model(vocab=16, valid=13, block=12, std=0.3, seed=0, **kw) -> model_lib.AOGPT:
  cfg = model_lib.ModelConfig(vocab_size=vocab, valid_vocab_size=valid, block_size=block,
                              n_layer=2, n_head=2, n_embd=16, target_dim=8, init_std=std, **kw)
  return model_lib.AOGPT(cfg, rngs=nnx.Rngs(seed))


_FORWARDS: dict[int, object] = {}


def forward(m):
  """A jitted ``m(tokens, order)`` (one per model, so repeated calls reuse the compile)."""
  if id(m) not in _FORWARDS:
    _FORWARDS[id(m)] = jax.jit(lambda t, o: m(t, o))
  return _FORWARDS[id(m)]


def tiny_encoder(vocab=4, valid=3, block=4, std=0.5, seed=0) -> model_lib.AOGPT:
  """A tiny encoder-only MDM model (`aogpt_jax.model.encoder`; [MASK] = ``valid``)."""
  cfg = model_lib.ModelConfig(vocab_size=vocab, valid_vocab_size=valid, block_size=block,
                              n_layer=2, n_head=2, n_embd=16, target_dim=8, init_std=std)
  return mdm.make_encoder(cfg, rngs=nnx.Rngs(seed))


def encoder_forward(m):
  """A jitted ``mdm.encoder_logits(m, tokens)`` (one per model)."""
  if id(m) not in _FORWARDS:
    _FORWARDS[id(m)] = jax.jit(lambda t: mdm.encoder_logits(m, t))
  return _FORWARDS[id(m)]


def all_sequences(valid: int, n: int) -> np.ndarray:
  return np.array(list(itertools.product(range(valid), repeat=n)), np.int32)


def conditional_logprobs(m, seqs: np.ndarray, order: np.ndarray, temperature=1.0, top_p=1.0,
                         top_p_rule="published"):
  """log p(x_{order[r]} | x_{order[:r]}) under the gather-path forward (one order for all rows),
  after temperature and top-p, for every sequence: [num_seqs, n]."""
  tokens = jnp.asarray(seqs)
  o = jnp.broadcast_to(jnp.asarray(order, jnp.int32), tokens.shape)
  logp = adjusted_logprobs(np.asarray(forward(m)(tokens, o)), temperature, top_p, top_p_rule)
  tgt = np.asarray(seqs)[:, np.asarray(order)]
  return np.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]


def adjusted_logprobs(logits: np.ndarray, temperature=1.0, top_p=1.0,
                      top_p_rule="published") -> np.ndarray:
  """float64 log-probabilities [..., V] after temperature and top-p, each rule from its
  definition: "published" drops every token whose inclusive cumulative probability (descending
  order) exceeds top_p, keeping the top one; "nucleus" keeps tokens while the mass before them
  is below top_p."""
  logits = np.asarray(logits, np.float64) / temperature
  logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  if top_p < 1.0:
    p = np.exp(logp)
    srt = -np.sort(-p, axis=-1)
    cum = np.cumsum(srt, axis=-1)
    if top_p_rule == "published":
      keep = cum <= top_p
      keep[..., 0] = True
    else:
      keep = cum - srt < top_p
    cutoff = np.min(np.where(keep, srt, np.inf), axis=-1, keepdims=True)
    p = np.where(p >= cutoff, p, 0.0)
    with np.errstate(divide="ignore"):
      logp = np.log(p / p.sum(-1, keepdims=True))
  return logp


def parallel_logprob(m, seqs, order, counts, start=0, **kw) -> np.ndarray:
  """log-probability of every sequence under the parallel steps ``counts`` in ``order``
  starting at rank ``start`` (the ranks before are given): each revealed token is predicted
  from the ranks before its step, i.e. the forward with rank m swapped with its target rank."""
  total = np.zeros(len(seqs))
  frontier = start
  for k in counts:
    for j in range(k):
      o = np.array(order)
      o[frontier], o[frontier + j] = o[frontier + j], o[frontier]
      total += conditional_logprobs(m, seqs, o, **kw)[:, frontier]
    frontier += k
  return total


def encoder_parallel_logprob(m, seqs, order, counts, start=0, **kw) -> np.ndarray:
  """The encoder's version of `parallel_logprob`: at each step the positions of rank >= the
  frontier are [MASK] and every position revealed by the step is scored from that input."""
  seqs = np.asarray(seqs)
  order = np.asarray(order)
  total = np.zeros(len(seqs))
  frontier = start
  for k in counts:
    inp = seqs.copy()
    inp[:, order[frontier:]] = mdm.mask_id(m.cfg)
    logp = adjusted_logprobs(np.asarray(encoder_forward(m)(jnp.asarray(inp))), **kw)
    for p in order[frontier:frontier + k]:
      total += logp[np.arange(len(seqs)), p, seqs[:, p]]
    frontier += k
  return total


def mixture_over_orders(m, seqs, positions, counts, prefix=(), logprob=parallel_logprob,
                        **kw) -> np.ndarray:
  """Exact probability of every sequence when the order is the ``prefix`` ranks followed by a
  uniformly random permutation of ``positions``, revealed with the parallel ``counts``
  (``logprob``: `parallel_logprob` for an AO-GPT, `encoder_parallel_logprob` for an encoder)."""
  total = np.zeros(len(seqs))
  perms = list(itertools.permutations(positions))
  for perm in perms:
    order = np.array(list(prefix) + list(perm))
    total += np.exp(logprob(m, seqs, order, counts, start=len(prefix), **kw))
  return total / len(perms)


def chisquare_p(observed: np.ndarray, expected_p: np.ndarray, n: int) -> float:
  """Chi-square goodness of fit, bins with expected count < 5 merged into one."""
  exp = expected_p * n
  small = exp < 5
  obs = np.concatenate([observed[~small], [observed[small].sum()]])
  exp = np.concatenate([exp[~small], [exp[small].sum()]])
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def histogram(samples: np.ndarray, valid: int) -> np.ndarray:
  idx = np.zeros(len(samples), np.int64)
  for c in range(samples.shape[1]):
    idx = idx * valid + samples[:, c]
  return np.bincount(idx, minlength=valid ** samples.shape[1])


def exact_elbo(m, tokens) -> np.ndarray:
  """The encoder's negative ELBO per sequence [B], exactly: the expectation of the ELBO terms
  by enumerating mask sets M; the integral over t of (1/t) t^|M| (1-t)^(n-|M|) is
  Beta(|M|, n-|M|+1)."""
  weighted = nnx.jit(mdm.weighted_nll)
  n = tokens.shape[1]
  total = np.zeros(tokens.shape[0])
  for k in range(1, n + 1):
    for subset in itertools.combinations(range(n), k):
      masked = np.zeros((tokens.shape[0], n), bool)
      masked[:, list(subset)] = True
      terms = np.asarray(weighted(m, tokens, jnp.asarray(masked), jnp.ones(tokens.shape[0])))
      total += terms * math.gamma(k) * math.gamma(n - k + 1) / math.gamma(n + 1)
  return total
