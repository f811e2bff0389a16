"""Both notebooks in colabs/ run top to bottom (CI mode: small sizes), on a random-weight
checkpoint in the published .pt format loaded as --checkpoint loads it, and on the offline
fallback (a random tiny model) when the published checkpoint is not in the Hugging Face cache."""

import json
import pathlib
import re

import numpy as np
import pytest

from helpers import published as pu
from aogpt_jax.checkpoints import spec as checkpoint_spec

COLABS = pathlib.Path(__file__).resolve().parent.parent / "colabs"
README = COLABS.parent / "README.md"


def run_notebook(name: str, cells: int | None = None) -> dict:
  """Executes the first ``cells`` (default all) code cells of colabs/NAME; returns the
  namespace."""
  nb = json.loads((COLABS / name).read_text())
  namespace: dict = {}
  code = [c for c in nb["cells"] if c["cell_type"] == "code"]
  for i, cell in enumerate(code[:cells]):
    exec(compile("".join(cell["source"]), f"{name}[code cell {i}]", "exec"), namespace)
  return namespace


@pytest.fixture
def offline(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hf_cache"))
  monkeypatch.setenv("AOGPT_DATA_DIR", str(tmp_path / "data"))
  monkeypatch.setenv("AOGPT_NOTEBOOK_FAST", "1")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
  pytest.importorskip("torch", reason="needs torch to write the published .pt")
  return pu.published_pt(tmp_path_factory.mktemp("pt") / "ckpt_250000.pt", block_size=32)


def test_default_checkpoint_is_the_readme_one():
  assert f"SMALL={checkpoint_spec.PUBLISHED['aogpt_small']}\n" in README.read_text()


@pytest.mark.torch
@pytest.mark.slow
def test_sampling_notebook_on_a_published_checkpoint(published, offline, monkeypatch, capsys):
  monkeypatch.setenv("AOGPT_CHECKPOINT", published)
  ns = run_notebook("sampling.ipynb")
  out = capsys.readouterr().out
  assert "unigram entropy" in out and "top_p=0.95 T=0.7" in out
  assert "'step': 250000" in out and "tokenizer: gpt2" in out
  assert ns["TRAINED"] is True and ns["cfg"].valid_vocab_size == 50257
  assert ns["out"].tokens.shape == (2, 32)
  prefix = ns["tokenizer"].encode("import ")
  assert (ns["out"].tokens[:, :len(prefix)] == prefix).all()    # the prefix-prompting cell
  assert "speculative K=4 order=l2r" in out and "speculative K=4 order=random" in out
  assert (ns["spec"].tokens[:, :len(prefix)] == prefix).all()   # the speculative cell
  for policy in ("max_prob", "margin", "random"):                # the adaptive cell
    assert re.search(rf"^adaptive {policy} *: first written \[", out, re.M), policy
  assert re.search(r"^adaptive threshold 0.9: \[\d+, \d+\] steps per row", out, re.M)
  assert (ns["ad"].tokens[:, :len(prefix)] == prefix).all()
  assert (np.sort(ns["ad"].order, axis=1) == np.arange(32)).all()
  # the speed cell: a line per decoder with its time and tokens/s, the speedups, the plot note
  for method, steps in [("ar", 32), ("diffusion", 8), ("encoder", 8)]:
    assert re.search(rf"^  {method} +T= +{steps}: [0-9.]+ s +[0-9.]+ tokens/s", out, re.M), method
  assert re.search(r"T=8: speedup of the KV-cached AO-GPT over the encoder [0-9.]+x; "
                   r"its time / AR time [0-9.]+$", out, re.M)
  assert "matplotlib is not installed" in out or "plt" in ns
  rows = {r["method"]: r for r in ns["speed_rows"]}
  assert sorted(rows) == ["ar", "diffusion", "encoder"]
  assert all(r["run_s"] > 0 and r["tokens_per_s"] == pytest.approx(2 * 32 / r["run_s"], rel=1e-2)
             for r in rows.values())


def test_sampling_notebook_falls_back_offline(tmp_path, offline, monkeypatch, capsys):
  monkeypatch.setenv("AOGPT_CHECKPOINT", checkpoint_spec.PUBLISHED["aogpt_small"])
  monkeypatch.setenv("AOGPT_WORKDIR", str(tmp_path / "no_run_here"))
  ns = run_notebook("sampling.ipynb", cells=4)       # up to the model (the rest: as above)
  out = capsys.readouterr().out
  assert "is not in the Hugging Face cache" in out and "hf download" in out
  assert ns["TRAINED"] is False and ns["LENGTH"] == 32                # random tiny model
  assert ns["cfg"].valid_vocab_size == 257
  assert "NO TRAINED MODEL: using an UNTRAINED tiny model" in out       # loudly


def test_both_notebooks_find_their_model_with_the_one_helper(tmp_path, offline, monkeypatch,
                                                             capsys):
  """The same search (checkpoint, then workdir, then a loud untrained fallback) in both."""
  for name in ("sampling.ipynb", "ensembles.ipynb"):
    text = (COLABS / name).read_text()
    assert "checkpoint_spec.notebook_model()" in text and "aogpt_jax.load(" not in text, name
  monkeypatch.setenv("AOGPT_CHECKPOINT", "")
  monkeypatch.setenv("AOGPT_WORKDIR", str(tmp_path / "no_run_here"))
  with pytest.warns(UserWarning, match="UNTRAINED tiny model"):
    ns = run_notebook("ensembles.ipynb", cells=5)
  out = capsys.readouterr().out
  assert "NO TRAINED MODEL" in out and str(tmp_path / "no_run_here") in out
  assert ns["TRAINED"] is False and ns["data_cfg"].tokenizer == "byte"


@pytest.mark.torch
def test_ensembles_notebook_on_a_published_checkpoint(published, offline, monkeypatch, capsys):
  monkeypatch.setenv("AOGPT_CHECKPOINT", published)
  for k, v in {"AOGPT_MAX_M": "2", "AOGPT_SEQ_LEN": "32", "AOGPT_MAX_BLOCKS": "2",
               "AOGPT_ENSEMBLE_BUCKETS": "1"}.items():
    monkeypatch.setenv(k, v)
  ns = run_notebook("ensembles.ipynb")
  out = capsys.readouterr().out
  assert "tokenizer: gpt2" in out and "ensemble M=2" in out
  assert ns["res"]["m_values"] == [1, 2] and ns["res"]["blocks"] == 2
  assert ns["data_cfg"].tokenizer == "gpt2" and ns["m"].cfg.block_size == 32
