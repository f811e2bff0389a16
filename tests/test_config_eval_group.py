"""One ``eval`` group for training-time eval and --mode=eval; configs written before it (with an
``evaluate`` group) still load, and an old key given today names its new one."""

import copy
import json
import logging

import pytest
from ml_collections import config_dict

from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax import data
from aogpt_jax import config as config_lib
from aogpt_jax import main as main_lib
from aogpt_jax import modes, recipes
from helpers.trainer import tiny_config


def _old_style(d: dict) -> dict:
  """``d`` (a config as plain data) as it was written before the merge: training-time keys in
  ``eval`` (its ``max_blocks`` = today's ``train_max_blocks``), --mode=eval keys in ``evaluate``."""
  old = copy.deepcopy(d)
  ev = old.pop("eval")
  old["eval"] = {"split": ev["split"], "batch_size": ev["batch_size"],
                 "max_blocks": ev["train_max_blocks"], "seed": ev["seed"]}
  old["evaluate"] = {k: v for k, v in ev.items() if k not in ("split", "train_max_blocks")}
  return old


@pytest.fixture(name="new")
def _new(tmp_path):
  cfg = tiny_config(tmp_path, eval__train_max_blocks=8, eval__max_blocks=3, eval__seed=5)
  return json.loads(cfg.to_json())


def test_the_eval_group_serves_both_and_its_owner_registers_it():
  c = config_lib.default_config()
  assert "evaluate" not in c
  assert (c.eval.train_max_blocks, c.eval.max_blocks) == (256, 0)   # training: a subset
  for key in ("split", "batch_size", "seed", "datasets", "which", "name", "ensemble_max_m",
              "model_kind", "order_kwargs"):
    assert key in c.eval, key
  assert c.sample.method == ""                                       # follows the objective


def test_old_config_json_reads_in_the_new_keys(new, caplog):
  old = _old_style(new)
  with pytest.raises(config_lib.ConfigError, match=r"^evaluate: renamed eval \(the evaluate"):
    config_lib.check_keys(config_dict.ConfigDict(old))
  with caplog.at_level(logging.WARNING):
    up = config_lib.upgrade(old, "run/config.json")
  assert up == new
  assert [r.getMessage() for r in caplog.records if "evaluate" in r.getMessage()] == [
      "run/config.json: written before evaluate.* merged into eval.*; read with evaluate.X as "
      "eval.X and eval.max_blocks as eval.train_max_blocks (eval.batch_size / eval.seed: the "
      "training run's values)"]
  config_lib.check_keys(config_dict.ConfigDict(up))
  assert config_lib.upgrade(new) == new                       # a new config: unchanged


def test_resume_from_an_old_checkpoint_sees_no_eval_difference(new, caplog):
  meta = {"config": new, "has_ema": True}
  with caplog.at_level(logging.INFO):
    checkpoint_lib.check_compatible({"config": _old_style(new), "has_ema": True}, meta, "ckpt/4")
  diffs = [r.getMessage() for r in caplog.records if "->" in r.getMessage()]
  assert not [m for m in diffs if "eval" in m], diffs          # no eval key differs


def test_eval_mode_on_a_workdir_with_an_old_config_json(new, tmp_path):
  work = tmp_path / "work"
  work.mkdir()
  run = _old_style(new)
  run["model"]["valid_vocab_size"] = data.get_tokenizer("byte").vocab_size
  (work / "config.json").write_text(json.dumps(run))
  modes._check_run(tiny_config(tmp_path), str(work), "eval.model_kind")  # pylint: disable=W0212


def test_old_keys_name_their_new_name(tmp_path):
  with pytest.raises(KeyError, match=r"evaluate\.max_blocks: renamed eval\.max_blocks"):
    recipes.apply(tiny_config(tmp_path), {"evaluate.max_blocks": 1})
  with pytest.raises(SystemExit, match=r"^aogpt_jax: config error: --config\.evaluate\.name: "
                     r"renamed --config\.eval\.name \(the evaluate\.\* group merged into eval"):
    main_lib.parse_flags(["main", "--config.evaluate.name=x"])


def test_ensembles_follow_the_objective(tmp_path):
  """An encoder's prediction does not depend on the context's order: eval.ensemble_max_m > 0
  with objective=mdm is refused before anything runs, naming the key."""
  config_lib.resolve(tiny_config(tmp_path, eval__ensemble_max_m=4))          # ao: fine
  config_lib.resolve(tiny_config(tmp_path, objective="mdm"))                  # default 0
  with pytest.raises(config_lib.ConfigError,
                     match=r"^eval\.ensemble_max_m: 4: context-order ensembles .* objective='mdm'"):
    config_lib.resolve(tiny_config(tmp_path, objective="mdm", eval__ensemble_max_m=4))


def test_a_config_file_using_the_old_group_is_told_the_new_name():
  """What `parse_flags` / `main` print when a config file sets ``cfg.evaluate.X`` (ml_collections
  raises ``KeyError: evaluate``)."""
  hint = main_lib._renamed_hint("KeyError: evaluate")  # pylint: disable=W0212
  assert hint == ("KeyError: evaluate (the evaluate.* group merged into eval.*: cfg.evaluate.X "
                  "is now cfg.eval.X)")
  other = main_lib._renamed_hint("KeyError: optimizer")  # pylint: disable=W0212
  assert other == "KeyError: optimizer"
