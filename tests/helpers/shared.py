"""Folders made once per test session and shared by every test file and pytest-xdist worker (CI
runs ``-n 2 --dist loadfile``: without this, each file trains its own copy of the same run)."""

import os
import pathlib
import shutil

import filelock


def session_dir(tmp_path_factory, name: str, make) -> pathlib.Path:
  """SESSION/shared/NAME, filled by ``make(path)`` once per test session: the first test to ask
  makes it under a file lock, the others (in this worker or another) wait for it and reuse it.
  A failed ``make`` leaves nothing, so the next test to ask tries again (and fails on its own).
  Users only read it; a test that changes a run works on a copy (``helpers.trainer.copy_workdir``).
  """
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent                # the session's folder, above every worker's own
  root = base / "shared"
  root.mkdir(exist_ok=True)
  path, done = root / name, root / f"{name}.done"
  with filelock.FileLock(str(root / f"{name}.lock")):
    if not done.exists():
      shutil.rmtree(path, ignore_errors=True)
      try:
        make(path)
      except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
      done.touch()
  return path
