"""Prompt / response text as a task: the data of supervised fine-tuning (docs/post_training.md).

    t = tasks.make("pairs", path="examples/sft_tiny.jsonl", tokenizer="byte", length=32)
    t.train_batch(seed=0, index=step, batch=16)   # {"tokens": int32 [B, n], "prompt": bool [B, n]}

Sources (exactly one): ``path=`` a JSONL file, one ``{"prompt": str, "response": str}`` object
per line (blank lines skipped), or ``dataset=`` a Hugging Face ``datasets`` dataset (a hub name,
a ``save_to_disk`` folder, or a builder such as ``"json"`` with ``data_files=``) and its
``split``; ``prompt_key`` / ``response_key`` name the two fields. ``limit`` keeps the first
``limit`` examples (0: all).

A row (`encode_pair`, which DPO uses too): the prompt's tokens, then the response's, then the
tokenizer's end-of-text id up to ``length``. The end-of-text padding belongs to the RESPONSE: it
is scored (as LLaDA's SFT pads with |EOS| and trains on it), so the model learns where an answer
ends, and a generated row is read up to its first end-of-text. A response fits when the prompt,
the response and at least one end-of-text fit the row; a longer one is refused with a one-line
error naming its row, or with ``truncate=True`` cut to the row (that row then has no end marker:
the model is taught to keep going). A prompt must leave room for one response token.

Split (`base`): an example is held out iff ``crc32(its prompt's UTF-8 bytes) % 2**20 <
heldout_frac * 2**20``: by the prompt's TEXT, so every response to one prompt is on the same side,
and the split does not depend on the tokenizer or the row length (an SFT file and a DPO file of
the same prompts agree). ``train_batch(seed, index, batch)`` walks the training examples in a
new order each epoch (a permutation drawn from the seed and the epoch): global position
``index * batch + j``. ``heldout(seed, count)`` is the first ``count`` held-out examples in an
order drawn from the seed: at most ``count`` (the set is finite), a prefix of any longer call.

verify: "solved" (every response token, end-of-text padding included, is the reference's, and
the prompt kept), "answer_match" (the response up to the reference's first end-of-text and that
end-of-text right: what follows it is ignored), "cell_accuracy" (the fraction of response tokens
right), "givens_kept".

``preferences`` (`TextPreferences`): ``{"prompt", "chosen", "rejected"}`` lines for DPO
(posttrain/dpo.py), each response encoded as above; as a task its rows are the chosen ones.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np

from aogpt_jax.data import tokenizers as tokenizers_lib
from aogpt_jax.tasks import base

NAME = "pairs"


def encode_pair(tokenizer, prompt: str, response: str, length: int, *, pad_id: int | None = None,
                truncate: bool = False, where: str = "pair") -> tuple[np.ndarray, np.ndarray]:
  """(tokens int32 [length], prompt_mask bool [length]): the prompt's tokens, the response's,
  then ``pad_id`` (default: the tokenizer's end-of-text) to the end, the padding part of the
  response (module docstring). Errors are one line starting with ``where``."""
  pad = int(tokenizer.eot_id if pad_id is None else pad_id)
  p, r = tokenizer.encode(prompt), tokenizer.encode(response)
  if len(p) >= length:
    raise ValueError(f"{where}: the prompt is {len(p)} tokens and rows are length={length}; "
                     f"expected a prompt of at most {length - 1} tokens (raise length)")
  if len(p) + len(r) + 1 > length:
    if not truncate:
      raise ValueError(f"{where}: prompt ({len(p)} tokens) + response ({len(r)}) + end-of-text "
                       f"do not fit length={length}; raise length, or set truncate=True to cut "
                       f"long responses")
    r = r[:length - len(p)]
  tokens = np.full(length, pad, np.int32)
  tokens[:len(p)] = p
  tokens[len(p):len(p) + len(r)] = r
  mask = np.zeros(length, bool)
  mask[:len(p)] = True
  return tokens, mask


def prompt_heldout(prompts, frac: float) -> np.ndarray:
  """bool [E]: which prompts (strings) are held out: ``crc32(utf-8) % 2**20 < frac * 2**20``."""
  cut = int(round(frac * base.BUCKETS))
  return np.array([zlib.crc32(str(p).encode("utf-8")) % base.BUCKETS < cut for p in prompts],
                  bool)


def read_examples(keys: tuple[str, ...], *, path: str = "", dataset: str = "",
                  data_files: str = "", split: str = "train", limit: int = 0,
                  what: str = NAME) -> list[tuple[str, dict[str, str]]]:
  """[(where, {key: text})]: the examples of a JSONL file (``path``) or a ``datasets``
  dataset, each with every one of ``keys`` a string; ``where`` names the file and line (or the
  dataset and row) for errors. One-line ValueErrors start with ``task {what!r}``."""
  head = f"task {what!r}"
  if bool(path) == bool(dataset):
    raise ValueError(f"{head}: path={path!r}, dataset={dataset!r}; expected exactly one (a JSONL "
                     f"file, or a datasets name / folder)")
  rows = _jsonl(path, head) if path else _dataset(dataset, data_files, split, head)
  out = []
  for where, ex in rows:
    if limit and len(out) >= limit:
      break
    if not isinstance(ex, dict):
      raise ValueError(f"{where}: a {type(ex).__name__}; expected an object with keys "
                       f"{', '.join(map(repr, keys))}")
    for k in keys:
      if k not in ex:
        raise ValueError(f"{where}: no key {k!r} (keys: {', '.join(map(repr, ex))}); expected "
                         f"{', '.join(map(repr, keys))}")
      if not isinstance(ex[k], str):
        raise ValueError(f"{where}: {k!r} is of type {type(ex[k]).__name__}; expected a string")
    out.append((where, {k: ex[k] for k in keys}))
  if not out:
    raise ValueError(f"{head}: {path or dataset}: no examples; expected one object per line")
  return out


def _jsonl(path: str, head: str):
  if not os.path.isfile(path):
    raise ValueError(f"{head}: path={path!r}: no such file; expected a JSONL file of "
                     f"{{\"prompt\": ..., \"response\": ...}} lines")
  with base.open_text(path) as f:
    for k, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        ex = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {k}: not JSON ({e.msg} at column {e.colno})") from None
      yield f"{path}: line {k}", ex


def _dataset(name: str, data_files: str, split: str, head: str):
  try:
    import datasets  # pylint: disable=g-import-not-at-top  (optional, heavy)
  except ImportError:
    raise ValueError(f"{head}: dataset={name!r} needs the `datasets` package (pip install "
                     f"datasets); or give a JSONL file as path=") from None
  try:
    if os.path.isdir(name):
      ds = datasets.load_from_disk(name)
      if isinstance(ds, datasets.DatasetDict):
        ds = ds[split]
    else:
      ds = datasets.load_dataset(name, data_files=data_files or None, split=split)
  except Exception as e:  # noqa: BLE001 - datasets raises many kinds; one line names the source
    msg = (str(e).splitlines() or [type(e).__name__])[0][:200]
    raise ValueError(f"{head}: dataset={name!r} (data_files={data_files!r}, split={split!r}) "
                     f"could not be loaded: {msg}") from None
  for i, ex in enumerate(ds):
    yield f"{name}: row {i + 1}", ex


@base.register(NAME)
class TextPairs(base.Task):
  """``tasks.make("pairs", path=FILE.jsonl, tokenizer="byte", length=64)`` (module docstring)."""

  def __init__(self, path: str = "", dataset: str = "", data_files: str = "",
               split: str = "train", prompt_key: str = "prompt", response_key: str = "response",
               tokenizer: str = "byte", length: int = 64, heldout_frac: float = 0.1,
               truncate: bool = False, limit: int = 0):
    self.response_key = str(response_key)
    self._setup(path, dataset, data_files, split, prompt_key, (self.response_key,), tokenizer,
                length, heldout_frac, truncate, limit)

  def _setup(self, path, dataset, data_files, split, prompt_key, answer_keys, tokenizer, length,
             heldout_frac, truncate, limit) -> None:
    """Reads and encodes the examples: ``self.rows[key]`` int32 [E, n] for each of
    ``answer_keys`` (``self.tokens`` the first), ``self.prompt`` bool [E, n], the split."""
    name = self.name
    self.path, self.dataset, self.data_files, self.split = (str(path), str(dataset),
                                                            str(data_files), str(split))
    self.prompt_key = str(prompt_key)
    self.length = base.check_int(name, "length", length, 2)
    self.limit = base.check_int(name, "limit", limit, 0)
    self.heldout_frac = base.check_frac(name, heldout_frac)
    if not isinstance(truncate, bool):
      raise ValueError(f"task {name!r}: truncate={truncate!r}; expected True or False")
    self.truncate = truncate
    self.tokenizer_name = str(tokenizer)
    try:
      self.tokenizer = tokenizers_lib.get_tokenizer(self.tokenizer_name)
    except (ValueError, OSError, ImportError) as e:
      raise ValueError(f"task {name!r}: tokenizer={tokenizer!r}: {e}") from None
    self.vocab_size = int(self.tokenizer.vocab_size)
    self.pad_id = int(self.tokenizer.eot_id)
    examples = read_examples((self.prompt_key, *answer_keys), path=self.path,
                             dataset=self.dataset, data_files=self.data_files, split=self.split,
                             limit=self.limit, what=name)
    self.rows = {}
    for key in answer_keys:
      self.rows[key], self.prompt = self._encode(examples, key)
    self.tokens = self.rows[answer_keys[0]]
    held = prompt_heldout([ex[self.prompt_key] for _, ex in examples], self.heldout_frac)
    self.train_index, self.heldout_index = np.flatnonzero(~held), np.flatnonzero(held)
    src = self.path or self.dataset
    for side, idx in (("training", self.train_index), ("held-out", self.heldout_index)):
      if not len(idx):
        raise ValueError(f"task {name!r}: {src}: none of its {len(examples)} examples falls on "
                         f"the {side} side of heldout_frac={self.heldout_frac}; expected more "
                         f"examples (distinct prompts) or another heldout_frac")
    self._perms: dict[tuple[int, int], np.ndarray] = {}

  def _encode(self, examples, key: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [encode_pair(self.tokenizer, ex[self.prompt_key], ex[key], self.length,
                        pad_id=self.pad_id, truncate=self.truncate, where=where)
            for where, ex in examples]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])

  def _source_options(self) -> dict:
    return {"path": self.path, "dataset": self.dataset, "data_files": self.data_files,
            "split": self.split, "prompt_key": self.prompt_key}

  def _row_options(self) -> dict:
    return {"tokenizer": self.tokenizer_name, "length": self.length,
            "heldout_frac": self.heldout_frac, "truncate": self.truncate, "limit": self.limit}

  def options(self) -> dict:
    return {**self._source_options(), "response_key": self.response_key, **self._row_options()}

  @property
  def examples(self) -> int:
    return int(self.tokens.shape[0])

  def _perm(self, seed: int, epoch: int) -> np.ndarray:
    key = (seed, epoch)
    if key not in self._perms:
      if len(self._perms) > 8:
        self._perms.clear()
      self._perms[key] = base.seeds(0x5F7, seed, epoch).permutation(len(self.train_index))
    return self._perms[key]

  def train_indices(self, seed: int, index: int, batch: int) -> np.ndarray:
    """int [batch]: the example indices of training batch ``index`` (module docstring)."""
    base.seeds(0, seed, index)                     # the argument checks
    e = len(self.train_index)
    pos = int(index) * int(batch) + np.arange(int(batch))
    out = np.empty(int(batch), np.int64)
    for epoch in np.unique(pos // e):
      sel = pos // e == epoch
      out[sel] = self.train_index[self._perm(int(seed), int(epoch))[pos[sel] % e]]
    return out

  def train_batch(self, seed: int, index: int, batch: int) -> dict[str, np.ndarray]:
    idx = self.train_indices(seed, index, batch)
    return {"tokens": self.tokens[idx].copy(), "prompt": self.prompt[idx].copy()}

  def heldout(self, seed: int, count: int) -> dict[str, np.ndarray]:
    """At most ``count`` held-out examples (the set is finite), in an order drawn from
    ``seed``; ``heldout(seed, k)`` is a prefix of ``heldout(seed, m)``, ``k <= m``."""
    idx = self.heldout_indices(seed, count)
    return {"tokens": self.tokens[idx].copy(), "prompt": self.prompt[idx].copy()}

  def heldout_indices(self, seed: int, count: int) -> np.ndarray:
    """int [<= count]: the example indices of ``heldout(seed, count)``."""
    perm = base.seeds(0x4E1D, 0x5F7, seed).permutation(len(self.heldout_index))
    return self.heldout_index[perm[:int(count)]]

  def load(self, path: str, limit: int | None = None) -> dict[str, np.ndarray]:
    """``--mode=solve`` with ``solve.puzzles=FILE``: a JSONL file of this task's keys, encoded
    as its rows."""
    key = next(iter(self.rows))
    examples = read_examples((self.prompt_key, key), path=path, limit=int(limit or 0),
                             what=self.name)
    tokens, prompt = self._encode(examples, key)
    return {"tokens": tokens, "prompt": prompt}

  def _response_end(self, ref: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """int [B]: the position of each reference row's first end-of-text after its prompt
    (``length`` when it has none: a truncated response)."""
    pad_after = (ref == self.pad_id) & ~prompt
    return np.where(pad_after.any(1), pad_after.argmax(1), self.length)

  def verify(self, tokens, puzzle: dict) -> dict[str, np.ndarray]:
    tokens = base.as_rows(self.name, "tokens", tokens, self.length)
    acc, kept = self._cell_accuracy(tokens, puzzle)
    ref = base.as_rows(self.name, "puzzle['tokens']", puzzle["tokens"], self.length)
    prompt = base.as_rows(self.name, "puzzle['prompt']", puzzle["prompt"], self.length, bool)
    same = tokens == ref
    end = self._response_end(ref, prompt)
    upto = np.arange(self.length)[None, :] <= end[:, None]     # the answer and its end marker
    return {"solved": same.all(1), "answer_match": (same | ~upto).all(1), "givens_kept": kept,
            "cell_accuracy": acc}

  def text(self, tokens_row, prompt_row) -> tuple[str, str]:
    """(prompt, response) decoded; the response up to its first end-of-text."""
    tok = np.asarray(tokens_row).ravel()
    prm = np.asarray(prompt_row, bool).ravel()
    resp = tok[~prm]
    stop = np.flatnonzero(resp == self.pad_id)
    resp = resp[:stop[0]] if len(stop) else resp
    return self.tokenizer.decode(tok[prm].tolist()), self.tokenizer.decode(resp.tolist())

  def render(self, tokens_row, prompt_row=None) -> str:
    """``prompt: ...`` and ``response: ...`` (up to the first end-of-text); without
    ``prompt_row`` the whole row up to its first end-of-text."""
    if prompt_row is None:
      return self.text(tokens_row, np.zeros(np.asarray(tokens_row).size, bool))[1]
    p, r = self.text(tokens_row, prompt_row)
    return f"prompt: {p}\nresponse: {r}"


@base.register("preferences")
class TextPreferences(TextPairs):
  """``tasks.make("preferences", path=FILE.jsonl, ...)``: ``{"prompt", "chosen", "rejected"}``
  lines (``chosen_key`` / ``rejected_key``), each response encoded as `encode_pair` does. As a
  task its rows are the CHOSEN responses (SFT on them, held-out loss, ``--mode=solve`` against
  them); `preferences` gives both for DPO. Split and batches as ``pairs``."""

  def __init__(self, path: str = "", dataset: str = "", data_files: str = "",
               split: str = "train", prompt_key: str = "prompt", chosen_key: str = "chosen",
               rejected_key: str = "rejected", tokenizer: str = "byte", length: int = 64,
               heldout_frac: float = 0.1, truncate: bool = False, limit: int = 0):
    self.chosen_key, self.rejected_key = str(chosen_key), str(rejected_key)
    if self.chosen_key == self.rejected_key:
      raise ValueError(f"task {self.name!r}: chosen_key and rejected_key are both "
                       f"{chosen_key!r}; expected two fields")
    self._setup(path, dataset, data_files, split, prompt_key,
                (self.chosen_key, self.rejected_key), tokenizer, length, heldout_frac, truncate,
                limit)

  def options(self) -> dict:
    return {**self._source_options(), "chosen_key": self.chosen_key,
            "rejected_key": self.rejected_key, **self._row_options()}

  def _triples(self, idx: np.ndarray) -> dict[str, np.ndarray]:
    return {"chosen": self.rows[self.chosen_key][idx].copy(),
            "rejected": self.rows[self.rejected_key][idx].copy(),
            "prompt": self.prompt[idx].copy()}

  def preferences(self, seed: int, index: int, batch: int) -> dict[str, np.ndarray]:
    """Training pairs ``{"chosen", "rejected": int32 [B, n], "prompt": bool [B, n]}``: the
    examples of ``train_batch(seed, index, batch)``."""
    return self._triples(self.train_indices(seed, index, batch))

  def heldout_preferences(self, seed: int, count: int) -> dict[str, np.ndarray]:
    """The held-out pairs of ``heldout(seed, count)``."""
    return self._triples(self.heldout_indices(seed, count))
