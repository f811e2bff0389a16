"""The smoke subset (``python -m pytest -m smoke``): a minute or so on 2 CPU cores, touching every
package of aogpt_jax once: config and recipes, data, model, train, checkpoints, sampling,
evaluation, tasks (a puzzle solved), posttrain, modes and main, figures.
`test_every_package_has_a_smoke_test` keeps it that way: a new package under aogpt_jax/ needs a
smoke test that imports it (here or marked elsewhere)."""

import ast
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

from helpers import trainer as tu

pytestmark = pytest.mark.smoke

REPO = pathlib.Path(tu.REPO)
FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "workdir_v0_1"


def test_config_and_recipes_resolve():
  from aogpt_jax import config as config_lib, recipes
  cfg = recipes.quickstart()
  config_lib.check_keys(cfg)
  mc = config_lib.resolve(cfg)
  assert mc.n_layer == 4 and cfg.seq_len == 32 and cfg.sample.steps == 32


def test_model_any_order_loss():
  from flax import nnx
  from aogpt_jax.model import aogpt, orders
  cfg = aogpt.preset("tiny", n_layer=1, n_embd=32, n_head=2, target_dim=8, block_size=16)
  m = aogpt.AOGPT(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, cfg.valid_vocab_size)
  order = orders.sample("mixture", jax.random.key(1), 2, 16, p_l2r=0.1)
  mean, _ = aogpt.loss(m, tokens, order)
  assert np.isfinite(float(mean))


def test_train_on_local_text_then_load(tmp_path):
  """data (prepare local text), train (2 steps, held-out eval), checkpoints (save, load)."""
  from aogpt_jax import data
  from aogpt_jax.checkpoints import store
  from aogpt_jax.train import loop
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for p in sorted((REPO / "aogpt_jax" / "sampling").glob("*.py")):
    shutil.copy(p, corpus / (p.stem + ".txt"))
  cfg = tu.tiny_config(tmp_path / "cache", **{
      "data.source": "text_files", "data.glob": str(corpus / "*.txt"),
      "data.validation_fraction": 0.2, "total_steps": 2, "checkpoint_every": 2,
      "log_every": 1, "eval.train_max_blocks": 8})
  last = loop.train(cfg, str(tmp_path / "run"))
  assert np.isfinite(last["eval/loss_l2r"])
  m, run_cfg = store.load_model(tmp_path / "run")
  assert run_cfg.loaded.step == 2 and m.cfg.n_embd == 32
  tok = data.get_tokenizer(run_cfg.data.tokenizer)
  assert tok.decode(tok.encode("def f():")) == "def f():"


def test_sample_mode_on_an_old_workdir(tmp_path, capsys):
  """modes and sampling: --mode=sample's writer on the checked-in fixture run (steps unset: the
  length)."""
  from aogpt_jax import modes, sampling
  assert sampling.SampleSettings(length=8).num_steps == 8
  work = tmp_path / "w"
  shutil.copytree(FIXTURE, work)
  cfg = tu.tiny_config(tmp_path / "cache", seq_len=16, model__rope=False)
  cfg.sample.update(dict(num_samples=2, batch_size=2, length=8))
  path = pathlib.Path(modes.sample_mode(cfg, str(work)))
  rows = [json.loads(x) for x in path.read_text().splitlines()]
  assert len(rows) == 2 and "_T8_" in path.name
  assert repr(rows[0]["text"]) in capsys.readouterr().out


def test_evaluate_batches_in_memory():
  from aogpt_jax import evaluation
  from helpers.sampler import tiny_model
  m = tiny_model(vocab=16, valid=13, block=8)
  tokens = np.random.default_rng(0).integers(0, 13, (2, 8)).astype(np.int32)
  res = evaluation.evaluate(m, {"toy": [{"tokens": tokens, "weight": np.ones(2, np.float32)}]},
                            evaluation.EvalSettings(ensemble_max_m=2))
  assert res["datasets"]["toy"]["l2r"]["blocks"] == 2


def test_main_knows_its_modes_and_keeps_details_off_the_console():
  import logging
  from aogpt_jax import main
  assert set(main.MODES) == {"train", "eval", "sample", "prepare", "genppl", "solve", "rl"}
  rec = logging.LogRecord("x", logging.INFO, "/x/aogpt_jax/train/loop.py", 1, "model: %s",
                          ("M",), None)
  rec.file_only = True
  assert not main._QuietLibraries().filter(rec) and main._QuietLibraries(verbose=True).filter(rec)


def test_figures_dry_run(tmp_path, capsys):
  from aogpt_jax.figures import cli
  assert cli.run(["fig2", "--size=tiny", f"--workdir={tmp_path / 'w'}", "--dry-run"]) == {}
  assert "training still to do" in capsys.readouterr().out


# ----------------------------------------------------------------------------- coverage


def _smoke_files() -> list[pathlib.Path]:
  """Test files with a smoke marker (the whole module or a test)."""
  here = pathlib.Path(__file__).parent
  return [p for p in sorted(here.glob("test_*.py")) if "mark.smoke" in p.read_text()]


def _imported(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names |= {f"{node.module}.{a.name}" for a in node.names}
  return names


def test_every_package_has_a_smoke_test():
  packages = sorted(p.parent.name for p in (REPO / "aogpt_jax").glob("*/__init__.py"))
  modules = ["config", "modes", "main", "recipes"]
  imported = set().union(*(_imported(p) for p in _smoke_files()))
  missing = [p for p in packages + modules
             if not any(n == f"aogpt_jax.{p}" or n.startswith(f"aogpt_jax.{p}.")
                        for n in imported)]
  assert not missing, (f"no smoke test imports aogpt_jax.{missing}; add one "
                       f"(@pytest.mark.smoke, tests/test_smoke.py)")
  assert {"model", "data", "train", "checkpoints", "sampling", "evaluation",
          "figures"} <= set(packages)


def test_task_solve_keeps_the_givens():
  from flax import nnx
  from aogpt_jax import tasks
  from aogpt_jax.evaluation import solve
  from aogpt_jax.model import aogpt
  from aogpt_jax.sampling import SampleSettings
  task = tasks.make("sudoku", size=4)
  m = aogpt.AOGPT(aogpt.ModelConfig(vocab_size=64, valid_vocab_size=4, block_size=16, n_layer=1,
                                    n_head=2, n_embd=32, target_dim=8), rngs=nnx.Rngs(0))
  puzzles = task.heldout(0, 4)
  res = solve.solve(m, task, puzzles, SampleSettings(length=16, method="adaptive", greedy=True),
                    warm=False)
  out = np.array([r["output"] for r in res.rows])
  np.testing.assert_array_equal(out[puzzles["prompt"]], puzzles["tokens"][puzzles["prompt"]])


def test_posttrain_exact_likelihood_is_minus_the_loss():
  from flax import nnx
  from aogpt_jax.model import aogpt, orders
  from aogpt_jax.posttrain import likelihood
  cfg = aogpt.preset("tiny", n_layer=1, n_embd=32, n_head=2, target_dim=8, block_size=8)
  m = aogpt.AOGPT(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, cfg.valid_vocab_size)
  order = orders.sample("uniform", jax.random.key(1), 2, 8)
  steps = np.broadcast_to(np.arange(8), (2, 8))        # one token per step
  logp = likelihood.sequence_logp(m, tokens, order, steps)
  _, nll = aogpt.loss(m, tokens, order)
  np.testing.assert_allclose(logp, -nll, atol=1e-5)
