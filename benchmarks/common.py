"""What every script in benchmarks/ shares: the machine's facts, the load average, interleaved
best-of timing, and the one JSON writer.

Every result is one JSON file, ``benchmarks/results/<benchmark>/<machine slug>.json``, holding
the latest run only (history is in git), with the schema::

    {"benchmark": str,        # e.g. "sample_speed_tiny"
     "date": str | null,      # ISO 8601 UTC, e.g. "2026-11-25T10:30:00Z"
     "commit": str | null,    # `git rev-parse HEAD` of the tree that ran
     "machine": {"slug": ..., "cpu": ..., "cores": ..., "memory_gib": ..., "accelerator": ...,
                 "load_avg_1m": ...},
     "device": {"backend": ..., "kind": ..., "count": ..., "jax": ...} | null,
     "args": {...} | null,    # the script's arguments (null: unknown, in a migrated result)
     "results": {...}}        # what the script measured

A rerun replaces the file atomically (a temporary file, then ``os.replace``). This module
imports no JAX at import time (data_throughput's worker processes re-import their script).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Mapping

BENCHMARKS = pathlib.Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
SCHEMA_KEYS = ("benchmark", "date", "commit", "machine", "device", "args", "results")
MACHINE_KEYS = ("slug", "cpu", "cores", "memory_gib", "accelerator", "load_avg_1m")

_GPU_NAMES = re.compile(r"\b(h100|h200|h20|a100|a10g?|l40s?|l4|v100|t4|b200|gb200|mi300x?|mi250x?)\b",
                        re.I)


def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo on Linux), else platform.processor()."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown"


def memory_gib() -> float | None:
  """Physical memory in GiB (/proc/meminfo), None where unknown."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return round(int(line.split()[1]) / 2**20, 1)
  except (OSError, ValueError, IndexError):
    pass
  return None


def load_avg_1m() -> float | None:
  """The 1-minute load average (None where the OS has none)."""
  try:
    return round(os.getloadavg()[0], 2)
  except OSError:
    return None


def accelerator() -> str | None:
  """The accelerator's name: the first GPU by nvidia-smi, else (when JAX is already imported)
  the first non-CPU JAX device's kind; None on a CPU-only machine. Never imports JAX itself."""
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    names = out.stdout.strip().splitlines()
    if out.returncode == 0 and names:
      return names[0].strip()
  except (OSError, subprocess.SubprocessError):
    pass
  jax = sys.modules.get("jax")
  if jax is not None:
    try:
      dev = jax.devices()[0]
      if dev.platform != "cpu":
        return str(dev.device_kind)
    except Exception:  # noqa: BLE001 - a backend that fails to start: no accelerator to name
      pass
  return None


def _slugify(text: str) -> str:
  return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_slug(cpu: str | None, cores: int | None, accel: str | None) -> str:
  """A short name for the machine: ``h100`` (the accelerator's model) or
  ``cpu-2core-amd-epyc`` (cores and the CPU's vendor and family)."""
  if accel:
    m = _GPU_NAMES.search(accel)
    if m:
      return m.group(1).lower()
    return _slugify(accel.replace("NVIDIA", ""))[:40] or "accelerator"
  words = re.sub(r"\((R|TM|tm|r)\)", " ", cpu or "").replace("CPU", " ").split()
  family = _slugify(" ".join(words[:2])) or "unknown"
  return f"cpu-{cores or 0}core-{family}"


def machine() -> dict:
  """The machine's facts: slug, CPU model, cores, memory, accelerator, 1-minute load."""
  cpu, cores, accel = cpu_model(), os.cpu_count(), accelerator()
  return {"slug": machine_slug(cpu, cores, accel), "cpu": cpu, "cores": cores,
          "memory_gib": memory_gib(), "accelerator": accel, "load_avg_1m": load_avg_1m()}


def device() -> dict:
  """The JAX backend and device kind (imports JAX)."""
  import jax  # pylint: disable=import-outside-toplevel
  dev = jax.devices()[0]
  return {"backend": jax.default_backend(), "kind": str(getattr(dev, "device_kind", dev)),
          "count": jax.device_count(), "jax": jax.__version__}


def commit() -> str | None:
  """The hash in AOGPT_COMMIT when set (a 40-digit hex hash, else ignored: for a copy of the tree
  whose git, if any, is not the tree's own, as on a rented accelerator), else `git rev-parse
  HEAD` of this checkout, else None."""
  given = os.environ.get("AOGPT_COMMIT", "").strip().lower()
  if re.fullmatch(r"[0-9a-f]{40}", given):
    return given
  try:
    p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                       timeout=20)
  except (OSError, subprocess.SubprocessError):
    return None
  return (p.stdout.strip() or None) if p.returncode == 0 else None


def _started() -> str | None:
  """The commit checked out when this process imported this module: the code a long run
  executes (a commit made while it ran is not what ran)."""
  return _START_COMMIT


def utc_now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def result_path(benchmark: str, slug: str) -> pathlib.Path:
  return RESULTS / benchmark / f"{slug}.json"


def record(benchmark: str, args: Any, results: Any, *, device_info: Mapping | None | str = "jax",
           machine_info: Mapping | None = None, date: str | None = None,
           commit_sha: str | None | bool = True) -> dict:
  """The schema's dict. ``args``: an argparse Namespace or a mapping; ``device_info``: "jax"
  (ask JAX), a mapping, or None (no JAX involved)."""
  if hasattr(args, "__dict__") and not isinstance(args, Mapping):
    args = vars(args)
  return {"benchmark": benchmark,
          "date": date or utc_now(),
          "commit": _started() if commit_sha is True else (commit_sha or None),
          "machine": dict(machine_info) if machine_info is not None else machine(),
          "device": device() if device_info == "jax" else device_info,
          "args": dict(args or {}),
          "results": results}


def write_json(path: str | os.PathLike, obj: Any) -> pathlib.Path:
  """Writes ``obj`` as JSON to ``path`` atomically: a temporary file in the same folder, then
  os.replace (a reader sees the old file or the new one, never half of one)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(obj, f, indent=1, allow_nan=True)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    try:
      os.unlink(tmp)
    except OSError:
      pass
    raise
  return path


OVERWRITE_ENV = "AOGPT_OVERWRITE_RESULTS"


def _same_args(a: Any, b: Any) -> bool:
  return json.loads(json.dumps(a, default=str)) == json.loads(json.dumps(b, default=str))


def default_target(benchmark: str, args: Any, slug: str) -> pathlib.Path:
  """Where a run without ``--out`` writes: ``benchmarks/results/<benchmark>/<slug>.json``, unless
  a result is there already that other arguments made (a committed protocol run replaced by a
  smoke run is lost work): then ``<slug>.<UTC time>.json`` beside it, said in one line. Set
  ``AOGPT_OVERWRITE_RESULTS=1`` to replace it anyway."""
  path = result_path(benchmark, slug)
  if not path.exists() or os.environ.get(OVERWRITE_ENV) == "1":
    return path
  if hasattr(args, "__dict__") and not isinstance(args, Mapping):
    args = vars(args)
  try:
    old = json.loads(path.read_text()).get("args")
  except (OSError, ValueError, AttributeError):
    old = None
  if old is not None and _same_args(old, dict(args or {})):
    return path
  beside = path.with_name(f"{path.stem}.{utc_now().replace(':', '')}.json")
  print(f"{path} holds a run with other arguments: this run goes to {beside} (to replace it: "
        f"{OVERWRITE_ENV}=1, or --out=PATH)", flush=True)
  return beside


def write_result(benchmark: str, args: Any, results: Any, *, out: str | os.PathLike | None = None,
                 **kw) -> pathlib.Path:
  """Writes one run in the schema to ``out`` or `default_target` (the committed result of the
  same arguments replaced, never one that other arguments made); prints and returns the path
  (a script's .md and .png go beside it). ``kw``: see `record`."""
  rec = record(benchmark, args, results, **kw)
  path = write_json(out or default_target(benchmark, args, rec["machine"]["slug"]), rec)
  print(f"wrote {path}", flush=True)
  return path


def write_with_markdown(benchmark: str, args: Any, results: Any, md: str) -> pathlib.Path:
  """`write_result` under ``benchmark`` (``_NAME`` added for a non-empty ``args.name``; to
  ``args.out`` if given), the Markdown table ``md`` printed and written beside it (.md)."""
  print(md)
  name = getattr(args, "name", "")
  path = write_result(benchmark + (f"_{name}" if name else ""), args, results,
                      out=getattr(args, "out", "") or None)
  path.with_suffix(".md").write_text(md)
  return path


def fail(parser, message: str) -> None:
  """Exits with ONE line (status 2), no usage text: a benchmark's bad argument, before work."""
  parser.exit(2, f"{parser.prog}: {message}\n")


def check_args(parser, args, *, positive: tuple[str, ...] = (), nonnegative: tuple[str, ...] = ()
               ) -> None:
  """The checks every benchmark's arguments get before any work: ``--workdir`` is not a file,
  ``--out`` (if given) can be written (found at the start, not after an hour of measuring),
  ``--name`` (if given) is one folder-name word, and the named numbers are > 0 / >= 0. One line
  each (`fail`)."""
  for key in positive + nonnegative:
    v = getattr(args, key)
    if v is None:
      continue
    if (key in positive and not v > 0) or (key in nonnegative and not v >= 0):
      fail(parser, f"--{key}={v!r}: expected a number {'> 0' if key in positive else '>= 0'}")
  name = getattr(args, "name", None)
  if name and not re.fullmatch(r"[A-Za-z0-9_-]+", name):
    fail(parser, f"--name={name!r}: expected letters, digits, '_' or '-'")
  wd = getattr(args, "workdir", None)
  if wd and os.path.isfile(os.path.expanduser(wd)):
    fail(parser, f"--workdir={wd!r} is a file; expected a folder (created if missing)")
  out = getattr(args, "out", None)
  if out:
    parent = pathlib.Path(out).expanduser().resolve().parent
    try:
      parent.mkdir(parents=True, exist_ok=True)
      with tempfile.TemporaryFile(dir=parent):
        pass
    except OSError as e:
      fail(parser, f"--out={out!r}: cannot write in {parent} ({e.strerror or e}); expected a "
                   f"writable path")


def check_schema(rec: Any, where: str = "result") -> None:
  """Raises ValueError (one line, naming ``where`` and the key) unless ``rec`` has the schema."""
  if not isinstance(rec, dict):
    raise ValueError(f"{where}: not a JSON object")
  for k in SCHEMA_KEYS:
    if k not in rec:
      raise ValueError(f"{where}: missing key '{k}'")
  extra = sorted(set(rec) - set(SCHEMA_KEYS))
  if extra:
    raise ValueError(f"{where}: unexpected top-level keys {extra}")
  if not isinstance(rec["benchmark"], str) or not rec["benchmark"]:
    raise ValueError(f"{where}: 'benchmark' must be a non-empty string")
  if rec["date"] is not None:
    try:
      datetime.datetime.strptime(rec["date"], "%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
      raise ValueError(f"{where}: 'date' {rec['date']!r} is not ISO UTC (YYYY-MM-DDTHH:MM:SSZ)")
  if rec["commit"] is not None and not re.fullmatch(r"[0-9a-f]{7,40}", str(rec["commit"])):
    raise ValueError(f"{where}: 'commit' {rec['commit']!r} is not a git hash or null")
  m = rec["machine"]
  if not isinstance(m, dict):
    raise ValueError(f"{where}: 'machine' must be an object")
  for k in MACHINE_KEYS:
    if k not in m:
      raise ValueError(f"{where}: missing key 'machine.{k}'")
  if not isinstance(m["slug"], str) or not re.fullmatch(r"[a-z0-9-]+", m["slug"]):
    raise ValueError(f"{where}: 'machine.slug' {m['slug']!r} is not a slug")
  if rec["device"] is not None and not isinstance(rec["device"], dict):
    raise ValueError(f"{where}: 'device' must be an object or null")
  if rec["args"] is not None and not isinstance(rec["args"], dict):
    raise ValueError(f"{where}: 'args' must be an object or null (unknown)")


def interleaved(fns: Mapping[str, Callable[[], Any]], repeats: int,
                sync: Callable[[Any], Any] | None = None) -> dict[str, list[float]]:
  """Times every function ``repeats`` times, round by round (one call of each per round, so a
  load that drifts hits all alike); returns the wall times in seconds per name. ``sync`` is
  applied to each call's result inside the timed span (e.g. jax.block_until_ready)."""
  times: dict[str, list[float]] = {k: [] for k in fns}
  for _ in range(repeats):
    for k, fn in fns.items():
      t0 = time.perf_counter()
      out = fn()
      if sync is not None:
        sync(out)
      times[k].append(time.perf_counter() - t0)
  return times


def best_of(fns: Mapping[str, Callable[[], Any]], repeats: int,
            sync: Callable[[Any], Any] | None = None) -> dict[str, float]:
  """The minimum of `interleaved`'s times per name (seconds)."""
  return {k: min(t) for k, t in interleaved(fns, repeats, sync).items()}


_START_COMMIT = commit()    # at import: what a run's record names (`record`, `_started`)
