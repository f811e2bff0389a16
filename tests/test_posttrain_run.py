"""``--mode=rl`` (posttrain/rl.py on the loop of posttrain/run.py): a few GRPO updates from a tiny
Sudoku run write the trainer's checkpoints, metrics.jsonl with every metric, the held-out eval
and config.json, compiling nothing after the first update; a run stopped early and resumed ends
bitwise where an uninterrupted one does (params, EMA, optimizer state and metrics); bad settings
are one-line errors before anything compiles or is written, a reward that returns NaN one line
before any update uses it."""

import json
import logging
import pathlib
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from aogpt_jax import config as config_lib
from aogpt_jax.checkpoints import store
from aogpt_jax.posttrain import grpo, rl
from helpers import posttrain as pt
from helpers import trainer as tu

# 2 prompts x 4 rollouts: 8 rows, one per fake device (tests/conftest.py); cell_accuracy, not
# solved: a barely trained model solves nothing, and all-equal rewards give no gradient. One
# cell per step (rl_sudoku.py's): the sampler's sizes follow the prompt lengths, reserved for the
# task's range when the trainer is built.
RL = {"total_steps": 4, "log_every": 2, "eval_every": 2, "checkpoint_every": 2,
      "rl.prompts": 2, "rl.group_size": 4, "rl.reward": "cell_accuracy", "rl.lr": 1e-3,
      "rl.kl_coef": 0.1, "rl.ema_decay": 0.9}
METRICS = {"rl/reward", "rl/reward_std", "rl/solved", "rl/loss", "rl/grad_norm", "rl/kl",
           "rl/clipped", "rl/ratio", "rl/ratio_min", "rl/ratio_max", "rl/rollout_sec",
           "rl/update_sec", "rl/rollouts_per_sec", "rl/update_share"}


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
  """The tiny configs/sudoku.py:tiny run (10 steps, shared): the starting weights of every RL run
  here."""
  return pt.train_start(tmp_path_factory)


def rl_config(sft, **overrides):
  return pt.config("rl_sudoku.py", **{"train.init_from": str(sft), **RL, **overrides})


def _state(workdir, step):
  """The arrays of checkpoint ``step`` (params, EMA, optimizer state) as numpy."""
  with ocp.StandardCheckpointer() as c:
    return {k: jax.tree.map(np.asarray, c.restore(pathlib.Path(workdir) / "checkpoints" /
                                                  str(step) / k))
            for k in ("params", "ema", "opt_state")}


def _lines(workdir, timed=False):
  rows = [json.loads(x) for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text()
          .splitlines()]
  timing = lambda k: k.endswith(("_sec", "update_share"))  # noqa: E731
  return rows if timed else [{k: v for k, v in r.items() if not timing(k)} for r in rows]


@pytest.fixture(scope="module")
def full(sft, tmp_path_factory):
  """An uninterrupted 4-update run; the compilations during each update."""
  wd = tmp_path_factory.mktemp("rl") / "full"
  root = logging.getLogger()
  level = root.level
  root.setLevel(logging.INFO)          # the INFO lines reach WORKDIR/train.log
  update, compiles = rl.GRPOAlgorithm.update, []

  def counted(self, *args):
    with pt.Compiles() as c:
      out = update(self, *args)
    compiles.append(c.count)
    return out

  rl.GRPOAlgorithm.update = counted
  try:
    last = rl.rl_mode(rl_config(sft), str(wd))
  finally:
    rl.GRPOAlgorithm.update = update
    root.setLevel(level)
  return wd, last, compiles


@pytest.mark.slow
def test_rl_run_writes_checkpoints_metrics_eval_and_config(sft, full):
  wd, last, compiles = full
  assert compiles[0] > 0 and compiles[1:] == [0, 0, 0], compiles
  assert tu.checkpoint_steps(wd) == [2, 4]
  rows = _lines(wd, timed=True)
  updates = [r for r in rows if "rl/reward" in r]
  evals = [r for r in rows if "eval/solved" in r]
  assert [r["step"] for r in updates] == [1, 2, 3, 4]
  assert all(set(r) == METRICS | {"step"} for r in updates), updates[0].keys()
  assert [r["step"] for r in evals] == [2, 4]
  assert set(evals[0]) == {"step", "eval/solved", "eval/solved_low", "eval/solved_high",
                           "eval/cell_accuracy"}
  assert all(0 <= r["eval/solved_low"] <= r["eval/solved"] <= r["eval/solved_high"] <= 1
             for r in evals)
  assert all(r["rl/ratio_min"] <= r["rl/ratio"] <= r["rl/ratio_max"] for r in updates)
  assert all(r["rl/grad_norm"] > 0 and r["rl/kl"] > -1e-6 for r in updates)   # KL: rounding
  assert updates[-1]["rl/kl"] > 1e-6         # to the starting weights, which the policy left
  assert all(r["rl/rollouts_per_sec"] > 0 and 0 < r["rl/update_share"] < 1 for r in updates)
  assert last["eval/cell_accuracy"] == evals[-1]["eval/cell_accuracy"]
  # the run says what produced it: its resolved config, the starting weights and the rl group
  run = json.loads((wd / "config.json").read_text())
  assert run["train"]["init_from"] == str(sft) and run["rl"]["reward"] == "cell_accuracy"
  assert run["task"]["name"] == "sudoku" and run["model"]["n_embd"] == 32
  log = (wd / "train.log").read_text()
  assert "rl update 4/4" in log and "held-out solved" in log and "rl finished: 4 updates" in log
  # other modes read it as a trained run: the EMA weights, moved away from the starting ones
  m, run_cfg = store.load_model(wd)
  assert run_cfg.loaded.step == 4 and run_cfg.loaded.weights == "ema"
  start, _ = store.load_model(sft)
  moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                       nnx.state(m, nnx.Param), nnx.state(start, nnx.Param))
  assert max(jax.tree.leaves(moved)) > 1e-4


@pytest.mark.slow
def test_stopped_and_resumed_run_equals_the_uninterrupted_one_bitwise(sft, full, tmp_path):
  wd_full = full[0]
  wd = tmp_path / "resumed"
  rl.rl_mode(rl_config(sft, total_steps=2), str(wd))      # stops at 2 (its checkpoint)
  assert tu.checkpoint_steps(wd) == [2]
  rl.rl_mode(rl_config(sft), str(wd))                      # resumes to 4
  a, b = _state(wd_full, 4), _state(wd, 4)
  for k in a:
    jax.tree.map(np.testing.assert_array_equal, a[k], b[k])
  assert _lines(wd) == _lines(wd_full)
  assert (wd / "train.log").exists()
  # already at total_steps: nothing to do, nothing written
  assert rl.rl_mode(rl_config(sft), str(wd)) == {}
  with pytest.raises(config_lib.ConfigError, match=r"^total_steps: 3 is below the newest"):
    rl.rl_mode(rl_config(sft, total_steps=3), str(wd))


@pytest.mark.slow
@pytest.mark.parametrize("overrides,match", [
    ({"rl.reward": "nope"}, r"^rl.reward: unknown reward 'nope'; expected one of"),
    ({"rl.group_size": 1}, r"^rl.group_size: must be an int >= 2"),
    ({"rl.prompts": 0}, r"^rl.prompts: must be an integer >= 1"),
    ({"rl.prompts": 3, "rl.group_size": 3}, r"^rl.prompts: 3 prompts x rl.group_size 3 "),
    ({"rl.method": "speculative"}, r"^rl.method: must be one of"),
    ({"rl.ema_decay": 1.0}, r"^rl.ema_decay: must be in \[0, 1\)"),
    ({"train.init_from": ""}, r"^train.init_from: --mode=rl starts from a trained model"),
    ({"task.name": ""}, r"^task.name: --mode=rl needs a task"),
    ({"task.options": {"size": 4}}, r"^seq_len: 36: task 'sudoku' rows are 16 tokens"),
    ({"rl.kl_coef": 0.0, "rl.reference": "/x"}, r"^rl.reference: '/x' is used only by the KL"),
    ({"rl.reference": "/no/such/run"}, r"^rl.reference: /no/such/run: no such folder or "),
    ({"train.init_from": "/no/such/run"}, r"^train.init_from: /no/such/run: no such folder or "),
    ({"rl.temperature": 0.0}, r"^rl.temperature: must be a finite number >= "),
    # SILENT-WRONG: the run trained the loaded blank-block model but recorded blank_block=False
    ({"model.blank_block": False}, r"^train.init_from: .* was trained with "
                                   r"model.blank_block=True \(the config has False\)"),
    ({"rl.max_grad_norm": -1.0}, r"^rl.max_grad_norm: must be a finite number >= 0"),
])
def test_bad_settings_are_one_line_errors_before_anything_runs(sft, tmp_path, overrides, match):
  wd = tmp_path / "w"
  with pytest.raises(config_lib.ConfigError, match=match) as e:
    rl.rl_mode(rl_config(sft, **overrides), str(wd))
  assert "\n" not in str(e.value) and "--checkpoint" not in str(e.value)
  assert not wd.exists()                  # nothing written: the checks come first


@pytest.mark.slow
def test_a_reward_that_returns_nan_is_one_line_before_any_update(sft, tmp_path, monkeypatch):
  def nan_reward(tokens, puzzles, task):
    return np.where(np.arange(len(tokens)) == 5, np.nan, 0.5)

  monkeypatch.setitem(grpo.REWARDS, "nan_reward", nan_reward)
  wd = tmp_path / "w"
  with pytest.raises(ValueError, match=r"^rl.reward: 'nan_reward' returned nan for rollout 5 "
                     r"\(1 of 8 not finite\)") as e:
    rl.rl_mode(rl_config(sft, **{"rl.reward": "nan_reward"}), str(wd))
  assert "\n" not in str(e.value)
  metrics = wd / "metrics.jsonl"
  assert tu.checkpoint_steps(wd) == [] and not (metrics.exists() and metrics.read_text().strip())


@pytest.mark.slow
def test_a_reference_of_another_shape_is_one_line(sft, tmp_path, tmp_path_factory):
  other = pt.other_shape(tmp_path_factory)
  with pytest.raises(config_lib.ConfigError, match=r"^rl.reference: the reference model's "
                     r"parameters differ in shape"):
    rl.rl_mode(rl_config(sft, **{"rl.reference": str(other)}), str(tmp_path / "w"))
  with pytest.raises(config_lib.ConfigError, match=r"^train.init_from: .* is a different model: "
                     r"model.n_embd=16"):
    rl.rl_mode(rl_config(sft, **{"train.init_from": str(other)}), str(tmp_path / "w"))


def test_rl_group_holds_every_grpo_setting():
  import dataclasses  # pylint: disable=g-import-not-at-top
  from aogpt_jax.posttrain import settings  # pylint: disable=g-import-not-at-top
  cfg = config_lib.default_config()
  fields = dataclasses.fields(grpo.GRPOSettings)
  assert {f.name for f in fields} | set(settings.RUN_KEYS) == set(cfg.rl.keys())
  assert settings.grpo_settings(cfg.rl) == grpo.GRPOSettings()


@pytest.mark.slow
@pytest.mark.subprocess
def test_command_line_runs_and_sigterm_saves(sft, tmp_path):
  """``--mode=rl`` from the command line: SIGTERM mid-run saves and exits 0; the same command
  resumes and finishes with the summary line."""
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  wd = tmp_path / "cli"
  flat = {**pt.SIZE, **RL, "train.init_from": str(sft), "total_steps": 2000, "eval_every": 0,
          "checkpoint_every": 0, "log_every": 1}
  args = [sys.executable, "-m", "aogpt_jax.main", "--config=configs/rl_sudoku.py:tiny",
          f"--workdir={wd}", "--mode=rl"] + [f"--config.{k}={v}" for k, v in flat.items()]
  env = tu.cpu_env(fast_compile=True)       # nothing here is compared bitwise
  p = subprocess.Popen(args, cwd=pt.REPO, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
  metrics = wd / "metrics.jsonl"
  deadline = time.time() + 600
  while not (metrics.exists() and metrics.read_text().strip()):   # a first update is done
    assert p.poll() is None and time.time() < deadline, p.stdout.read()[-3000:]
    time.sleep(1)
  p.send_signal(signal.SIGTERM)
  out = p.communicate(timeout=300)[0]
  assert p.returncode == 0, out[-3000:]
  saved = tu.checkpoint_steps(wd)
  assert len(saved) == 1 and 1 <= saved[0] < 2000, out[-3000:]
  args = [a.replace("total_steps=2000", f"total_steps={saved[0] + 1}") for a in args]
  p = subprocess.run(args, cwd=pt.REPO, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"rl finished: updates {saved[0]}-{saved[0] + 1}" in p.stderr + p.stdout
  assert "--mode=solve" in p.stderr + p.stdout


def test_a_checkpoint_older_than_the_rl_group_resumes_without_warnings(caplog):
  cfg = tu.tiny_config("/nonexistent")
  meta = store.run_meta(cfg, config_lib.resolve(cfg))
  old = json.loads(json.dumps(meta))
  del old["config"]["rl"]                  # written before the group existed
  with caplog.at_level(logging.WARNING):
    store.check_compatible(old, meta, "old")
  assert not caplog.records
  cfg.rl.lr = 0.5                          # a changed value is still reported
  with caplog.at_level(logging.WARNING):
    store.check_compatible(old, store.run_meta(cfg, config_lib.resolve(cfg)), "old")
  assert "rl.lr: '<absent>' -> 0.5" in caplog.text


@pytest.mark.slow
def test_an_order_head_trains_saves_loads_and_solves(sft, tmp_path):
  """``rl.order_head=K``: the run attaches a new head over max_prob's top K and trains it alone
  (``head_only``); its checkpoints hold it, `store.load_model` restores it (equal to the saved
  arrays, the rest equal to the starting weights), and ``--mode=solve`` decodes with it under
  ``sample.order_head=True``; a model without one is one line."""
  from aogpt_jax import modes, recipes
  from aogpt_jax.model import order_head
  head_rl = {"rl.policy": "max_prob", "rl.policy_temperature": 0.05, "rl.temperature": 0.8,
             "rl.order_head": 3, "rl.head_kl": 1e-4, "rl.head_only": True, "rl.kl_coef": 0.0,
             "rl.ema_decay": 0.0, "rl.lr": 1e-2, "total_steps": 2, "eval_every": 0}
  wd = tmp_path / "head"
  rl.rl_mode(rl_config(sft, **head_rl), str(wd))
  m, run_cfg = store.load_model(wd)
  assert run_cfg.loaded.weights == "params" and order_head.spec(m) == {"top_k": 3, "width": 32,
                                                                   "context": 32}
  with ocp.StandardCheckpointer() as c:
    saved = jax.tree.map(np.asarray, c.restore(wd / "checkpoints" / "2" / "params"))
  np.testing.assert_array_equal(np.asarray(m.order_head.out.kernel[...]),
                                saved["order_head"]["out"]["kernel"])
  assert np.abs(saved["order_head"]["out"]["kernel"]).max() > 0      # the head moved
  start, _ = store.load_model(sft)
  for a, b in zip(jax.tree.leaves(nnx.state(start, nnx.Param)),
                  jax.tree.leaves({k: v for k, v in saved.items() if k != "order_head"})):
    np.testing.assert_array_equal(np.asarray(a), b)                   # the rest did not
  solve = {"solve.count": 4, "sample.method": "adaptive", "sample.policy": "max_prob",
           "sample.greedy": True, "sample.steps": 36, "sample.order_head": True,
           "solve.search_width": 0}
  out = modes.solve_mode(recipes.apply(rl_config(sft, **head_rl), solve), str(wd))
  rows = [json.loads(s) for s in (wd / "solve" / "solve.jsonl").read_text().splitlines()]
  assert len(rows) == 4 and 0 <= out["solved"]["count"] <= 4
  summary = json.loads((wd / "solve" / "solve.json").read_text())["summary"]
  assert summary["settings"]["order_head"] is True          # the output says what produced it
  with pytest.raises(config_lib.ConfigError, match="^sample.order_head: True needs a model "
                                                   "with an order head"):
    modes.solve_mode(recipes.apply(rl_config(sft), solve), str(sft))
  with pytest.raises(config_lib.ConfigError, match="^sample.order_head: the order head decodes "
                                                   "with the adaptive sampler"):
    modes.solve_mode(recipes.apply(rl_config(sft, **head_rl), {**solve,
                                                                "solve.search_width": 8}), str(wd))
