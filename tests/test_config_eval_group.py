"""One ``eval`` group for training-time eval and --mode=eval, registered by its owner; ensembles
follow the objective."""


import pytest

from aogpt_jax import config as config_lib
from helpers.trainer import tiny_config


def test_the_eval_group_serves_both_and_its_owner_registers_it():
  c = config_lib.default_config()
  assert "evaluate" not in c
  assert (c.eval.train_max_blocks, c.eval.max_blocks) == (256, 0)   # training: a subset
  for key in ("split", "batch_size", "seed", "datasets", "which", "name", "ensemble_max_m",
              "model_kind", "order_kwargs"):
    assert key in c.eval, key
  assert c.sample.method == ""                                       # follows the objective


def test_ensembles_follow_the_objective(tmp_path):
  """An encoder's prediction does not depend on the context's order: eval.ensemble_max_m > 0
  with objective=mdm is refused before anything runs, naming the key."""
  config_lib.resolve(tiny_config(tmp_path, eval__ensemble_max_m=4))          # ao: fine
  config_lib.resolve(tiny_config(tmp_path, objective="mdm"))                  # default 0
  with pytest.raises(config_lib.ConfigError,
                     match=r"^eval\.ensemble_max_m: 4: context-order ensembles .* objective='mdm'"):
    config_lib.resolve(tiny_config(tmp_path, objective="mdm", eval__ensemble_max_m=4))
