"""Every `convert` failure on a bad file is one line naming the file and the problem (exit 1, no
traceback; ``--verbose`` shows it), and --trust_pickle is advised only where it would help. The
same files through --checkpoint=SPEC give one CheckpointSpecError line."""

import argparse
import os

import numpy as np
import pytest

from helpers import published as pu
from aogpt_jax.checkpoints import spec as checkpoint_spec
from aogpt_jax.checkpoints import convert

torch = pytest.importorskip("torch", reason="needs torch (pip install -r requirements-extra.txt)")

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("bad")
  ok = pu.published_pt(d / "ok.pt", block_size=32)
  data = open(ok, "rb").read()
  out = {"ok": ok}

  def write(name, payload):
    (d / name).write_bytes(payload)
    out[name.split(".")[0]] = str(d / name)

  write("truncated.pt", data[:len(data) // 2])
  write("garbage.pt", np.random.default_rng(0).bytes(5000))
  write("text.pt", b"hello, not a checkpoint\n")
  write("empty.pt", b"")
  flipped = bytearray(data)                       # bytes overwritten inside the pickle
  at = flipped.index(b"data.pkl")
  flipped[at + 100:at + 300] = b"\xff" * 200
  write("flipped.pt", bytes(flipped))
  torch.save([1, 2, 3], d / "list.pt")
  out["list"] = str(d / "list.pt")
  torch.save({"model": {"transformer.wte.weight": torch.zeros(4, 2)}}, d / "mismatch.pt")
  out["mismatch"] = str(d / "mismatch.pt")
  sd = torch.load(ok, weights_only=True)
  sd["ema_model"]["shadow_params"] = sd["ema_model"]["shadow_params"][:-1]
  torch.save(sd, d / "short_ema.pt")
  out["short_ema"] = str(d / "short_ema.pt")
  torch.save({"model": sd["model"], "args": argparse.Namespace(lr=1)}, d / "pickled.pt")
  out["pickled"] = str(d / "pickled.pt")
  return out


def _one_line(capsys, argv) -> str:
  with pytest.raises(SystemExit) as e:
    convert.main(argv)
  msg = str(e.value.code)
  assert e.value.code != 0 and "\n" not in msg.strip(), msg
  assert "Traceback" not in capsys.readouterr().err
  return msg


@pytest.mark.parametrize("name,want", [
    ("truncated", "truncated or corrupt"),
    ("garbage", "not a PyTorch checkpoint"),
    ("text", "not a PyTorch checkpoint"),
    ("empty", "empty"),
    ("flipped", "corrupt"),
    ("list", "no 'model' state dict"),
    ("mismatch", "neither AO-GPT"),
    ("short_ema", "shadow_params has"),
    ("missing", "does not exist"),
])
def test_bad_checkpoint_is_one_line(files, tmp_path, capsys, name, want):
  path = files.get(name, str(tmp_path / "missing.pt"))
  for extra in ([], ["--trust_pickle"]):
    msg = _one_line(capsys, ["import", "--ckpt", path, "--out", str(tmp_path / "o")] + extra)
    assert want in msg and path in msg, msg
    assert "--trust_pickle" not in msg, msg        # it would fail the same way
  spec_want = "no such file" if name == "missing" else want
  with pytest.raises(checkpoint_spec.CheckpointSpecError, match=spec_want) as e:
    checkpoint_spec.load(path)
  assert "\n" not in str(e.value) and path in str(e.value)


def test_trust_pickle_is_advised_only_where_it_helps(files, tmp_path, capsys):
  msg = _one_line(capsys, ["import", "--ckpt", files["pickled"], "--out", str(tmp_path / "o")])
  assert "argparse.Namespace" in msg and "--trust_pickle" in msg
  convert.main(["import", "--ckpt", files["pickled"], "--out", str(tmp_path / "o"),
                "--which", "params", "--trust_pickle"])
  assert os.path.exists(tmp_path / "o" / "params" / "model.safetensors")


def test_verbose_shows_the_traceback(files, tmp_path):
  with pytest.raises(ValueError, match="truncated or corrupt"):
    convert.main(["import", "--ckpt", files["truncated"], "--out", str(tmp_path / "o"),
                  "--verbose"])


def test_export_errors_are_one_line(tmp_path, capsys):
  msg = _one_line(capsys, ["export", "--workdir", str(tmp_path / "no_run"), "--out",
                           str(tmp_path / "o")])
  assert "no_run" in msg
