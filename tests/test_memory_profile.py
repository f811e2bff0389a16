"""benchmarks/memory_profile.py: the live-range parser, and on a real (tiny) compile the buffers
at XLA's peak carry their jax op and project source line."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import memory_profile  # noqa: E402


def test_peak_buffers_parses_the_live_range_dump():
  text = ("HloLiveRange (max 9):\n  BufferLiveRange:\n    a{}:0-3\n"
          "  Live ranges at 5 (peak):\n"
          "    small{}: 10 bytes (cumulative: 10 bytes)\n"
          "    big.1{1}: 300 bytes (cumulative: 310 bytes)\n"
          "  Stack trace breakdown for peak usage: 310 bytes\n")
  assert memory_profile.peak_buffers(text) == (5, [("big.1{1}", 300), ("small{}", 10)])


@pytest.mark.slow
def test_profile_of_a_tiny_gradient_names_ops_and_sources():
  # The same program compiled first: JAX's persistent compilation cache (on in the tests,
  # conftest.py) now holds it, and the profile still compiles for real (a hit writes no dump).
  memory_profile.grad_lowered("tiny", 2, 64, {"n_layer": 1, "remat": True})[0].compile()
  r = memory_profile.profile("tiny", batch=2, seq_len=64,
                             overrides={"n_layer": 1, "remat": True}, top=8)
  assert r["temp_bytes"] > 0 and r["n_layer"] == 1
  assert r["top"] and r["top"][0]["bytes"] >= r["top"][-1]["bytes"]
  # At least one of the largest buffers comes from a named jax op in the package's sources.
  named = [b for b in r["top"] if b["op_name"] and b["source"]]
  assert named and all(s.startswith("aogpt_jax/") for b in named for s in b["source"]), r["top"]
