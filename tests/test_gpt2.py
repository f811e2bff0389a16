"""The JAX GPT-2 evaluator against Hugging Face transformers, and its error messages."""

import json
import os
import re

import numpy as np
import pytest

from aogpt_jax.evaluation import genppl, gpt2


def _save_hf(tmp_path, **kw):
  torch = pytest.importorskip("torch", reason="needs torch (requirements-extra.txt)")
  transformers = pytest.importorskip("transformers",
                                     reason="needs transformers (requirements-extra.txt)")
  torch.manual_seed(0)
  cfg = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                                **kw)
  hf = transformers.GPT2LMHeadModel(cfg).eval()
  with torch.no_grad():   # non-trivial norms and biases so a swapped tensor shows
    for name, p in hf.named_parameters():
      if name.endswith("bias") or "ln_" in name:
        p.add_(0.1 * torch.randn_like(p))
  hf.save_pretrained(tmp_path, safe_serialization=True)
  assert os.path.exists(tmp_path / "model.safetensors")
  return torch, hf


@pytest.mark.parametrize("act", ["gelu_new", "gelu"])
@pytest.mark.torch
def test_logits_match_transformers(tmp_path, act):
  torch, hf = _save_hf(tmp_path, activation_function=act)
  params, cfg = gpt2.load(str(tmp_path))
  x = np.random.default_rng(0).integers(0, 97, (3, 20))
  want = hf(torch.tensor(x)).logits.detach().numpy()
  got = np.asarray(gpt2.logits(params, x, cfg=cfg))
  np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)


@pytest.mark.torch
def test_genppl_uses_the_scorers_nll(tmp_path):
  torch, hf = _save_hf(tmp_path)
  scorer = genppl.GPT2Scorer.from_pretrained(str(tmp_path))
  x = np.random.default_rng(1).integers(0, 97, (5, 16))
  x[1, :] = 7                                                # one degenerate sample
  with torch.no_grad():
    lg = torch.log_softmax(hf(torch.tensor(x)).logits.double(), -1)
  want = -lg[:, :-1].gather(-1, torch.tensor(x)[:, 1:, None])[..., 0].numpy()   # [5, 15]
  res = genppl.generative_perplexity(x, scorer, batch_size=2)
  np.testing.assert_allclose(res["gen_ppl"]["corpus"], np.exp(want.mean()), rtol=1e-5)
  np.testing.assert_allclose(res["gen_ppl"]["per_sample_mean"], np.exp(want.mean(1)).mean(),
                             rtol=1e-5)
  assert res["gen_ppl"]["per_sample_mean"] > res["gen_ppl"]["corpus"]   # Jensen, unequal rows
  assert res["scored_tokens"] == 5 * 15
  ent = genppl.unigram_entropy(x)
  assert res["unigram_entropy"] == ent


@pytest.mark.torch
def test_prepend_eot_scores_every_token(tmp_path):
  pytest.importorskip("torch", reason="needs torch (requirements-extra.txt)")
  # vocab must contain the EOT id for this protocol: use a config with GPT-2's vocabulary size.
  transformers = pytest.importorskip("transformers")
  import torch
  torch.manual_seed(0)
  hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=50257, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
  hf.save_pretrained(tmp_path, safe_serialization=True)
  scorer = genppl.GPT2Scorer.from_pretrained(str(tmp_path))
  x = np.random.default_rng(2).integers(0, 50257, (2, 8))
  nll = scorer.token_nll(x, prepend_eot=True)
  assert nll.shape == (2, 8)
  np.testing.assert_allclose(nll[:, 1:], scorer.token_nll(
      np.concatenate([np.full((2, 1), genppl.EOT), x], 1))[:, 1:], rtol=1e-6)


def test_unigram_entropy_known_values():
  ent = genppl.unigram_entropy(np.array([[1, 1, 1, 1], [1, 2, 3, 4]]))
  np.testing.assert_allclose(ent["per_sample_mean"], np.log(4) / 2)
  p = np.array([5, 1, 1, 1]) / 8
  np.testing.assert_allclose(ent["corpus"], -(p * np.log(p)).sum())


def test_missing_weights_error_names_the_file(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"model\.safetensors.*GPT-2 Large"):
    gpt2.load(str(tmp_path / "gpt2-large"))
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  with pytest.raises(FileNotFoundError, match="hf download"):
    gpt2.load(str(tmp_path))


def test_bad_sample_tokens_are_named():
  scorer = genppl.GPT2Scorer({}, gpt2.GPT2Config(vocab_size=10, n_positions=8))
  with pytest.raises(ValueError, match="sample 1 has token 12 at position 2"):
    scorer.token_nll(np.array([[1, 2, 3], [1, 2, 12]]))
  with pytest.raises(ValueError, match="exceed the evaluator's context of 8"):
    scorer.token_nll(np.ones((1, 9), int))


def test_run_grid_covers_the_papers_grid():
  calls = []

  class FakeScorer(genppl.GPT2Scorer):
    def token_nll(self, tokens, **kw):
      return np.ones((len(tokens), tokens.shape[1] - 1))

  def sample_fn(**kw):
    calls.append(kw)
    return np.zeros((2, 4), int)

  rows = genppl.run_grid(sample_fn, FakeScorer({}, gpt2.GPT2Config()), num_samples=2, seed=3)
  assert len(rows) == 15 and len(calls) == 15
  assert {(c["top_p"], c["temperature"]) for c in calls} == {(1.0, 1.0), (0.95, 0.9),
                                                             (0.95, 0.7)}
  assert sorted({c["steps"] for c in calls}) == [64, 128, 256, 512, 1024]
  np.testing.assert_allclose(rows[0]["gen_ppl"]["corpus"], np.e)
  assert "unigram entropy" in genppl.grid_table(rows)


def test_missing_weights_error_names_an_api_that_exists(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    gpt2.load(str(tmp_path))
  named = re.search(r"pass that folder to (\w+)\.(\w+)\.(\w+)\(", str(e.value))
  assert named, str(e.value)
  module = {"genppl": genppl}[named.group(1)]
  assert callable(getattr(getattr(module, named.group(2)), named.group(3)))
