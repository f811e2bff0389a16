"""--mode=genppl: sample with a --checkpoint over a (top-p, temperature) x steps grid, score
with a GPT-2 evaluator (here a random tiny one), both aggregations and the entropy named."""

import json
import subprocess

import numpy as np
import pytest

from aogpt_jax import modes
from aogpt_jax.config import ConfigError
from aogpt_jax.evaluation import genppl
from helpers import published as pu
from helpers import trainer as tu


def _cfg(tmp_path, scorer):
  cfg = tu.tiny_config(tmp_path / "cache")
  cfg.sample.update(dict(num_samples=3, batch_size=2, length=16))
  cfg.genppl.update(dict(scorer=str(scorer), sampling="1.0/1.0,0.95/0.7", steps="4,16"))
  return cfg


@pytest.mark.slow
def test_genppl_mode_scores_every_grid_point(tmp_path):
  ckpt = pu.converted_folder(tmp_path / "conv")
  scorer = pu.gpt2_folder(tmp_path / "gpt2")
  out = tmp_path / "out"
  res = modes.genppl_mode(_cfg(tmp_path, scorer), str(out), checkpoint=ckpt)
  rows = res["rows"]
  assert [(r["top_p"], r["temperature"], r["steps"]) for r in rows] == [
      (1.0, 1.0, 4), (1.0, 1.0, 16), (0.95, 0.7, 4), (0.95, 0.7, 16)]
  # Each row is the scorer's numbers on the samples written to WORKDIR/samples.
  files = sorted((out / "samples").glob("*.jsonl"))
  assert len(files) == 4
  first = next(f for f in files if "T4_" in f.name and "p1_t1_" in f.name)
  toks = np.array([json.loads(x)["tokens"] for x in first.read_text().splitlines()])
  want = genppl.generative_perplexity(toks, genppl.GPT2Scorer.from_pretrained(scorer))
  assert rows[0]["gen_ppl"] == pytest.approx(want["gen_ppl"])
  assert rows[0]["unigram_entropy"] == pytest.approx(want["unigram_entropy"])
  assert toks.shape == (3, 16)
  saved = json.loads((out / "eval" / "genppl.json").read_text())
  assert set(saved["aggregations"]) == {"corpus", "per_sample_mean"}
  assert saved["meta"]["source"] == ckpt
  table = (out / "eval" / "genppl.md").read_text()
  assert "gen. PPL (corpus)" in table and "per-sample mean" in table and "entropy" in table


def test_genppl_mode_bad_settings_are_named(tmp_path):
  ckpt = pu.converted_folder(tmp_path / "conv")
  cfg = _cfg(tmp_path, pu.gpt2_folder(tmp_path / "g", vocab=300))
  with pytest.raises(ConfigError, match="genppl.scorer: .* vocab_size 300 .* 257 ids"):
    modes.genppl_mode(cfg, str(tmp_path / "o"), checkpoint=ckpt)
  cfg.genppl.scorer = pu.gpt2_folder(tmp_path / "short", n_positions=16)
  cfg.sample.length = 16
  cfg.genppl.prepend_eot = True                # 16 + the end-of-text > 16 positions
  with pytest.raises(ConfigError, match="genppl.scorer: .* at most 16 tokens .* have 17 "
                                        "\\(sample.length \\+ 1 for genppl.prepend_eot"):
    modes.genppl_mode(cfg, str(tmp_path / "o"), checkpoint=ckpt)
  assert not (tmp_path / "o" / "samples").exists()
  cfg.genppl.sampling = "0.9"
  with pytest.raises(ConfigError, match="genppl.sampling"):
    modes.genppl_mode(cfg, str(tmp_path / "o"), checkpoint=ckpt)
  cfg.genppl.sampling, cfg.genppl.steps = "paper", "x"
  with pytest.raises(ConfigError, match="genppl.steps"):
    modes.genppl_mode(cfg, str(tmp_path / "o"), checkpoint=ckpt)


@pytest.mark.subprocess
def test_scorer_path_errors_are_one_line_naming_the_key(tmp_path):
  """A missing scorer folder stops the CLI with one line naming genppl.scorer, before sampling;
  an uncached hf: scorer (offline) names the download command."""
  ckpt = pu.converted_folder(tmp_path / "conv")
  out = tmp_path / "out"
  args = tu.cli_args(tmp_path / "cache", out) + [
      "--mode=genppl", f"--checkpoint={ckpt}", "--config.sample.length=16",
      f"--config.genppl.scorer={tmp_path / 'no_such_gpt2'}"]
  p = subprocess.run(args, cwd=tu.REPO, env=tu.cpu_env(), capture_output=True, text=True,
                     timeout=180)
  assert p.returncode != 0
  assert "Traceback" not in p.stderr, p.stderr
  err = [x for x in p.stderr.splitlines() if x.startswith("aogpt_jax:")]
  assert len(err) == 1 and p.stderr.strip().endswith(err[0]), p.stderr
  assert "genppl.scorer:" in err[0] and "no_such_gpt2" in err[0], err[0]
  assert not (out / "samples").exists()           # nothing was sampled
  cfg = _cfg(tmp_path, "hf:openai-community/gpt2-large")
  env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
         "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}
  with pytest.MonkeyPatch.context() as mp:
    for k, v in env.items():
      mp.setenv(k, v)
    with pytest.raises(ConfigError, match="genppl.scorer: .*hf download "
                                          "openai-community/gpt2-large") as e:
      modes.genppl_mode(cfg, str(out), checkpoint=ckpt)
  assert "\n" not in str(e.value)


def test_prepend_eot_uses_the_tokenizers_end_of_text(tmp_path):
  """A byte-vocabulary scorer has no id 50256: the end-of-text put in front is the tokenizer's
  (the mode passes data.tokenizer's eot_id), and an id outside the scorer is refused."""
  scorer = genppl.GPT2Scorer.from_pretrained(pu.gpt2_folder(tmp_path / "g"))
  toks = np.random.default_rng(0).integers(0, 256, (2, 8))
  got = scorer.token_nll(toks, prepend_eot=True, eot=256)
  want = scorer.token_nll(np.concatenate([np.full((2, 1), 256), toks], axis=1))
  np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match="end-of-text id 50256 is outside"):
    scorer.token_nll(toks, prepend_eot=True)
