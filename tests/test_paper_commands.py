"""The README's "Paper results, one command each" commands run as written (size overrides
appended) on random-weight published-format checkpoints at the exact hf: paths, read from a
test-made Hugging Face cache, with a random GPT-2 standing in for gpt2-large. No network."""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from helpers import published as pu
from helpers import trainer as tu
from helpers.docs import shell_commands

pytest.importorskip("torch", reason="needs torch (pip install -r requirements-extra.txt)")

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.subprocess]

README = pathlib.Path(tu.REPO) / "README.md"


def readme_commands() -> list[list[str]]:
  """The `python -m aogpt_jax.main` commands of the README's paper-commands block, with its
  VAR=value lines substituted, run by this interpreter."""
  text = README.read_text()
  block = text.split("<!-- paper-commands -->")[1].split("<!-- /paper-commands -->")[0]
  return [[sys.executable] + argv[1:] for argv in shell_commands(block)]


def _wikitext2(raw, cache):
  """A small local WikiText-2 in the HF parquet layout, prepared for 32-token blocks."""
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  from aogpt_jax.data import config as data_config, prepare  # pylint: disable=g-import-not-at-top
  rows = ["", " = Valkyria Chronicles = \n", ""] + [
      f" The game ( {i} ) is played by {i} people , and it 's a good one . \n" for i in range(12)]
  d = pathlib.Path(raw) / "wikitext-2-raw-v1"
  d.mkdir(parents=True)
  pq.write_table(pa.table({"text": rows}), d / "train-00000-of-00001.parquet")
  c = data_config.resolve({}, source="wikitext2", tokenizer="gpt2", path=str(raw),
                          cache_dir=str(cache))
  prepare.prepare(c, block_size=32, num_proc=1, progress=False)


def test_readme_paper_commands_run_on_published_format_checkpoints(tmp_path):
  cmds = readme_commands()
  assert [c[c.index("--mode=eval") if "--mode=eval" in c else c.index("--mode=genppl")]
          for c in cmds] == ["--mode=eval", "--mode=eval", "--mode=genppl"]
  hub = tmp_path / "hf" / "hub"
  spec = next(a for a in cmds[0] if a.startswith("--checkpoint="))[len("--checkpoint="):]
  repo_path = spec[len("hf:Cauthyyy/AO-GPT-MDM/"):]
  pu.hf_cache_repo(hub, "Cauthyyy/AO-GPT-MDM",
                   {repo_path: pu.published_pt(tmp_path / "ckpt.pt", block_size=32)})
  pu.hf_cache_repo(hub, "openai-community/gpt2-large",
                   pu.folder_files(pu.gpt2_folder(tmp_path / "g", vocab=50257)))
  _wikitext2(tmp_path / "raw", tmp_path / "data")
  env = tu.cpu_env() | {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
  small = ["--config.seq_len=32", f"--config.data.cache_dir={tmp_path / 'data'}"]
  extra = {"eval": ["--config.eval.datasets=wikitext2", "--config.eval.max_blocks=1",
                    "--config.eval.ensemble_num_buckets=1"],
           "genppl": ["--config.genppl.steps=4", "--config.sample.num_samples=2"]}
  # The Table 4 command is the Table 5 one without the ensembles: run the superset only.
  assert cmds[1] == [a.replace("table4", "table5") for a in cmds[0]] + [
      "--config.eval.ensemble_max_m=64"]
  for cmd in cmds[1:]:
    t0 = time.perf_counter()
    mode = next(a for a in cmd if a.startswith("--mode="))[len("--mode="):]
    work = next(a for a in cmd if a.startswith("--workdir="))[len("--workdir="):]
    cmd = [a.replace("--workdir=", f"--workdir={tmp_path}/") for a in cmd]
    p = subprocess.run(cmd + small + extra[mode], cwd=tu.REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, (cmd, p.stderr[-3000:])
    print(f"{mode}: {time.perf_counter() - t0:.1f}s")
    out = tmp_path / work / "eval"
    res = json.loads((out / ("genppl.json" if mode == "genppl" else "zero_shot.json")).read_text())
    assert res["meta"]["source"] == spec and res["meta"]["step"] == 250_000
    if mode == "genppl":
      assert [(r["top_p"], r["temperature"], r["steps"]) for r in res["rows"]] == [
          (1.0, 1.0, 4), (0.95, 0.9, 4), (0.95, 0.7, 4)]
    else:
      assert "wikitext2" in (out / "zero_shot.md").read_text()
  table5 = (tmp_path / "out/table5_small/eval/zero_shot.md").read_text()
  assert "64" in table5
  assert os.path.exists(hub / "models--Cauthyyy--AO-GPT-MDM")
