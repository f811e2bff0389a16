"""Streaming: per-epoch shuffling, process sharding, resume, worker processes, eval coverage."""

import json

import numpy as np
import pytest

from aogpt_jax import data
from aogpt_jax.data import config

SEQ = 16
N_BLOCKS = 40


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
  """40 blocks whose block i is row i: 15 digits of i then end-of-text (byte tokens)."""
  d = tmp_path_factory.mktemp("pipe")
  (d / "rows.jsonl").write_text("".join(json.dumps({"text": f"{i:015d}"}) + "\n"
                                        for i in range(N_BLOCKS)))
  return config.resolve({}, source="text_files", glob=str(d / "rows.jsonl"),
                        validation_glob=str(d / "rows.jsonl"), cache_dir=str(d / "cache"))


def ids(tokens):
  assert np.all(tokens[:, -1] == 256)
  return [int(bytes(t[:15].astype(np.uint8)).decode()) for t in tokens]


def take(it, n):
  return [next(it)["tokens"] for _ in range(n)]


def test_batches_are_blocks_and_epochs_reshuffle(cfg):
  it = data.train_iterator(cfg, seq_len=SEQ, global_batch_size=8, seed=3)
  batches = take(it, 10)
  assert all(b.shape == (8, SEQ) and b.dtype == np.int32 for b in batches)
  epoch0 = sum((ids(b) for b in batches[:5]), [])
  epoch1 = sum((ids(b) for b in batches[5:]), [])
  assert sorted(epoch0) == sorted(epoch1) == list(range(N_BLOCKS))
  assert epoch0 != epoch1 and epoch0 != list(range(N_BLOCKS))
  again = take(data.train_iterator(cfg, seq_len=SEQ, global_batch_size=8, seed=3), 10)
  assert all(np.array_equal(a, b) for a, b in zip(batches, again))
  other = take(data.train_iterator(cfg, seq_len=SEQ, global_batch_size=8, seed=4), 5)
  assert sum((ids(b) for b in other), []) != epoch0


@pytest.mark.parametrize("procs", [2, 4])
def test_union_over_processes_is_the_global_batch(cfg, procs):
  single = take(data.train_iterator(cfg, seq_len=SEQ, global_batch_size=8, seed=0), 12)
  locals_ = [take(data.train_iterator(cfg, seq_len=SEQ, global_batch_size=8, seed=0,
                                      process_index=p, process_count=procs), 12)
             for p in range(procs)]
  for step in range(12):
    assert all(loc[step].shape == (8 // procs, SEQ) for loc in locals_)
    assert np.array_equal(np.concatenate([loc[step] for loc in locals_]), single[step])


def test_resume_from_state_equals_uninterrupted(cfg):
  it = data.train_iterator(cfg, seq_len=SEQ, global_batch_size=6, seed=1)
  take(it, 7)                                   # crosses an epoch boundary
  state = json.loads(json.dumps(it.get_state()))  # what the checkpoint stores
  want = take(it, 9)
  resumed = data.train_iterator(cfg, seq_len=SEQ, global_batch_size=6, seed=1)
  resumed.set_state(state)
  got = take(resumed, 9)
  assert all(np.array_equal(a, b) for a, b in zip(want, got))
  fresh = take(data.train_iterator(cfg, seq_len=SEQ, global_batch_size=6, seed=1), 9)
  assert not all(np.array_equal(a, b) for a, b in zip(want, fresh))


def test_grain_checkpoint_handler_round_trip(cfg, tmp_path):
  import grain
  it = data.train_iterator(cfg, seq_len=SEQ, global_batch_size=4, seed=2)
  take(it, 3)
  handler = grain.checkpoint.CheckpointHandler()
  handler.save(tmp_path, item=it)
  want = take(it, 4)
  restored = data.train_iterator(cfg, seq_len=SEQ, global_batch_size=4, seed=2)
  handler.restore(tmp_path, item=restored)
  assert all(np.array_equal(a, b) for a, b in zip(want, take(restored, 4)))


@pytest.mark.slow
def test_worker_processes(cfg):
  from absl import flags
  wcfg = config.resolve(cfg, worker_count=2)
  was_parsed = flags.FLAGS.is_parsed()
  if not was_parsed:
    with pytest.raises(RuntimeError, match="absl flags"):
      data.train_iterator(wcfg, seq_len=SEQ, global_batch_size=4, seed=5)
    flags.FLAGS.mark_as_parsed()
  try:
    want = take(data.train_iterator(cfg, seq_len=SEQ, global_batch_size=4, seed=5), 14)
    it = data.train_iterator(wcfg, seq_len=SEQ, global_batch_size=4, seed=5)
    got = take(it, 6)
    state = json.loads(json.dumps(it.get_state()))
    got += take(it, 8)
    assert all(type(b) is np.ndarray for b in got)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    it.close()
    it2 = data.train_iterator(wcfg, seq_len=SEQ, global_batch_size=4, seed=5)
    it2.set_state(state)
    assert all(np.array_equal(a, b) for a, b in zip(want[6:], take(it2, 8)))
    it2.close()
  finally:
    if not was_parsed:
      flags.FLAGS.unparse_flags()


@pytest.mark.parametrize("procs,batch,max_blocks", [(1, 12, 0), (2, 12, 0), (4, 8, 0),
                                                    (2, 6, 10), (4, 4, 3)])
def test_eval_blocks_covered_exactly_once(cfg, procs, batch, max_blocks):
  want = list(range(N_BLOCKS if not max_blocks else max_blocks))
  seen, n_batches = [], set()
  for p in range(procs):
    batches = list(data.eval_batches(cfg, split="validation", seq_len=SEQ,
                                     global_batch_size=batch, process_index=p,
                                     process_count=procs, max_blocks=max_blocks))
    n_batches.add(len(batches))
    for b in batches:
      assert b["tokens"].shape == (batch // procs, SEQ) and b["weight"].shape == (batch // procs,)
      real = b["weight"] == 1
      assert np.all(b["weight"][~real] == 0) and np.all(b["tokens"][~real] == 0)
      seen += ids(b["tokens"][real])
  assert len(n_batches) == 1                          # every process runs the same steps
  assert n_batches.pop() == -(-len(want) // batch)    # no extra padded batch
  assert sorted(seen) == want


def test_eval_other_source_by_name(cfg, tmp_path):
  (tmp_path / "lambada_test.jsonl").write_text(json.dumps({"text": "\u201cA\u201d b " * 10}) + "\n")
  c = config.resolve(cfg, path=str(tmp_path / "lambada_test.jsonl"))
  (b,) = data.eval_batches(c, split="lambada:test", seq_len=8, global_batch_size=8)
  tok = data.get_tokenizer("byte")
  # The LAMBADA detokenizer ran: straight quotes, stripped, a newline first.
  assert tok.decode(b["tokens"][:2].ravel()) == '\n"A" b "A" b "A"'
  assert b["weight"].tolist() == [1.0] * 7 + [0.0]  # 1 + 59 + EOT = 61 tokens -> 7 blocks of 8


def test_bad_process_arguments(cfg):
  with pytest.raises(ValueError, match="not divisible by the 3 JAX processes"):
    data.train_iterator(cfg, seq_len=SEQ, global_batch_size=8, seed=0, process_count=3)
  with pytest.raises(ValueError, match="process_index 2 is not in"):
    data.eval_batches(cfg, split="validation", seq_len=SEQ, global_batch_size=8,
                      process_index=2, process_count=2)


def test_quickstart_default_config_streams_python_stdlib(tmp_path):
  c = data.default_config()
  c.cache_dir = str(tmp_path)
  it = data.train_iterator(c, seq_len=64, global_batch_size=4, seed=0)
  b = next(it)["tokens"]
  assert b.shape == (4, 64) and b.max() <= 256
  v = next(data.eval_batches(c, split="validation", seq_len=64, global_batch_size=4))
  assert v["weight"].sum() == 4
