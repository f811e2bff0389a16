"""Config checks name the culprit before anything compiles; every config file loads."""

import importlib.util
import math

import jax
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import config as config_lib
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax import recipes
from aogpt_jax.train import sharding as sharding_lib
from aogpt_jax.train import step as train_lib
from aogpt_jax.train import workdir as workdir_lib
from helpers.trainer import REPO, tiny_config

ConfigError = config_lib.ConfigError


def _load(path: str, arg: str | None = None):
  """What ``--config=path:arg`` does: import the file and call get_config(arg)."""
  spec = importlib.util.spec_from_file_location("config_under_test", REPO / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg is not None else module.get_config()


@pytest.mark.parametrize("overrides, key", [
    ({"model.n_head": 3}, "model.n_head"),                 # 3 heads do not divide 32
    ({"seq_len": 64}, "seq_len"),                          # longer than block_size 32
    ({"order.name": "zigzag"}, "order.name"),
    ({"order.kwargs": {"p_l2r": 2.0}}, "order.kwargs"),
    ({"order.kwargs": {"p_lr": 0.1}}, "order.kwargs"),     # misspelt option
    ({"model.target": "film"}, "model.target"),
    ({"model.preset": "huge"}, "model.preset"),
    ({"data.tokenizer": "klingon"}, "data.tokenizer"),
    ({"microbatches": 3}, "microbatches"),                 # does not divide batch_size 8
    ({"total_steps": 0}, "total_steps"),
    ({"optimizer.ema_decay": 1.5}, "optimizer.ema_decay"),
    ({"optimizer.b2": 1.5}, "optimizer.b2"),
    ({"mesh.rules": {"embed": "fsdb"}}, "mesh.rules.embed"),
    ({"mesh.rules": {"hidden": "tensor"}}, "mesh.rules.hidden"),
    ({"mesh.data": 0}, "mesh.data"),
])
def test_bad_values_name_their_key(tmp_path, overrides, key):
  cfg = tiny_config(tmp_path)
  for path, value in overrides.items():
    if isinstance(value, dict):
      *parents, leaf = path.split(".")
      node = cfg
      for p in parents:
        node = node[p]
      node[leaf] = value
    else:
      recipes.set_path(cfg, path, value)
  with pytest.raises(ConfigError) as e:
    config_lib.resolve(cfg)
  assert str(e.value).startswith(key), str(e.value)


def test_unknown_keys_are_named(tmp_path):
  cfg = tiny_config(tmp_path)
  cfg.optimizer.learning_rate = 1e-3
  with pytest.raises(ConfigError, match=r"^optimizer\.learning_rate: unknown config key"):
    config_lib.resolve(cfg)
  cfg = tiny_config(tmp_path)
  cfg.stpes = 10
  with pytest.raises(ConfigError, match=r"^stpes: unknown config key"):
    config_lib.resolve(cfg)


def test_vocab_is_derived_from_the_tokenizer(tmp_path):
  mc = config_lib.resolve(tiny_config(tmp_path))
  assert (mc.valid_vocab_size, mc.vocab_size) == (257, 320)
  assert mc.n_layer == 1 and mc.n_embd == 32       # field overrides on top of the preset
  assert mc.head_dim == 16 and mc.target == "adaln"


def test_mesh_and_batch_errors(tmp_path):
  devices = jax.devices()[:8]
  with pytest.raises(ConfigError, match=r"^mesh: mesh.data \* mesh.fsdp \* mesh.tensor = 12"):
    sharding_lib.make_mesh(tiny_config(tmp_path, mesh__data=3, mesh__tensor=4), devices)
  with pytest.raises(ConfigError, match=r"^mesh: .*does not divide the 8 devices"):
    sharding_lib.make_mesh(tiny_config(tmp_path, mesh__data=-1, mesh__tensor=3), devices)
  assert dict(sharding_lib.make_mesh(tiny_config(tmp_path, mesh__data=-1, mesh__tensor=2),
                                     devices).shape) == {"data": 4, "fsdp": 1, "tensor": 2}
  cfg = tiny_config(tmp_path, batch_size=12)
  with pytest.raises(ConfigError, match=r"^batch_size: 12 is not divisible by the data axes"):
    sharding_lib.check_batch_sizes(cfg, sharding_lib.make_mesh(cfg, devices))
  cfg = tiny_config(tmp_path, batch_size=16, microbatches=4)
  with pytest.raises(ConfigError, match=r"^microbatches: each of the 4 microbatches has 4"):
    sharding_lib.check_batch_sizes(cfg, sharding_lib.make_mesh(cfg, devices))
  cfg = tiny_config(tmp_path, batch_size=8, microbatches=2, mesh__data=2, mesh__fsdp=2,
                    mesh__tensor=2)
  with pytest.raises(ConfigError, match=r"^microbatches: .*one sequence per device"):
    sharding_lib.check_batch_sizes(cfg, sharding_lib.make_mesh(cfg, devices))


def test_a_workdir_that_is_a_file_is_named_as_a_file(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a folder")
  for path in (blocker, blocker / "run"):   # no "chmod" advice: permissions are not the problem
    with pytest.raises(ConfigError, match=rf"^--workdir: {blocker} is a file, not a folder;"):
      workdir_lib.prepare_workdir(str(path))


def test_an_output_folder_check_leaves_no_empty_folder(tmp_path):
  from aogpt_jax.checkpoints import store
  store.check_writable(tmp_path / "run" / "eval", "--workdir", keep=False)
  assert not (tmp_path / "run").exists()
  (tmp_path / "old").mkdir()
  store.check_writable(tmp_path / "old" / "samples", "--workdir", keep=False)
  assert (tmp_path / "old").is_dir() and not (tmp_path / "old" / "samples").exists()
  store.check_writable(tmp_path / "kept", "--workdir")      # keep=True (train's workdir)
  assert (tmp_path / "kept").is_dir()


@pytest.mark.parametrize("arg,variants,want", [
    ("tinny", None, "config argument 'tinny': unknown 'tinny' (did you mean 'tiny'?); this "
                    "config file takes only 'tiny'"),
    ("0.9,tiny", {"0.99": {}, "none": {}}, "unknown '0.9' (did you mean '0.99'?); this config "
                                            "file takes one of '0.99', 'none', optionally with "
                                            "'tiny'"),
    ("0.99,none", {"0.99": {}, "none": {}}, "2 variants given")])
def test_config_file_argument_errors_name_the_argument(arg, variants, want):
  from aogpt_jax import recipes
  with pytest.raises(ValueError) as e:
    recipes.from_arg(arg, recipes.quickstart, variants)
  assert want in str(e.value) and "\n" not in str(e.value)


CONFIG_FILES = ["configs/quickstart.py", "configs/aogpt_small.py", "configs/aogpt_medium.py",
                "configs/sigma_gpt_small.py", "configs/gpt2_small.py"]
EXPERIMENTS = {
    "configs/experiments/fig2_l2r_vs_any_order.py": ["l2r", "any_order"],
    "configs/experiments/fig3a_orders.py": ["fixed_random", "blockwise"],
    "configs/experiments/fig3b_mixture.py": ["mixture_10", "uniform"],
    "configs/experiments/fig7_target_injection.py": ["adaln", "sigma_gpt", "repeat", "per_block"],
    "configs/experiments/fig8_ema.py": ["0.99", "0.999", "0.9999", "none"],
}


@pytest.mark.parametrize("path", CONFIG_FILES + sorted(EXPERIMENTS))
def test_every_config_file_resolves_at_tiny_size(path):
  cfg = _load(path, "tiny")
  config_lib.check_keys(cfg)
  mc = config_lib.resolve(cfg)
  assert mc.n_layer == 4 and cfg.data.source == "python_stdlib"


def test_published_recipes():
  small, medium = _load("configs/aogpt_small.py"), _load("configs/aogpt_medium.py")
  for cfg, lr, size in ((small, 6e-4, "small"), (medium, 3e-4, "medium")):
    config_lib.check_keys(cfg)
    o = cfg.optimizer
    assert (o.lr, o.b1, o.b2, o.weight_decay, o.grad_clip, o.ema_decay) == (lr, 0.9, 0.95, 0.05,
                                                                            1.0, 0.9999)
    assert cfg.seq_len == 1024 and cfg.batch_size * cfg.seq_len == 1024 * 1024
    assert (cfg.order.name, cfg.order.kwargs.p_l2r) == ("mixture", 0.1)
    assert cfg.model.preset == size and cfg.model.target == "adaln"
    assert cfg.model.dtype == "bfloat16" and cfg.data.tokenizer == "gpt2"
  assert (model_lib.PRESETS["small"].n_layer, model_lib.PRESETS["medium"].n_layer) == (12, 24)
  sigma, gpt2 = _load("configs/sigma_gpt_small.py"), _load("configs/gpt2_small.py")
  assert (sigma.model.target, sigma.order.name) == ("sigma_gpt", "uniform")
  assert (gpt2.model.target, gpt2.order.name) == ("none", "l2r")
  # The paper configs resolve once the GPT-2 tokenizer is there (checked here with bytes).
  small.data.tokenizer, small.data.source = "byte", "python_stdlib"
  assert config_lib.resolve(small).n_embd == 768


@pytest.mark.parametrize("path, variants", sorted(EXPERIMENTS.items()))
def test_experiment_variants_differ_only_where_they_should(path, variants):
  configs = {v: _load(path, f"{v},tiny") for v in variants}
  flat = {v: config_lib.flatten(c.to_dict()) for v, c in configs.items()}
  keys = set().union(*flat.values())
  differing = {k for k in keys if len({repr(f.get(k)) for f in flat.values()}) > 1}
  assert differing, path
  assert all(k.split(".")[0] in ("order", "model", "optimizer") for k in differing), differing
  with pytest.raises(ValueError, match=r"unknown 'nonsense'.*; this config file takes one of "):
    _load(path, "nonsense")
  full = _load(path, variants[-1])
  assert full.model.preset == "small" and full.total_steps == 20_000   # the ablation recipe
  if path.endswith("fig8_ema.py"):
    assert config_lib.ema_decay(configs["none"]) is None
    assert configs["0.99"].optimizer.ema_decay == 0.99



# The released training recipes, read off the published repository (scxue/AO-GPT-MDM):
# config_larger_model_v3/train_AOGPT_AdaLN6_NoRep_cond_128{,_350M}.py set lr, weight decay 5e-2,
# beta2 0.95, ema_rate 1 - 1e-4, 16 x 1024 tokens x 64 accumulation steps, max_iters =
# lr_decay_iters = 500k; config_order/*.py: 32 x 1024 x 16 = 0.5M tokens, max_iters 20k,
# lr_decay_iters 500k; everything else is train_AOGPT_CL.py's default (beta1 0.9, grad_clip 1.0,
# warmup_iters 2000, min_lr 6e-5; no config overrides min_lr, so Medium decays to 6e-5 too).
PUBLISHED = {
    "configs/aogpt_small.py": dict(lr=6e-4, min_lr=6e-5, tokens=16 * 1024 * 64, total=500_000,
                                   decay=500_000),
    "configs/aogpt_medium.py": dict(lr=3e-4, min_lr=6e-5, tokens=16 * 1024 * 64, total=500_000,
                                    decay=500_000),
    "configs/experiments/fig3a_orders.py": dict(lr=6e-4, min_lr=6e-5, tokens=32 * 1024 * 16,
                                                total=20_000, decay=500_000),
}


@pytest.mark.parametrize("path", sorted(PUBLISHED))
def test_every_recipe_field_matches_the_published_configs(path):
  want, cfg = PUBLISHED[path], _load(path)
  o = cfg.optimizer
  assert (o.b1, o.b2, o.weight_decay, o.grad_clip, o.ema_decay) == (0.9, 0.95, 0.05, 1.0, 0.9999)
  assert o.warmup_steps == 2000 and cfg.seq_len == 1024
  assert cfg.batch_size * cfg.seq_len == want["tokens"] and cfg.total_steps == want["total"]
  assert cfg.model.dropout in (None, 0.0)
  sched = train_lib.lr_schedule(o, cfg.total_steps)
  assert math.isclose(float(sched(2000)), want["lr"], rel_tol=1e-6)
  decay_end = (o.decay_steps or cfg.total_steps)
  assert decay_end == want["decay"]
  assert math.isclose(float(sched(decay_end)), want["min_lr"], rel_tol=1e-5)
  assert math.isclose(float(sched(decay_end + 1000)), want["min_lr"], rel_tol=1e-5)


def test_sigma_gpt_config_is_the_published_sigma_gpt_field_by_field():
  # model_sigmaGPT.py: LayerNorm(bias=config.bias=True), no q/k norm, lm_head tied to wte and
  # without bias, normal_(std=0.02) init, target position added once at the input; its runs
  # keep no EMA (the paper's Figure 9 adds adaLN, then EMA, to it).
  cfg = _load("configs/sigma_gpt_small.py")
  mc = model_lib.preset("small", **{k: v for k, v in cfg.model.items()
                                    if k != "preset" and v is not None})
  assert (mc.target, mc.norm, mc.qk_norm, mc.bias) == ("sigma_gpt", "layernorm", False, True)
  assert (mc.tie_embeddings, mc.head_bias, mc.init_truncation) == (True, False, 0.0)
  assert (mc.n_layer, mc.n_head, mc.n_embd, mc.block_size) == (12, 12, 768, 1024)
  assert cfg.order.name == "uniform" and config_lib.ema_decay(cfg) is None
  assert cfg.optimizer.lr == 6e-4
  m = model_lib.AOGPT(mc.replace(n_layer=1, n_embd=64, n_head=2, vocab_size=64,
                                 valid_vocab_size=64, block_size=8), rngs=nnx.Rngs(0))
  assert not hasattr(m, "lm_head") and not hasattr(m, "lm_head_bias")
  assert m.h[0].ln_1.bias is not None and not hasattr(m.h[0].attn, "q_norm")
  # plain normal init: values beyond 3 std exist in a 64 x 64 table (truncation would cut them)
  assert np.abs(np.asarray(m.wte.embedding[...])).max() > 3 * 0.02


def test_eval_mode_takes_the_order_options():
  from aogpt_jax import modes
  from aogpt_jax.evaluation import zero_shot as evaluate_lib
  cfg = _load("configs/experiments/fig3a_orders.py", "blockwise,tiny")
  cfg.eval.order = "blockwise"           # the run's own order: its kwargs by default
  assert modes.eval_order_kwargs(cfg) == {"block": 16, "seed": 0}
  cfg.eval.order_kwargs = '{"block": 4}'
  assert modes.eval_order_kwargs(cfg) == {"block": 4}
  cfg.eval.order = "uniform"
  cfg.eval.order_kwargs = ""
  assert modes.eval_order_kwargs(cfg) == {}
  cfg.eval.order_kwargs = "{block: 4"
  with pytest.raises(ConfigError, match="eval.order_kwargs: not JSON"):
    modes.eval_order_kwargs(cfg)
  with pytest.raises(ValueError, match="eval.order / eval.order_kwargs"):
    evaluate_lib.EvalSettings(order="fixed_random", order_kwargs={"block": 4})


@pytest.mark.parametrize("overrides, message", [
    ({"seq_len": 1}, "seq_len: must be >= 2"),
    ({"optimizer.warmup_steps": 50, "optimizer.decay_steps": 20},
     "optimizer.decay_steps: the cosine would end at step 20, before the warmup ends"),
])
def test_degenerate_run_settings_are_refused(overrides, message, tmp_path):
  cfg = tiny_config(tmp_path)
  recipes.apply(cfg, overrides)
  with pytest.raises(ConfigError, match=message):
    config_lib.resolve(cfg)


@pytest.mark.parametrize("temperature", [float("inf"), float("nan"), 1e-308, 5e-324, 0.0, -1.0,
                                         "1.0"])
def test_temperatures_that_cannot_be_sampled_are_refused(temperature):
  from aogpt_jax.sampling import sampler
  s = sampler.SampleSettings(length=8, steps=8, temperature=temperature)
  want = ("sample.temperature: must be a number, got str" if isinstance(temperature, str) else
          "sample.temperature: must be a finite number >= 1e-06")
  with pytest.raises(ValueError, match=want):
    s.validate(model_lib.preset("tiny"))


def test_quickstart_eval_is_bounded_by_default():
  """README's `--mode=eval` on the quickstart must finish in minutes (issue 16): not the whole
  5,610-block held-out split."""
  c = recipes.quickstart()
  assert 0 < c.eval.max_blocks * c.seq_len <= 256 * 128          # at most 32k tokens


def test_sample_method_and_model_kind_follow_the_objective(tmp_path):
  """Left "", sample.method and eval.model_kind take the objective's value; a run that
  sets one the objective's model cannot use is refused in one line naming the key."""
  for objective, method, kind in (("ao", "diffusion", "aogpt"), ("mdm", "encoder", "encoder")):
    cfg = tiny_config(tmp_path, objective=objective, eval__ensemble_max_m=0)
    config_lib.resolve(cfg)
    assert (cfg.sample.method, cfg.eval.model_kind) == (method, kind)
  cfg = tiny_config(tmp_path, objective="mdm", sample__method="diffusion")
  with pytest.raises(config_lib.ConfigError,
                     match=r"^sample\.method: 'diffusion' does not fit objective='mdm'"):
    config_lib.resolve(cfg)
  cfg = tiny_config(tmp_path, eval__model_kind="encoder")
  with pytest.raises(config_lib.ConfigError, match=r"^eval\.model_kind: 'encoder' does not"):
    config_lib.resolve(cfg)
  with pytest.raises(config_lib.ConfigError, match=r"^objective: must be one of"):
    config_lib.resolve(tiny_config(tmp_path, objective="bert"))
