"""The lm-evaluation-harness adapter (`aogpt_jax.evaluation.lmeval`), driven through the
harness's own API on small local task files (no downloads), on a random-weight checkpoint in
the published .pt format; its numbers are checked against our perplexity and ensemble code."""

import json
import os
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import published_util as pu
import trainer_util as tu

pytest.importorskip("lm_eval", reason="needs lm_eval (pip install -e .[lmeval])")
pytest.importorskip("torch", reason="needs torch to write the published .pt")
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from aogpt_jax import checkpoint_spec  # noqa: E402
from aogpt_jax.data import tokenizers  # noqa: E402
from aogpt_jax.evaluation import ensembles as ens_lib  # noqa: E402
from aogpt_jax.evaluation import lmeval  # noqa: E402
from aogpt_jax.evaluation import perplexity as ppl_lib  # noqa: E402

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


def _evaluate(d, model_args, tasks):
  return lm_eval.simple_evaluate(
      model="aogpt", model_args=model_args, tasks=[f"aogpt_test_{t}" for t in tasks],
      task_manager=TaskManager(include_path=str(d / "tasks"), include_defaults=False),
      log_samples=True, bootstrap_iters=0)


def _resps(res, task):
  return [s["resps"][0][0] for s in sorted(res["samples"][f"aogpt_test_{task}"],
                                           key=lambda s: s["doc_id"])]


def test_harness_answers_local_tasks_like_our_perplexity_code(setup):
  d, pt = setup
  res = _evaluate(d, f"checkpoint={pt},batch_size=2", ["ll", "roll", "gen"])
  m, cfg, _ = checkpoint_spec.load(pt)
  tok = tokenizers.get_tokenizer("gpt2")

  def l2r_nll(ids):                    # the perplexity code on one block, no padding
    nll, _ = ppl_lib.token_nll(m, np.asarray([ids], np.int32),
                               np.zeros((1,), np.uint32), order="l2r")
    return np.asarray(nll[0], np.float64)

  # loglikelihood: the continuation's L2R log-likelihood (context cut on the left to 32).
  for row, (ll, greedy) in zip(ROWS, _resps(res, "ll")):
    ctx, cont = tok.encode(row["ctx"]), tok.encode(row["ctx"] + row["cont"])[
        len(tok.encode(row["ctx"])):]
    ids = (ctx + cont)[-cfg.block_size:]
    assert ll == pytest.approx(-l2r_nll(ids)[-len(cont):].sum(), rel=1e-5, abs=1e-4)
    assert isinstance(greedy, bool)
  # loglikelihood_rolling: blocks of block_size as --mode=eval cuts them, every token once.
  for row, total in zip(ROWS, _resps(res, "roll")):
    ids = tok.encode(row["text"])
    blocks, weight = lmeval.text_blocks(ids, cfg.block_size)
    assert weight.sum() == len(ids) and len(blocks) == -(-len(ids) // cfg.block_size)
    out = ppl_lib.perplexity(m, [{"tokens": blocks, "weight": weight}], order="l2r")
    assert total == pytest.approx(-out["nll"] * out["tokens"], rel=1e-5)
  assert len(ROWS[0]["text"]) and len(tok.encode(ROWS[0]["text"])) > cfg.block_size
  # generate_until: greedy L2R continuation (uncached argmax oracle), cut at the stop strings.
  for row, text in zip(ROWS, _resps(res, "gen")):
    ids = tok.encode(row["ctx"])[-(cfg.block_size - 6):]
    gen = []
    for _ in range(6):
      seq = jnp.asarray([ids + gen + [0]], jnp.int32)      # logits[r] predicts token r
      logits = m(seq, jnp.arange(seq.shape[1], dtype=jnp.int32)[None])
      gen.append(int(jnp.argmax(logits[0, -1])))
    want = tok.decode(gen[:gen.index(tok.eot_id)] if tok.eot_id in gen else gen)
    for stop in (" the", "."):
      want = want.split(stop)[0]
    assert text == want


def test_ensemble_option_is_eq4_over_the_context(setup):
  d, pt = setup
  res = _evaluate(d, f"checkpoint={pt},batch_size=4,ensemble_m=3,seed=5", ["ll"])
  m, cfg, _ = checkpoint_spec.load(pt)
  tok = tokenizers.get_tokenizer("gpt2")
  n = cfg.block_size
  for row, (ll, _) in list(zip(ROWS, _resps(res, "ll")))[:2]:
    ctx = tok.encode(row["ctx"])
    ids = ctx + tok.encode(row["ctx"] + row["cont"])[len(ctx):]
    k = len(ids) - len(ctx)
    tokens = jnp.asarray(ids + [0] * (n - len(ids)), jnp.int32)
    sigma = jnp.arange(n, dtype=jnp.int32)
    ekey = ens_lib.ensemble_key(5, zlib.crc32(np.asarray(ids, np.int32).tobytes()))
    want = 0.0
    for i in range(len(ids) - k, len(ids)):
      ctx_orders = jnp.stack([sigma[ens_lib.context_permutation(ekey, i, j, n)][:i]
                              for j in range(3)])
      want -= float(ens_lib.eq4_reference(m, tokens, sigma, i, ctx_orders))
    assert ll == pytest.approx(want, rel=1e-5, abs=1e-4)
  # M = 1 is the exact L2R log-likelihood.
  one = _evaluate(d, f"checkpoint={pt},batch_size=4,ensemble_m=1", ["ll"])
  l2r = _evaluate(d, f"checkpoint={pt},batch_size=4", ["ll"])
  assert _resps(one, "ll") == _resps(l2r, "ll")


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


def test_command_line_entry_point_registers_the_model(setup):
  d, pt = setup
  out = subprocess.run(
      [sys.executable, "-m", "aogpt_jax.evaluation.lmeval", "--model", "aogpt", "--model_args",
       f"checkpoint={pt},batch_size=4", "--tasks", "aogpt_test_ll", "--include_path",
       str(d / "tasks"), "--output_path", str(d / "out")],
      env=tu.cpu_env() | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
      capture_output=True, text=True, timeout=300, cwd=tu.REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "aogpt_test_ll" in out.stdout and "acc" in out.stdout
