"""The samplers' typed inputs: what one pass of the scan reads, and the settings fixed per compile.

    Passes     the host-planned per-pass bookkeeping (`schedules.StepPlan`): frontier m, first
               query q0, queries k, catch-up range; int32 [P, B] (scan inputs; [B] per pass)
    PassShape  static block sizes: slots per pass S, query slots Q, prefill slots
    Draw       static token-draw settings (temperature, top-p and its rule, greedy, debug, and
               whether to record each drawn token's log-probabilities)

Passes is a pytree (its arrays are traced); PassShape and Draw have no array leaves and are
hashable, so they are jit static arguments: one compile per shape and setting.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import struct


@struct.dataclass
class Passes:
  """Per-pass bookkeeping of the diffusion / encoder samplers (field meanings: StepPlan)."""
  m: Any          # frontier: tokens known at the pass's step
  q0: Any         # index within its step of the pass's first query
  k: Any          # query slots in the pass
  cstart: Any     # first catch-up rank-slot
  ccount: Any     # catch-up slots


@struct.dataclass
class PassShape:
  block: int = struct.field(pytree_node=False)      # S: slots per forward pass
  queries: int = struct.field(pytree_node=False)    # Q: query slots (the first Q of the block)
  prefill: int = struct.field(pytree_node=False)    # slots of the prefill pass (0: none)


@struct.dataclass
class Draw:
  temperature: float = struct.field(pytree_node=False, default=1.0)
  top_p: float = struct.field(pytree_node=False, default=1.0)
  top_p_rule: str = struct.field(pytree_node=False, default="published")
  greedy: bool = struct.field(pytree_node=False, default=False)
  debug: bool = struct.field(pytree_node=False, default=False)
  logp: bool = struct.field(pytree_node=False, default=False)   # record log-probs (`Samples.logp`)

  def kwargs(self) -> dict[str, Any]:
    """The keyword arguments of `tokens.draw_and_commit` (all but ``logp``)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "logp"}
