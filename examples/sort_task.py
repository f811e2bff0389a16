"""A task of your own, outside the package: sort a row of digits (docs/tasks.md, "Your own task").

Each row is ``digits`` digits (the prompt) followed by the same digits sorted (the answer):
``3 1 4 1 5 9 | 1 1 3 4 5 9``. Tokens are the digits themselves (``vocab_size`` = ``values``). The
verifier checks that the answer is sorted and holds exactly the prompt's digits. Every mode runs it
with configs/task.py::

  python -m aogpt_jax.main --config=configs/task.py:tiny --config.task.module=examples/sort_task.py \
      --config.task.name=sort --workdir=/tmp/sort

``task.module`` may also be a dotted name importable from the current folder (``examples.sort_task``).
``in_order`` is a reward of your own for ``--mode=rl``:
``--config.rl.reward=examples/sort_task.py:in_order``.
"""

import numpy as np

from aogpt_jax import tasks
from aogpt_jax.tasks import base


@tasks.register("sort")
class Sort(tasks.Task):
  """``tasks.make("sort", digits=6, values=10)``: ``digits`` digits in ``0 .. values - 1``."""

  def __init__(self, digits: int = 6, values: int = 10, heldout_frac: float = 0.1):
    self.digits = base.check_int("sort", "digits", digits, 2)
    self.values = base.check_int("sort", "values", values, 2)
    self.heldout_frac = base.check_frac("sort", heldout_frac)
    self.length, self.vocab_size = 2 * self.digits, self.values

  def options(self) -> dict:
    return {"digits": self.digits, "values": self.values, "heldout_frac": self.heldout_frac}

  def split_keys(self, tokens) -> np.ndarray:
    """An instance is its unsorted digits (the prompt)."""
    return base.as_rows(self.name, "tokens", tokens, self.length, np.uint8)[:, :self.digits]

  def _rows(self, rng: np.random.Generator, count: int, held: bool) -> dict:
    out, have = [], 0
    while have < count:
      x = rng.integers(0, self.values, (max(2 * count, 64), self.digits))
      x = x[self.in_heldout(np.concatenate([x, x], 1)) == held]
      out.append(x)
      have += len(x)
    x = np.concatenate(out)[:count]
    tokens = np.concatenate([x, np.sort(x, 1)], 1).astype(np.int32)
    prompt = np.zeros(tokens.shape, bool)
    prompt[:, :self.digits] = True
    return {"tokens": tokens, "prompt": prompt}

  def train_batch(self, seed: int, index: int, batch: int) -> dict:
    return self._rows(base.seeds(0x5027, seed, index), batch, held=False)

  def heldout(self, seed: int, count: int) -> dict:
    return self._rows(base.seeds(0x4E1D, 0x5027, seed), count, held=True)

  def verify(self, tokens, puzzle: dict) -> dict:
    tokens = base.as_rows(self.name, "tokens", tokens, self.length)
    acc, kept = self._cell_accuracy(tokens, puzzle)
    ref = base.as_rows(self.name, "puzzle['tokens']", puzzle["tokens"], self.length)
    answer = tokens[:, self.digits:]
    ordered = (np.diff(answer, axis=1) >= 0).all(1)
    same_digits = (np.sort(answer, 1) == np.sort(ref[:, :self.digits], 1)).all(1)
    return {"solved": ordered & same_digits & kept, "ordered": ordered,
            "givens_kept": kept, "cell_accuracy": acc}

  def render(self, tokens_row, prompt_row=None) -> str:
    t = [str(int(v)) for v in np.asarray(tokens_row).ravel()]
    return f"{' '.join(t[:self.digits])} | {' '.join(t[self.digits:])}"


def in_order(tokens, puzzles, task) -> np.ndarray:
  """A reward of your own (``rl.reward=MODULE:in_order``): the fraction of the answer's adjacent
  pairs in order, a partial credit where ``solved`` gives 0 or 1."""
  answer = np.asarray(tokens)[:, task.digits:]
  return (np.diff(answer, axis=1) >= 0).mean(1)
