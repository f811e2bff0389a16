"""A workdir written before the package took its current layout (tests/fixtures/workdir_v0_1: 4
steps of a tiny run, its config.json and Orbax checkpoint) still loads: it samples the same tokens
and evaluates to the same NLLs as the code that wrote it did (tests/fixtures/
workdir_v0_1.expected.json, recorded then), `aogpt_jax.load` reads it, and training resumes from
it. Guards the on-disk formats (config.json keys, checkpoint items) against refactors."""

import json
import pathlib
import shutil

import pytest

from helpers import trainer as tu

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "workdir_v0_1"
EXPECTED = json.loads((FIXTURE.parent / "workdir_v0_1.expected.json").read_text())
# The overrides the fixture was trained with (its config.json holds the same values; model.rope
# did not exist then: its default, which the quickstart recipe has since changed).
RUN = {"seq_len": 16, "total_steps": 4, "checkpoint_every": 4, "log_every": 2,
       "optimizer.warmup_steps": 1, "eval.batch_size": 8, "model.rope": False}


@pytest.fixture(name="workdir")
def _workdir(tmp_path):
  w = tmp_path / "w"
  shutil.copytree(FIXTURE, w)
  return w


def _args(tmp_path, w, *extra, **over):
  return tu.cli_args(tmp_path / "cache", w, **{k.replace(".", "__"): v
                                              for k, v in {**RUN, **over}.items()}) + list(extra)


@pytest.mark.slow
@pytest.mark.subprocess
def test_old_workdir_samples_evaluates_and_resumes(tmp_path, workdir):
  s = EXPECTED["sample"]
  tu.run(_args(tmp_path, workdir, "--mode=sample", **{
      "sample.num_samples": s["num_samples"], "sample.length": s["length"],
      "sample.steps": s["steps"], "sample.seed": s["seed"]}), tmp_path / "sample.log")
  (jsonl,) = (workdir / "samples").glob("*.jsonl")
  assert [json.loads(line)["tokens"] for line in jsonl.open()] == s["tokens"]

  e = EXPECTED["eval"]
  tu.run(_args(tmp_path, workdir, "--mode=eval", **{
      "eval.max_blocks": e["max_blocks"], "eval.datasets": "heldout"}), tmp_path / "eval.log")
  got = json.loads((workdir / "eval" / "zero_shot.json").read_text())["datasets"]["heldout"]
  assert got["l2r"]["nll"] == pytest.approx(e["l2r_nll"], abs=1e-5)
  assert got["any_order"]["nll"] == pytest.approx(e["any_order_nll"], abs=1e-5)

  tu.run(_args(tmp_path, workdir, total_steps=6, checkpoint_every=2), tmp_path / "train.log")
  assert 6 in tu.checkpoint_steps(workdir)
  log = (tmp_path / "train.log").read_text()
  assert "step 6/6" in log and "step 2/6" not in log      # resumed at 4, not started over


def test_old_workdir_loads_through_aogpt_jax_load(workdir):
  import aogpt_jax  # pylint: disable=g-import-not-at-top
  m, cfg = aogpt_jax.load(str(workdir))
  assert type(m).__name__ == "AOGPT" and m.cfg.n_embd == 32 and m.cfg.valid_vocab_size == 257
  assert cfg.data.tokenizer == "byte" and cfg.loaded.step == 4 and cfg.loaded.weights == "ema"
  _, params_cfg = aogpt_jax.load(str(workdir), which="params")
  assert params_cfg.loaded.weights == "params"
