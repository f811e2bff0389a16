"""A learned order policy over a heuristic's top-k candidates (UPO, arXiv 2510.05725, adapted).

The adaptive sampler (`sampling.adaptive`) scores each step's candidates with a parameterless
heuristic (``max_prob``, ``margin``, ...). An `OrderHead` re-scores the heuristic's ``top_k``
candidates of each step and leaves the others unchosen (NaN: ranked last, never drawn by a
stochastic policy):

    score_j = base_j + delta_j    (j among the step's top_k by base; ties: lower position first)
    delta_j = w2 . gelu(W1 f_j + C x_j + E[position_j] + b1) + b2

``f_j`` are features of candidate j's distribution and of the step (`features`): its base
score, how far below the step's best it is, its rank among the candidates, its three largest
probabilities, its normalised entropy and how many cells are still free. ``x_j`` is the model's
own reading of the candidate: its query's output-head input (`AOGPT.head_features`, the final
norm of the last layer, d wide), which the logits are a linear function of; ``C`` projects it
(``context`` = d; 0: not read). ``E`` is a learned table of positions (the head may learn which
cells to write first, e.g. from the goal back).

Imitation by construction: ``w2`` and ``b2`` start at zero, so a new head IS the heuristic
restricted to its top-k (UPO first trains its head by cross-entropy to imitate max-confidence;
here the residual form starts there exactly, and the KL pull toward the heuristic, `step_kl`,
keeps it near). The head sees what the policy functions see (the candidates' probabilities,
positions and validity), so `posttrain.likelihood` recomputes its scores, and their gradients,
exactly from the same logits.

Attach one with `attach` (``model.order_head``); the adaptive sampler uses it under
``sample.order_head=True`` and GRPO trains it (`posttrain.grpo`, ``order_head``). Shape
suffixes: B rows, Q candidates, V vocabulary, F features, H hidden width.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

N_FEATURES = 8
# The heuristic's (reference policy's) logit of a candidate outside the top-k: finite, as
# `sampling.adaptive.NEVER`, so the KL's terms stay finite where they are unused.
_NEVER = -1e30


class OrderHead(nnx.Module):
  """Re-scores a heuristic's ``top_k`` candidates per step (module docstring). ``positions``:
  the sequence length it serves (the position table's size); ``context``: the width of the
  model features it reads (0: none)."""

  def __init__(self, positions: int, top_k: int = 5, width: int = 32, context: int = 0, *,
               rngs: nnx.Rngs):
    for key, v, low in (("top_k", top_k, 1), ("width", width, 1), ("positions", positions, 1),
                        ("context", context, 0)):
      if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"order_head.{key}: must be an int >= {low}, got {v!r}")
    self.top_k = top_k
    self.positions = positions
    self.context = context
    self.inp = nnx.Linear(N_FEATURES, width, rngs=rngs)
    self.ctx = nnx.Linear(context, width, use_bias=False, rngs=rngs) if context else None
    self.pos = nnx.Embed(positions, width, rngs=rngs,
                         embedding_init=nnx.initializers.normal(0.02))
    self.out = nnx.Linear(width, 1, kernel_init=nnx.initializers.zeros, rngs=rngs)

  def __call__(self, probs, base, positions, valid, feats=None):
    """float32 [B, Q]: the head's scores of the candidates (``probs`` float32 [B, Q, V] their
    distributions, ``base`` [B, Q] the heuristic's scores, ``positions`` int32 [B, Q],
    ``valid`` bool [B, Q] which are candidates, ``feats`` [B, Q, context] their queries'
    `AOGPT.head_features`); NaN outside the top-k."""
    top_BxQ, rank_BxQ = top_candidates(base, positions, valid, self.top_k)
    f_BxQxF = features(probs, base, rank_BxQ, valid)
    idx = jnp.clip(positions, 0, self.positions - 1)
    pre_BxQxH = self.inp(f_BxQxF) + self.pos(idx)
    if self.ctx is not None:
      if feats is None or feats.shape[-1] != self.context:
        raise ValueError(f"order_head: reads the model's {self.context}-wide features; got "
                         f"{None if feats is None else feats.shape[-1]}")
      pre_BxQxH = pre_BxQxH + self.ctx(jnp.where(valid[..., None], feats, 0.0)
                                       .astype(jnp.float32))
    h_BxQxH = jax.nn.gelu(pre_BxQxH)
    delta_BxQ = self.out(h_BxQxH)[..., 0]
    return jnp.where(top_BxQ, base.astype(jnp.float32) + delta_BxQ, jnp.nan)


def top_candidates(base, positions, valid, k: int):
  """(in the top k [B, Q] bool, rank [B, Q] int32): a candidate's rank is how many valid
  candidates score above it (NaN as -inf), or the same with a lower position, so the set does not
  depend on the candidates' order (the sampler lists them by position, the likelihood by rank)."""
  s = base.astype(jnp.float32)
  s = jnp.where(valid & ~jnp.isnan(s), s, -jnp.inf)
  si, sj = s[:, :, None], s[:, None, :]
  pi, pj = positions[:, :, None], positions[:, None, :]
  above = valid[:, None, :] & ((sj > si) | ((sj == si) & (pj < pi)))
  rank = jnp.sum(above, axis=-1, dtype=jnp.int32)
  return valid & (rank < k), rank


def features(probs, base, rank, valid):
  """float32 [B, Q, F] (F = `N_FEATURES`) of each candidate: base score, base minus the step's
  best, rank / 8, its three largest probabilities, entropy / log V, log(1 + free cells) / 4."""
  p = probs.astype(jnp.float32)
  v = p.shape[-1]
  s = jnp.where(valid & ~jnp.isnan(base), base.astype(jnp.float32), 0.0)
  best = jnp.max(jnp.where(valid, s, -jnp.inf), axis=-1, keepdims=True)
  best = jnp.where(jnp.isfinite(best), best, 0.0)
  top = jax.lax.top_k(p, min(3, v))[0]
  top = jnp.pad(top, ((0, 0), (0, 0), (0, 3 - top.shape[-1])))
  ent = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)
  free = jnp.sum(valid, axis=-1, keepdims=True).astype(jnp.float32)
  f = jnp.concatenate([s[..., None], (s - best)[..., None], (rank / 8.0)[..., None], top,
                       (ent / math.log(max(v, 2)))[..., None],
                       jnp.broadcast_to(jnp.log1p(free) / 4.0, s.shape)[..., None]], axis=-1)
  return jnp.where(valid[..., None], f, 0.0)


def step_kl(head_scores, base, positions, valid, k: int, tau: float):
  """float32 [B]: KL(head || heuristic) of a step's first choice: both ``softmax(scores /
  tau)`` over the heuristic's top-k candidates (the heuristic restricted as the head is: UPO's
  reference policy). Exact for steps that write one cell (UPO's setting); a step that writes
  several contributes its first choice's."""
  top_BxQ, _ = top_candidates(base, positions, valid, k)
  z = jnp.where(top_BxQ, head_scores / tau, _NEVER)
  zr = jnp.where(top_BxQ, base.astype(jnp.float32) / tau, _NEVER)
  lp, lr = jax.nn.log_softmax(z, axis=-1), jax.nn.log_softmax(zr, axis=-1)
  return jnp.sum(jnp.where(top_BxQ, jnp.exp(lp) * (lp - lr), 0.0), axis=-1)


def attach(model, top_k: int = 5, width: int = 32, seed: int = 0,
           context: int | None = None) -> OrderHead:
  """Gives ``model`` a new `OrderHead` (``model.order_head``; the sequence length is the
  model's ``block_size``; ``context`` None: it reads the model's ``n_embd``-wide features) and
  returns it; the model's other weights are unchanged."""
  context = model.cfg.n_embd if context is None else context
  head = OrderHead(model.cfg.block_size, top_k, width, context, rngs=nnx.Rngs(seed))
  model.order_head = head
  return head


def spec(model) -> dict | None:
  """What a checkpoint records of ``model``'s order head (`attach`'s arguments), or None."""
  head = head_of(model)
  return None if head is None else {"top_k": int(head.top_k), "width": int(head.out.in_features),
                                    "context": int(head.context)}


def with_head(model, recorded: dict | None):
  """``model`` with a new order head of the ``recorded`` `spec` (None: as it is): what
  `checkpoints.store.load_model` restores the weights into."""
  if recorded:
    attach(model, top_k=int(recorded["top_k"]), width=int(recorded["width"]),
           context=int(recorded.get("context", 0)))
  return model


def head_of(model):
  """``model.order_head``, or None."""
  return getattr(model, "order_head", None)


def require(model, key: str) -> OrderHead:
  """``model.order_head``; one line naming the setting ``key`` that asked for it if it has none."""
  head = head_of(model)
  if head is None:
    raise ValueError(f"{key}: True needs a model with an order head (`model.order_head.attach`, "
                     f"trained by --mode=rl with rl.order_head=K); this model has none")
  return head
