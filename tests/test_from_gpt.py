"""GPT-2 / our left-to-right model -> AO-GPT (checkpoints/from_gpt.py): under the L2R order the
converted model computes the source's logits (against Hugging Face transformers and the JAX GPT-2
of the gen-PPL scorer), decodes greedily as HF's `generate`, scores --mode=eval perplexity as
GPT-2; bad sources are one line naming the file and tensor; the order curriculum."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from aogpt_jax import config as config_lib
from aogpt_jax import recipes
from aogpt_jax.checkpoints import convert, from_gpt
from aogpt_jax.checkpoints import spec as spec_lib
from aogpt_jax.evaluation import gpt2
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax.model import orders
from helpers import published

V, NPOS, N = 257, 33, 32       # byte vocabulary (EOT = 256); 33 positions = START + 32 tokens


def _hf_gpt2(tmp_path, **kw):
  torch = pytest.importorskip("torch", reason="needs torch (requirements-extra.txt)")
  transformers = pytest.importorskip("transformers", reason="needs transformers")
  torch.manual_seed(0)
  cfg = transformers.GPT2Config(vocab_size=V, n_positions=NPOS, n_embd=48, n_layer=2, n_head=4,
                                bos_token_id=V - 1, eos_token_id=V - 1, **kw)
  hf = transformers.GPT2LMHeadModel(cfg).eval()
  with torch.no_grad():   # non-trivial norms and biases so that a swapped tensor shows
    for name, p in hf.named_parameters():
      if name.endswith("bias") or "ln_" in name:
        p.add_(0.1 * torch.randn_like(p))
  hf.save_pretrained(tmp_path, safe_serialization=True)
  return torch, hf


def _l2r(b=3):
  return np.broadcast_to(np.arange(N), (b, N))


def _with(m, **kw):
  """The same weights under another config (attention path / kernel)."""
  return from_gpt.with_weights(m.cfg.replace(**kw),
                               from_gpt.flatten(nnx.to_pure_dict(nnx.state(m, nnx.Param))))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("act", ["gelu_new", "gelu"])
def test_converted_gpt2_has_gpt2s_logits_on_every_attention_path(tmp_path, act):
  torch, hf = _hf_gpt2(tmp_path, activation_function=act)
  m, cfg, prov = spec_lib.load(f"gpt2:{tmp_path}")
  assert (cfg.block_size, cfg.valid_vocab_size, cfg.vocab_size) == (NPOS - 1, V, 320)
  assert cfg.gelu == ("tanh" if act == "gelu_new" else "exact") and prov["eot_id"] == V - 1
  x = np.random.default_rng(0).integers(0, V, (3, N))
  ctx = np.concatenate([np.full((3, 1), V - 1), x[:, :-1]], 1)    # GPT-2 reads EOT first
  want = hf(torch.tensor(ctx)).logits.detach().numpy()
  params, gcfg = gpt2.load(str(tmp_path))
  jax_gpt2 = np.asarray(gpt2.logits(params, ctx, cfg=gcfg))
  np.testing.assert_allclose(jax_gpt2, want, atol=1e-5, rtol=0)
  for kw in (dict(attention="gather", attention_impl="xla"),
             dict(attention="gather", attention_impl="blockwise", attention_block=8),
             dict(attention="mask", attention_impl="xla"),
             dict(attention="mask", attention_impl="blockwise", attention_block=8)):
    got = np.asarray(_with(m, **kw)(x, _l2r()))
    assert np.all(np.isneginf(got[..., V:])), kw                   # padding ids never scored
    np.testing.assert_allclose(got[..., :V], want, atol=1e-5, rtol=0, err_msg=str(kw))
    np.testing.assert_allclose(got[..., :V], jax_gpt2, atol=1e-5, rtol=0, err_msg=str(kw))
  # Every target-injection variant is the identity at initialisation too.
  for target in ("sigma_gpt", "per_block", "repeat", "none"):
    mt, _, _ = from_gpt.from_gpt2(str(tmp_path), target=target)
    np.testing.assert_allclose(np.asarray(mt(x, _l2r()))[..., :V], want, atol=1e-5, rtol=0,
                               err_msg=target)


@pytest.mark.slow
@pytest.mark.torch
def test_greedy_kv_cached_ar_decoding_equals_hf_generate(tmp_path):
  from aogpt_jax.sampling import prompts, sampler
  torch, hf = _hf_gpt2(tmp_path)
  m, _, _ = spec_lib.load(f"gpt2:{tmp_path}")
  prefixes = [[5, 17, 99], [200, 3, 3, 41, 7]]
  s = sampler.SampleSettings(length=24, order="l2r", method="ar", greedy=True)
  out = sampler.generate(m, jax.random.key(0), s,
                         prompt=prompts.prefix_prompt(prefixes, 24, m.cfg.vocab_size)).tokens
  for row, p in zip(out, prefixes):
    ids = torch.tensor([[V - 1] + p])
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       max_new_tokens=24 - len(p), pad_token_id=V - 1)[0, 1:].numpy()
    np.testing.assert_array_equal(row, want)


@pytest.mark.slow
def test_l2r_run_converts_exactly_and_its_new_parts_are_the_identity():
  src = model_lib.AOGPT(model_lib.preset("tiny", n_layer=2, n_embd=32, n_head=2, target_dim=8,
                                         block_size=N, target="none"), rngs=nnx.Rngs(3))
  m, cfg = from_gpt.from_l2r(src)
  assert cfg.target == "adaln" and cfg.gate_offset == 1.0 and cfg.zero_init_modulation
  x = np.random.default_rng(1).integers(0, V, (2, N))
  order = np.stack([np.arange(N), np.random.default_rng(2).permutation(N)])
  np.testing.assert_allclose(np.asarray(m(x, order)), np.asarray(src(x, order)), atol=1e-6)
  assert not np.any(np.asarray(m.h[0].adaLN.kernel[...]))
  assert np.any(np.asarray(m.wtpe.embedding[...]))      # adaLN's table: random, gets gradients
  for target in ("sigma_gpt", "per_block"):
    mt, _ = from_gpt.from_l2r(src, target=target)
    np.testing.assert_allclose(np.asarray(mt(x, order)), np.asarray(src(x, order)), atol=1e-6)
  with pytest.raises(from_gpt.ConversionError, match=r"l2r:W: model.target='adaln'"):
    from_gpt.from_l2r(m, where="l2r:W")


@pytest.mark.slow
def test_gate_offset_and_tanh_gelu_change_the_function_only_when_set():
  base = model_lib.preset("tiny", n_layer=1, n_embd=32, n_head=2, target_dim=8, block_size=N)
  x = np.random.default_rng(0).integers(0, V, (1, N))
  ref = np.asarray(model_lib.AOGPT(base, rngs=nnx.Rngs(0))(x, _l2r(1)))
  got = np.asarray(model_lib.AOGPT(base.replace(gate_offset=1.0), rngs=nnx.Rngs(0))(x, _l2r(1)))
  assert np.abs(got[..., :V] - ref[..., :V]).max() > 1e-4
  h = 3 * np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
  mlp = {g: model_lib.AOGPT(base.replace(gelu=g), rngs=nnx.Rngs(0)).h[0].mlp
         for g in ("exact", "tanh")}
  w1, b1 = (np.asarray(mlp["tanh"].c_fc.kernel[...]), np.asarray(mlp["tanh"].c_fc.bias[...]))
  w2, b2 = (np.asarray(mlp["tanh"].c_proj.kernel[...]), np.asarray(mlp["tanh"].c_proj.bias[...]))
  u = h @ w1 + b1
  tanh_gelu = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
  np.testing.assert_allclose(np.asarray(mlp["tanh"](h)), tanh_gelu @ w2 + b2, atol=1e-6)
  assert np.abs(np.asarray(mlp["tanh"](h)) - np.asarray(mlp["exact"](h))).max() > 1e-7
  with pytest.raises(ValueError, match="model.gelu: must be one of"):
    base.replace(gelu="fast")


def _write_tensors(path, tensors):
  from safetensors.numpy import save_file
  save_file(tensors, os.path.join(path, "model.safetensors"))


def test_bad_sources_are_one_line_naming_file_and_tensor(tmp_path):
  from safetensors.numpy import load_file
  folder = published.gpt2_folder(tmp_path / "g", vocab=97, n_positions=NPOS)
  weights = os.path.join(folder, "model.safetensors")
  m, cfg, prov = spec_lib.load(f"gpt2:{folder}")
  assert cfg.valid_vocab_size == 97 and prov["weights_file"] == weights
  # A GPT-2 whose vocabulary the tokenizer does not match.
  with pytest.raises(spec_lib.CheckpointSpecError,
                     match=rf"'byte' has 257 ids .* valid_vocab_size=97 \(tensor 'wte.weight' "
                           rf"of {weights}\)"):
    spec_lib.check_vocab(cfg, "byte", 257, prov)
  # Missing and misshapen tensors.
  tensors = load_file(weights)
  _write_tensors(folder, {k: v for k, v in tensors.items() if k != "h.0.mlp.c_fc.bias"})
  with pytest.raises(spec_lib.CheckpointSpecError,
                     match=rf"^--checkpoint=gpt2:{folder}: {weights}: missing tensor "
                           rf"'h.0.mlp.c_fc.bias'$"):
    spec_lib.load(f"gpt2:{folder}")
  _write_tensors(folder, dict(tensors, **{"wpe.weight": tensors["wpe.weight"][:-1]}))
  with pytest.raises(spec_lib.CheckpointSpecError, match=r"tensor 'wpe.weight' has shape "
                                                         r"\(32, 16\), config.json implies"):
    spec_lib.load(f"gpt2:{folder}")
  _write_tensors(folder, dict(tensors, **{"h.0.attn.extra": tensors["ln_f.bias"]}))
  with pytest.raises(spec_lib.CheckpointSpecError, match=r"unexpected tensor\(s\) "
                                                         r"\['h.0.attn.extra'\]"):
    spec_lib.load(f"gpt2:{folder}")
  # A folder that is not a GPT-2.
  cfg_file = os.path.join(folder, "config.json")
  with open(cfg_file, "w") as f:
    json.dump({"model_type": "llama"}, f)
  with pytest.raises(spec_lib.CheckpointSpecError,
                     match=rf": {cfg_file}: model_type 'llama' is not 'gpt2'"):
    spec_lib.load(f"gpt2:{folder}")
  with pytest.raises(spec_lib.CheckpointSpecError, match="config.json: missing"):
    spec_lib.load(f"gpt2:{tmp_path}")
  with pytest.raises(spec_lib.CheckpointSpecError, match="no such folder"):
    spec_lib.load(f"gpt2:{tmp_path}/nope")
  # The convert command: one line, nothing written.
  with pytest.raises(SystemExit) as e:
    convert.main(["from-gpt", "--spec", f"gpt2:{folder}", "--out", str(tmp_path / "o")])
  assert len(str(e.value).splitlines()) == 1 and "model_type 'llama'" in str(e.value)
  assert not (tmp_path / "o").exists()


def test_convert_from_gpt_writes_a_folder_that_loads_back(tmp_path):
  folder = published.gpt2_folder(tmp_path / "g", vocab=V, n_positions=NPOS, n_layer=2)
  out = tmp_path / "a2o"
  convert.main(["from-gpt", "--spec", f"gpt2:{folder}", "--out", str(out)])
  back, cfg, prov = spec_lib.load(str(out))
  direct, cfg2, _ = spec_lib.load(f"gpt2:{folder}")
  assert cfg == cfg2 and prov["source"] == str(out)
  x = np.random.default_rng(0).integers(0, V, (2, N))
  np.testing.assert_array_equal(np.asarray(back(x, _l2r(2))), np.asarray(direct(x, _l2r(2))))
  params, gcfg = gpt2.load(folder)
  ctx = np.concatenate([np.full((2, 1), V - 1), x[:, :-1]], 1)
  np.testing.assert_allclose(np.asarray(back(x, _l2r(2)))[..., :V],
                             np.asarray(gpt2.logits(params, ctx, cfg=gcfg)), atol=1e-5)
  meta = json.loads((out / "config.json").read_text())["meta"]
  assert meta["source"] == f"gpt2:{folder}" and "from-gpt" in meta["converted_by"]
  with pytest.raises(SystemExit, match="is not empty"):
    convert.main(["from-gpt", "--spec", f"gpt2:{folder}", "--out", str(out)])
  # aogpt_jax.load takes the spec too, with the byte tokenizer for a 257-id vocabulary.
  import aogpt_jax
  m, run_cfg = aogpt_jax.load(f"gpt2:{folder}")
  assert run_cfg.data.tokenizer == "byte" and run_cfg.seq_len == NPOS - 1
  assert run_cfg.loaded.source == f"gpt2:{folder}"


def test_curriculum_goes_from_all_l2r_to_the_mixture():
  key = jax.random.key(0)
  kw = dict(steps=100, p_start=1.0, p_end=0.1)
  frac = lambda step: float(np.mean(np.asarray(orders.is_l2r(
      orders.sample("curriculum", key, 4000, 8, step=step, **kw)))))
  assert frac(0) == 1.0
  assert frac(50) == pytest.approx(0.55, abs=0.03)
  assert frac(100) == pytest.approx(0.1, abs=0.02) and frac(10_000) == pytest.approx(0.1, abs=0.02)
  assert float(orders.curriculum_p_l2r(jax.numpy.asarray(25), 100, 1.0, 0.1)) == pytest.approx(
      0.775)
  # Traced step (as in the train step), and a step-free distribution ignores it.
  jitted = jax.jit(lambda s: orders.sample("curriculum", key, 8, 8, step=s, **kw))
  assert np.all(np.asarray(orders.is_l2r(jitted(0))))
  assert orders.takes_step("curriculum") and not orders.takes_step("mixture")
  np.testing.assert_array_equal(orders.sample("mixture", key, 4, 8, step=3),
                                orders.sample("mixture", key, 4, 8))
  with pytest.raises(ValueError, match=r"takes \['steps', 'p_start', 'p_end'\]"):
    orders.check_kwargs("curriculum", {"step": 3})
  with pytest.raises(ValueError, match="p_end must be in"):
    orders.sample("curriculum", key, 2, 4, p_end=2.0)


def test_a2o_configs_resolve_to_the_gpt2_architecture():
  import importlib.util
  spec = importlib.util.spec_from_file_location("a2o", os.path.join(
      os.path.dirname(__file__), "..", "configs", "a2o_gpt2_small.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  big = mod.get_config()
  mc = config_lib.resolve(big)
  hf_small = dict(model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12,
                  n_head=12)
  want = from_gpt.gpt2_model_config(hf_small)
  assert {f: getattr(mc, f) for f in from_gpt.FUNCTION_FIELDS} == {
      f: getattr(want, f) for f in from_gpt.FUNCTION_FIELDS}
  assert big.train.init_from == "gpt2:openai-community/gpt2" and big.order.name == "curriculum"
  tiny = mod.get_config("tiny")
  assert tiny.train.init_from == "l2r:" + recipes.L2R_TINY_WORKDIR
  config_lib.resolve(tiny)
  with pytest.raises(ValueError, match="expected nothing or 'tiny'"):
    mod.get_config("medium")


@pytest.mark.slow
def test_eval_mode_l2r_perplexity_of_a_converted_gpt2_is_gpt2s(tmp_path):
  from aogpt_jax import data, modes
  from helpers import trainer as tu
  folder = published.gpt2_folder(tmp_path / "g", vocab=V, n_positions=NPOS, n_layer=2)
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i} + 1\n" * 3})
                            + "\n" for i in range(40)))
  cfg = tu.tiny_config(tmp_path / "cache")
  cfg.data.source, cfg.data.glob, cfg.data.validation_fraction = "text_files", str(corpus), 0.5
  cfg.seq_len, cfg.eval.max_blocks, cfg.eval.batch_size = N, 12, 4
  res = modes.eval_mode(cfg, str(tmp_path / "out"), checkpoint=f"gpt2:{folder}")
  got = res["datasets"]["heldout"]["l2r"]
  params, gcfg = gpt2.load(folder)
  nll, count = 0.0, 0
  for b in data.eval_batches(cfg.data, split=cfg.eval.split, seq_len=N, global_batch_size=4,
                             max_blocks=12):
    x = b["tokens"][b["weight"] > 0]
    ctx = np.concatenate([np.full((len(x), 1), V - 1), x[:, :-1]], 1)   # GPT-2 reads EOT first
    lp = jax.nn.log_softmax(np.asarray(gpt2.logits(params, ctx, cfg=gcfg), np.float64), -1)
    nll -= float(np.take_along_axis(np.asarray(lp), x[..., None], -1).sum())
    count += x.size
  assert count == 12 * N
  assert got["nll"] == pytest.approx(nll / count, rel=1e-5)
  meta = json.loads((tmp_path / "out" / "eval" / "zero_shot.json").read_text())["meta"]
  assert meta["source"] == f"gpt2:{folder}"


@pytest.mark.slow
def test_train_init_from_l2r_run_starts_from_its_weights_and_resume_ignores_it(tmp_path):
  from ml_collections import config_dict
  from aogpt_jax.checkpoints import store
  from aogpt_jax.train import loop
  from helpers import trainer as tu
  cache = tmp_path / "cache"
  l2r_cfg = tu.tiny_config(cache, model__target="none", total_steps=2, checkpoint_every=2)
  l2r_cfg.order.name, l2r_cfg.order.kwargs = "l2r", config_dict.ConfigDict({})
  loop.train(l2r_cfg, str(tmp_path / "l2r"))
  want, _, _ = from_gpt.load(f"l2r:{tmp_path / 'l2r'}")

  def a2o(**kw):
    c = tu.tiny_config(cache, **{f"model__{k}": v for k, v in recipes.IDENTITY_FIELDS.items()},
                       **({"optimizer__lr": 0.0, "total_steps": 1, "checkpoint_every": 1} | kw))
    c.order.name = "curriculum"
    c.order.kwargs = config_dict.ConfigDict({"steps": 10})
    return c
  cfg = a2o()
  cfg.train.init_from = f"l2r:{tmp_path / 'l2r'}"
  loop.train(cfg, str(tmp_path / "a2o"))
  flat = lambda m: from_gpt.flatten(nnx.to_pure_dict(nnx.state(m, nnx.Param)))
  ref = flat(want)
  for which in ("params", "ema"):      # lr 0: the run's weights are still the converted ones
    got = flat(store.load_model(str(tmp_path / "a2o"), which=which)[0])
    assert sorted(got) == sorted(ref)
    for k in ref:
      np.testing.assert_array_equal(got[k], ref[k], err_msg=f"{which} {k}")
  # Resuming: the run's own checkpoint takes over (init_from is not read again).
  cfg = a2o(total_steps=2)
  cfg.train.init_from = f"l2r:{tmp_path / 'nowhere'}"
  loop.train(cfg, str(tmp_path / "a2o"))
  assert tu.checkpoint_steps(tmp_path / "a2o")[-1] == 2
  # A new run whose model differs: one line naming the fields, before training.
  cfg = a2o(model__n_embd=64)
  cfg.train.init_from = f"l2r:{tmp_path / 'l2r'}"
  with pytest.raises(config_lib.ConfigError, match=r"train.init_from: l2r:.* is a different "
                                                   r"model: model.n_embd=32 \(the run has 64\)"):
    loop.train(cfg, str(tmp_path / "other"))
  cfg = a2o()
  cfg.train.init_from = f"l2r:{tmp_path / 'nowhere'}"
  with pytest.raises(config_lib.ConfigError, match="train.init_from: .*no training run there"):
    loop.train(cfg, str(tmp_path / "other2"))
