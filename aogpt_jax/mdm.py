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

from aogpt_jax.layers import FULL
from aogpt_jax.orders import ranks
from aogpt_jax.model import AOGPT, NO_TARGET, ModelConfig, nll_from_logits


def encoder_config(cfg: ModelConfig) -> ModelConfig:
  """The encoder's backbone config: the same blocks, no target conditioning."""
  if cfg.vocab_size <= cfg.valid_vocab_size:
    raise ValueError(f"model.vocab_size ({cfg.vocab_size}) must exceed model.valid_vocab_size "
                     f"({cfg.valid_vocab_size}): the encoder's [MASK] token is the first padding id")
  return cfg.replace(target="none")


def check_encoder(cfg: ModelConfig, what: str) -> None:
  """Raises naming ``what`` (e.g. ``sample.method='encoder'``) unless ``cfg`` is an encoder's
  config: ``target='none'`` (as `make_encoder` builds it) and a padding id for [MASK]."""
  if cfg.target != "none":
    raise ValueError(f"{what} needs the encoder-only MDM model (built with "
                     f"aogpt_jax.mdm.make_encoder, model.target='none'); this model has "
                     f"model.target={cfg.target!r}, an AO-GPT")
  encoder_config(cfg)


def make_encoder(cfg: ModelConfig, *, rngs: nnx.Rngs) -> AOGPT:
  return AOGPT(encoder_config(cfg), rngs=rngs)


def mask_id(cfg: ModelConfig) -> int:
  return cfg.valid_vocab_size


def _inputs(m: AOGPT, tokens: jax.Array):
  b, n = tokens.shape
  if n > m.cfg.block_size:
    raise ValueError(f"sequence length {n} exceeds model.block_size {m.cfg.block_size}")
  pos = jnp.broadcast_to(jnp.arange(1, n + 1, dtype=jnp.int32), (b, n))
  return pos, jnp.full((b, n), NO_TARGET, jnp.int32)


def encoder_hidden(m: AOGPT, tokens: jax.Array, *, dropout_key=None) -> jax.Array:
  """Final hidden states [B, n, d] of the bidirectional encoder (tokens may hold [MASK])."""
  pos, tgt = _inputs(m, tokens)
  h, _ = m.encode(tokens.astype(jnp.int32), pos, tgt, mask=FULL, dropout_key=dropout_key)
  return h


def encoder_logits(m: AOGPT, tokens: jax.Array, *, dropout_key=None) -> jax.Array:
  """Logits [B, n, V] at every position (padding ids and [MASK] at -inf)."""
  h = encoder_hidden(m, tokens, dropout_key=dropout_key)
  return m.head(h, jnp.full(tokens.shape, NO_TARGET, jnp.int32))


def draw_masks(key: jax.Array, batch: int, length: int, *, antithetic: bool = True):
  """(t float32[B] in (0, 1], masked bool[B, n]). Antithetic: t_b = 1 - ((u + b/B) mod 1), one
  uniform u shared by the batch, so the t's are evenly spread (lower-variance estimate)."""
  k_t, k_m = jax.random.split(key)
  if antithetic:
    u = (jax.random.uniform(k_t, ()) + jnp.arange(batch) / batch) % 1.0
  else:
    u = jax.random.uniform(k_t, (batch,))
  t = 1.0 - u
  masked = jax.random.uniform(k_m, (batch, length)) < t[:, None]
  return t, masked


def weighted_nll(m: AOGPT, tokens: jax.Array, masked: jax.Array, t: jax.Array, *,
                 dropout_key=None) -> jax.Array:
  """Per-sequence ELBO terms [B]: (1/t) * sum of -log p(x_i | unmasked) over masked i."""
  inp = jnp.where(masked, mask_id(m.cfg), tokens)
  nll = nll_from_logits(encoder_logits(m, inp, dropout_key=dropout_key), tokens)
  return jnp.sum(jnp.where(masked, nll, 0.0), axis=-1) / t


def mdm_loss(m: AOGPT, tokens: jax.Array, key: jax.Array, *, antithetic: bool = True,
             dropout_key=None) -> tuple[jax.Array, jax.Array]:
  """Training loss per token (mean over the batch of the ELBO terms / n) and the terms [B]."""
  t, masked = draw_masks(key, *tokens.shape, antithetic=antithetic)
  terms = weighted_nll(m, tokens, masked, t, dropout_key=dropout_key)
  return jnp.mean(terms) / tokens.shape[1], terms


def elbo_samples(m: AOGPT, tokens: jax.Array, key: jax.Array, num_samples: int, *,
                 antithetic: bool = True) -> jax.Array:
  """[num_samples, B] Monte Carlo estimates of each sequence's negative ELBO (nats); their mean
  is the NLL upper bound and their spread gives a confidence interval."""
  def one(k):
    t, masked = draw_masks(k, *tokens.shape, antithetic=antithetic)
    return weighted_nll(m, tokens, masked, t)

  return jax.lax.map(one, jax.random.split(key, num_samples))


def exact_order_nll(m: AOGPT, tokens: jax.Array, order: jax.Array) -> jax.Array:
  """Any-order NLL of the encoder for given orders: per-token NLL [B, n] in order space,
  ``out[b, r] = -log p(x_{order[b, r]} | x_{order[b, :r]})``, one bidirectional forward per rank
  (n forwards: the encoder cannot share work between ranks, unlike the decoder)."""
  b, n = tokens.shape
  rank = ranks(order)
  mid = mask_id(m.cfg)
  rows = jnp.arange(b)

  def one_rank(r):
    inp = jnp.where(rank >= r, mid, tokens)        # positions at rank >= r are still masked
    h = encoder_hidden(m, inp)
    pos = order[:, r]
    logits = m.head(h[rows, pos][:, None], jnp.full((b, 1), NO_TARGET, jnp.int32))[:, 0]
    return nll_from_logits(logits, tokens[rows, pos])

  return jax.lax.map(one_rank, jnp.arange(n)).T
