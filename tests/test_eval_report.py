"""The evaluation driver: one pass per dataset, WORKDIR/eval/<name>.json and the Table 4 layout."""

import json

import numpy as np
import pytest
from flax import nnx

from aogpt_jax.checkpoints import store as checkpoint
from aogpt_jax.evaluation import zero_shot as evaluate
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.evaluation import ensembles as ens
from aogpt_jax.evaluation import perplexity as ppl

N = 8


def _setup():
  cfg = model_lib.preset("tiny", n_layer=1, n_embd=32, n_head=4, block_size=N, target_dim=8)
  m = model_lib.AOGPT(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  data = {name: [{"tokens": rng.integers(0, 257, (2, N)).astype(np.int32),
                  "weight": np.array([1.0, w])} for w in (1.0, 0.0)]
          for name in ("wikitext2", "ptb")}
  return m, data


@pytest.mark.slow
def test_evaluate_writes_json_and_table(tmp_path):
  m, data = _setup()
  s = evaluate.EvalSettings(num_orders=2, ensemble_max_m=2, seed=3)
  res = evaluate.evaluate(m, {k: (lambda v=v: iter(v)) for k, v in data.items()}, s,
                          workdir=str(tmp_path), name="zs", meta={"ckpt": "x"})
  saved = json.loads((tmp_path / "eval" / "zs.json").read_text())
  assert saved["settings"]["ensemble_max_m"] == 2 and saved["meta"] == {"ckpt": "x"}
  assert saved["model"]["n_layer"] == 1
  for name, batches in data.items():
    d = saved["datasets"][name]
    assert d["l2r"]["tokens"] == 3 * N and d["l2r"]["blocks"] == 3
    l2r = ppl.perplexity(m, batches, order="l2r")
    np.testing.assert_allclose(d["l2r"]["ppl"], l2r["ppl"], rtol=1e-7)
    ao = ppl.perplexity(m, batches, seed=3, num_orders=2)
    np.testing.assert_allclose(d["any_order"]["per_order_nll"], ao["per_order_nll"], rtol=1e-7)
    e = ens.ensemble_perplexity(m, batches, max_m=2, seed=3)
    np.testing.assert_allclose([d["ensemble"]["nll"][k] for k in ("1", "2")],
                               [e["nll"][k] for k in ("1", "2")], rtol=1e-7)
    np.testing.assert_allclose(d["ensemble"]["nll"]["1"], d["any_order"]["per_order_nll"][0],
                               rtol=1e-7)
  table = (tmp_path / "eval" / "zs.md").read_text().splitlines()
  blocks = {d: int(res["datasets"][d]["l2r"]["blocks"]) for d in ("wikitext2", "ptb")}
  assert table[0] == (f"| Method: perplexity (nats/token) | wikitext2 ({blocks['wikitext2']} "
                      f"blocks) | ptb ({blocks['ptb']} blocks) |")
  l2r = res["datasets"]["wikitext2"]["l2r"]      # units: perplexity, then nats/token
  assert table[2].startswith(f"| L2R | {l2r['ppl']:.2f} ({l2r['nll']:.3f}) | ")
  assert table[3].startswith("| Any-order (uniform, 2 order draw(s), seed 3, 95% CI) | ")
  assert [r.split(" |")[0] for r in table[4:]] == ["| Ensemble M=1", "| Ensemble M=2"]
  assert f"{res['datasets']['ptb']['ensemble']['ppl']['2']:.2f}" in table[5]
  assert res == saved


def test_run_loads_ema_weights_from_the_workdir(tmp_path, monkeypatch):
  m, data = _setup()
  calls = []
  from ml_collections import config_dict
  run_cfg = config_dict.ConfigDict({"loaded": {"checkpoint": "ckpts/7", "step": 7,
                                               "weights": "ema"}})
  monkeypatch.setattr(checkpoint, "load_model",
                      lambda workdir, which: (calls.append((workdir, which)) or (m, run_cfg)))
  res = evaluate.evaluate_workdir(str(tmp_path), {"ptb": data["ptb"]},
                                  evaluate.EvalSettings(any_order=False))
  assert calls == [(str(tmp_path), "ema")]
  assert res["meta"]["weights"] == "ema" and "any_order" not in res["datasets"]["ptb"]
  assert res["meta"]["step"] == 7
  assert (tmp_path / "eval" / "zero_shot.json").exists()


def test_settings_errors():
  with pytest.raises(ValueError, match=r"unknown eval setting\(s\) \['bogus'\]"):
    evaluate.EvalSettings.from_dict({"bogus": 1})
  with pytest.raises(ValueError, match="ensemble_layout"):
    evaluate.EvalSettings(ensemble_layout="x")
  with pytest.raises(ValueError, match="nothing to compute"):
    evaluate.EvalSettings(l2r=False, any_order=False)
  assert evaluate.EvalSettings.from_dict({"num_orders": 3}).num_orders == 3


def test_eval_mode_says_what_it_scored_and_why_training_differs():
  from aogpt_jax import modes
  from aogpt_jax.config import default_config
  cfg = default_config()
  cfg.seq_len, cfg.eval.max_blocks, cfg.eval.train_max_blocks = 32, 1024, 512
  res = {"datasets": {"heldout": {"l2r": {"blocks": 1024.0}, "any_order": {"blocks": 1024.0}}}}
  assert modes.scored_line(res, cfg) == (
      "scored: heldout 1024 blocks of 32 tokens (eval.max_blocks=1024, 0 = all); training's own "
      "eval scores the first eval.train_max_blocks=512 held-out blocks, so its numbers differ "
      "(docs/evaluation.md)")
