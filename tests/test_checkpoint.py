"""Checkpoints: exact round trip (state and data position), a corrupt newest step is skipped,
an incompatible config is named, and `load_model` gives back the saved weights."""

import logging
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.checkpoints import store as checkpoint_lib
from aogpt_jax import config as config_lib
from aogpt_jax import data as data_lib
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax import recipes
from aogpt_jax.train import sharding as sharding_lib
from aogpt_jax.train import step as train_lib
from helpers.trainer import tiny_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """Two saved steps (2 and 4) of a tiny run, plus what the state looked like at each."""
  cache = tmp_path_factory.mktemp("cache")
  workdir = tmp_path_factory.mktemp("run")
  cfg = tiny_config(cache)
  mc = config_lib.resolve(cfg)
  mesh = sharding_lib.make_mesh(cfg, devices=jax.devices()[:1])
  trainer = train_lib.build(cfg, mc, mesh)
  meta = checkpoint_lib.run_meta(cfg, mc)
  it = _iterator(cfg)
  ckpt = checkpoint_lib.Checkpointer(workdir, cfg.checkpoint)
  saved = {}
  with jax.set_mesh(mesh):
    state = trainer.init()
    for step in range(1, 5):
      state, _ = trainer.step(state, sharding_lib.global_batch(next(it), mesh))
      if step % 2 == 0:
        ckpt.save(step, state, it, meta)
        saved[step] = (jax.device_get(state), next(_clone(cfg, it)))
  ckpt.close()
  return dict(cfg=cfg, trainer=trainer, meta=meta, workdir=workdir, saved=saved, mesh=mesh)


def _iterator(cfg):
  return data_lib.train_iterator(cfg.data, seq_len=cfg.seq_len,
                                 global_batch_size=cfg.batch_size, seed=cfg.seed)


def _clone(cfg, it):
  """A fresh iterator at ``it``'s position (to peek at the next batch without advancing it)."""
  other = _iterator(cfg)
  other.set_state(it.get_state())
  return other


def _assert_tree_equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def _restore(run, workdir):
  it = _iterator(run["cfg"])
  ckpt = checkpoint_lib.Checkpointer(workdir, run["cfg"].checkpoint)
  try:
    with jax.set_mesh(run["mesh"]):
      return ckpt.restore_latest(run["trainer"].abstract_state, it, run["meta"]), it
  finally:
    ckpt.close()


def _copy_run(run, tmp_path) -> pathlib.Path:
  import shutil
  dst = tmp_path / "copy"
  shutil.copytree(run["workdir"], dst)
  return dst


def test_round_trip_restores_state_and_data_position(run, tmp_path):
  (step, state), it = _restore(run, _copy_run(run, tmp_path))
  assert step == 4
  want_state, want_next_batch = run["saved"][4]
  _assert_tree_equal(jax.device_get(state), want_state)
  np.testing.assert_array_equal(next(it)["tokens"], want_next_batch["tokens"])
  # Restored arrays carry the run's shardings.
  assert state["params"]["wte"]["embedding"].sharding == \
      run["trainer"].state_shardings["params"]["wte"]["embedding"]


def test_corrupt_latest_checkpoint_is_skipped(run, tmp_path, caplog):
  workdir = _copy_run(run, tmp_path)
  for f in (workdir / "checkpoints" / "4" / "params").rglob("*"):
    if f.is_file():
      f.write_bytes(b"\x00garbage")
  with caplog.at_level(logging.WARNING):
    (step, state), it = _restore(run, workdir)
  assert step == 2
  want_state, want_next_batch = run["saved"][2]
  _assert_tree_equal(jax.device_get(state), want_state)
  np.testing.assert_array_equal(next(it)["tokens"], want_next_batch["tokens"])
  assert any(str(workdir / "checkpoints" / "4") in r.getMessage() and "is corrupt" in
             r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
  assert not (workdir / "checkpoints" / "4").exists()          # set aside, kept for inspection
  assert len(list((workdir / "checkpoints_corrupt").iterdir())) == 1


def test_half_written_checkpoint_is_ignored(run, tmp_path):
  workdir = _copy_run(run, tmp_path)
  # What a SIGKILL during an async save leaves behind: a temporary step folder.
  tmp = workdir / "checkpoints" / "6.orbax-checkpoint-tmp-1234567"
  (tmp / "params").mkdir(parents=True)
  (tmp / "params" / "partial").write_bytes(b"\x00")
  (step, _), _ = _restore(run, workdir)
  assert step == 4


def test_a_model_field_newer_than_the_checkpoint_is_named_with_its_default():
  """A checkpoint from before a model field existed was made with the field's default: the same
  run resumes, another value is refused naming that default and the flag that restores it."""
  saved = {"config": {"model": {"n_layer": 1}, "seq_len": 16}}
  same = {"config": {"model": {"n_layer": 1, "rope": False}, "seq_len": 16}}
  checkpoint_lib.check_compatible(saved, same, "W/checkpoints/4")
  other = {"config": {"model": {"n_layer": 1, "rope": True}, "seq_len": 16}}
  with pytest.raises(checkpoint_lib.IncompatibleCheckpoint,
                     match=r"^model\.rope: the checkpoint W/checkpoints/4 was written with "
                           r"model\.rope=False \(the default: the field is newer than the "
                           r"checkpoint\) but this run has model\.rope=True; resume with "
                           r"--config\.model\.rope=False or use a new --workdir$"):
    checkpoint_lib.check_compatible(saved, other, "W/checkpoints/4")


def test_a_checkpoint_of_another_mode_names_the_modes():
  """--mode=rl on a training run's workdir (or the reverse) said the checkpoint "cannot be
  restored ... tree structures do not match": it names the two modes."""
  cfg = {"config": {"model": {"n_layer": 1}, "seq_len": 16}}
  with pytest.raises(checkpoint_lib.IncompatibleCheckpoint,
                     match=r"^W/checkpoints/4 was written by --mode=train; this is --mode=rl: "
                           r"run --mode=train to continue that run, or use a new --workdir"):
    checkpoint_lib.check_compatible(cfg, {**cfg, "mode": "rl"}, "W/checkpoints/4")
  with pytest.raises(checkpoint_lib.IncompatibleCheckpoint, match=r"by --mode=dpo; this is "
                     r"--mode=train"):
    checkpoint_lib.check_compatible({**cfg, "mode": "dpo"}, cfg, "W/checkpoints/4")
  checkpoint_lib.check_compatible({**cfg, "mode": "rl"}, {**cfg, "mode": "rl"}, "here")


def test_incompatible_config_names_the_field(run, tmp_path):
  workdir = _copy_run(run, tmp_path)
  cfg = tiny_config(run["cfg"].data.cache_dir, model__n_layer=2)
  meta = checkpoint_lib.run_meta(cfg, config_lib.resolve(cfg))
  ckpt = checkpoint_lib.Checkpointer(workdir, cfg.checkpoint)
  try:
    with pytest.raises(checkpoint_lib.IncompatibleCheckpoint,
                       match=r"^model\.n_layer: the checkpoint .*checkpoints/4 was written with "
                             r"model\.n_layer=1 but this run has model\.n_layer=2; resume with "
                             r"--config\.model\.n_layer=1 or use a new --workdir$"):
      ckpt.restore_latest(run["trainer"].abstract_state, _iterator(cfg), meta)
  finally:
    ckpt.close()
  assert (workdir / "checkpoints" / "4").exists()     # an incompatible step is not set aside
  for key, value in (("batch_size", 16), ("optimizer.ema_decay", 0.0)):
    cfg = recipes.apply(tiny_config(run["cfg"].data.cache_dir), {key: value})
    meta = checkpoint_lib.run_meta(cfg, config_lib.resolve(cfg))
    with pytest.raises(checkpoint_lib.IncompatibleCheckpoint, match=f"^{key}: "):
      checkpoint_lib.check_compatible(run["meta"], meta, "here")
  # Harmless changes (learning rate, length of the run) are allowed.
  cfg = tiny_config(run["cfg"].data.cache_dir, optimizer__lr=1e-4, total_steps=99)
  checkpoint_lib.check_compatible(run["meta"], checkpoint_lib.run_meta(
      cfg, config_lib.resolve(cfg)), "here")


@pytest.mark.parametrize("which", ["ema", "params"])
def test_load_model_returns_the_saved_weights(run, which):
  m, cfg = checkpoint_lib.load_model(run["workdir"], which=which)
  want = run["saved"][4][0][which]
  _assert_tree_equal(jax.device_get(nnx.to_pure_dict(nnx.state(m, nnx.Param))), want)
  assert isinstance(m, model_lib.AOGPT) and m.cfg.n_layer == 1
  assert cfg.model.vocab_size == 320 and cfg.data.tokenizer == "byte"
  tokens = np.asarray(run["saved"][4][1]["tokens"])
  logits = m(tokens, np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape))
  assert logits.shape == tokens.shape + (320,) and np.isfinite(np.asarray(logits)[..., :257]).all()
  m2, _ = checkpoint_lib.load_model(run["workdir"], which=which, step=2, dtype="bfloat16")
  assert m2.cfg.dtype == "bfloat16"
  _assert_tree_equal(jax.device_get(nnx.to_pure_dict(nnx.state(m2, nnx.Param))),
                     run["saved"][2][0][which])
  with pytest.raises(ValueError, match="change the parameters"):
    checkpoint_lib.load_model(run["workdir"], n_layer=3)


@pytest.mark.parametrize("async_save", [True, False])
def test_every_saved_step_has_a_sha256_manifest(run, tmp_path, monkeypatch, async_save):
  """Async saves write the manifest into the temporary folder before orbax commits (renames) it,
  so no committed step lacks one; sync saves (no such hook in orbax) right after the save."""
  (step, state), it = _restore(run, _copy_run(run, tmp_path))
  written = []
  real = checkpoint_lib.write_manifest
  monkeypatch.setattr(checkpoint_lib, "write_manifest",
                      lambda d: written.append(pathlib.Path(d).name) or real(d))
  cfg = tiny_config(run["cfg"].data.cache_dir, checkpoint__async_save=async_save)
  workdir = tmp_path / "new"
  ckpt = checkpoint_lib.Checkpointer(workdir, cfg.checkpoint)
  with jax.set_mesh(run["mesh"]):
    ckpt.save(step, state, it, run["meta"])
    ckpt.wait()
  ckpt.close()
  assert written == ([f"{step}.orbax-checkpoint-tmp"] if async_save else [str(step)])
  assert checkpoint_lib.verify_manifest(workdir / "checkpoints" / str(step))
  assert ckpt.last_saved == step
