"""Rewards for GRPO: a registry of ``fn(tokens, puzzles, task) -> [R]`` float (``credit="token"``:
[R, n], one per position), the built-in ones (fields of a task's verifier: ``solved``,
``cell_accuracy``, Sudoku's ``rule_cells``; ``cell_correct`` and ``cell_valid`` per position), ``MODULE:FUNCTION``
imports of one's own, and the one-line checks of what a reward returns (shape, NaN / inf).
`grpo` re-exports every public name here (``grpo.register_reward`` is the documented spelling).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

RewardFn = Callable[[np.ndarray, dict, Any], np.ndarray]
REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
  """Registers ``fn(tokens, puzzles, task) -> float [R]`` as reward ``name``."""

  def deco(fn: RewardFn) -> RewardFn:
    old = REWARDS.get(name)
    if old is not None and _origin(old) != _origin(fn):   # the same function re-imported: fine
      raise ValueError(f"grpo reward {name!r} is already registered")
    REWARDS[name] = fn
    return fn

  return deco


def _origin(fn) -> tuple:
  """(qualified name, file) of a function: the same for one whose module was imported again."""
  code = getattr(fn, "__code__", None)
  return (fn, None) if code is None else (fn.__qualname__, code.co_filename)


def _verified(field: str) -> RewardFn:
  def fn(tokens, puzzles, task):
    if task is None:
      raise ValueError(f"rl.reward: {field!r} needs a task (its verifier), got task=None")
    out = task.verify(tokens, puzzles)
    if field not in out:
      raise ValueError(f"rl.reward: {field!r} is not a field of the verifier of task "
                       f"{task.name!r}; expected one of {', '.join(sorted(out))}")
    return np.asarray(out[field], np.float64)
  fn.__doc__ = f"The task verifier's ``{field}`` per rollout."
  return fn


register_reward("solved")(_verified("solved"))
register_reward("cell_accuracy")(_verified("cell_accuracy"))
register_reward("rule_cells")(_verified("rule_cells"))     # sudoku: cells breaking no rule


@register_reward("cell_correct")
def cell_correct(tokens, puzzles, task):
  """float [R, n], a per-token reward (``credit="token"``): 1 where a position holds the
  reference answer's token (``puzzles["tokens"]``), else 0; any task with reference answers."""
  del task
  return (np.asarray(tokens) == np.asarray(puzzles["tokens"])).astype(np.float64)


@register_reward("cell_valid")
def cell_valid(tokens, puzzles, task):
  """float [R, n], a per-token reward (``credit="token"``): 1 where a cell's token breaks no rule
  of the finished answer (`Task.cell_rules`: Sudoku's row, column and box), else 0. Unlike
  ``cell_correct`` it does not punish a right digit of another solution (a puzzle with several)."""
  fn = getattr(task, "cell_rules", None)
  if not callable(fn):
    raise ValueError(f"rl.reward: 'cell_valid' needs a task with rules per cell "
                     f"(Task.cell_rules, e.g. sudoku); task "
                     f"{getattr(task, 'name', task)!r} has none; expected cell_correct")
  return np.asarray(fn(tokens, puzzles), np.float64)


def get_reward(reward: str | RewardFn) -> RewardFn:
  """A reward function: ``reward`` itself when callable, a `REWARDS` name, or ``MODULE:FUNCTION``
  (a dotted module name or a .py file, imported as ``task.module`` is: `tasks.import_module`)."""
  if callable(reward):
    return reward
  if isinstance(reward, str) and ":" in reward and reward not in REWARDS:
    from aogpt_jax import tasks  # pylint: disable=g-import-not-at-top
    module_name, _, fn_name = reward.rpartition(":")
    try:
      module = tasks.import_module(module_name)
    except ValueError as e:
      raise ValueError(f"rl.reward: {reward!r}: {str(e).removeprefix('task.module: ')}") from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
      raise ValueError(f"rl.reward: {reward!r}: {module_name} has no function {fn_name!r}; "
                       f"expected MODULE:FUNCTION with FUNCTION(tokens, puzzles, task) -> [R]")
    return fn
  if reward not in REWARDS:
    raise ValueError(f"rl.reward: unknown reward {reward!r}; expected one of "
                     f"{', '.join(sorted(REWARDS))}, MODULE:FUNCTION or a function (tokens, "
                     f"puzzles, task) -> [R]")
  return REWARDS[reward]


def reward_values(fn: RewardFn, tokens, puzzles: dict, task, what: str,
                  per_token: bool = False) -> np.ndarray:
  """float64 [R] (``per_token``: [R, n], one per position): ``fn(tokens, puzzles, task)`` on the
  rows of ``tokens`` (``what`` they are, for the message); a reward that raises or returns
  another shape is one line."""
  try:
    rewards = np.asarray(fn(tokens, puzzles, task), np.float64)
  except Exception as e:  # noqa: BLE001 - a reward of one's own may raise anything
    msg = (str(e).strip().splitlines() or [repr(e)])[0]
    raise ValueError(f"rl.reward: {getattr(fn, '__name__', fn)} raised {type(e).__name__}: "
                     f"{msg} on {what}") from e
  want = tuple(np.shape(tokens)) if per_token else (np.shape(tokens)[0],)
  if rewards.shape != want:
    raise ValueError(f"rl.reward: returned shape {rewards.shape} on {what}; expected {want}, "
                     + ("one reward per position (rl.credit='token')" if per_token else
                        "one reward per rollout"))
  return rewards


def reward_name(reward) -> str:
  return reward if isinstance(reward, str) else getattr(reward, "__name__", repr(reward))


def check_finite(rewards: np.ndarray, reward, what: str = "rollout") -> np.ndarray:
  """``rewards``, or a one-line ValueError naming the reward when one is NaN or inf (which would
  make every weight NaN); ``what`` a row is, for the message."""
  bad = ~np.isfinite(rewards).reshape(len(rewards), -1)
  if bad.any():
    row = int(np.argmax(bad.any(1)))
    value = np.reshape(rewards[row], -1)[np.argmax(bad[row])]
    raise ValueError(f"rl.reward: {reward_name(reward)!r} returned {value} for {what} "
                     f"{row} ({int(bad.any(1).sum())} of {len(rewards)} not finite); expected a "
                     f"finite reward per {what} (no update was taken with it)")
  return rewards
