"""The training objectives, one registry entry each: what a run with ``objective=NAME`` trains,
how its held-out loss is measured and reported, and which sampler and evaluator fit its model.

    ao   any-order autoregression (AO-GPT, sigma-GPT, GPT): NLL under an order (model.loss)
    mdm  the encoder-only masked diffusion baseline: the ELBO of Eq. 1 (model/encoder.py)

The trainer (train/step.py, train/loop.py) calls `get(cfg.objective)` and never tests the name; the
keys ``sample.method`` and ``eval.model_kind`` follow from the objective unless a run sets
them, and ``eval.ensemble_max_m`` must be 0 for an objective without ensembles
(`config.follow_objective` fills them in and refuses a value that does not fit).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import blanks
from aogpt_jax.model import encoder as encoder_model
from aogpt_jax.model import orders as orders_lib

# (label, order name, sorted kwargs) of one held-out loss (`train.step.heldout_orders`).
HeldoutOrders = tuple[tuple[str, str, tuple], ...]


@dataclasses.dataclass(frozen=True)
class Objective:
  """One training objective.

  loss(m, tokens, order, mask_key, dropout_key, prompt=None, denominator=None) -> (mean loss to
      differentiate, metric sums with the keys of `model.loss_metrics`); ``prompt`` bool [B, n]
      marks given tokens (prompt-conditioned training): they are context, never scored;
  heldout(m, tokens [B, n], weight [B], key, orders, prompt=None) -> weighted NLL sums of one
      held-out batch (``tokens``: the number of scored tokens);
  report(sums, orders) -> the ``eval/...`` scalars from the summed `heldout` outputs;
  model_config(ModelConfig) -> the config of the model it trains;
  sample_methods / model_kinds: the ``sample.method`` / ``eval.model_kind`` values that fit
      its model, the first of each being the default;
  ensembles: whether context-order ensembles (``eval.ensemble_max_m`` > 0, Eq. 4) apply.
  """
  name: str
  description: str          # what a run with this objective trains, for messages
  loss: Callable
  heldout: Callable
  report: Callable
  model_config: Callable
  sample_methods: tuple[str, ...]
  model_kinds: tuple[str, ...]
  ensembles: bool

  def follows(self, key: str) -> tuple[str, ...]:
    """The values of ``key`` (``sample.method`` or ``eval.model_kind``) that fit."""
    return {"sample.method": self.sample_methods, "eval.model_kind": self.model_kinds}[key]


# ----------------------------------------------------------------------------- ao


def _ao_nll(m, tokens, order, cut_key, *, dropout_key=None, prompt=None, denominator=None,
            every_blank=True):
  """`aogpt.loss`, or for ``model.blank_block`` the cut objective (`blanks.blank_loss`, its cuts
  drawn from ``cut_key``): (mean, per-token terms [B, n] in order space)."""
  if m.cfg.blank_block:
    if m.cfg.loss_chunk:
      raise ValueError("model.loss_chunk: model.blank_block trains with plain logits; set "
                       "model.loss_chunk=0")
    return blanks.blank_loss(m, tokens, order, cut_key, prompt=prompt, dropout_key=dropout_key,
                             denominator=denominator, every_blank=every_blank)
  return model_lib.loss(m, tokens, order, dropout_key=dropout_key, prompt=prompt,
                        denominator=denominator)


def _ao_loss(m, tokens, order, mask_key, dropout_key, prompt=None, denominator=None):
  mean_nll, per_token = _ao_nll(m, tokens, order, mask_key, dropout_key=dropout_key,
                                prompt=prompt, denominator=denominator)
  scored = None if prompt is None else orders_lib.scored_ranks(prompt)
  return mean_nll, model_lib.loss_metrics(per_token, order, scored)


def _ao_heldout(m, tokens, weight, key, orders: HeldoutOrders, prompt=None):
  b, n = tokens.shape
  scored = (jnp.ones((b, n), bool) if prompt is None else orders_lib.scored_ranks(prompt))
  w = scored * weight[:, None]
  out = {"tokens": jnp.sum(w)}
  for label, name, kwargs in orders:
    order = orders_lib.sample(name, key, b, n, **dict(kwargs))
    if prompt is not None:
      order = orders_lib.prompt_first(order, prompt)
    # model.blank_block: a cut per row; every blank scores under uniform orders (exchangeable),
    # only the next rank's under any other
    _, per_token = _ao_nll(m, tokens, order, jax.random.fold_in(key, 1), prompt=prompt,
                           every_blank=name == "uniform")
    out[f"nll_{label}"] = jnp.sum(per_token * w)
  return out


def _ao_report(sums, orders: HeldoutOrders):
  n = max(sums.get("tokens", 0.0), 1.0)
  return {f"eval/loss_{label}": sums[f"nll_{label}"] / n for label, _, _ in orders}


# ----------------------------------------------------------------------------- mdm


def mdm_metrics(terms: jax.Array, count: jax.Array) -> dict[str, jax.Array]:
  """The keys of `model.loss_metrics` for the encoder: ``nll_sum`` is the sum of the ELBO terms
  (a bound on the NLL) over ``count`` scored tokens; there are no L2R / random-order rows."""
  zero = jnp.zeros((), jnp.float32)
  return {"nll_sum": jnp.sum(terms), "token_count": jnp.asarray(count, jnp.float32),
          "nll_sum_l2r": zero, "token_count_l2r": zero, "nll_sum_random": zero,
          "token_count_random": zero}


def _mdm_loss(m, tokens, order, mask_key, dropout_key, prompt=None, denominator=None):
  del order
  loss, terms = encoder_model.mdm_loss(m, tokens, mask_key, dropout_key=dropout_key,
                                       prompt=prompt, denominator=denominator)
  b, n = tokens.shape
  count = b * n if prompt is None else jnp.sum(~prompt)
  return loss, mdm_metrics(terms, count)


def _mdm_heldout(m, tokens, weight, key, orders: HeldoutOrders, prompt=None):
  del orders
  b, n = tokens.shape
  t, masked = encoder_model.draw_masks(key, b, n)
  if prompt is not None:
    masked = masked & ~prompt
  count = n if prompt is None else jnp.sum(~prompt, axis=-1)
  return {"tokens": jnp.sum(weight * count),
          "nll_elbo": jnp.sum(encoder_model.weighted_nll(m, tokens, masked, t) * weight)}


def _mdm_report(sums, orders: HeldoutOrders):
  del orders
  return {"eval/elbo": sums["nll_elbo"] / max(sums.get("tokens", 0.0), 1.0)}


REGISTRY: dict[str, Objective] = {
    "ao": Objective("ao", "an AO-GPT (objective=ao)", _ao_loss, _ao_heldout, _ao_report,
                    model_config=lambda mc: mc,
                    sample_methods=("diffusion", "ar", "uncached", "speculative", "adaptive"),
                    model_kinds=("aogpt",), ensembles=True),
    "mdm": Objective("mdm", "an encoder (objective=mdm)", _mdm_loss, _mdm_heldout, _mdm_report,
                     model_config=encoder_model.encoder_config,
                     sample_methods=("encoder", "adaptive"),
                     model_kinds=("encoder",), ensembles=False),
}
NAMES = tuple(REGISTRY)


def get(name: str) -> Objective:
  if name not in REGISTRY:
    raise ValueError(f"objective: must be one of {NAMES}, got {name!r}")
  return REGISTRY[name]


def merged_loss(params, graphdef: nnx.GraphDef, tokens, order, mask_key, dropout_key,
                objective: str, prompt=None, denominator=None):
  """`Objective.loss` of the model ``nnx.merge(graphdef, params)`` (the function to
  differentiate with respect to ``params``)."""
  return get(objective).loss(nnx.merge(graphdef, params), tokens, order, mask_key, dropout_key,
                             prompt, denominator)
