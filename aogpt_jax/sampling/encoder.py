"""The encoder-only masked-diffusion sampler: the standard MDM reverse process (method ``encoder``).

The model is the encoder of `aogpt_jax.model.encoder` (an AOGPT with ``target='none'`` run with
bidirectional attention; [MASK] = ``valid_vocab_size``). It shares everything but the forward
with the AO-GPT sampler: the host-side plan (`sampler.prepare` / `sampler.plan`: the generation
order with prompt positions first, the linear / cosine schedule, deterministic or Lemma 4.1
counts) and the token draw (`sampling.tokens`: temperature, top-p, the inverse-CDF draw, the token
at original position p of sample i drawn with the key ``fold_in(fold_in(fold_in(key, i), 2), p)``).

One step (frontier m = tokens known, k to reveal). The input is the current tokens at positions
of rank < m (prompt and revealed) and [MASK] everywhere else, and ONE full bidirectional forward
over all n positions gives the hidden states; the head runs only at the k positions revealed at
this step (``order[m .. m+k-1]``), whose tokens are drawn independently given the same revealed
set (the MDM factorisation of a step). Nothing is cached: every step re-reads the whole
sequence, T forwards of n positions in all (T*n position-passes, against about n slot-passes for
the KV-cached AO-GPT sampler): the cost the paper's Figure 5 compares.

The plan has one pass per step (`sampler.plan(..., method="encoder")`): `state.Passes` (m, q0,
k, cstart, ccount, int32 [P, B]) with q0 = 0 (catch-up fields unused); rows with fewer non-empty
steps run trailing no-op passes (k = 0). Steps that reveal nothing are skipped, as in the AO-GPT
sampler: with a time-independent model they change nothing.

``method="adaptive"`` on an encoder (`sample_adaptive_encoder`) decodes as LLaDA, Dream and Kim
et al. do: no fixed order; at every step ONE full forward (the current tokens, [MASK] at every
unwritten position) gives the logits at every still-masked position (or ``candidates`` of them),
and the AO-GPT adaptive sampler's step (`adaptive.adaptive_loop`: the token draw keyed by
position, the registered policy, the counts or ``threshold`` commit rule) chooses the positions
to write. n position-passes per step, T*n in all.

Shape suffixes of local arrays (``qpos_PxBxQ`` = [P, B, Q]): P passes, B rows, N sequence length
n, Q query positions per pass, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT
from aogpt_jax.sampling import adaptive as adaptive_lib
from aogpt_jax.sampling import tokens as tokens_lib
from aogpt_jax.sampling.state import Draw, Passes


def query_positions(order: jax.Array, known: jax.Array, q0: jax.Array, k: jax.Array, *,
                    queries: int) -> tuple[jax.Array, jax.Array]:
  """Positions ``order[known + q0 + j]`` revealed by a pass (j < ``queries``) and their validity
  ``j < k``, both [B, Q]."""
  qpos_BxQ = orders_lib.slot_target(order, orders_lib.query_ranks(known, q0, queries))
  return qpos_BxQ, jnp.arange(queries, dtype=jnp.int32)[None, :] < k[:, None]


def step_logits(model: AOGPT, tokens: jax.Array, rank: jax.Array, known: jax.Array,
                qpos: jax.Array) -> jax.Array:
  """Logits [B, Q, V] at positions ``qpos`` [B, Q]: the encoder's masked forward
  (`encoder_model.masked_logits`) with the tokens of rank >= ``known`` [B] masked."""
  return encoder_model.masked_logits(model, tokens, rank >= known[:, None], qpos)


def sample_encoder(model: AOGPT, order, tokens0, tok_keys, passes: Passes, queries: int,
                   draw: Draw):
  """Traced body of the encoder sampler (the prompt is in tokens0 at ranks < m; the catch-up
  fields of ``passes`` are unused). Returns (tokens [B, n], per-pass logits [P, B, Q, V] if
  ``draw.debug`` else None)."""
  n = order.shape[1]
  rank_BxN = orders_lib.ranks(order)
  known_PxB, q0_PxB, k_PxB = passes.m, passes.q0, passes.k
  qpos_PxBxQ, is_q_PxBxQ = jax.vmap(
      lambda a, b, c: query_positions(order, a, b, c, queries=queries))(known_PxB, q0_PxB, k_PxB)
  keys_PxBxQ = jax.vmap(lambda p: tokens_lib.token_keys(tok_keys, p))(qpos_PxBxQ)
  commit_PxBxQ = jnp.where(is_q_PxBxQ, qpos_PxBxQ, n)

  def step(tokens_BxN, x):
    known_B, qpos_BxQ, commit_BxQ, keys_BxQ = x
    logits_BxQxV = step_logits(model, tokens_BxN, rank_BxN, known_B, qpos_BxQ)
    return tokens_lib.draw_and_commit(tokens_BxN, logits_BxQxV, keys_BxQ, commit_BxQ,
                                      **draw.kwargs())

  tokens_BxN, logits_PxBxQxV = jax.lax.scan(step, tokens0,
                                            (known_PxB, qpos_PxBxQ, commit_PxBxQ, keys_PxBxQ))
  return tokens_BxN, logits_PxBxQxV


def sample_adaptive_encoder(model: AOGPT, order0, tokens0, prompt_len, tok_keys, counts,
                            adapt_keys, *, shape: adaptive_lib.AdaptiveShape, draw: Draw):
  """Traced body of the encoder's adaptive sampler: `adaptive.sample_adaptive`'s inputs and
  outputs (``order0``: prompt positions first; ``counts`` [B, T]: commits per step, unused by
  ``threshold``), each step's logits from one full masked forward
  (`encoder_model.masked_logits` at the candidates; the catch-up / prefill / cached fields of
  ``shape`` are unused: nothing is cached)."""

  def forward(extra, order, tokens_BxN, masked_BxN, m_B, cand_BxQ, valid_BxQ):
    return (encoder_model.masked_logits(model, tokens_BxN, masked_BxN, cand_BxQ), None), extra

  return adaptive_lib.adaptive_loop(
      order0, tokens0, prompt_len, tok_keys, counts, adapt_keys, shape=shape, draw=draw,
      vocab=model.cfg.vocab_size, forward=forward, on_commit=lambda extra, *_: extra, extra0=())
