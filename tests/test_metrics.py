"""Metric writers and the FLOP count behind tokens/s and MFU."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.train import metrics as metrics_lib
from aogpt_jax.train import flops as flops_lib
from aogpt_jax.model import aogpt as model_lib


@pytest.mark.parametrize("target", ["adaln", "none"])
def test_forward_flops_match_xla_cost_analysis(target):
  """Independent count: XLA's own cost analysis of the compiled forward pass. XLA's attention
  computes the masked half too, hence ``causal=False``; the rest (norms, softmax, GELU) is a few
  percent at this width."""
  mc = model_lib.ModelConfig(vocab_size=320, valid_vocab_size=257, block_size=64, n_layer=2,
                             n_head=4, n_embd=256, target=target, target_dim=32)
  m = model_lib.AOGPT(mc, rngs=nnx.Rngs(0))
  b, n = 4, 64
  tokens = jnp.zeros((b, n), jnp.int32)
  order = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  graphdef, params = nnx.split(m)
  fwd = jax.jit(lambda p, t, o: nnx.merge(graphdef, p)(t, o))
  cost = fwd.lower(params, tokens, order).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  ours = flops_lib.forward_flops(mc, b, n, causal=False)
  assert ours == pytest.approx(cost["flops"], rel=0.08), (ours, cost["flops"])
  assert ours > flops_lib.forward_flops(mc, b, n, causal=True)


def test_train_flops_are_three_forwards_per_microbatch():
  mc = model_lib.PRESETS["small"]
  one = flops_lib.train_flops_per_step(mc, 512, 1024)
  assert one == pytest.approx(3 * flops_lib.forward_flops(mc, 512, 1024))
  # The usual estimate 6 N + 6 L d n per token (N without embeddings) within a percent.
  n_matmul = 12 * 12 * 768 ** 2 + 768 * 50304
  assert one / (512 * 1024) == pytest.approx(6 * n_matmul + 6 * 12 * 768 * 1025, rel=0.01)
  assert flops_lib.train_flops_per_step(mc, 512, 1024, microbatches=8) == pytest.approx(
      one, rel=1e-3)
  assert flops_lib.peak_flops(jax.devices("cpu")[0]) is None       # no MFU on CPU


def test_writer_jsonl_tensorboard_and_resume(tmp_path):
  w = metrics_lib.MetricWriter(tmp_path)
  for step in (10, 20, 30):
    w.write_scalars(step, {"train/loss": 1.0 / step, "train/lr": np.float32(1e-3)})
  w.write_scalars(30, {"eval/loss_l2r": float("nan")})
  w.close()
  lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [x["step"] for x in lines] == [10, 20, 30, 30]
  assert lines[0]["train/loss"] == pytest.approx(0.1) and lines[3]["eval/loss_l2r"] == "nan"
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  # A killed run left a torn line; resuming from step 20 drops it and everything after 20.
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 40, "train/lo')
  metrics_lib.MetricWriter(tmp_path, resume_step=20).close()
  steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert steps == [10, 20]


def test_progress_excludes_paused_time_and_formats_eta():
  p = metrics_lib.Progress(start_step=0, total_steps=100)
  with p.paused():
    pass
  rate, eta = p.window(10)
  assert rate > 0 and eta == pytest.approx(90 / rate)
  assert metrics_lib.format_duration(3725) == "1h02m05s"
  assert metrics_lib.format_duration(65) == "1m05s"
  assert metrics_lib.format_duration(float("inf")) == "?"


def test_progress_log_lines_have_an_eta_and_skip_the_first_item(monkeypatch, caplog):
  """eval / sample progress (issue 16): the first item (compilation) is not in the rate."""
  now = [100.0]
  monkeypatch.setattr(metrics_lib.time, "perf_counter", lambda: now[0])
  caplog.set_level("INFO")
  p = metrics_lib.ProgressLog("eval heldout batches", 11, every=5.0)
  now[0] += 60.0           # compiling
  p.update(1)
  for i in range(2, 12):
    now[0] += 2.0
    p.update(i)
  lines = [r.getMessage() for r in caplog.records]
  assert lines == [f"eval heldout batches: {i}/11 ({100 * i / 11:.0f}%), {t} elapsed, ETA {eta}"
                   for i, t, eta in ((2, "1m02s", "0m18s"), (5, "1m08s", "0m12s"),
                                     (8, "1m14s", "0m06s"))] + [
                       "eval heldout batches: 11/11 (100%), done in 1m20s"]
  caplog.clear()
  one = metrics_lib.ProgressLog("sample batches", 1)   # 1/1: no "ETA ?"
  now[0] += 3.0
  one.update(1)
  assert [r.getMessage() for r in caplog.records] == ["sample batches: 1/1 (100%), done in 0m03s"]


def test_memory_line_names_the_options_and_warns_over_the_device_limit():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  mem = {"argument_bytes": 2 * 2**30, "temp_bytes": 15 * 2**30, "output_bytes": 0,
         "alias_bytes": 0, "peak_bytes": 17 * 2**30}
  opts = flops_lib.memory_options(model_lib.preset("small", remat=True, loss_chunk=1024), 8)
  assert opts == "attention_impl=auto, loss_chunk=1024, remat=block, microbatches=8"
  assert flops_lib.memory_options(model_lib.preset("small")).endswith(
      "loss_chunk=off, remat=off, microbatches=1")
  line = flops_lib.memory_line(mesh, mem, 16 * 2**30, opts)
  assert f"(XLA; {opts})" in line and "peak ~17.00 GiB (106% of the 16.00 GiB" in line, line
  warn = flops_lib.memory_warning(mem, 16 * 2**30)
  assert "\n" not in warn and "17.00 GiB per device" in warn and "exceeds the device's 16.00" in warn
  assert flops_lib.memory_warning(mem, 20 * 2**30) is None
  assert flops_lib.memory_warning(mem, None) is None     # CPU: limit unknown


def test_a_full_disk_while_writing_metrics_is_one_error_naming_step_and_folder(tmp_path):
  import errno
  from aogpt_jax.train import metrics as metrics_lib
  w = metrics_lib.MetricWriter(tmp_path)
  w.write_scalars(1, {"train/loss": 1.0})

  class Full:
    def write(self, _):
      raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
      pass

    def close(self):
      raise OSError(errno.ENOSPC, "No space left on device")

  w._jsonl = Full()
  with pytest.raises(metrics_lib.MetricsWriteError,
                     match=rf"^metrics: writing step 7 to {tmp_path} .*No space left on device"):
    w.write_scalars(7, {"train/loss": 1.0})
  w.write_scalars(8, {"train/loss": 1.0})     # nothing more is tried, nothing raised
  w.flush()
  w.close()
