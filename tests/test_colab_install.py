"""The notebooks' first code cell installs the package on Colab (CPU, GPU or TPU runtime) and
does nothing elsewhere (a local checkout, CI)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import types

import pytest

COLABS = pathlib.Path(__file__).resolve().parent.parent / "colabs"
NOTEBOOKS = ["sampling.ipynb", "ensembles.ipynb"]


def _install_cell(name):
  nb = json.loads((COLABS / name).read_text())
  src = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
  assert src.startswith("# Install (Colab only"), name
  return src


def _run(src, monkeypatch, *, colab, gpu=False, tpu=False, source=None):
  calls = []
  monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(list(cmd)))
  monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/x" if gpu else None)
  monkeypatch.setattr(os, "chdir", lambda path: None)
  monkeypatch.setattr(sys, "path", list(sys.path))
  monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
  if tpu:
    monkeypatch.setenv("COLAB_TPU_ADDR", "10.0.0.1:8470")
  if source:
    monkeypatch.setenv("AOGPT_JAX_SOURCE", str(source))
  if colab:
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
  exec(compile(src, "install cell", "exec"), {})
  return calls


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_install_cell_is_a_no_op_off_colab(name, monkeypatch):
  assert _run(_install_cell(name), monkeypatch, colab=False) == []


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_install_cell_on_colab_per_runtime(name, monkeypatch):
  src = _install_cell(name)
  repo = pathlib.Path(__file__).resolve().parent.parent
  jax_v = next(x for x in (repo / "requirements.txt").read_text().splitlines()
               if x.startswith("jax==")).split("==")[1]
  base = [sys.executable, "-m", "pip", "install", "-q", "-r", str(repo / "requirements.txt"),
          "-e", str(repo)]
  assert _run(src, monkeypatch, colab=True, source=repo) == [base]
  gpu = _run(src, monkeypatch, colab=True, gpu=True, source=repo)
  assert gpu == [base, base[:5] + ["-U", f"jax[cuda12]=={jax_v}"]]
  tpu = _run(src, monkeypatch, colab=True, tpu=True, source=repo)
  assert tpu[-1] == base[:5] + ["-U", f"jax[tpu]=={jax_v}"]
  with pytest.raises(SystemExit, match="AOGPT_JAX_SOURCE=.*no aogpt_jax checkout"):
    _run(src, monkeypatch, colab=True, source="/nonexistent/aogpt_jax")
