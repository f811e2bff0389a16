"""Raw-text sources: which rows make up each split, from HF datasets, a URL or local files.

A source yields the rows of a split as strings, in a fixed order; preparation detokenizes,
tokenizes, appends end-of-text to every row, concatenates and packs them (`prepare.py`). Rows follow
the SEDD / AO-GPT loaders: WikiText rows are the raw file's lines with their newline (blank lines
become ""), PTB rows are stripped lines (column ``sentence``), LAMBADA rows are OpenAI's test jsonl
(``text``), LM1B and OpenWebText rows are documents (``text``).

Raw text comes from, in this order: ``data.path`` (a local file, or a directory in HF layout such as
``wikitext-2-raw-v1/test-00000-of-00001.parquet``, ``wiki.test.raw``, ``ptb.test.txt``,
``lambada_test.jsonl``), else a download (HF ``datasets``, imported lazily; LAMBADA from OpenAI's
URL). ``text_files`` reads a user's glob; ``python_stdlib`` the embedded corpus.

Held-out validation (openwebtext, text_files without ``data.validation_glob``) is a slice of the
train rows; empty (whitespace-only) rows are dropped from both sides.
- openwebtext (unique documents): a row goes to validation when
  ``crc32(utf-8 text) % 2**20 < validation_fraction * 2**20``: deterministic and independent of
  file order.
- text_files (a user's corpus, often lines with repeats): by position, so the held-out share of
  the TEXT (hence of the tokens) is ``validation_fraction`` and representative of the whole
  corpus. The non-empty rows are laid end to end and cut into ``S`` equal stripes
  (`STRIPE_CHARS` of held-out text each, at most `MAX_STRIPES`); a row goes to validation when its
  midpoint falls in the first ``validation_fraction`` of its stripe. A row of several lines (a
  whole file, ``txt_rows=file``) that spans the edge of a held-out stretch is first cut at the
  line break nearest the edge, so the held-out share is ``validation_fraction`` (to a line per
  edge) however large the files are. A content hash would send every copy of a repeated line
  (blank lines, ``}``, ``return``) to the same side.
"""

from __future__ import annotations

import dataclasses
import glob as globlib
import hashlib
import json
import pathlib
import re
import urllib.request
import zlib
from typing import Callable, Iterable, Iterator

from aogpt_jax.data import stdlib_source
from aogpt_jax.data.config import cache_dir, get


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  splits: tuple[str, ...]
  hf: tuple[str, str | None] | None = None   # (dataset id, config name)
  urls: tuple[tuple[str, str], ...] = ()     # (split, url) downloaded as jsonl
  field: str = "text"
  detokenizer: str = ""
  txt_rows: str = "file"                      # file | line (HF wikitext) | strip
  held_out: bool = False                      # validation = hashed slice of the train rows
  local: bool = False                         # needs no download (auto-preparable)


SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("openwebtext", ("train", "validation"), hf=("Skylion007/openwebtext", None),
           held_out=True),
    Source("wikitext2", ("train", "validation", "test"), hf=("Salesforce/wikitext",
           "wikitext-2-raw-v1"), detokenizer="wikitext", txt_rows="line"),
    Source("wikitext103", ("train", "validation", "test"), hf=("Salesforce/wikitext",
           "wikitext-103-raw-v1"), detokenizer="wikitext", txt_rows="line"),
    Source("ptb", ("train", "validation", "test"), hf=("ptb-text-only/ptb_text_only", None),
           field="sentence", detokenizer="ptb", txt_rows="strip"),
    Source("lambada", ("test",), urls=(("test", "https://openaipublic.blob.core.windows.net/"
                                        "gpt-2/data/lambada_test.jsonl"),),
           detokenizer="lambada", txt_rows="strip"),
    Source("lm1b", ("train", "test"), hf=("dvruette/lm1b", None), detokenizer="lm1b",
           txt_rows="strip"),
    Source("python_stdlib", ("train", "validation"), local=True),
    Source("text_files", ("train", "validation"), held_out=True, local=True),
)}

# The zero-shot sets of the paper, with the split SEDD / AO-GPT score (WikiText2: train).
ZERO_SHOT = {"wikitext2": "train", "wikitext103": "test", "ptb": "test", "lambada": "test",
             "lm1b": "test"}

SPLIT_ALIASES = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"),
                 "test": ("test", "heldout")}
DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".txt", ".raw", ".tokens")
NOT_DATA = ("dataset_info.json", "dataset_infos.json", "state.json", "dataset_dict.json")


@dataclasses.dataclass
class RawSplit:
  """The rows of one split and where they came from (recorded in the prepared metadata)."""
  rows: Iterator[str]
  origin: str
  files: list[str] = dataclasses.field(default_factory=list)
  total_rows: int | None = None


def get_source(name: str) -> Source:
  if name not in SOURCES:
    raise ValueError(f"data.source: unknown source {name!r}; known: {sorted(SOURCES)}")
  return SOURCES[name]


def check_split(src: Source, split: str) -> None:
  if split not in src.splits:
    raise ValueError(f"data.source {src.name!r} has splits {list(src.splits)}, not {split!r}")


def is_held_out(text: str, fraction: float) -> bool:
  return zlib.crc32(text.encode("utf-8")) % 2**20 < fraction * 2**20


STRIPE_CHARS = 4096   # held-out characters per stripe of a text_files corpus
HELD_OUT_RULE = "stripes/2"   # in the cache key: 2 = rows cut at the stretches' edges
MAX_STRIPES = 1000


def _cut_at_lines(r: str, offset: float, width: float, held: float) -> list[tuple[str, float]]:
  """``r`` (at ``offset`` in the stream) cut, at the line break nearest each held-out boundary
  (``k * width`` and ``k * width + held``) that falls inside it, into ``(piece, offset)``; a row
  without an inner line break (a line) is never cut."""
  if "\n" not in r[:-1]:
    return [(r, offset)]
  end, cuts = offset + len(r), set()
  k = int(offset // width)
  while k * width < end:
    for b in (k * width, k * width + held):
      if offset < b < end:
        i = int(round(b - offset))
        before, after = r.rfind("\n", 0, i), r.find("\n", i)
        options = [j + 1 for j in (before, after) if j >= 0 and 0 < j + 1 < len(r)]
        if options:
          cuts.add(min(options, key=lambda c: abs(c - i)))
    k += 1
  bounds = [0, *sorted(cuts), len(r)]
  return [(r[a:b], offset + a) for a, b in zip(bounds, bounds[1:])]


def stripe_held_out(rows: Callable[[], Iterable[str]], fraction: float,
                    want_validation: bool) -> tuple[Iterator[str], str]:
  """The non-empty rows of one side of a positional held-out split (module docstring), and a
  description with the held-out share of the characters. ``rows`` is called twice. A row that
  spans a boundary of a held-out stretch (a whole file) is cut at the line break nearest it, so
  the share is the fraction whatever the size of the rows. An empty validation side is a
  ValueError naming the fix."""
  total = sum(len(r) for r in rows() if r.strip())
  stripes = max(1, min(MAX_STRIPES, int(total * fraction) // STRIPE_CHARS))
  width = total / stripes if total else 1.0

  def pieces() -> Iterator[tuple[str, bool]]:
    off = 0
    for r in rows():
      if r.strip():
        for piece, at in _cut_at_lines(r, off, width, fraction * width):
          if piece.strip():
            yield piece, ((at + len(piece) / 2) % width) < fraction * width
        off += len(r)

  held = sum(len(p) for p, v in pieces() if v)
  cut = stripes * 2 if total else 0
  desc = (f"validation = {held} of {total} non-empty characters ({held / max(total, 1):.2%}; "
          f"validation_fraction {fraction}) in {stripes} stripe(s), by position, rows longer "
          f"than a line cut at the line break nearest each of the {cut} boundaries; empty rows "
          f"dropped")
  if want_validation and not held:
    raise ValueError(
        f"data.validation_fraction: {fraction} of {total} characters holds out no whole line "
        f"(the held-out stretch, {fraction * width:.0f} characters, is shorter than the lines "
        f"there); raise data.validation_fraction until a stretch holds a line, or give the "
        f"held-out text as data.validation_glob")

  def side() -> Iterator[str]:
    for piece, v in pieces():
      if v == want_validation:
        yield piece

  return side(), desc


# ---------------------------------------------------------------------------------------- files


def _undecodable(path, offset: int) -> ValueError:
  return ValueError(f"{path}: undecodable UTF-8 at byte offset {offset}")


def _decode(raw: bytes, path, base: int = 0) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise _undecodable(path, base + e.start) from None


def _text_rows(path: pathlib.Path, txt_rows: str) -> Iterator[str]:
  raw = path.read_bytes()
  if txt_rows == "file":
    yield _decode(raw, path)
    return
  if txt_rows not in ("line", "strip"):
    raise ValueError(f"data.txt_rows: {txt_rows!r} is not 'file', 'line' or 'strip'")
  if not raw:
    return
  pieces = raw.split(b"\n")
  if raw.endswith(b"\n"):
    pieces.pop()  # the empty piece after the final newline is not a line
  offset = 0
  for i, piece in enumerate(pieces):
    start, offset = offset, offset + len(piece) + 1
    line = _decode(piece.removesuffix(b"\r"), path, start)
    if txt_rows == "strip":
      yield line.strip()
    else:  # HF wikitext: the line with its newline; blank lines as ""
      has_newline = i < len(pieces) - 1 or raw.endswith(b"\n")
      yield (line + "\n" if has_newline else line) if line.strip() else ""


def _field(obj, field: str, where: str) -> str:
  if not isinstance(obj, dict) or field not in obj:
    keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
    raise ValueError(f"{where}: no field {field!r} (found {keys}); set data.text_field")
  value = obj[field]
  if not isinstance(value, str):
    raise ValueError(f"{where}: field {field!r} is {type(value).__name__}, not text")
  return value


def _jsonl_rows(path: pathlib.Path, field: str) -> Iterator[str]:
  raw = path.read_bytes()
  if raw.lstrip()[:1] == b"[":  # a JSON array of objects
    for i, obj in enumerate(json.loads(_decode(raw, path))):
      yield _field(obj, field, f"{path} item {i}")
    return
  offset = 0
  for lineno, piece in enumerate(raw.split(b"\n"), 1):
    start, offset = offset, offset + len(piece) + 1
    if not piece.strip():
      continue
    line = _decode(piece, path, start)
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: invalid JSON on line {lineno} (byte offset {start}): {e.msg}") \
          from None
    yield _field(obj, field, f"{path} line {lineno}")


def _parquet_rows(path: pathlib.Path, field: str) -> Iterator[str]:
  try:
    import pyarrow.parquet as pq
  except ImportError as e:
    raise ImportError(f"{path}: reading .parquet needs pyarrow (pip install -r "
                      f"requirements.txt)") from e
  pf = pq.ParquetFile(path)
  names = pf.schema_arrow.names
  if field not in names:
    raise ValueError(f"{path}: no column {field!r} (columns {names}); set data.text_field")
  row = 0
  for batch in pf.iter_batches(columns=[field], batch_size=4096):
    for value in batch.column(0).to_pylist():
      if isinstance(value, bytes):
        try:
          value = value.decode("utf-8")
        except UnicodeDecodeError as e:
          raise ValueError(f"{path} row {row}: undecodable UTF-8 at byte offset {e.start} of "
                           f"column {field!r}") from None
      if not isinstance(value, str):
        raise ValueError(f"{path} row {row}: column {field!r} is {type(value).__name__}")
      row += 1
      yield value


def file_rows(path: pathlib.Path, *, field: str, txt_rows: str) -> Iterator[str]:
  """Rows of one file: parquet / jsonl / json by column ``field``, anything else as text."""
  suffix = path.suffix.lower()
  if suffix == ".parquet":
    return _parquet_rows(path, field)
  if suffix in (".jsonl", ".json"):
    return _jsonl_rows(path, field)
  return _text_rows(path, txt_rows)


def _parquet_count(files: list[pathlib.Path]) -> int | None:
  if not files or any(p.suffix.lower() != ".parquet" for p in files):
    return None
  import pyarrow.parquet as pq
  return sum(pq.ParquetFile(p).metadata.num_rows for p in files)


def _is_data_file(p: pathlib.Path) -> bool:
  return (p.is_file() and not p.name.startswith(".") and p.name not in NOT_DATA and
          (p.suffix.lower() in DATA_SUFFIXES or re.search(r"-\d{5}-of-\d{5}$", p.name) is not None))


def _splits_named(rel: str) -> set[str]:
  words = set(re.split(r"[^a-z0-9]+", rel.lower()))
  return {s for s, aliases in SPLIT_ALIASES.items() if words & set(aliases)}


def local_files(src: Source, split: str, path: str) -> list[pathlib.Path]:
  """The files of ``split`` under ``path`` (a file is used as it is)."""
  root = pathlib.Path(path).expanduser()
  if root.is_file():
    return [root]
  if not root.is_dir():
    raise FileNotFoundError(f"data.path {path!r} does not exist")
  if src.hf and src.hf[1] and (root / src.hf[1]).is_dir():
    root = root / src.hf[1]  # an HF-layout checkout with several configs
  files = sorted(p for p in root.rglob("*") if _is_data_file(p))
  if not files:
    raise FileNotFoundError(f"data.path {str(root)!r}: no data files ({', '.join(DATA_SUFFIXES)})")
  named = {p: _splits_named(p.relative_to(root).as_posix()) for p in files}
  chosen = [p for p in files if split in named[p]]
  base = "train" if src.held_out else (src.splits[0] if len(src.splits) == 1 else None)
  if not chosen and base == split and not any(named.values()):
    chosen = files  # no split names at all: everything is the source's only raw split
  if not chosen:
    raise FileNotFoundError(
        f"data.path {str(root)!r}: no file named for split {split!r} (a name containing one of "
        f"{SPLIT_ALIASES[split]}); files: {[p.name for p in files[:10]]}")
  return chosen


def _rows_of_files(files, field, txt_rows) -> Iterator[str]:
  for p in files:
    yield from file_rows(p, field=field, txt_rows=txt_rows)


# ------------------------------------------------------------------------------------ downloads


def _hf_rows(src: Source, split: str, data_cfg) -> RawSplit:
  try:
    import datasets
  except ImportError as e:
    raise ImportError(
        f"data.source {src.name!r}: downloading needs the Hugging Face `datasets` package "
        f"(pip install -r requirements-download.txt), or download the files yourself and pass "
        f"--path / data.path") from e
  path, name = src.hf
  try:
    ds = datasets.load_dataset(path, name, split=split, cache_dir=get(data_cfg, "hf_cache_dir")
                               or None, num_proc=int(get(data_cfg, "num_proc")) or None)
  except Exception as e:  # offline, moved dataset, ...: say how to go on without the Hub
    raise RuntimeError(
        f"data.source {src.name!r}: could not load {path}" + (f" ({name})" if name else "") +
        f" split {split!r} from the Hugging Face Hub ({type(e).__name__}: {e}); download the "
        f"files elsewhere and pass --path / data.path (a directory in HF layout, e.g. "
        f"{name or 'data'}/{split}-00000-of-00001.parquet, or the raw .txt/.jsonl)") from e
  field = get(data_cfg, "text_field") or src.field

  def rows():
    for batch in ds.iter(batch_size=1000):
      yield from batch[field]
  return RawSplit(rows(), origin=f"hf:{path}" + (f"/{name}" if name else "") + f":{split}",
                  total_rows=len(ds))


def _download(url: str, dest: pathlib.Path) -> pathlib.Path:
  if not dest.exists():
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    urllib.request.urlretrieve(url, tmp)  # noqa: S310 (a fixed https URL)
    tmp.replace(dest)
  return dest


# ------------------------------------------------------------------------------------- dispatch


def glob_files(pattern: str) -> list[pathlib.Path]:
  """The files a comma-separated glob matches (``**`` recursive), sorted."""
  return sorted({pathlib.Path(f) for g in str(pattern or "").split(",") if g.strip()
                 for f in globlib.glob(str(pathlib.Path(g.strip()).expanduser()), recursive=True)
                 if pathlib.Path(f).is_file()})


def files_identity(pattern: str) -> str:
  """A digest of the path, size and modification time of every file a glob matches: an edited,
  added or removed file changes it (so a text_files corpus is prepared again)."""
  h = hashlib.sha256()
  for p in glob_files(pattern):
    st = p.stat()
    h.update(f"{p.absolute()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
  return h.hexdigest()[:16]


def _base_rows(src: Source, split: str, data_cfg) -> RawSplit:
  """Rows of a raw split (before held-out filtering)."""
  field = get(data_cfg, "text_field") or src.field
  txt_rows = get(data_cfg, "txt_rows") or src.txt_rows
  if src.name == "python_stdlib":
    files = stdlib_source.stdlib_files(split)
    rows = (raw.decode("utf-8") for _, raw in stdlib_source.read_rows(split, files=files))
    return RawSplit(rows, origin=f"python_stdlib:{stdlib_source.stdlib_root()}:{split}",
                    files=[str(p) for p in files])
  if src.name == "text_files":
    pattern = get(data_cfg, "validation_glob") if split == "validation" else get(data_cfg, "glob")
    key = "validation_glob" if split == "validation" else "glob"
    if not pattern:
      raise ValueError(f"data.{key}: text_files needs a glob of .txt/.jsonl/.json/.parquet files")
    files = glob_files(pattern)
    if not files:
      raise FileNotFoundError(f"data.{key} {pattern!r} matches no file")
    return RawSplit(_rows_of_files(files, field, txt_rows), origin=f"text_files:{pattern}",
                    files=[str(p) for p in files], total_rows=_parquet_count(files))
  if get(data_cfg, "path"):
    files = local_files(src, split, get(data_cfg, "path"))
    return RawSplit(_rows_of_files(files, field, txt_rows), origin=f"local:{get(data_cfg, 'path')}",
                    files=[str(p) for p in files], total_rows=_parquet_count(files))
  urls = dict(src.urls)
  if split in urls:
    dest = _download(urls[split], cache_dir(data_cfg) / "raw" / src.name / urls[split].rsplit(
        "/", 1)[-1])
    return RawSplit(_rows_of_files([dest], field, txt_rows), origin=urls[split], files=[str(dest)])
  return _hf_rows(src, split, data_cfg)


def raw_split(data_cfg, split: str) -> RawSplit:
  """The rows of ``split`` of ``data.source``, in their fixed order."""
  src = get_source(get(data_cfg, "source"))
  check_split(src, split)
  held = src.held_out and not (src.name == "text_files" and get(data_cfg, "validation_glob"))
  if not held:
    return _base_rows(src, split, data_cfg)
  base = _base_rows(src, "train", data_cfg)
  fraction = float(get(data_cfg, "validation_fraction"))
  want = split == "validation"
  if fraction == 0:   # no held-out split: train is every row as given
    return base if not want else RawSplit(iter(()), origin=f"{base.origin} (validation_fraction "
                                          "0: empty)", files=base.files)
  if src.local:   # re-readable: split by position (module docstring)
    rows, desc = stripe_held_out(lambda: _base_rows(src, "train", data_cfg).rows, fraction, want)
    return RawSplit(rows, origin=f"{base.origin} ({split}; {desc})", files=base.files)
  rows = (t for t in base.rows if t.strip() and is_held_out(t, fraction) == want)
  return RawSplit(rows, origin=f"{base.origin} ({split}: non-empty rows with crc32 % 2**20 "
                  f"{'<' if want else '>='} {fraction} * 2**20)", files=base.files,
                  total_rows=base.total_rows)


def needs_download(data_cfg) -> bool:
  src = get_source(get(data_cfg, "source"))
  return not (src.local or get(data_cfg, "path"))
