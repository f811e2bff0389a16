"""``--mode=dpo`` (posttrain/dpo_run.py on the loop of posttrain/run.py): a few DPO updates from a
tiny Sudoku run write checkpoints, every metric per update and the held-out eval (equal to the
trainer's own metrics on all held-out pairs at once); a resumed run ends bitwise where an
uninterrupted one does; bad settings are one-line errors before anything is written."""

import json
import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from aogpt_jax import config as config_lib
from aogpt_jax.checkpoints import store
from aogpt_jax.posttrain import dpo, dpo_run
from helpers import posttrain as pt
from helpers import trainer as tu

# 8 pairs per update: one per fake device (tests/conftest.py); 12 held-out pairs: the eval's
# second batch wraps. Random orders: the keys must come from the step for a bitwise resume.
DPO = {"task.heldout_count": 12, "total_steps": 4, "log_every": 2, "eval_every": 2, "checkpoint_every": 2,
       "dpo.pairs": 8, "dpo.order": "random", "dpo.orders": 2, "dpo.lr": 1e-3,
       "dpo.beta": 0.5, "dpo.ema_decay": 0.9}
METRICS = {"dpo/" + k for k in dpo_run.METRICS} | {"dpo/grad_norm", "dpo/update_sec"}


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
  """The tiny configs/sudoku.py:tiny run (10 steps, shared): the starting weights of every DPO run
  here."""
  return pt.train_start(tmp_path_factory)


def dpo_config(sft, **overrides):
  return pt.config("dpo_sudoku.py", **{"train.init_from": str(sft), **DPO, **overrides})


def _lines(workdir):
  rows = [json.loads(x) for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text()
          .splitlines()]
  return [{k: v for k, v in r.items() if not k.endswith("_sec")} for r in rows]


@pytest.fixture(scope="module")
def full(sft, tmp_path_factory):
  wd = tmp_path_factory.mktemp("dpo") / "full"
  return wd, dpo_run.dpo_mode(dpo_config(sft), str(wd))


@pytest.mark.slow
def test_dpo_run_writes_checkpoints_metrics_and_the_heldout_eval(sft, full):
  wd, last = full
  assert tu.checkpoint_steps(wd) == [2, 4]
  rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
  updates = [r for r in rows if "dpo/loss" in r]
  evals = [r for r in rows if "eval/accuracy" in r]
  assert [r["step"] for r in updates] == [1, 2, 3, 4]
  assert all(set(r) == METRICS | {"step"} for r in updates), updates[0].keys()
  assert [r["step"] for r in evals] == [2, 4]
  assert set(evals[0]) == {"step"} | {"eval/" + k for k in dpo_run.METRICS}
  # the first update starts at the reference: margin 0, loss log 2
  assert abs(updates[0]["dpo/margin"]) < 1e-5 and abs(updates[0]["dpo/loss"] - np.log(2)) < 1e-5
  run = json.loads((wd / "config.json").read_text())
  assert run["dpo"]["order"] == "random" and run["train"]["init_from"] == str(sft)
  # the eval equals the trainer's metrics on all 12 held-out pairs at once, EMA weights, the
  # same orders key; the policy moved away from the reference
  cfg = dpo_config(sft)
  task = config_lib.task_of(cfg)
  held = dpo.heldout_preferences(task, 0, 12, cfg.dpo.max_changes)
  m, _ = store.load_model(wd)
  start, _ = store.load_model(sft)
  trainer = dpo.DPO(m, dpo.settings_from_config(cfg.dpo), reference=start)
  want = trainer.evaluate(held, jax.random.key(int(cfg.seed)))     # one batch, its own orders
  for k in dpo_run.METRICS:
    np.testing.assert_allclose(last[f"eval/{k}"], want[k], rtol=1e-4, atol=1e-6, err_msg=k)
  assert abs(want["margin"]) > 1e-5
  moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                       nnx.state(m, nnx.Param), nnx.state(start, nnx.Param))
  assert max(jax.tree.leaves(moved)) > 1e-4


@pytest.mark.slow
def test_a_resumed_dpo_run_equals_the_uninterrupted_one_bitwise(sft, full, tmp_path):
  wd_full, _ = full
  wd = tmp_path / "resumed"
  dpo_run.dpo_mode(dpo_config(sft, total_steps=2), str(wd))
  assert tu.checkpoint_steps(wd) == [2]
  dpo_run.dpo_mode(dpo_config(sft), str(wd))
  with ocp.StandardCheckpointer() as c:
    for k in ("params", "ema", "opt_state"):
      a = c.restore(wd_full / "checkpoints" / "4" / k)
      b = c.restore(wd / "checkpoints" / "4" / k)
      jax.tree.map(np.testing.assert_array_equal, a, b)
  assert _lines(wd) == _lines(wd_full)


@pytest.mark.slow
@pytest.mark.parametrize("overrides,match", [
    ({"dpo.beta": 0.0}, r"^dpo.beta: must be a finite number > 0"),
    ({"dpo.order": "r2l"}, r"^dpo.order: must be one of"),
    ({"dpo.orders": 0}, r"^dpo.orders: must be an integer >= 1"),
    ({"dpo.pairs": 3}, r"^dpo.pairs: 3 pairs must split evenly over the 8 data-parallel"),
    ({"dpo.ema_decay": 1.0}, r"^dpo.ema_decay: must be in \[0, 1\)"),
    ({"train.init_from": ""}, r"^train.init_from: --mode=dpo starts from a trained model"),
    ({"task.name": ""}, r"^task.name: --mode=dpo needs a task"),
    ({"dpo.reference": "/no/such/run"}, r"^dpo.reference: /no/such/run: no such folder or "),
    ({"train.init_from": "/no/such/run"}, r"^train.init_from: /no/such/run: no such folder or "),
])
def test_bad_settings_are_one_line_errors_before_anything_runs(sft, tmp_path, overrides, match):
  wd = tmp_path / "w"
  with pytest.raises(config_lib.ConfigError, match=match) as e:
    dpo_run.dpo_mode(dpo_config(sft, **overrides), str(wd))
  assert "\n" not in str(e.value) and "--checkpoint" not in str(e.value)
  assert not wd.exists()


@pytest.mark.slow
def test_a_reference_of_another_shape_is_one_line(sft, tmp_path, tmp_path_factory):
  other = pt.other_shape(tmp_path_factory)
  with pytest.raises(config_lib.ConfigError, match=r"^dpo.reference: the reference model "
                     r"differs in shape"):
    dpo_run.dpo_mode(dpo_config(sft, **{"dpo.reference": str(other)}), str(tmp_path / "w"))


def test_dpo_group_holds_every_dpo_setting():
  import dataclasses  # pylint: disable=g-import-not-at-top
  cfg = config_lib.default_config()
  assert {f.name for f in dataclasses.fields(dpo.DPOSettings)} | set(dpo.RUN_KEYS) == set(
      cfg.dpo.keys())
  assert dpo.settings_from_config(cfg.dpo) == dpo.DPOSettings()
