"""Raw sources: local files in the formats HF / the benchmarks ship, splits, held-out slices."""

import builtins
import json
import pathlib

import numpy as np
import pytest

from aogpt_jax.data import config, sources


def cfg(**kw):
  return config.resolve({}, **kw)


def rows(c, split):
  return list(sources.raw_split(c, split).rows)


def test_wikitext_txt_rows_follow_hf(tmp_path):
  # HF wikitext rows: every line with its newline; blank lines become "".
  (tmp_path / "wiki.test.raw").write_bytes(b" \n = Title = \n\n Some text .\r\nlast")
  got = rows(cfg(source="wikitext103", path=str(tmp_path)), "test")
  assert got == ["", " = Title = \n", "", " Some text .\n", "last"]


def test_ptb_txt_rows_stripped(tmp_path):
  (tmp_path / "ptb.test.txt").write_text(" no it was n't black monday \n the <unk> \n")
  (tmp_path / "ptb.train.txt").write_text(" train row \n")
  assert rows(cfg(source="ptb", path=str(tmp_path)), "test") == [
      "no it was n't black monday", "the <unk>"]
  assert rows(cfg(source="ptb", path=str(tmp_path)), "train") == ["train row"]


def test_hf_layout_parquet(tmp_path):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq
  for conf, text in (("wikitext-2-raw-v1", "two"), ("wikitext-103-raw-v1", "hundred")):
    d = tmp_path / conf
    d.mkdir()
    for split in ("train", "test"):
      pq.write_table(pa.table({"text": [f"{text} {split} {i}" for i in range(3)]}),
                     d / f"{split}-00000-of-00001.parquet")
  r = sources.raw_split(cfg(source="wikitext2", path=str(tmp_path)), "test")
  assert list(r.rows) == ["two test 0", "two test 1", "two test 2"] and r.total_rows == 3
  assert rows(cfg(source="wikitext103", path=str(tmp_path)), "train")[0] == "hundred train 0"
  with pytest.raises(FileNotFoundError, match="no file named for split 'validation'"):
    sources.raw_split(cfg(source="wikitext2", path=str(tmp_path)), "validation")


def test_parquet_missing_column(tmp_path):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq
  pq.write_table(pa.table({"content": ["x"]}), tmp_path / "a.parquet")
  with pytest.raises(ValueError, match="no column 'text'.*content.*data.text_field"):
    rows(cfg(source="text_files", glob=str(tmp_path / "*.parquet"), validation_fraction=0.0),
         "train")
  c = cfg(source="text_files", glob=str(tmp_path / "*.parquet"), text_field="content",
          validation_fraction=0.0)
  assert rows(c, "train") == ["x"]


def test_jsonl_and_json_array(tmp_path):
  (tmp_path / "lambada_test.jsonl").write_text(
      json.dumps({"text": "a \u201cquote\u201d"}) + "\n\n" + json.dumps({"text": "b"}) + "\n")
  assert rows(cfg(source="lambada", path=str(tmp_path / "lambada_test.jsonl")), "test") == [
      "a \u201cquote\u201d", "b"]
  (tmp_path / "arr.json").write_text(json.dumps([{"text": "x"}, {"text": "y"}]))
  c = cfg(source="text_files", glob=str(tmp_path / "arr.json"), validation_fraction=0.0)
  assert rows(c, "train") == ["x", "y"]


def test_jsonl_errors(tmp_path):
  p = tmp_path / "bad.jsonl"
  p.write_text('{"text": "ok"}\n{"body": "no text"}\n')
  c = cfg(source="text_files", glob=str(p), validation_fraction=0.0)
  with pytest.raises(ValueError, match=r"bad.jsonl line 2: no field 'text' \(found \['body'\]\)"):
    rows(c, "train")
  p.write_text('{"text": "ok"}\n{"text": oops}\n')
  with pytest.raises(ValueError, match="invalid JSON on line 2 .byte offset 15."):
    rows(c, "train")


def test_undecodable_bytes_name_file_and_offset(tmp_path):
  p = tmp_path / "doc.txt"
  p.write_bytes(b"fine line\nbad \xff here\n")
  c = cfg(source="text_files", glob=str(p), validation_fraction=0.0)
  with pytest.raises(ValueError, match=r"doc.txt: undecodable UTF-8 at byte offset 14"):
    rows(c, "train")
  with pytest.raises(ValueError, match=r"doc.txt: undecodable UTF-8 at byte offset 14"):
    rows(cfg(source="text_files", glob=str(p), validation_fraction=0.0, txt_rows="line"), "train")
  j = tmp_path / "doc.jsonl"
  j.write_bytes(b'{"text": "a"}\n{"text": "\xc3("}\n')
  with pytest.raises(ValueError, match=r"doc.jsonl: undecodable UTF-8 at byte offset 24"):
    rows(cfg(source="text_files", glob=str(j), validation_fraction=0.0), "train")


def test_text_files_whole_file_rows_and_glob_errors(tmp_path):
  (tmp_path / "a.txt").write_text("doc a\nline 2\n")
  (tmp_path / "b.txt").write_text("doc b")
  c = cfg(source="text_files", glob=str(tmp_path / "*.txt"), validation_fraction=0.0)
  assert rows(c, "train") == ["doc a\nline 2\n", "doc b"]
  with pytest.raises(FileNotFoundError, match="data.glob .* matches no file"):
    rows(cfg(source="text_files", glob=str(tmp_path / "*.md")), "train")
  with pytest.raises(ValueError, match="data.glob: text_files needs a glob"):
    rows(cfg(source="text_files"), "train")


def test_held_out_split_is_deterministic_and_disjoint(tmp_path):
  docs = [f"document number {i}" for i in range(400)]
  (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  c = cfg(source="text_files", glob=str(tmp_path / "d.jsonl"), validation_fraction=0.1)
  train, val = rows(c, "train"), rows(c, "validation")
  assert sorted(train + val) == sorted(docs) and not set(train) & set(val)
  assert 15 <= len(val) <= 70                      # about 10%
  assert rows(c, "validation") == val              # same rows every time


def test_held_out_text_split_with_blank_and_repeated_lines(tmp_path):
  # Most plain text: blank lines, repeated short lines. The held-out share of the TEXT must be
  # the validation fraction, no empty rows, and the held-out rows must look like the train rows
  # (a content hash sent every blank line and every repeated "}" to one side).
  rng = np.random.default_rng(0)
  lines = []
  for i in range(3000):
    kind = rng.integers(4)
    lines.append(["", "}", "    return x", f"def function_{i}(a, b): return a * {i} + b"][kind])
  (tmp_path / "code.txt").write_text("\n".join(lines) + "\n")
  c = cfg(source="text_files", glob=str(tmp_path / "code.txt"), validation_fraction=0.1,
          txt_rows="line")
  train, val = rows(c, "train"), rows(c, "validation")
  assert all(r.strip() for r in train + val)
  nonempty = [ln + "\n" for ln in lines if ln]
  assert sorted(train + val) == sorted(nonempty)
  share = sum(map(len, val)) / sum(map(len, nonempty))
  assert abs(share - 0.1) < 0.01, share
  mean = lambda rs: sum(map(len, rs)) / len(rs)
  assert abs(mean(val) / mean(train) - 1) < 0.25, (mean(val), mean(train))
  origin = sources.raw_split(c, "validation").origin
  assert "validation_fraction 0.1" in origin and "empty rows dropped" in origin


def test_validation_glob(tmp_path):
  (tmp_path / "t.txt").write_text("train doc")
  (tmp_path / "v.txt").write_text("val doc")
  c = cfg(source="text_files", glob=str(tmp_path / "t.txt"),
          validation_glob=str(tmp_path / "v.txt"))
  assert rows(c, "train") == ["train doc"] and rows(c, "validation") == ["val doc"]


def test_openwebtext_local_dir_without_split_names(tmp_path):
  (tmp_path / "urlsf_subset00-1_data").mkdir()
  for i in range(30):
    (tmp_path / "urlsf_subset00-1_data" / f"{i:04d}.txt").write_text(f"web page {i}")
  c = cfg(source="openwebtext", path=str(tmp_path), validation_fraction=0.2)
  train, val = rows(c, "train"), rows(c, "validation")
  assert len(train) + len(val) == 30 and val and train


def test_unknown_source_and_split():
  with pytest.raises(ValueError, match="unknown source 'owt'"):
    sources.raw_split(cfg(source="owt"), "train")
  with pytest.raises(ValueError, match="'lambada' has splits \\['test'\\], not 'train'"):
    sources.raw_split(cfg(source="lambada"), "train")
  with pytest.raises(FileNotFoundError, match="data.path '/nonexistent/x' does not exist"):
    sources.raw_split(cfg(source="ptb", path="/nonexistent/x"), "test")


def test_download_without_datasets_package_says_what_to_do(monkeypatch):
  real_import = builtins.__import__

  def fake_import(name, *a, **k):
    if name == "datasets":
      raise ImportError("no datasets")
    return real_import(name, *a, **k)
  monkeypatch.setattr(builtins, "__import__", fake_import)
  with pytest.raises(ImportError, match="requirements-download.txt.*--path"):
    sources.raw_split(cfg(source="wikitext103"), "test")


def test_sources_table():
  assert sources.ZERO_SHOT == {"wikitext2": "train", "wikitext103": "test", "ptb": "test",
                               "lambada": "test", "lm1b": "test"}
  for name, split in sources.ZERO_SHOT.items():
    assert split in sources.SOURCES[name].splits and sources.SOURCES[name].detokenizer
  assert sources.SOURCES["openwebtext"].held_out


def test_hf_download_path(monkeypatch, tmp_path):
  datasets = pytest.importorskip("datasets")
  calls = []

  def fake_load_dataset(path, name=None, split=None, cache_dir=None, num_proc=None):
    calls.append((path, name, split, cache_dir))
    return datasets.Dataset.from_dict({"text": [f" row {i} @-@ x \n" for i in range(2500)]})
  monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
  r = sources.raw_split(cfg(source="wikitext103", hf_cache_dir=str(tmp_path)), "test")
  got = list(r.rows)
  assert calls == [("Salesforce/wikitext", "wikitext-103-raw-v1", "test", str(tmp_path))]
  assert len(got) == r.total_rows == 2500 and got[1234] == " row 1234 @-@ x \n"
  assert r.origin == "hf:Salesforce/wikitext/wikitext-103-raw-v1:test"


def test_lambada_url_download(monkeypatch, tmp_path):
  import urllib.request
  urls = []

  def fake_urlretrieve(url, dest):
    urls.append(url)
    pathlib.Path(dest).write_text("".join(json.dumps({"text": t}) + "\n" for t in ("one", "two")))
  monkeypatch.setattr(urllib.request, "urlretrieve", fake_urlretrieve)
  c = cfg(source="lambada", cache_dir=str(tmp_path))
  assert rows(c, "test") == ["one", "two"]
  assert rows(c, "test") == ["one", "two"]  # the second time from the cached copy
  assert urls == ["https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl"]
  assert (tmp_path / "raw" / "lambada" / "lambada_test.jsonl").exists()
