"""`EvalSettings`: what `evaluation.zero_shot` computes, and the ``eval`` config group that holds
them (`eval_config`, registered in `aogpt_jax.config_groups`). A leaf module: it does not import
`evaluation.zero_shot` (which loads checkpoints, and `checkpoints.store` imports `config`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
from ml_collections import config_dict

from aogpt_jax import config_groups
from aogpt_jax.errors import one_line
from aogpt_jax.evaluation import ensembles as ens_lib
from aogpt_jax.model import orders as orders_lib

MODEL_KINDS = ("aogpt", "encoder")


MAX_ENSEMBLE_M = 1024   # ensembles beyond this cost days per dataset


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """What `evaluate` computes. Orders and ensemble orderings are pure functions of ``seed`` and
  each block's id (see evaluation/perplexity.py and evaluation/ensembles.py)."""
  l2r: bool = True                 # left-to-right perplexity
  any_order: bool = True           # any-order perplexity over ``num_orders`` order draws
  num_orders: int = 1
  order: str = "uniform"           # order distribution of the any-order rows
  order_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # its options
  seed: int = 0
  ensemble_max_m: int = 0          # > 0: ensembles for M = 1, 2, 4, ..., ensemble_max_m
  ensemble_layout: str = "pairs"   # pairs (one compiled shape) | buckets (evaluation/ensembles.py)
  ensemble_num_buckets: int = 16
  slots_per_call: int = 0          # ensemble slots per compiled call; 0: the backend's default
                                   # (ensembles.default_slots_per_call; also a memory knob)
  max_batches: int = 0             # > 0: only the first batches (smoke tests)
  model_kind: str = "aogpt"        # aogpt | encoder (the encoder-only MDM model, model/encoder.py)
  elbo_samples: int = 16           # encoder only: t samples per block of the ELBO row (0: off)
  elbo_stratified: bool = False    # encoder only: stratified t per block (see encoder_nll.py)

  def __post_init__(self):
    if self.model_kind not in MODEL_KINDS:
      raise ValueError(f"eval.model_kind must be one of {MODEL_KINDS}, got {self.model_kind!r}")
    if self.elbo_samples < 0:
      raise ValueError(f"eval.elbo_samples must be >= 0, got {self.elbo_samples}")
    if self.model_kind == "encoder" and self.ensemble_max_m:
      raise ValueError("eval.ensemble_max_m: context-order ensembles do not apply to the encoder "
                       "(its prediction does not depend on the order of the context); set it "
                       "to 0 with model_kind='encoder'")
    if self.num_orders < 1:
      raise ValueError(f"eval.num_orders must be >= 1, got {self.num_orders}")
    try:
      orders_lib.check_kwargs(self.order, dict(self.order_kwargs))
      # the values too (a string where a number goes), on a tiny draw, before anything compiles
      orders_lib.sample(self.order, jax.random.key(0), 1, 8, **dict(self.order_kwargs))
    except (ValueError, TypeError) as e:
      raise ValueError(f"eval.order / eval.order_kwargs: {one_line(e)}") from None
    if self.slots_per_call < 0:
      raise ValueError(f"eval.slots_per_call must be >= 0 (0: the backend's default), got "
                       f"{self.slots_per_call}")
    if not 0 <= self.ensemble_max_m <= MAX_ENSEMBLE_M:
      raise ValueError(f"eval.ensemble_max_m must be in [0, {MAX_ENSEMBLE_M}] (each block costs "
                       f"about (M - 1) * block_size / 2 forwards), got {self.ensemble_max_m}")
    if self.ensemble_layout not in ens_lib.LAYOUTS:
      raise ValueError(f"eval.ensemble_layout must be one of {ens_lib.LAYOUTS}, "
                       f"got {self.ensemble_layout!r}")
    if not (self.l2r or self.any_order or self.ensemble_max_m or self.elbo):
      raise ValueError("eval: nothing to compute (l2r, any_order and ensemble_max_m all off, and "
                       "no ELBO for an encoder)")

  @property
  def elbo(self) -> bool:
    return self.model_kind == "encoder" and self.elbo_samples > 0

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "EvalSettings":
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"unknown eval setting(s) {unknown}; known: {sorted(known)}")
    return cls(**dict(d))


def eval_config() -> config_dict.ConfigDict:
  """The ``eval`` config group: one group for the held-out evaluation during training and for
  ``--mode=eval``. Both read ``split``, ``batch_size`` and ``seed``; training scores the first
  ``train_max_blocks`` blocks of ``split`` every ``eval_every`` steps (L2R, uniform and the run's
  own order, or the ELBO for objective=mdm: objectives.py), since it runs many times; the rest
  is what ``--mode=eval`` computes (every `EvalSettings` field)."""
  c = config_dict.ConfigDict(dict(
      split="validation",    # the held-out split of data.source ("heldout" below)
      batch_size=0,          # global, in blocks; 0 = batch_size
      train_max_blocks=256,  # during training: the first blocks of split (0 = all of it)
      datasets="heldout",    # --mode=eval, comma-separated: heldout (= data.source's split) |
                             # wikitext2 | wikitext103 | ptb | lambada | lm1b | any source:split
      which="",              # --mode=eval weights: ema | params; "" = ema (a converted folder:
                             # the weights it holds, without a warning)
      name="zero_shot",      # --mode=eval output file stem under WORKDIR/eval/ (never
                             # overwritten: a rerun writes zero_shot-2, ...)
      data="",               # --mode=eval: "" = "heldout" must be the run's data source, split
                             # and seq_len (else an error); "config" = this config's, even if
                             # they differ from the run's
      max_blocks=0,          # --mode=eval: > 0 only the first blocks of each dataset (0 = all)
  ))
  for f in dataclasses.fields(EvalSettings):
    if f.name != "order_kwargs":
      c[f.name] = f.default
  # JSON, e.g. '{"seed": 3}'; "" = the run's order.kwargs when eval.order is the run's
  # order.name (a fixed_random / blockwise run is scored under its own order), else none.
  c.order_kwargs = ""
  c.model_kind = ""          # "" = the objective's (aogpt | encoder)
  return c


config_groups.register("eval", eval_config)
