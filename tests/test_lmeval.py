"""The lm-evaluation-harness adapter (`aogpt_jax.evaluation.lmeval`), driven through the
harness's own API on small local task files (no downloads), on a random-weight checkpoint in
the published .pt format; its numbers are checked against our perplexity and ensemble code."""

import json
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import published as pu
from helpers import trainer as tu

pytest.importorskip("lm_eval", reason="needs lm_eval (pip install -e .[lmeval])")
pytest.importorskip("torch", reason="needs torch to write the published .pt")

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from aogpt_jax.checkpoints import spec as checkpoint_spec  # noqa: E402
from aogpt_jax.data import tokenizers  # noqa: E402
from aogpt_jax.evaluation import ensembles as ens_lib  # noqa: E402
from aogpt_jax.evaluation import lmeval  # noqa: E402
from aogpt_jax.evaluation import perplexity as ppl_lib  # noqa: E402

pytestmark = pytest.mark.torch

ROWS = [
    {"ctx": "The cat sat on the", "cont": " mat", "text": "Hello world, a rolling text. " * 6},
    {"ctx": "One two", "cont": " three four", "text": "Short one."},
    {"ctx": "A much longer context that the model must cut on the left because it does not "
            "fit into thirty-two tokens at all, not even close", "cont": " end",
     "text": "x " * 40},
]
TASKS = {
    "ll": """output_type: loglikelihood
doc_to_text: "{{ctx}}"
doc_to_target: "{{cont}}"
metric_list:
  - metric: acc
""",
    "roll": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
""",
    "gen": """output_type: generate_until
doc_to_text: "{{ctx}}"
doc_to_target: "{{cont}}"
generation_kwargs:
  until: [" the", "."]
  max_gen_toks: 6
metric_list:
  - metric: exact_match
""",
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  d = tmp_path_factory.mktemp("lmeval")
  pt = pu.published_pt(d / "ckpt.pt", block_size=32)
  with open(d / "data.jsonl", "w") as f:
    for r in ROWS:
      f.write(json.dumps(r) + "\n")
  (d / "tasks").mkdir()
  for name, body in TASKS.items():
    (d / "tasks" / f"{name}.yaml").write_text(
        f"task: aogpt_test_{name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {d / 'data.jsonl'}\ntest_split: test\n" + body)
  return d, pt


def _evaluate(d, model, tasks, model_args=None):
  return lm_eval.simple_evaluate(
      model=model, model_args=model_args, tasks=[f"aogpt_test_{t}" for t in tasks],
      task_manager=TaskManager(include_path=str(d / "tasks"), include_defaults=False),
      log_samples=True, bootstrap_iters=0)


def _resps(res, task):
  return [s["resps"][0][0] for s in sorted(res["samples"][f"aogpt_test_{task}"],
                                           key=lambda s: s["doc_id"])]


def _pad(rows, n):
  return np.asarray([r + [0] * (n - len(r)) for r in rows], np.int32)


def _pair(tok, row):
  ctx = tok.encode(row["ctx"])
  return ctx, tok.encode(row["ctx"] + row["cont"])[len(ctx):]


@pytest.mark.slow
def test_harness_answers_local_tasks_like_our_perplexity_code(setup):
  d, pt = setup
  res = _evaluate(d, "aogpt", ["ll", "roll", "gen"], f"checkpoint={pt},batch_size=4")
  m, cfg, _ = checkpoint_spec.load(pt)
  n = cfg.block_size
  tok = tokenizers.get_tokenizer("gpt2")

  # loglikelihood: the continuation's L2R log-likelihood (context cut on the left to 32), as
  # the perplexity code scores the same tokens (one batch, right-padded: causal, so exact).
  seqs = [(c + k)[-n:] for c, k in (_pair(tok, r) for r in ROWS)]
  nll, _ = ppl_lib.token_nll(m, _pad(seqs, n), np.zeros((len(seqs),), np.uint32), order="l2r")
  for row, seq, (ll, greedy), per_token in zip(ROWS, seqs, _resps(res, "ll"), np.asarray(nll)):
    k = len(_pair(tok, row)[1])
    assert ll == pytest.approx(-per_token[len(seq) - k:len(seq)].sum(), rel=1e-5, abs=1e-4)
    assert isinstance(greedy, bool)
  # loglikelihood_rolling: blocks of block_size as --mode=eval cuts them, every token once.
  assert len(tok.encode(ROWS[0]["text"])) > n
  cut = [lmeval.text_blocks(tok.encode(r["text"]), n) for r in ROWS]
  rows = max(len(b) for b, _ in cut)
  for (blocks, weight), row, total in zip(cut, ROWS, _resps(res, "roll")):
    assert weight.sum() == len(tok.encode(row["text"]))
    pad = rows - len(blocks)                     # weight-0 rows: one compiled shape
    out = ppl_lib.perplexity(m, [{"tokens": np.pad(blocks, ((0, pad), (0, 0))),
                                  "weight": np.pad(weight, ((0, pad), (0, 0)))}], order="l2r")
    assert total == pytest.approx(-out["nll"] * out["tokens"], rel=1e-5)
  # generate_until: the greedy L2R continuation (uncached argmax oracle), cut at the stops.
  forward = jax.jit(lambda t: m(t, jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), t.shape)))
  ctxs = [tok.encode(r["ctx"])[-(n - 6):] for r in ROWS]
  gens = [[] for _ in ROWS]
  for _ in range(6):
    logits = np.asarray(forward(jnp.asarray(_pad([c + g for c, g in zip(ctxs, gens)], n))))
    for c, g, lg in zip(ctxs, gens, logits):
      g.append(int(np.argmax(lg[len(c) + len(g)])))    # logits[r] predicts token r
  for g, text in zip(gens, _resps(res, "gen")):
    want = tok.decode(g[:g.index(tok.eot_id)] if tok.eot_id in g else g)
    for stop in (" the", "."):
      want = want.split(stop)[0]
    assert text == want


@pytest.mark.slow
def test_ensemble_option_is_eq4_over_the_context(setup):
  d, pt = setup
  lm = lmeval.AOGPTLM(checkpoint=str(pt), batch_size=4, ensemble_m=3, seed=5)
  got = _resps(_evaluate(d, lm, ["ll"]), "ll")
  n = lm.cfg.block_size
  tok = lm.tok
  seqs = [(c + k)[-n:] for c, k in (_pair(tok, r) for r in ROWS)]
  ids = np.array([zlib.crc32(np.asarray(s, np.int32).tobytes()) for s in seqs], np.uint32)
  sigma = np.broadcast_to(np.arange(n, dtype=np.int32), (len(seqs), n))
  ranks = sorted({i for r, s in zip(ROWS, seqs)
                  for i in range(len(s) - len(_pair(tok, r)[1]), len(s))})
  # The reference estimator: one full-length forward per (row, rank, ordering).
  ref = ens_lib.naive_logp(lm.model, _pad(seqs, n), ids, sigma, max_m=3, seed=5, ranks=ranks)
  nll = ens_lib.ensemble_nll(np.nan_to_num(ref), [3])[0]
  for b, (row, seq, (ll, _)) in enumerate(zip(ROWS, seqs, got)):
    k = len(_pair(tok, row)[1])
    assert ll == pytest.approx(-nll[b, len(seq) - k:len(seq)].sum(), rel=1e-5, abs=1e-4)
  # The ensemble is not the L2R number (ensemble_m=1, the default path).
  lm.ensemble_m = 1
  l2r = lm.loglikelihood(_instances(ROWS))
  assert [a for a, _ in l2r] != pytest.approx([a for a, _ in got], rel=1e-3)


def _instances(rows):
  from lm_eval.api.instance import Instance  # pylint: disable=g-import-not-at-top
  return [Instance(request_type="loglikelihood", doc={}, arguments=(r["ctx"], r["cont"]), idx=0)
          for r in rows]


def test_bad_model_args_are_one_clear_error(setup):
  d, pt = setup
  with pytest.raises(ValueError, match="unknown.*'ensemble'"):
    lmeval.AOGPTLM(checkpoint=str(pt), ensemble=2)
  with pytest.raises(ValueError, match="checkpoint=SPEC is required"):
    lmeval.AOGPTLM()
  with pytest.raises(ValueError, match="ensemble_m: expected an integer >= 1, got 0"):
    lmeval.AOGPTLM(checkpoint=str(pt), ensemble_m=0)
  with pytest.raises(checkpoint_spec.CheckpointSpecError, match="byte.*257.*50257"):
    lmeval.AOGPTLM(checkpoint=str(pt), tokenizer="byte")


def test_batch_size_model_arg_wins_over_the_harness_flag(setup):
  """The harness always passes its own --batch_size (1 by default) beside --model_args; the
  documented ``batch_size`` model_arg used to be a second value for the same keyword."""
  d, pt = setup
  harness = {"batch_size": 1, "max_batch_size": None, "device": None}
  lm = lmeval.AOGPTLM.create_from_arg_string(f"checkpoint={pt},batch_size=4", harness)
  assert lm.batch_size == 4
  lm = lmeval.AOGPTLM.create_from_arg_obj({"checkpoint": str(pt), "batch_size": 2}, harness)
  assert lm.batch_size == 2
  lm = lmeval.AOGPTLM.create_from_arg_string(f"checkpoint={pt}", dict(harness, batch_size=3))
  assert lm.batch_size == 3                        # without the model_arg: the harness's flag


@pytest.mark.subprocess
@pytest.mark.slow
def test_command_line_entry_point_registers_the_model(setup):
  d, pt = setup
  out = subprocess.run(
      [sys.executable, "-m", "aogpt_jax.evaluation.lmeval", "--model", "aogpt", "--model_args",
       f"checkpoint={pt},batch_size=2", "--batch_size", "4", "--tasks", "aogpt_test_ll",
       "--include_path", str(d / "tasks"), "--limit", "2"],
      env=tu.cpu_env() | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
      capture_output=True, text=True, timeout=300, cwd=tu.REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "aogpt_test_ll" in out.stdout and "acc" in out.stdout
