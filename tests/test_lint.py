"""`ruff check` (rules in pyproject.toml, [tool.ruff.lint]) passes on aogpt_jax/, tests/ and
benchmarks/. Skipped when ruff is not installed (pip install -r requirements-test.txt)."""

import importlib.util
import shutil
import subprocess
import sys

import pytest

from helpers.trainer import REPO

pytestmark = pytest.mark.subprocess


def _ruff() -> list[str]:
  if importlib.util.find_spec("ruff") is not None:
    return [sys.executable, "-m", "ruff"]
  exe = shutil.which("ruff")
  if exe is None:
    pytest.skip("ruff is not installed (pip install -r requirements-test.txt)")
  return [exe]


def test_ruff_check_passes():
  proc = subprocess.run(
      _ruff() + ["check", "--no-cache", "--output-format", "concise",
                 "aogpt_jax", "tests", "benchmarks"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, f"ruff check found problems:\n{proc.stdout}{proc.stderr}"
