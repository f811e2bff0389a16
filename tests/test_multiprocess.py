"""Multi-host data parallelism on one machine: two JAX processes (one CPU device each, gloo
collectives, coordinator on 127.0.0.1) train a few steps through ``python -m aogpt_jax.main``
and end with the parameters of one process training on the same global batches."""

import socket

import jax
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax import data as data_lib
from helpers.trainer import cli_args, run, start, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

RUN = dict(total_steps=6, checkpoint_every=3, log_every=3, eval_every=6, batch_size=8)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _params(workdir, which):
  m, _ = checkpoint_lib.load_model(workdir, which=which)
  return jax.device_get(nnx.to_pure_dict(nnx.state(m, nnx.Param)))


def test_two_processes_equal_one_process(tmp_path):
  cache = tmp_path / "cache"
  cfg = tiny_config(cache)
  for split in ("train", "validation"):      # build the token cache before the processes race
    data_lib.token_stream(cfg.data, split)

  port = _free_port()
  multi = tmp_path / "two_processes"
  procs = [start(cli_args(cache, multi, **RUN, **{
      "distributed.enabled": True, "distributed.coordinator_address": f"127.0.0.1:{port}",
      "distributed.num_processes": 2, "distributed.process_id": i}), tmp_path / f"p{i}.log")
           for i in range(2)]
  single = tmp_path / "one_process"
  run(cli_args(cache, single, **RUN), tmp_path / "single.log")
  for i, p in enumerate(procs):
    rc = p.wait(timeout=240)
    assert rc == 0, (tmp_path / f"p{i}.log").read_text()[-4000:]

  log0, log1 = (tmp_path / "p0.log").read_text(), (tmp_path / "p1.log").read_text()
  assert "process 0 of 2" in log0 and "process 1 of 2" in log1
  assert "step 6/6" in log0 and "step 6/6" not in log1          # only process 0 logs metrics
  assert (multi / "checkpoints" / "6").is_dir()
  # Each process saved its own data-iterator position.
  assert len(list((multi / "checkpoints" / "6" / "data").glob("process_*"))) == 2
  for which in ("params", "ema"):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 _params(multi, which), _params(single, which))
