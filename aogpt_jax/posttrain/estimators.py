"""Estimates of a rollout's log-likelihood that a masked diffusion model has to use, computed on an
AO-GPT so that they can be compared with the exact value (`likelihood.sequence_logp`).

d1's one-step mean-field estimate (diffu-GRPO, Zhao et al. 2025): every answer token's
log-probability from ONE forward with the whole answer masked, given only the prompt::

    mf_BxN[b, r] = log p(x_{order[b, r]} | the prompt)          (0 at the prompt's ranks)

whatever order and steps the rollout was written in. For an AO-GPT this is exactly
`likelihood.sequence_logp` with every answer rank in one step (all answer steps 0), the
conditional the diffusion sampler draws from at its first step with every answer position
queried. The exact value conditions each token on the tokens of earlier steps instead; the two
agree only for a rollout written in one step.

d1 also masks each prompt token at random (p = 0.15) in every estimate, a fresh mask for each
inner update, the same mask for the old and the new policy's values of that update:
``keep`` [B, n] (`prompt_keep`) drops the prompt positions where it is False from the context.
An AO-GPT has no mask token: a dropped prompt token is moved out of the prefix (after the answer,
at a later step, so no answer token sees it); the kept prompt tokens keep their generation order.

A Monte Carlo ELBO (``elbo``), the estimate LLaDA, VRPO and SPG train with: M random masks of
the answer, mask m hiding l_m answer positions (l_m uniform in 1..L, L the row's answer length;
the hidden set uniform given l_m), each hidden token scored given the prompt and the visible
answer tokens, weighted L / l_m::

    elbo_BxN[b, r] = 1/M sum_m (L / l_m) [x_{order[b, r]} hidden by m] log p(x_{order[b, r]} | visible_m)

(LLaDA's low-variance form, Nie et al. 2025; its sum over the answer estimates the
masked-diffusion ELBO without bias). An AO-GPT conditions on the visible tokens by putting them
first, as a prompt, in an ORDER: `elbo_masks` draws a uniformly random order of the answer and
hides its last l_m positions, so that the estimate's expectation is exactly the model's
log-likelihood averaged over uniformly random generation orders of the answer (the any-order
model's ELBO; tests/test_posttrain_estimators.py checks it by enumeration). Each mask is one
pass of 2n slots (M per rollout).

Shape suffixes: B rows, K conditionals per row, M masks, N sequence length n, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.aogpt import AOGPT
from aogpt_jax.posttrain import likelihood

ESTIMATORS = ("exact", "mean_field", "elbo")


def prompt_keep(key: jax.Array, prompt: jax.Array, p_mask: float) -> jax.Array:
  """bool [B, n] (original order): each prompt position kept with probability 1 - ``p_mask``,
  independently (d1's random prompt masking); False off the prompt."""
  return prompt & (jax.random.uniform(key, prompt.shape) >= p_mask)


def mean_field_rollout(order: jax.Array, prompt: jax.Array, keep: jax.Array | None = None):
  """(order', steps', prompt', back): a rollout layout under which `likelihood.sequence_logp`
  is the mean-field estimate. Every answer rank in step 0, the kept prompt positions (``prompt``
  & ``keep``; all of the prompt when ``keep`` is None) first in their generation order, the
  dropped ones last at step 1. ``back`` [B, n]: the new rank of each original rank (for
  ``take_along_axis``)."""
  n = order.shape[1]
  order = order.astype(jnp.int32)
  kept_BxN = prompt if keep is None else prompt & keep
  dropped_BxN = prompt & ~kept_BxN
  rank_of_pos_BxN = orders_lib.ranks(order)
  key_BxN = jnp.where(kept_BxN, rank_of_pos_BxN - n,
                      jnp.where(dropped_BxN, rank_of_pos_BxN + n, rank_of_pos_BxN))
  new_order_BxN = jnp.argsort(key_BxN, axis=1, stable=True).astype(jnp.int32)
  k_Bx1 = jnp.sum(kept_BxN, axis=1, keepdims=True)
  a_Bx1 = n - jnp.sum(dropped_BxN, axis=1, keepdims=True)
  r_1xN = jnp.arange(n, dtype=jnp.int32)[None, :]
  steps_BxN = jnp.where(r_1xN < k_Bx1, likelihood.NO_PROMPT_STEP,
                        jnp.where(r_1xN < a_Bx1, 0, 1)).astype(jnp.int32)
  back_BxN = jnp.take_along_axis(orders_lib.ranks(new_order_BxN), order, axis=1)
  return new_order_BxN, steps_BxN, kept_BxN, back_BxN


def rollout_logits(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
                   prompt: jax.Array | None = None, *, estimator: str = "exact",
                   keep: jax.Array | None = None, width: int | None = None) -> jax.Array:
  """float32 [B, n, V] in the rollout's rank layout: the conditional of each rank under
  ``estimator`` (exact: `likelihood.rollout_logits`, ``width`` its; mean_field: given the
  prompt, or its ``keep`` part, only; elbo: `conditionals`)."""
  if estimator == "exact":
    return likelihood.rollout_logits(model, tokens, order, steps, prompt, width=width)
  check_estimator(estimator)
  if estimator == "elbo":
    raise ValueError("estimators.rollout_logits: 'elbo' scores each rank under M masks; use "
                     "conditionals")
  prompt = jnp.zeros(tokens.shape, bool) if prompt is None else prompt
  o, s, p, back = mean_field_rollout(order, prompt, keep)
  logits_BxNxV = likelihood.rollout_logits(model, tokens, o, s, p)
  return jnp.take_along_axis(logits_BxNxV, back[..., None], axis=1)


def mean_field_logp(model: AOGPT, tokens: jax.Array, order: jax.Array,
                    prompt: jax.Array | None = None, *, keep: jax.Array | None = None,
                    temperature: float = 1.0) -> jax.Array:
  """float32 [B, n] in rank layout (as `likelihood.sequence_logp`, 0 at the prompt's ranks):
  d1's one-step mean-field estimate, ``log p(x_{order[b, r]} | prompt)`` (module docstring).
  ``keep``: the prompt positions left in the context (None: all)."""
  steps = jnp.zeros(order.shape, jnp.int32)     # unused by the mean-field layout
  logits_BxNxV = rollout_logits(model, tokens, order, steps, prompt, estimator="mean_field",
                                keep=keep)
  return likelihood.token_logp(logits_BxNxV, tokens, order, prompt, temperature)


def elbo_masks(key: jax.Array, order: jax.Array, prompt: jax.Array, samples: int):
  """(mask_order int32 [B, M, n], hidden int32 [B, M]): ``samples`` = M random masks of each
  row's answer (``~prompt``, L positions; ``order`` the rollout's, its prompt first): mask m is
  a generation order, the prompt first (in ``order``'s order) then the answer in a uniformly
  random order, whose last ``hidden[b, m]`` = l_m ~ uniform{1..L} positions are hidden (module
  docstring)."""
  b, n = prompt.shape
  len_B = n - jnp.sum(prompt, axis=1, dtype=jnp.int32)
  k_len, k_order = jax.random.split(key)
  hidden_BxM = jax.random.randint(k_len, (b, samples), 1, jnp.maximum(len_B, 1)[:, None] + 1)
  rank_BxN = orders_lib.ranks(order.astype(jnp.int32))
  key_BxMxN = jnp.where(prompt[:, None], rank_BxN[:, None] - n,      # the prompt first, in order
                        jax.random.uniform(k_order, (b, samples, n)))
  return jnp.argsort(key_BxMxN, axis=-1).astype(jnp.int32), hidden_BxM.astype(jnp.int32)


def conditionals(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
                 prompt: jax.Array | None = None, *, estimator: str = "exact",
                 keep: jax.Array | None = None, mask_order: jax.Array | None = None,
                 hidden: jax.Array | None = None, width: int | None = None):
  """(logits float32 [B, K, n, V] in the rollout's rank layout, w float32 [B, K, n]): the
  conditionals ``estimator`` scores each rank with and their weights, the estimate being
  ``sum_k w[b, k, r] log softmax(logits[b, k, r])[x_{order[b, r]}]``. exact and mean_field
  (`rollout_logits`, with ``keep``): K = 1, w = 1. elbo: K = M masks (``mask_order`` [B, M, n],
  ``hidden`` [B, M]: `elbo_masks`), w = (L / l_m) / M at the ranks mask m hides, else 0.
  ``width``: a blank model's queries per step (`likelihood.rollout_logits`; at least every row's
  answer length; mean_field ignores it: its dropped prompt tokens are candidates too)."""
  if estimator != "elbo":
    logits_BxNxV = rollout_logits(model, tokens, order, steps, prompt, estimator=estimator,
                                  keep=keep, width=width if estimator == "exact" else None)
    return logits_BxNxV[:, None], jnp.ones((tokens.shape[0], 1, tokens.shape[1]), jnp.float32)
  if mask_order is None or hidden is None:
    raise ValueError("estimators.conditionals: 'elbo' needs mask_order and hidden (elbo_masks)")
  b, k, n = mask_order.shape
  prompt = jnp.zeros(tokens.shape, bool) if prompt is None else prompt
  rep = lambda x: jnp.repeat(x, k, axis=0)  # noqa: E731
  o_BKxN = mask_order.reshape(b * k, n)
  context_BKx1 = n - hidden.reshape(b * k, 1)          # its first ranks: prompt and visible
  new_rank_BKxN = orders_lib.ranks(o_BKxN)             # by position
  r_1xN = jnp.arange(n, dtype=jnp.int32)[None, :]
  steps_BKxN = jnp.where(r_1xN < context_BKx1, likelihood.NO_PROMPT_STEP, 0).astype(jnp.int32)
  logits = likelihood.rollout_logits(model, rep(tokens), o_BKxN, steps_BKxN,
                                     new_rank_BKxN < context_BKx1, width=width)
  back_BKxN = jnp.take_along_axis(new_rank_BKxN, rep(order.astype(jnp.int32)), axis=1)
  logits_BxKxNxV = jnp.take_along_axis(logits, back_BKxN[..., None], axis=1).reshape(b, k, n, -1)
  len_Bx1 = n - jnp.sum(prompt, axis=1, keepdims=True, dtype=jnp.int32)
  w_BxK = len_Bx1 / hidden / k
  return logits_BxKxNxV, jnp.where((back_BKxN >= context_BKx1).reshape(b, k, n),
                                   w_BxK[..., None], 0.0).astype(jnp.float32)


def weighted_logp(logits: jax.Array, w: jax.Array, tokens: jax.Array, order: jax.Array,
                  prompt: jax.Array | None, temperature: float = 1.0) -> jax.Array:
  """[B, n]: the estimate from `conditionals`' outputs (0 at the prompt's ranks)."""
  lp_BxKxN = jax.vmap(lambda lg: likelihood.token_logp(lg, tokens, order, prompt, temperature),
                      in_axes=1, out_axes=1)(logits)
  return jnp.sum(w * lp_BxKxN, axis=1)


def estimate_logp(model: AOGPT, tokens: jax.Array, order: jax.Array, steps: jax.Array,
                  prompt: jax.Array | None = None, *, estimator: str = "exact",
                  keep: jax.Array | None = None, mask_order: jax.Array | None = None,
                  hidden: jax.Array | None = None, temperature: float = 1.0) -> jax.Array:
  """[B, n]: `likelihood.sequence_logp` (exact), `mean_field_logp` or the elbo estimate, by
  name (`conditionals`' arguments)."""
  logits, w = conditionals(model, tokens, order, steps, prompt, estimator=estimator, keep=keep,
                           mask_order=mask_order, hidden=hidden)
  return weighted_logp(logits, w, tokens, order, prompt, temperature)


def check_estimator(name: str) -> None:
  if name not in ESTIMATORS:
    raise ValueError(f"rl.likelihood: expected one of {', '.join(ESTIMATORS)}, got {name!r}")
