"""Supervised fine-tuning on prompt / response text (tasks/text_pairs.py, configs/sft_text.py):
the row encoding (prompt first, end-of-text padding scored), deterministic batches, the held-out
split by prompt, JSONL and ``datasets`` giving the same rows, one-line errors, the verifier, and
short runs that fit examples, start from ``train.init_from`` and solve."""

import json

import numpy as np
import pytest

from aogpt_jax import tasks
from aogpt_jax.data import tokenizers
from aogpt_jax.tasks import text_pairs

BYTE = tokenizers.get_tokenizer("byte")


def _write(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return str(path)


def _pairs(n=60):
  return [{"prompt": f"{i}+{i % 7}=", "response": str(i + i % 7)} for i in range(n)]


@pytest.fixture
def jsonl(tmp_path):
  return _write(tmp_path / "pairs.jsonl", _pairs())


def test_encode_pair_puts_the_prompt_first_and_pads_the_response_with_end_of_text():
  tokens, mask = text_pairs.encode_pair(BYTE, "ab=", "xyz", 10)
  want = [*b"ab=", *b"xyz", 256, 256, 256, 256]          # bytes, then end-of-text (256)
  assert tokens.tolist() == want and tokens.dtype == np.int32
  assert mask.tolist() == [True] * 3 + [False] * 7      # the padding is response: scored
  # An empty prompt or response: the row is all response, or the end-of-text right after.
  t0, m0 = text_pairs.encode_pair(BYTE, "", "hi", 4)
  assert t0.tolist() == [104, 105, 256, 256] and not m0.any()
  t1, m1 = text_pairs.encode_pair(BYTE, "q", "", 3, pad_id=0)
  assert t1.tolist() == [113, 0, 0] and m1.tolist() == [True, False, False]


def test_encode_pair_refuses_or_truncates_what_does_not_fit():
  with pytest.raises(ValueError, match=r"^f: line 3: the prompt is 4 tokens and rows are "
                     r"length=4;"):
    text_pairs.encode_pair(BYTE, "abcd", "", 4, where="f: line 3")
  # prompt 2 + response 3 + end-of-text = 6 > 5: refused, unless truncate (then no end marker)
  with pytest.raises(ValueError, match=r"^row 7: prompt \(2 tokens\) \+ response \(3\) \+ "
                     r"end-of-text do not fit length=5; .*truncate=True"):
    text_pairs.encode_pair(BYTE, "ab", "cde", 5, where="row 7")
  tokens, mask = text_pairs.encode_pair(BYTE, "ab", "cdefg", 5, truncate=True)
  assert tokens.tolist() == list(b"abcde") and mask.sum() == 2
  # exactly one end-of-text fits
  assert text_pairs.encode_pair(BYTE, "ab", "cd", 5)[0].tolist() == [*b"abcd", 256]


def test_rows_are_the_encoded_examples_and_the_vocabulary_is_the_tokenizers(jsonl):
  t = tasks.make("pairs", path=jsonl, length=12)
  assert t.vocab_size == 257 and t.length == 12 and t.examples == 60
  assert tasks.make("pairs", **t.options()).options() == t.options()
  rows = {(bytes(r[m].tolist()).decode(), bytes(r[(~m) & (r < 256)].tolist()).decode())
          for r, m in zip(t.tokens, t.prompt)}
  assert rows == {(p["prompt"], p["response"]) for p in _pairs()}


def test_batches_are_deterministic_epoch_shuffled_and_never_held_out(jsonl):
  t = tasks.make("pairs", path=jsonl, length=12, heldout_frac=0.25)
  b = t.train_batch(3, 5, 7)
  np.testing.assert_array_equal(b["tokens"], t.train_batch(3, 5, 7)["tokens"])
  assert not np.array_equal(b["tokens"], t.train_batch(4, 5, 7)["tokens"])
  e = len(t.train_index)
  # Global positions 0 .. 2e - 1 in batches of 4 (crossing the epoch edge inside a batch):
  # each epoch visits every training example once, in two different orders.
  batches = -(-2 * e // 4)
  idx = np.concatenate([t.train_indices(3, i, 4) for i in range(batches)])[:2 * e]
  assert sorted(idx[:e]) == sorted(idx[e:]) == sorted(t.train_index)
  assert not np.array_equal(idx[:e], idx[e:])
  # The split is by the prompt's text: the recomputed crc32 bucket, disjoint sides.
  held = t.heldout(0, 1000)
  texts = lambda rows: {bytes(r[m].tolist()).decode() for r, m in zip(rows["tokens"],  # noqa: E731
                                                                      rows["prompt"])}
  held_prompts = texts(held)
  assert len(held["tokens"]) == len(t.heldout_index) == len(held_prompts) > 0
  import zlib
  want = {p["prompt"] for p in _pairs() if zlib.crc32(p["prompt"].encode()) % 2**20 < 0.25 * 2**20}
  assert held_prompts == want
  seen = set().union(*(texts(t.train_batch(0, i, 16)) for i in range(20)))
  assert seen and not seen & held_prompts
  # heldout(seed, k) is a prefix of heldout(seed, m)
  np.testing.assert_array_equal(t.heldout(0, 3)["tokens"], held["tokens"][:3])
  assert not np.array_equal(t.heldout(1, 1000)["tokens"], held["tokens"])


def test_a_datasets_json_file_gives_the_same_rows_as_the_jsonl(jsonl):
  pytest.importorskip("datasets")
  a = tasks.make("pairs", path=jsonl, length=12)
  b = tasks.make("pairs", dataset="json", data_files=jsonl, length=12)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.prompt, b.prompt)
  np.testing.assert_array_equal(a.train_batch(0, 2, 8)["tokens"], b.train_batch(0, 2, 8)["tokens"])
  # other field names
  c = tasks.make("pairs", dataset="json", data_files=_write(
      __import__("pathlib").Path(jsonl).with_name("qa.jsonl"),
      [{"q": p["prompt"], "a": p["response"]} for p in _pairs()]),
      prompt_key="q", response_key="a", length=12)
  np.testing.assert_array_equal(a.tokens, c.tokens)


@pytest.mark.parametrize("rows,options,msg", [
    (None, {"path": "/nonexistent/x.jsonl"},
     r"^task 'pairs': path='/nonexistent/x.jsonl': no such file"),
    ([{"prompt": "a", "response": "b"}, "", {"prompt": "c"}], {},
     r"^\S+: line 3: no key 'response' \(keys: 'prompt'\)"),
    ([{"prompt": "a", "response": "b"}, "{not json"], {}, r"^\S+: line 2: not JSON"),
    ([{"prompt": "a", "response": 3}], {}, r"^\S+: line 1: 'response' is of type int"),
    ([{"prompt": "a", "response": "b"}, {"prompt": "x" * 12, "response": "b"}], {},
     r"^\S+: line 2: the prompt is 12 tokens and rows are length=12"),
    ([{"prompt": "a", "response": "b"}], {"dataset": "json"},
     r"^task 'pairs': path=.*, dataset='json'; expected exactly one"),
    ([{"prompt": "a", "response": "b"}], {"tokenizer": "nope"},
     r"^task 'pairs': tokenizer='nope': .*unknown tokenizer"),
    ([{"prompt": "a", "response": "b"}], {},
     r"^task 'pairs': .*: none of its 1 examples falls on the held-out side"),
])
def test_bad_inputs_are_one_line(tmp_path, rows, options, msg):
  kw = {"length": 12}
  if rows is not None:
    kw["path"] = _write(tmp_path / "bad.jsonl", rows)
  kw.update(options)
  with pytest.raises(ValueError, match=msg) as e:
    tasks.make("pairs", **kw)
  assert "\n" not in str(e.value)


def test_verify_scores_the_response_and_its_end(jsonl):
  t = tasks.make("pairs", path=jsonl, length=12)
  ref = t.heldout(0, 4)
  out = ref["tokens"].copy()
  start = ref["prompt"].sum(1)
  out[0, start[0]] ^= 1                      # a wrong answer token
  out[1, -1] = 65                            # junk after the end-of-text
  end2 = start[2] + np.flatnonzero(ref["tokens"][2, start[2]:] == 256)[0]
  out[2, end2] = 65                          # the end-of-text itself missing
  got = t.verify(out, ref)
  free = (~ref["prompt"]).sum(1)
  want_acc = ((out == ref["tokens"]) & ~ref["prompt"]).sum(1) / free
  np.testing.assert_allclose(got["cell_accuracy"], want_acc)
  assert got["solved"].tolist() == [False, False, False, True]
  assert got["answer_match"].tolist() == [False, True, False, True]
  assert "response: " + t.text(ref["tokens"][3], ref["prompt"][3])[1] in t.render(
      ref["tokens"][3], ref["prompt"][3])


@pytest.mark.slow
def test_a_short_sft_run_fits_its_examples_and_solves_them(tmp_path):
  """60 steps from scratch on 16 sums: the training loss and the held-out response loss fall far
  below the uniform ln(257); ``--mode=solve`` on a JSONL file (``solve.puzzles``) reports the
  verifier's exact-match rate of what it wrote."""
  from aogpt_jax import modes, recipes
  from aogpt_jax.train import loop
  from helpers.trainer import tiny_config
  path = _write(tmp_path / "sums.jsonl", _pairs(16))
  opts = {"path": path, "length": 10, "heldout_frac": 0.25}
  cfg = recipes.apply(tiny_config(tmp_path / "cache"), {
      "task.name": "pairs", "task.options": opts, "seq_len": 10, "model.block_size": 10,
      "total_steps": 60, "batch_size": 16, "log_every": 10, "eval_every": 0,
      "checkpoint_every": 0, "optimizer.lr": 1e-2, "optimizer.warmup_steps": 5,
      "task.heldout_count": 8})
  last = loop.train(cfg, str(tmp_path / "run"))
  lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  losses = [d["train/loss"] for d in lines if "train/loss" in d]
  uniform = np.log(257)
  assert losses[0] > 0.5 * uniform and losses[-1] < 0.25 * uniform, losses
  assert last["eval/loss_l2r"] < 0.5 * uniform, last
  recipes.apply(cfg, {"solve.puzzles": path, "solve.count": 0, "sample.method": "adaptive",
                      "sample.policy": "max_prob", "sample.greedy": True, "sample.steps": 10})
  out = modes.solve_mode(cfg, str(tmp_path / "run"))
  rows = [json.loads(s) for s in (tmp_path / "run" / "solve" / "solve.jsonl").read_text()
          .splitlines()]
  t = tasks.make("pairs", **opts)
  again = t.verify(np.array([r["output"] for r in rows]), t.load(path))
  assert len(rows) == 16 and out["solved"]["count"] == int(again["solved"].sum())
  np.testing.assert_allclose(out["cell_accuracy"], again["cell_accuracy"].mean())
  assert out["cell_accuracy"] > 0.5      # the padding and most answer digits (uniform: 1/257)
