"""lm-evaluation-harness adapter: the registered model ``aogpt`` (``pip install -e .[lmeval]``).

    python -m aogpt_jax.evaluation.lmeval --model aogpt \\
        --model_args checkpoint=SPEC --tasks lambada_openai
    # or from Python, after `import aogpt_jax.evaluation.lmeval` (registers "aogpt"):
    lm_eval.simple_evaluate(model="aogpt", model_args="checkpoint=SPEC", tasks=[...])

``python -m aogpt_jax.evaluation.lmeval`` is lm_eval's own command line (same flags) with the
model registered first: the harness has no plugin discovery, so a bare ``lm_eval --model aogpt``
does not know the name. An error ends in one line (``--verbose``: the traceback).

model_args: ``checkpoint=SPEC`` (resolved as ``--checkpoint``: a published .pt, a converted
folder or ``hf:...``; `aogpt_jax.checkpoints.spec`), ``which=ema|params``, ``tokenizer=NAME``
(default: ``gpt2`` for a 50257-id model, ``byte`` for 257 ids), ``batch_size`` (over the
harness's ``--batch_size``; ``auto`` is 8), ``ensemble_m=M``, ``seed``, ``max_gen_toks``,
``trust_pickle``.

* ``loglikelihood``: the exact left-to-right log-likelihood of the continuation from one causal
  forward over ``context + continuation`` (the model's START slot is the BOS; an empty context is
  the end-of-text token, as the harness does for every model; at most ``block_size`` tokens, the
  context cut on the left). ``ensemble_m=M > 1``: every continuation token's probability is
  instead the context-order ensemble of the paper's Eq. 4 (`evaluation.ensembles`, base order
  left to right, ``M`` orderings of the tokens before it, the identity one included; seed
  ``seed``). ``is_greedy`` is always that of the left-to-right distribution.
* ``loglikelihood_rolling``: the text's tokens cut into consecutive blocks of ``block_size`` as
  ``--mode=eval`` cuts its streams (`data.pipeline.pack`; the last, shorter block kept with
  weight-0 padding), each scored left to right from START by `perplexity.token_nll`: the sum
  equals what the perplexity code gives for the same blocks.
* ``generate_until``: prefix prompting through the KV-cached left-to-right decoder
  (``sample.method='ar'``): greedy unless ``do_sample`` (then ``temperature``, ``top_p``), up to
  ``max_gen_toks`` tokens, cut at the first stop string of ``until`` or at end-of-text. The
  decoder runs the whole batch to its (bucketed) length; stop strings cut afterwards.
"""

from __future__ import annotations

import dataclasses
import importlib
import zlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from aogpt_jax.checkpoints import spec as checkpoint_spec
from aogpt_jax.data import tokenizers
from aogpt_jax.evaluation import ensembles as ens_lib
from aogpt_jax.evaluation import perplexity as ppl_lib
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import jit as model_jit
from aogpt_jax.sampling import prompts
from aogpt_jax.sampling import sampler

# The harness's own model names first (its get_model loads them only into an empty registry).
importlib.import_module("lm_eval.models")


def bucket(length: int, limit: int, smallest: int = 16) -> int:
  """Padded length of a batch: the next power of two (>= ``smallest``), at most ``limit``."""
  return min(limit, max(smallest, 1 << max(0, int(length) - 1).bit_length()))


def text_blocks(ids: Sequence[int], n: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [k, n], weight [k, n]): ``ids`` cut into consecutive blocks of ``n`` as
  `data.pipeline.pack` cuts an eval stream, the remainder kept as one more block padded with
  weight 0 (every token scored once)."""
  k = max(1, -(-len(ids) // n))
  tokens = np.zeros((k * n,), np.int32)
  tokens[:len(ids)] = ids
  weight = (np.arange(k * n) < len(ids)).astype(np.float64)
  return tokens.reshape(k, n), weight.reshape(k, n)


@model_jit.jit()
def _l2r_scores(m, tokens):
  """Left-to-right log p [B, n] of every token and whether it is the argmax."""
  order = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  logits = m(tokens, order)
  return -model_lib.nll_from_logits(logits, tokens), jnp.argmax(logits, -1) == tokens


def _int(name: str, value, lo: int = 1) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit() \
      or int(value) < lo:
    raise ValueError(f"aogpt model_args {name}: expected an integer >= {lo}, got {value!r}")
  return int(value)


class AOGPTLM(TemplateLM):
  """An AO-GPT checkpoint as an lm-evaluation-harness model (see the module docstring)."""

  def __init__(self, checkpoint: str = "", which: str = "ema", tokenizer: str = "",
               batch_size: Any = 8, ensemble_m: Any = 1, seed: Any = 0,
               max_gen_toks: Any = 256, trust_pickle: bool = False, max_batch_size=None,
               device=None, **unknown):
    super().__init__()
    del max_batch_size, device            # passed by the harness; JAX picks its own device
    if unknown:
      raise ValueError(f"aogpt model_args: unknown {sorted(unknown)}; known: checkpoint, which, "
                       f"tokenizer, batch_size, ensemble_m, seed, max_gen_toks, trust_pickle")
    if not checkpoint:
      raise ValueError("aogpt model_args: checkpoint=SPEC is required (a published .pt, a "
                       "converted folder or hf:OWNER/REPO/PATH)")
    self.model, self.cfg, self.provenance = checkpoint_spec.load(str(checkpoint), which,
                                                                 bool(trust_pickle))
    name = tokenizer or checkpoint_spec.default_tokenizer(self.cfg)
    self.tok = tokenizers.get_tokenizer(str(name))
    checkpoint_spec.check_vocab(self.cfg, str(name), self.tok.vocab_size)
    self.batch_size = 8 if str(batch_size).startswith("auto") else _int("batch_size", batch_size)
    self.ensemble_m = _int("ensemble_m", ensemble_m)
    self.seed = _int("seed", seed, 0)
    self.max_gen_toks = _int("max_gen_toks", max_gen_toks)
    self._graphdef, self._params = nnx.split(self.model)
    self._sample_offset = 0

  @classmethod
  def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
    """The harness's constructor from ``--model_args``: a ``batch_size`` there wins over the
    harness's own ``--batch_size`` (which it always passes, 1 by default) instead of being a
    second value for the same keyword."""
    from lm_eval import utils  # pylint: disable=g-import-not-at-top
    return cls.create_from_arg_obj(utils.simple_parse_args_string(arg_string),
                                   additional_config)

  @classmethod
  def create_from_arg_obj(cls, arg_dict: dict[str, Any],
                          additional_config: dict[str, Any] | None = None):
    extra = {k: v for k, v in (additional_config or {}).items()
             if v is not None and k not in arg_dict}
    return cls(**arg_dict, **extra)

  # ------------------------------------------------------------------ tokenizer interface

  @property
  def eot_token_id(self) -> int:
    return self.tok.eot_id

  @property
  def max_length(self) -> int:
    return self.cfg.block_size

  @property
  def tokenizer_name(self) -> str:
    return self.tok.name

  def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
    del add_special_tokens, kwargs
    return list(self.tok.encode(string))

  def tok_decode(self, ids: Sequence[int]) -> str:
    return self.tok.decode(ids)

  # ------------------------------------------------------------------ scoring

  def _batches(self, items: list, key):
    order = sorted(range(len(items)), key=lambda i: -key(items[i]))
    for a in range(0, len(order), self.batch_size):
      yield order[a:a + self.batch_size]

  def _padded(self, rows: list[list[int]], n: int) -> np.ndarray:
    out = np.zeros((self.batch_size, n), np.int32)       # fixed batch: one compiled shape
    for r, ids in enumerate(rows):
      out[r, :len(ids)] = ids
    return out

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
    del disable_tqdm, kwargs
    n_max = self.cfg.block_size
    seqs = []
    for (ctx, cont), ctx_enc, cont_enc in requests:
      if not cont_enc:
        raise ValueError(f"aogpt loglikelihood: empty continuation for context {ctx[-40:]!r}")
      if len(cont_enc) >= n_max:
        raise ValueError(f"aogpt loglikelihood: continuation {cont[:40]!r}... has "
                         f"{len(cont_enc)} tokens; the model reads at most {n_max - 1} after "
                         f"one context token")
      seqs.append(((list(ctx_enc) + list(cont_enc))[-n_max:], len(cont_enc)))
    out: list[Any] = [None] * len(seqs)
    for idx in self._batches(seqs, key=lambda s: len(s[0])):
      rows = [seqs[i][0] for i in idx]
      n = n_max if self.ensemble_m > 1 else bucket(max(map(len, rows)), n_max)
      tokens = self._padded(rows, n)
      logp, greedy = (np.asarray(a) for a in _l2r_scores(self._graphdef, self._params,
                                                          jnp.asarray(tokens)))
      if self.ensemble_m > 1:
        logp = self._ensemble_logp(tokens, rows, [seqs[i][1] for i in idx], logp)
      for r, i in enumerate(idx):
        length, k = len(rows[r]), seqs[i][1]
        out[i] = (float(np.sum(logp[r, length - k:length], dtype=np.float64)),
                  bool(np.all(greedy[r, length - k:length])))
    return out

  def _ensemble_logp(self, tokens, rows, cont_lens, base_logp) -> np.ndarray:
    """log of the Eq. 4 ensemble probability [B, n] at the continuation ranks (base order
    left to right, block id = CRC-32 of the row's real tokens)."""
    b, n = tokens.shape
    ids = np.array([zlib.crc32(np.asarray(r, np.int32).tobytes()) for r in rows]
                   + [0] * (b - len(rows)), np.uint32)
    ranks = sorted({i for r, k in zip(rows, cont_lens) for i in range(len(r) - k, len(r))})
    sigma = np.broadcast_to(np.arange(n, dtype=np.int32), (b, n))
    # layout="pairs": one compiled shape whatever the continuation ranks (buckets would
    # compile new row lengths for almost every batch of a harness task).
    lp = ens_lib.ensemble_logp(self.model, tokens, ids, sigma, base_logp, max_m=self.ensemble_m,
                               seed=self.seed, ranks=ranks, rows=list(range(len(rows))),
                               layout="pairs")
    lp = np.where(np.isnan(lp), 0.0, lp)                 # ranks not asked for: unused
    return -ens_lib.ensemble_nll(lp, [self.ensemble_m])[0]

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    del disable_tqdm
    n = self.cfg.block_size
    blocks, owner = [], []
    for d, req in enumerate(requests):
      tokens, weight = text_blocks(self.tok_encode(req.args[0]), n)
      blocks += list(zip(tokens, weight))
      owner += [d] * len(tokens)
    total = np.zeros((len(requests),), np.float64)
    for idx in self._batches(blocks, key=lambda bw: int(np.sum(bw[1]))):
      width = bucket(max(int(np.sum(blocks[i][1])) for i in idx), n)
      tokens = np.zeros((self.batch_size, width), np.int32)
      weight = np.zeros((self.batch_size, width), np.float64)
      for r, i in enumerate(idx):
        tokens[r], weight[r] = blocks[i][0][:width], blocks[i][1][:width]
      tokens, weight = ppl_lib.check_eval_batch({"tokens": tokens, "weight": weight}, self.cfg)
      nll, order = ppl_lib.token_nll(self.model, tokens, ppl_lib.block_ids({"tokens": tokens}),
                                     order="l2r", seed=self.seed)
      per_token = ppl_lib.to_original(np.asarray(nll, np.float64), np.asarray(order)) * weight
      for r, i in enumerate(idx):
        total[owner[i]] -= per_token[r].sum()
    return [float(t) for t in total]

  # ------------------------------------------------------------------ generation

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    del disable_tqdm
    groups: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
      groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
    out: list[str] = [""] * len(requests)
    for members in groups.values():
      kw = dict(requests[members[0]].args[1])
      until = kw.pop("until", None) or []
      until = [until] if isinstance(until, str) else list(until)
      eot = self.tok.decode([self.eot_token_id])
      until = until + ([eot] if eot and eot not in until else [])
      max_gen = _int("max_gen_toks", kw.pop("max_gen_toks", self.max_gen_toks))
      max_gen = min(max_gen, self.cfg.block_size - 1)
      sample = bool(kw.pop("do_sample", False)) and float(kw.get("temperature", 1.0)) > 0
      settings = sampler.SampleSettings(
          length=1, method="ar", greedy=not sample,
          temperature=float(kw.get("temperature", 1.0)) if sample else 1.0,
          top_p=float(kw.get("top_p", 1.0)) if sample else 1.0)
      ctxs = [self.tok_encode(requests[i].args[0])[-(self.cfg.block_size - max_gen):] or
              [self.eot_token_id] for i in members]
      for idx in self._batches(ctxs, key=len):
        rows = [ctxs[i] for i in idx]
        n = bucket(max(map(len, rows)) + max_gen, self.cfg.block_size)
        rows_full = rows + [rows[0]] * (self.batch_size - len(rows))
        prompt = prompts.prefix_prompt(rows_full, n, self.cfg.valid_vocab_size)
        s = dataclasses.replace(settings, length=n)
        toks = sampler.generate(self.model, jax.random.key(self.seed), s, prompt=prompt,
                                sample_offset=self._sample_offset).tokens
        self._sample_offset += self.batch_size
        for r, i in enumerate(idx):
          gen = [int(t) for t in toks[r, len(rows[r]):len(rows[r]) + max_gen]]
          if self.eot_token_id in gen:
            gen = gen[:gen.index(self.eot_token_id)]
          text = self.tok_decode(gen)
          for stop in until:
            if stop:
              text = text.split(stop)[0]
          out[members[i]] = text
    return out


if __name__ == "__main__":
  # Run as `python -m`: register the class of the module imported under its own name (not this
  # __main__ copy), then the harness's own command line.
  # A bad task, model_arg, checkpoint or tokenizer ends in one line (`aogpt_jax.errors`),
  # --verbose for the traceback.
  import sys
  from aogpt_jax import errors
  importlib.import_module("aogpt_jax.evaluation.lmeval")
  from lm_eval.__main__ import cli_evaluate

  def _cli(argv):
    sys.argv = sys.argv[:1] + argv
    return cli_evaluate()

  sys.exit(errors.run_cli(_cli, sys.argv[1:], prog="aogpt_jax.evaluation.lmeval",
                          errors=(Exception,)))
else:
  register_model("aogpt")(AOGPTLM)
