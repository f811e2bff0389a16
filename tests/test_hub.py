"""``hf:`` specs resolve from the local Hugging Face cache or a local Hub-style folder, never the
network; what is missing is one line naming the spec and the download command."""

import json
import subprocess

import numpy as np
import pytest

from aogpt_jax.checkpoints import spec as checkpoint_spec
from aogpt_jax.checkpoints import hub
from aogpt_jax.evaluation import genppl
from aogpt_jax.checkpoints import convert
from helpers import published as pu
from helpers import trainer as tu


def _flat(m):
  return convert.model_to_flat(m)


@pytest.fixture
def cache(tmp_path, monkeypatch):
  c = tmp_path / "hf" / "hub"
  monkeypatch.setenv("HF_HUB_CACHE", str(c))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  return c


def test_resolve_reads_the_cache_layout(tmp_path, cache):
  src = tmp_path / "f.txt"
  src.write_text("x")
  snap = pu.hf_cache_repo(cache, "me/repo", {"a/b.pt": src, "c.json": src})
  assert hub.resolve("hf:me/repo/a/b.pt") == f"{snap}/a/b.pt"
  assert hub.resolve("hf:me/repo/a") == f"{snap}/a"
  assert hub.resolve("hf:me/repo") == snap
  pu.hf_cache_repo(cache, "me/repo", {"v.txt": src}, rev="v1", commit="f" * 40)
  assert hub.resolve("hf:me/repo@v1/v.txt").endswith("f" * 40 + "/v.txt")
  assert hub.resolve(f"hf:{tmp_path}/f.txt") == str(src)


def test_missing_is_one_line_with_the_download_command(tmp_path, cache):
  with pytest.raises(hub.HubError) as e:
    hub.resolve("hf:someone/aogpt/124M/ckpt.pt")
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith("hf:someone/aogpt/124M/ckpt.pt: repository")
  assert "hf download someone/aogpt 124M/ckpt.pt" in msg and str(cache) in msg
  src = tmp_path / "f.txt"
  src.write_text("x")
  pu.hf_cache_repo(cache, "someone/aogpt", {"other.pt": src})
  with pytest.raises(hub.HubError, match="124M is not in the cached snapshot .*"
                                         "--include '124M/\\*'"):
    hub.resolve("hf:someone/aogpt/124M")
  with pytest.raises(hub.HubError, match="no such local folder"):
    hub.resolve(f"hf:{tmp_path}/nothing")
  with pytest.raises(checkpoint_spec.CheckpointSpecError,
                     match="^--checkpoint=hf:justone: expected hf:OWNER/REPO"):
    checkpoint_spec.load("hf:justone")


def test_checkpoint_spec_loads_hub_snapshots_and_local_hub_folders(tmp_path, cache):
  conv = pu.converted_folder(tmp_path / "conv", seed=3)            # conv/ema/{config,model}
  ref, _, _ = checkpoint_spec.load(conv)
  pu.hf_cache_repo(cache, "me/aogpt", pu.folder_files(f"{conv}/ema", "124M/ema"))
  for spec in ("hf:me/aogpt/124M", "hf:me/aogpt/124M/ema", f"hf:{conv}"):
    m, cfg, prov = checkpoint_spec.load(spec)
    assert prov == {"source": spec, "step": 3, "weights": "ema"} and cfg == ref.cfg
    for k, v in _flat(ref).items():
      np.testing.assert_array_equal(_flat(m)[k], v)


def test_scorer_from_the_cache(tmp_path, cache):
  g = pu.gpt2_folder(tmp_path / "g")
  pu.hf_cache_repo(cache, "openai-community/gpt2-large", pu.folder_files(g))
  toks = np.random.default_rng(0).integers(0, 257, (2, 12))
  a = genppl.generative_perplexity(toks, genppl.GPT2Scorer.from_pretrained(g))
  b = genppl.generative_perplexity(
      toks, genppl.GPT2Scorer.from_pretrained("hf:openai-community/gpt2-large"))
  assert a == b
  with pytest.raises(hub.HubError, match="download openai-community/gpt2-xl config.json "
                                         "model.safetensors"):
    genppl.GPT2Scorer.from_pretrained("hf:openai-community/gpt2-xl")


@pytest.mark.subprocess
@pytest.mark.slow
def test_cli_genppl_with_model_and_scorer_from_the_cache(tmp_path):
  """The README's route on a machine without network: both from HF_HUB_CACHE, one command."""
  cache = tmp_path / "hf" / "hub"
  conv = pu.converted_folder(tmp_path / "conv")
  pu.hf_cache_repo(cache, "me/aogpt", pu.folder_files(f"{conv}/ema", "tiny/ema"))
  pu.hf_cache_repo(cache, "me/gpt2", pu.folder_files(pu.gpt2_folder(tmp_path / "g")))
  out = tmp_path / "out"
  args = tu.cli_args(tmp_path / "cache", out) + [
      "--mode=genppl", "--checkpoint=hf:me/aogpt/tiny", "--config.genppl.scorer=hf:me/gpt2",
      "--config.sample.length=16", "--config.sample.num_samples=2", "--config.sample.steps=4"]
  env = tu.cpu_env() | {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
  p = subprocess.run(args, cwd=tu.REPO, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-3000:]
  res = json.loads((out / "eval" / "genppl.json").read_text())
  assert res["meta"]["source"] == "hf:me/aogpt/tiny" and res["scorer"] == "hf:me/gpt2"
  (row,) = res["rows"]
  assert row["steps"] == 4 and row["num_samples"] == 2 and row["length"] == 16
  assert row["gen_ppl"]["corpus"] > 1 and row["unigram_entropy"]["per_sample_mean"] > 0
