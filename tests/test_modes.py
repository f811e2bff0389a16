"""The eval / sample / prepare modes of `python -m aogpt_jax.main`, end to end on a tiny run:
train a few steps in a subprocess, then evaluate and sample from its checkpoint in process."""

import json
import pathlib

import numpy as np
import pytest

from aogpt_jax import data, modes
from aogpt_jax.checkpoints import store as checkpoint
from aogpt_jax.evaluation import zero_shot as evaluate
from aogpt_jax.config import ConfigError
from helpers import trainer as tu

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  root = tmp_path_factory.mktemp("modes")
  cache, workdir = root / "cache", root / "run"
  tu.run(tu.cli_args(cache, workdir), root / "train.log")
  return cache, workdir


def test_eval_mode_writes_json_and_table_with_the_ema_weights(trained, capsys, caplog):
  cache, workdir = trained
  cfg = tu.tiny_config(cache)
  cfg.eval.max_blocks = 16
  cfg.eval.ensemble_max_m = 2
  caplog.set_level("INFO")
  res = modes.eval_mode(cfg, str(workdir))
  # It says where it wrote, and shows progress with an ETA (16 blocks: 2 batches of 8).
  assert f"eval results written to {workdir}/eval/zero_shot.json and" in capsys.readouterr().out
  assert "eval heldout batches: 2/2 (100%), done in" in caplog.text
  out = json.loads((workdir / "eval" / "zero_shot.json").read_text())
  table = (workdir / "eval" / "zero_shot.md").read_text()
  assert "heldout" in table and "Ensemble M=2" in table
  assert out["meta"]["weights"] == "ema"
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert out["meta"]["step"] == steps[-1] and out["meta"]["checkpoint"].endswith(str(steps[-1]))
  assert "nats" in out["unit"] and out["datasets"]["heldout"]["l2r"]["blocks"] == 16
  # The numbers are those of `evaluate.evaluate` on the same model and batches.
  m, _ = checkpoint.load_model(workdir, which="ema")
  direct = evaluate.evaluate_dataset(
      m, data.eval_batches(cfg.data, split="validation", seq_len=16, global_batch_size=8,
                           max_blocks=16),
      evaluate.EvalSettings(ensemble_max_m=2))
  assert res["datasets"]["heldout"]["l2r"]["nll"] == pytest.approx(direct["l2r"]["nll"])


def test_sample_mode_writes_jsonl(trained):
  cache, workdir = trained
  cfg = tu.tiny_config(cache)
  cfg.sample.update(dict(num_samples=3, batch_size=2, length=16, steps=4, prompt="ab"))
  path = pathlib.Path(modes.sample_mode(cfg, str(workdir)))
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert len(rows) == 3 and all(r["tokens"][:2] == [97, 98] for r in rows)
  meta = json.loads(path.with_suffix(".json").read_text())
  assert meta["checkpoint_step"] is not None and meta["loaded"]["weights"] == "ema"
  assert meta["loaded"]["step"] == meta["checkpoint_step"]
  # Another prompt with the same settings: new files, the first ones untouched.
  first = path.read_text()
  cfg.sample.prompt = "xy"
  second = pathlib.Path(modes.sample_mode(cfg, str(workdir)))
  assert second != path and second.name.endswith("-2.jsonl") and path.read_text() == first
  assert json.loads(second.read_text().splitlines()[0])["tokens"][:2] == [120, 121]
  # sample.length 0: the length the run trained on (seq_len 16), not block_size (32)
  cfg.sample.length = 0
  third = pathlib.Path(modes.sample_mode(cfg, str(workdir)))
  assert {len(json.loads(x)["tokens"]) for x in third.read_text().splitlines()} == {16}


def test_genppl_mode_from_the_workdir(trained, tmp_path):
  """Without --checkpoint, genppl samples the run's EMA weights; the JSON names the step."""
  from helpers import published as pu  # pylint: disable=g-import-not-at-top
  cache, workdir = trained
  cfg = tu.tiny_config(cache)
  cfg.sample.update(dict(num_samples=2, batch_size=2, length=16, steps=4))
  cfg.genppl.scorer = pu.gpt2_folder(tmp_path / "gpt2")
  res = modes.genppl_mode(cfg, str(workdir))
  (row,) = res["rows"]
  assert res["meta"]["weights"] == "ema" and res["meta"]["step"] == tu.checkpoint_steps(workdir)[-1]
  assert row["steps"] == 4 and row["num_samples"] == 2 and row["length"] == 16
  assert pathlib.Path(row["samples_file"]).exists()
  assert json.loads((workdir / "eval" / "genppl.json").read_text())["rows"] == json.loads(
      json.dumps(res["rows"]))


def test_export_hub_dir_has_a_model_card_and_loads_back_as_hf(trained, tmp_path):
  from aogpt_jax.checkpoints import spec as checkpoint_spec  # pylint: disable=g-import-not-at-top
  from aogpt_jax.checkpoints import convert  # pylint: disable=g-import-not-at-top
  _, workdir = trained
  hub = tmp_path / "hub"
  convert.main(["export", "--workdir", str(workdir), "--hub-dir", str(hub)])
  ref, _ = checkpoint.load_model(str(workdir), which="ema")
  m, _, prov = checkpoint_spec.load(f"hf:{hub}")
  assert prov == {"source": f"hf:{hub}", "step": tu.checkpoint_steps(workdir)[-1],
                  "weights": "ema"}
  for k, v in convert.model_to_flat(ref).items():
    np.testing.assert_array_equal(convert.model_to_flat(m)[k], v)
  card = (hub / "README.md").read_text()
  assert card.startswith("---\nlibrary_name: aogpt_jax")
  assert "| n_layer |" in card and "| order.name | `\"mixture\"` |" in card
  assert "| optimizer.lr | `0.003` |" in card
  for md in (workdir / "eval").glob("*.md"):         # every eval table the run wrote
    assert f"### {md.stem}" in card and md.read_text().strip() in card


def test_sample_mode_speculative(trained):
  cache, workdir = trained
  cfg = tu.tiny_config(cache)
  cfg.sample.update(dict(method="speculative", draft="3", num_samples=2, batch_size=2,
                         length=16, prompt="ab", order="l2r"))
  path = pathlib.Path(modes.sample_mode(cfg, str(workdir)))
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert len(rows) == 2 and all(r["tokens"][:2] == [97, 98] for r in rows)
  meta = json.loads(path.with_suffix(".json").read_text())
  assert "speculative_K3" in path.name and 0 < meta["passes_per_token"] <= 1
  # Random order with an infill prompt (same shapes: the compiled sampler is reused).
  cfg.sample.update(dict(order="random", suffix="yz"))
  path = pathlib.Path(modes.sample_mode(cfg, str(workdir)))
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert all(r["tokens"][:2] == [97, 98] and r["tokens"][-2:] == [121, 122] for r in rows)
  assert "speculative_K3_random" in path.name
  cfg.sample.draft_queries = "all"                 # the untapered layout, named in the file
  path = pathlib.Path(modes.sample_mode(cfg, str(workdir)))
  assert "speculative_K3_all_random" in path.name
  assert json.loads(path.with_suffix(".json").read_text())["settings"]["draft_queries"] == "all"
  cfg.sample.draft_queries = "most"
  with pytest.raises(ValueError, match="sample.draft_queries"):
    modes.sample_mode(cfg, str(workdir))
  cfg.sample.draft_queries, cfg.sample.draft = "taper", "many"
  with pytest.raises(ValueError, match="sample.draft"):
    modes.sample_mode(cfg, str(workdir))


def test_modes_refuse_bad_input_before_running(trained):
  cache, workdir = trained
  cfg = tu.tiny_config(cache)
  cfg.eval.num_orders = 0
  with pytest.raises(ConfigError, match="num_orders"):
    modes.eval_mode(cfg, str(workdir))
  cfg = tu.tiny_config(cache)
  cfg.data.tokenizer = "gpt2"
  with pytest.raises(ConfigError, match="data.tokenizer"):
    modes.sample_mode(cfg, str(workdir))
  cfg = tu.tiny_config(cache)
  cfg.sample.update(dict(steps=4, top_p=1.5))
  with pytest.raises(ValueError, match="top_p"):
    modes.sample_mode(cfg, str(workdir))


def test_encoder_baseline_trains_evaluates_and_samples(tmp_path):
  """objective=mdm end to end: the trainer optimises the masked-diffusion ELBO of the encoder
  (its metrics.jsonl shows the ELBO falling), eval writes the encoder rows, sample uses the
  encoder sampler, and the AO-GPT sampler is refused for that run."""
  cache, workdir = tmp_path / "cache", tmp_path / "run"
  enc = {"objective": "mdm", "model.target": "none", "sample.method": "encoder",
         "eval.model_kind": "encoder", "eval.ensemble_max_m": 0,
         "total_steps": 30, "checkpoint_every": 30, "log_every": 10}
  tu.run(tu.cli_args(cache, workdir, **enc), tmp_path / "train.log")
  logged = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  losses = [r["train/loss"] for r in logged if "train/loss" in r]
  assert losses[-1] < losses[0] - 0.5, losses
  assert json.loads((workdir / "config.json").read_text())["model"]["target"] == "none"

  cfg = tu.tiny_config(cache, **enc)
  cfg.eval.update(dict(max_blocks=2, elbo_samples=2, num_orders=1, l2r=False))
  res = modes.eval_mode(cfg, str(workdir))
  assert "elbo" in json.dumps(res["datasets"]["heldout"]).lower()
  cfg.sample.update(dict(num_samples=2, batch_size=2, length=16, steps=4))
  path = pathlib.Path(modes.sample_mode(cfg, str(workdir)))
  assert len(path.read_text().splitlines()) == 2
  cfg.sample.method = "diffusion"
  with pytest.raises(ConfigError, match="sample.method: the run .* trained an encoder"):
    modes.sample_mode(cfg, str(workdir))


def test_checkpoint_spec_evaluates_and_samples_into_an_empty_workdir(trained, tmp_path):
  from aogpt_jax.checkpoints import convert
  cache, workdir = trained
  folder = tmp_path / "conv"
  convert.main(["export", "--workdir", str(workdir), "--which", "ema", "--out", str(folder)])
  out = tmp_path / "out"
  cfg = tu.tiny_config(cache)
  cfg.eval.max_blocks = 16
  cfg.eval.ensemble_max_m = 1
  res = modes.eval_mode(cfg, str(out), checkpoint=str(folder))
  ref = modes.eval_mode(cfg, str(workdir))
  assert res["datasets"]["heldout"]["l2r"]["nll"] == pytest.approx(
      ref["datasets"]["heldout"]["l2r"]["nll"], rel=1e-6)
  meta = json.loads((out / "eval" / "zero_shot.json").read_text())["meta"]
  assert meta["source"] == str(folder) and meta["weights"] == "ema"
  cfg.sample.update(dict(num_samples=2, batch_size=2, length=16, steps=4, prompt="ab"))
  rows = pathlib.Path(modes.sample_mode(cfg, str(out), checkpoint=str(folder))).read_text()
  assert len(rows.splitlines()) == 2
  cfg.data.tokenizer = "gpt2"
  with pytest.raises(ValueError, match="data.tokenizer: 'gpt2' has 50257 ids.*valid_vocab_size"):
    modes.sample_mode(cfg, str(out), checkpoint=str(folder))


def test_adaptive_on_a_left_to_right_decoder_is_refused(trained, tmp_path):
  """A model.target='none' run of the AO objective is a left-to-right decoder: method=adaptive
  is one line naming sample.method, not the encoder's sampler run on a causal model."""
  cache, workdir = trained
  run = json.loads((workdir / "config.json").read_text())
  run["model"]["target"] = "none"
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text(json.dumps(run))
  cfg = tu.tiny_config(cache)
  cfg.sample.update(dict(method="adaptive", num_samples=2, batch_size=2, length=16, steps=4))
  with pytest.raises(ConfigError, match="sample.method: 'adaptive' needs an AO-GPT.*left-to-right"):
    modes.sample_mode(cfg, str(tmp_path))
  modes._check_run(cfg, str(workdir), "sample.method")     # the AO-GPT run itself is fine
