"""Encoder-only masked diffusion baseline (RADD / MDLM time-independent parameterisation) on
the SAME backbone as AO-GPT, for the paper's architecture comparison.

The encoder is an `AOGPT` with ``target='none'`` run with bidirectional attention over the
original order: the input at position p is ``x_p`` or the [MASK] token plus position embedding
row p + 1 (the START slot and its vector are never used). [MASK] is the first padding id
(``valid_vocab_size``), so it has an embedding row but its logit is -inf like every padding id:
the model can never predict [MASK] or padding. There is no time conditioning.

Training objective (Eq. 1): t ~ U(0, 1], each token masked independently with probability t,
loss = (1/t) * sum over masked positions of -log p(x_i | unmasked tokens), divided by n. Its
expectation is the negative ELBO, which equals the any-order NLL averaged over uniform orders
(the AO-AR / MDM equivalence); `exact_order_nll` gives the NLL of one order (n forwards).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from aogpt_jax.model.aogpt import AOGPT, NO_TARGET, ModelConfig, check_length, nll_from_logits
from aogpt_jax.model.attention import FULL
from aogpt_jax.model.orders import ranks


def encoder_config(cfg: ModelConfig) -> ModelConfig:
  """The encoder's backbone config: the same blocks, no target conditioning."""
  if cfg.vocab_size <= cfg.valid_vocab_size:
    raise ValueError(f"model.vocab_size ({cfg.vocab_size}) must exceed model.valid_vocab_size "
                     f"({cfg.valid_vocab_size}): the encoder's [MASK] token is the first padding id")
  if cfg.prompt_attention != "causal":
    raise ValueError(f"model.prompt_attention={cfg.prompt_attention!r}: the encoder MDM attends "
                     f"bidirectionally everywhere already; expected 'causal' (the default)")
  if cfg.blank_block:
    raise ValueError("model.blank_block=True: the encoder MDM gives every masked position a slot "
                     "that sees every other already; expected False (the default)")
  return cfg.replace(target="none")


def check_encoder(cfg: ModelConfig, what: str) -> None:
  """Raises naming ``what`` (e.g. ``sample.method='encoder'``) unless ``cfg`` is an encoder's
  config: ``target='none'`` (as `make_encoder` builds it) and a padding id for [MASK]."""
  if cfg.target != "none":
    raise ValueError(f"{what} needs the encoder-only MDM model (built with "
                     f"aogpt_jax.model.encoder.make_encoder, model.target='none'); this model has "
                     f"model.target={cfg.target!r}, an AO-GPT")
  encoder_config(cfg)


def is_encoder(cfg: ModelConfig) -> bool:
  """Whether ``cfg`` is sampled as the encoder (``target='none'``, as `make_encoder` builds it):
  the samplers' test for ``method='adaptive'`` (a decoder without target conditioning could not
  be told which position a query predicts)."""
  return cfg.target == "none"


def make_encoder(cfg: ModelConfig, *, rngs: nnx.Rngs) -> AOGPT:
  return AOGPT(encoder_config(cfg), rngs=rngs)


def mask_id(cfg: ModelConfig) -> int:
  return cfg.valid_vocab_size


def _inputs(model: AOGPT, tokens: jax.Array):
  b, n = tokens.shape
  check_length(model.cfg, n)
  pos = jnp.broadcast_to(jnp.arange(1, n + 1, dtype=jnp.int32), (b, n))
  return pos, jnp.full((b, n), NO_TARGET, jnp.int32)


def encoder_hidden(model: AOGPT, tokens: jax.Array, *, dropout_key=None) -> jax.Array:
  """Final hidden states [B, n, d] of the bidirectional encoder (tokens may hold [MASK])."""
  pos, tgt = _inputs(model, tokens)
  h, _ = model.hidden_slots(tokens.astype(jnp.int32), pos, tgt, mask=FULL, dropout_key=dropout_key)
  return h


def encoder_logits(model: AOGPT, tokens: jax.Array, *, dropout_key=None) -> jax.Array:
  """Logits [B, n, V] at every position (padding ids and [MASK] at -inf)."""
  h = encoder_hidden(model, tokens, dropout_key=dropout_key)
  return model.head(h, jnp.full(tokens.shape, NO_TARGET, jnp.int32))


def masked_tokens(cfg: ModelConfig, tokens: jax.Array, masked: jax.Array) -> jax.Array:
  """The encoder's input: [MASK] where ``masked``, else the token (int32, shaped like
  ``tokens``)."""
  return jnp.where(masked, mask_id(cfg), tokens).astype(jnp.int32)


def masked_logits(model: AOGPT, tokens: jax.Array, masked: jax.Array,
                  positions: jax.Array) -> jax.Array:
  """The encoder's masked forward: logits [B, Q, V] at ``positions`` [B, Q] from ONE
  bidirectional forward of ``tokens`` [B, n] with [MASK] where ``masked`` [B, n] (the head runs
  at those Q positions only). Used by `exact_order_nll` and the encoder sampler."""
  h = encoder_hidden(model, masked_tokens(model.cfg, tokens, masked))
  hq = jnp.take_along_axis(h, positions[..., None], axis=1)
  return model.head(hq, jnp.full(positions.shape, NO_TARGET, jnp.int32))


def stratified_times(u: jax.Array, index: jax.Array, count: int) -> jax.Array:
  """The antithetic (stratified) time draw: ``t_i = 1 - ((u + i/count) mod 1)`` in (0, 1], so
  ``count`` times from one uniform ``u`` are evenly spread (a lower-variance ELBO estimate).
  Used over a batch (`draw_masks`) and over a block's ELBO samples (`encoder_nll.elbo_masks`)."""
  return 1.0 - (u + index / count) % 1.0


def masks_at(key: jax.Array, t: jax.Array, length: int) -> jax.Array:
  """bool [..., length]: each position masked independently with probability ``t`` [...]."""
  return jax.random.uniform(key, t.shape + (length,)) < t[..., None]


def draw_masks(key: jax.Array, batch: int, length: int, *, antithetic: bool = True):
  """(t float32[B] in (0, 1], masked bool[B, n]). Antithetic: `stratified_times` over the batch
  (one uniform u shared by the batch); otherwise t_b = 1 - u_b, one uniform per row."""
  k_t, k_m = jax.random.split(key)
  if antithetic:
    t = stratified_times(jax.random.uniform(k_t, ()), jnp.arange(batch), batch)
  else:
    t = 1.0 - jax.random.uniform(k_t, (batch,))
  return t, masks_at(k_m, t, length)


def weighted_nll(model: AOGPT, tokens: jax.Array, masked: jax.Array, t: jax.Array, *,
                 dropout_key=None) -> jax.Array:
  """Per-sequence ELBO terms [B]: (1/t) * sum of -log p(x_i | unmasked) over masked i."""
  inp = masked_tokens(model.cfg, tokens, masked)
  nll = nll_from_logits(encoder_logits(model, inp, dropout_key=dropout_key), tokens)
  return jnp.sum(jnp.where(masked, nll, 0.0), axis=-1) / t


def mdm_loss(model: AOGPT, tokens: jax.Array, key: jax.Array, *, antithetic: bool = True,
             dropout_key=None, prompt: jax.Array | None = None,
             denominator: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Training loss per token (the sum of the ELBO terms over the scored tokens' count) and the
  terms [B]. ``prompt`` (bool [B, n], True where a token is given): those positions are never
  masked and not counted, so the terms bound the NLL of the rest given the prompt; the count is
  replaced by ``denominator`` when given (gradient accumulation, as `aogpt.loss`)."""
  t, masked = draw_masks(key, *tokens.shape, antithetic=antithetic)
  if prompt is not None:
    masked = masked & ~prompt
  terms = weighted_nll(model, tokens, masked, t, dropout_key=dropout_key)
  if prompt is None and denominator is None:
    return jnp.mean(terms) / tokens.shape[1], terms
  if denominator is None:
    denominator = jnp.maximum(jnp.sum(~prompt), 1)
  return jnp.sum(terms) / denominator, terms


def elbo_samples(model: AOGPT, tokens: jax.Array, key: jax.Array, num_samples: int, *,
                 antithetic: bool = True) -> jax.Array:
  """[num_samples, B] Monte Carlo estimates of each sequence's negative ELBO (nats); their mean
  is the NLL upper bound and their spread gives a confidence interval."""
  def one(k):
    t, masked = draw_masks(k, *tokens.shape, antithetic=antithetic)
    return weighted_nll(model, tokens, masked, t)

  return jax.lax.map(one, jax.random.split(key, num_samples))


def exact_order_nll(model: AOGPT, tokens: jax.Array, order: jax.Array) -> jax.Array:
  """Any-order NLL of the encoder for given orders: per-token NLL [B, n] in order space,
  ``out[b, r] = -log p(x_{order[b, r]} | x_{order[b, :r]})``, one bidirectional forward per rank
  (n forwards: the encoder cannot share work between ranks, unlike the decoder)."""
  n = tokens.shape[1]
  rank = ranks(order)

  def one_rank(r):
    pos = order[:, r][:, None]                     # positions at rank >= r are still masked
    logits = masked_logits(model, tokens, rank >= r, pos)[:, 0]
    return nll_from_logits(logits, jnp.take_along_axis(tokens, pos, axis=1)[:, 0])

  return jax.lax.map(one_rank, jnp.arange(n)).T
