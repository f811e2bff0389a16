"""``hf:`` specs -> local paths, without the network.

* ``hf:OWNER/REPO[/PATH]``: PATH (a file or a folder; empty = the whole repository) inside the
  repository's snapshot in the Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``), as ``hf download OWNER/REPO`` leaves it.
  ``hf:OWNER/REPO@REVISION/PATH`` picks a branch, tag or commit other than ``main``.
* ``hf:./DIR`` / ``hf:/abs/DIR`` / ``hf:~/DIR`` (a path, not OWNER/REPO): a local folder laid out
  like a Hub repository (e.g. ``hf download ... --local-dir DIR``), used as is.

Nothing is downloaded at run time: a spec that is not on this machine is one line (`HubError`)
naming the spec and the command that fetches it on a machine with network.
"""

from __future__ import annotations

import os


class HubError(FileNotFoundError):
  """An ``hf:`` spec that is not on this machine; the message names the spec and the fix."""


def cache_dir() -> str:
  """The Hugging Face hub cache, read from the environment at call time."""
  if os.environ.get("HF_HUB_CACHE"):
    return os.path.expanduser(os.environ["HF_HUB_CACHE"])
  home = os.environ.get("HF_HOME") or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
  return os.path.join(os.path.expanduser(home), "hub")


def parse(spec: str) -> tuple[str, str, str]:
  """``hf:OWNER/REPO[@REV][/PATH]`` -> (OWNER/REPO, REV, PATH)."""
  parts = spec[len("hf:"):].strip("/").split("/")
  if len(parts) < 2 or not all(parts[:2]):
    raise HubError(f"{spec}: expected hf:OWNER/REPO[/PATH] or hf:/path/to/local/folder")
  repo, rev = "/".join(parts[:2]), "main"
  if "@" in repo:
    repo, rev = repo.split("@", 1)
  return repo, rev, "/".join(parts[2:])


def _is_local(body: str) -> bool:
  return body.startswith(("/", "./", "../", "~")) or body in (".", "..")


def download_hint(repo: str, path: str = "", rev: str = "main", files: tuple = ()) -> str:
  """The ``hf download`` command that puts PATH (or ``files``) into the cache."""
  if files:
    what = " " + " ".join(f"{path}/{f}" if path else f for f in files)
  elif path:
    what = f" {path}" if os.path.splitext(path)[1] else f" --include '{path}/*'"
  else:
    what = ""
  r = "" if rev == "main" else f" --revision {rev}"
  return f"hf download {repo}{what}{r}"


def resolve(spec: str, files: tuple = ()) -> str:
  """``hf:...`` -> an existing local file or folder (see the module docstring); no network.
  ``files``: what the caller needs inside the folder (only for the download hint)."""
  body = spec[len("hf:"):]
  if _is_local(body):
    path = os.path.expanduser(body)
    if not os.path.exists(path):
      raise HubError(f"{spec}: no such local folder or file ({os.path.abspath(path)})")
    return path
  repo, rev, path = parse(spec)
  root = cache_dir()
  repo_dir = os.path.join(root, "models--" + repo.replace("/", "--"))
  cmd = download_hint(repo, path, rev, files)
  fix = (f"fetch it on a machine with network (`{cmd}`, with HF_HOME or HF_HUB_CACHE pointing "
         f"at the cache you then copy here), or pass a local path")
  commit = rev
  ref = os.path.join(repo_dir, "refs", rev)
  if os.path.isfile(ref):
    with open(ref) as f:
      commit = f.read().strip()
  snap = os.path.join(repo_dir, "snapshots", commit)
  if not os.path.isdir(snap):
    raise HubError(f"{spec}: repository {repo} (revision {rev}) is not in the Hugging Face cache "
                   f"{root} and nothing is downloaded at run time; {fix}")
  local = os.path.join(snap, path) if path else snap
  if not os.path.exists(local):
    raise HubError(f"{spec}: {path} is not in the cached snapshot {snap}; {fix}")
  return local
