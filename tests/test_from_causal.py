"""Llama / Mistral / Qwen2 / Qwen3 / Gemma -> AO-GPT (checkpoints/from_causal.py): under the L2R
order the converted model computes the source's logits (random small transformers models, both
attention paths), decodes greedily as HF's `generate`, scores --mode=eval perplexity as the
source with the source's own tokenizer; grouped-query attention in every cached sampler equals
its uncached reference; every unsupported config field is refused in one line naming it."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from aogpt_jax.checkpoints import convert, from_causal, from_gpt
from aogpt_jax.checkpoints import spec as spec_lib
from aogpt_jax.model import aogpt as model_lib

N, BOS = 16, 3
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma")
# Measured max |AO-GPT - HF| logit differences (fp32, both attention paths), for the record.
MAX_DIFF = 1e-4


def _hf_config(family, vocab, **kw):
  transformers = pytest.importorskip("transformers", reason="needs transformers")
  cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
         "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
         "gemma": transformers.GemmaConfig}[family]
  args = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              bos_token_id=BOS, eos_token_id=BOS, rope_theta=500.0, initializer_range=0.1,
              tie_word_embeddings=family in ("qwen2", "gemma"))
  if family in ("qwen3", "gemma"):
    args["head_dim"] = 16                        # heads wider than hidden_size / heads
  if family == "mistral":
    args["sliding_window"] = 64                  # never binds within 63 positions
  return cls(**(args | kw))


def hf_model(family, folder, vocab=200, shard=None, **kw):
  """A random transformers model of ``family`` saved to ``folder`` (norms and biases made
  non-trivial so that a swapped or misplaced tensor shows)."""
  torch = pytest.importorskip("torch", reason="needs torch (requirements-extra.txt)")
  transformers = pytest.importorskip("transformers", reason="needs transformers")
  torch.manual_seed(0)
  hf = transformers.AutoModelForCausalLM.from_config(_hf_config(family, vocab, **kw)).eval()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.2 * torch.randn_like(p))
  hf.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
  return torch, hf


def _l2r(b):
  return np.broadcast_to(np.arange(N), (b, N))


def _with(m, **kw):
  return from_gpt.with_weights(m.cfg.replace(**kw),
                               from_gpt.flatten(nnx.to_pure_dict(nnx.state(m, nnx.Param))))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("family", FAMILIES)
def test_converted_model_has_the_source_logits_on_both_attention_paths(tmp_path, family):
  shard = "20KB" if family == "qwen2" else None          # qwen2: a sharded folder
  torch, hf = hf_model(family, tmp_path, shard=shard)
  if shard:
    assert (tmp_path / "model.safetensors.index.json").exists()
  m, cfg, prov = spec_lib.load(f"causal:{tmp_path}")
  assert (cfg.valid_vocab_size, cfg.vocab_size, cfg.block_size) == (200, 256, 63)
  assert cfg.rope_query == "token" and not cfg.learned_pos and cfg.kv_heads == 2
  assert prov["bos_id"] == BOS and prov["weights"] == family
  x = np.random.default_rng(0).integers(0, 200, (3, N))
  ctx = np.concatenate([np.full((3, 1), BOS), x[:, :-1]], 1)      # the source reads BOS first
  want = hf(torch.tensor(ctx)).logits.detach().numpy()
  assert np.abs(want).max() > 1.0                                  # a non-trivial function
  for kw in (dict(attention="gather"), dict(attention="mask"),
             dict(attention="gather", attention_impl="blockwise", attention_block=8)):
    got = np.asarray(_with(m, **kw)(x, _l2r(3)))
    assert np.all(np.isneginf(got[..., 200:])), kw
    diff = np.abs(got[..., :200] - want).max()
    print(f"{family} {kw}: max |logit diff| {diff:.2e}")
    assert diff < MAX_DIFF, (kw, diff)
  # The target conditioning is the identity only under L2R's targets; any order still runs.
  order = np.stack([np.random.default_rng(i).permutation(N) for i in range(3)])
  assert np.isfinite(np.asarray(m(x, order))[..., :200]).all()


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_kv_cached_ar_decoding_equals_hf_generate(tmp_path, family):
  from aogpt_jax.sampling import prompts, sampler
  torch, hf = hf_model(family, tmp_path)
  m, _, _ = spec_lib.load(f"causal:{tmp_path}")
  prefixes = [[5, 17, 99], [150, 3, 3, 41, 7]]
  s = sampler.SampleSettings(length=N, order="l2r", method="ar", greedy=True)
  out = sampler.generate(m, jax.random.key(0), s,
                         prompt=prompts.prefix_prompt(prefixes, N, m.cfg.vocab_size)).tokens
  for row, p in zip(out, prefixes):
    ids = torch.tensor([[BOS] + p])
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       max_new_tokens=N - len(p), min_new_tokens=N - len(p),
                       pad_token_id=0)[0, 1:].numpy()
    np.testing.assert_array_equal(row, want)


def tiny_tokenizer(folder, texts):
  """A byte-level BPE tokenizer.json trained on ``texts`` (``<|endoftext|>`` = id 0)."""
  tokenizers = pytest.importorskip("tokenizers")
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer)
  tok.save(os.path.join(folder, "tokenizer.json"))
  return tok


@pytest.mark.slow
@pytest.mark.torch
def test_eval_mode_l2r_perplexity_with_the_sources_tokenizer_is_the_sources(tmp_path):
  """The folder's tokenizer.json prepares the corpus (data.tokenizer=causal:DIR) and
  --mode=eval's L2R NLL is the source model's on the same blocks; aogpt_jax.load names the
  tokenizer, and the sampler's text decodes with it."""
  from aogpt_jax import data, modes
  from helpers import trainer as tu
  import aogpt_jax
  texts = [f"def f{i}(x):\n    return x * {i} + 1\n" * 3 for i in range(40)]
  folder = tmp_path / "qwen"
  folder.mkdir()
  tok = tiny_tokenizer(folder, texts)
  vocab = tok.get_vocab_size()
  torch, hf = hf_model("qwen2", folder, vocab=vocab, bos_token_id=0, eos_token_id=0)
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
  cfg = tu.tiny_config(tmp_path / "cache")
  cfg.data.source, cfg.data.glob, cfg.data.validation_fraction = "text_files", str(corpus), 0.5
  cfg.data.tokenizer = f"causal:{folder}"
  cfg.seq_len, cfg.eval.max_blocks, cfg.eval.batch_size = N, 8, 4
  assert data.get_tokenizer(cfg.data.tokenizer).eot_id == 0
  res = modes.eval_mode(cfg, str(tmp_path / "out"), checkpoint=f"causal:{folder}")
  got = res["datasets"]["heldout"]["l2r"]
  nll, count = 0.0, 0
  for b in data.eval_batches(cfg.data, split=cfg.eval.split, seq_len=N, global_batch_size=4,
                             max_blocks=8):
    x = b["tokens"][b["weight"] > 0]
    ctx = np.concatenate([np.zeros((len(x), 1), np.int64), x[:, :-1]], 1)
    lp = torch.log_softmax(hf(torch.tensor(ctx)).logits.double(), -1).detach().numpy()
    nll -= float(np.take_along_axis(lp, x[..., None], -1).sum())
    count += x.size
  assert count == 8 * N
  assert got["nll"] == pytest.approx(nll / count, rel=1e-5)
  m, run_cfg = aogpt_jax.load(f"causal:{folder}")
  assert run_cfg.data.tokenizer == f"causal:{folder}" and run_cfg.seq_len == 63
  text = data.get_tokenizer(run_cfg.data.tokenizer).decode(tok.encode("return x").ids)
  assert text == "return x"


@pytest.fixture(scope="module")
def gqa_model():
  """A converted-like tiny model: 2 query heads sharing 1 key/value head, SwiGLU, q/k/v biases,
  rotary queries at their token, no learned positions (random adaLN: the target matters)."""
  from helpers.sampler import tiny_model
  return tiny_model(n_kv_head=1, mlp="swiglu", mlp_hidden=24, qkv_bias=True, bias=False,
                    rope=True, rope_query="token", learned_pos=False, qk_norm=False)


def test_gqa_cache_holds_the_kv_heads_and_diffusion_steps_equal_uncached(gqa_model):
  import test_sampler_logits as sl
  k, v = gqa_model.init_cache(3, 7)[0]
  assert k.shape == v.shape == (3, 1, 7, 8)
  sl.test_step_logits_equal_uncached_forward(gqa_model, "stochastic", 4, True, 2)
  sl.test_ar_greedy_equals_uncached_argmax(gqa_model)


@pytest.mark.slow
def test_gqa_cached_samplers_equal_their_uncached_references(gqa_model, monkeypatch):
  import test_sampler_adaptive as sa
  import test_sampler_logits as sl
  import test_speculative as sp
  sl.test_step_logits_equal_uncached_forward(gqa_model, "deterministic", 3, True, 2)
  sl.test_cached_and_uncached_samplers_draw_identical_tokens(gqa_model, "stochastic")
  sl.test_ar_equals_l2r_diffusion_with_one_token_per_step(gqa_model)
  sa.test_cached_equals_the_uncached_reference(
      gqa_model, dict(policy="margin", steps=3, candidates=5), True)
  monkeypatch.setattr(sp, "tiny_model", lambda rope, prompt_attention: gqa_model)
  sp.test_verify_and_draft_logits_equal_uncached_forward(4, "taper", True, "causal")
  # Queries turned at their target (the default) with grouped heads, too.
  from helpers.sampler import tiny_model
  sl.test_step_logits_equal_uncached_forward(
      tiny_model(n_kv_head=1, rope=True, seed=1), "stochastic", 4, True, 2)


BASE = dict(model_type="llama", vocab_size=50, hidden_size=16, intermediate_size=24,
            num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=33)


@pytest.mark.parametrize("change,match", [
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
     r"rope_scaling.rope_type 'llama3': only the default"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
     r"rope_parameters.rope_type 'yarn'"),
    (dict(partial_rotary_factor=0.5), r"partial_rotary_factor 0.5"),
    (dict(model_type="mistral", sliding_window=16), r"sliding_window 16: the window binds"),
    (dict(model_type="qwen2", use_sliding_window=True), r"use_sliding_window True: not supp"),
    (dict(attention_bias=True), r"attention_bias True: not supported"),
    (dict(mlp_bias=True), r"mlp_bias True"),
    (dict(attn_logit_softcapping=50.0), r"attn_logit_softcapping 50.0"),
    (dict(final_logit_softcapping=30.0), r"final_logit_softcapping 30.0"),
    (dict(num_local_experts=8), r"num_local_experts 8"),
    (dict(layer_types=["sliding_attention"]), r"layer_types \['sliding_attention'\]"),
    (dict(hidden_act="gelu"), r"hidden_act 'gelu': llama converts with \['silu', 'swish'\]"),
    (dict(num_key_value_heads=3), r"num_key_value_heads 3 does not divide"),
    (dict(hidden_size=None), r"hidden_size None: a positive integer"),
])
def test_unsupported_fields_are_refused_in_one_line(change, match):
  hf = {**from_causal.DEFAULTS[change.get("model_type", "llama")], **BASE, **change}
  hf = {k: v for k, v in hf.items() if v is not None}
  with pytest.raises(from_gpt.ConversionError, match=rf"^C: {match}") as e:
    from_causal.model_config(hf, where="C")
  assert len(str(e.value).splitlines()) == 1


def _tiny_folder(path, family="llama", **cfg):
  """A random causal LM folder written without torch (numpy tensors)."""
  from safetensors.numpy import save_file
  hf = {**BASE, "model_type": family, "bos_token_id": 1, **cfg}
  os.makedirs(path, exist_ok=True)
  (path / "config.json").write_text(json.dumps(hf))
  full = {**from_causal.DEFAULTS[family], **hf}
  mc = from_causal.model_config(full)
  rng = np.random.default_rng(0)
  d, h, hd = mc.n_embd, mc.mlp_width, mc.head_dim
  qd, kvd = mc.n_head * hd, mc.kv_heads * hd
  t = {"model.embed_tokens.weight": (50, d), "model.norm.weight": (d,), "lm_head.weight": (50, d)}
  for i in range(mc.n_layer):
    p = f"model.layers.{i}."
    t.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
              p + "self_attn.q_proj.weight": (qd, d), p + "self_attn.k_proj.weight": (kvd, d),
              p + "self_attn.v_proj.weight": (kvd, d), p + "self_attn.o_proj.weight": (d, qd),
              p + "mlp.gate_proj.weight": (h, d), p + "mlp.up_proj.weight": (h, d),
              p + "mlp.down_proj.weight": (d, h)})
  tensors = {k: rng.standard_normal(s).astype(np.float32) * 0.1 for k, s in t.items()}
  save_file(tensors, str(path / "model.safetensors"))
  return tensors


def test_bad_folders_name_the_file_and_tensor_and_convert_writes_a_loadable_folder(tmp_path):
  from safetensors.numpy import save_file
  folder = tmp_path / "llama"
  tensors = _tiny_folder(folder)
  weights = str(folder / "model.safetensors")
  m, cfg, prov = spec_lib.load(f"causal:{folder}?block_size=16")
  assert cfg.block_size == 16 and prov["weights_file"] == weights and "tokenizer" not in prov
  with pytest.raises(spec_lib.CheckpointSpecError, match=r"only option is \?block_size=N"):
    spec_lib.load(f"causal:{folder}?bos=2")
  with pytest.raises(spec_lib.CheckpointSpecError, match=r"block_size 40 needs block_size \+ 1"):
    spec_lib.load(f"causal:{folder}?block_size=40")
  # convert from-gpt takes the spec; the folder loads back with the same logits.
  out = tmp_path / "a2o"
  convert.main(["from-gpt", "--spec", f"causal:{folder}?block_size=16", "--out", str(out)])
  back, cfg2, _ = spec_lib.load(str(out))
  assert cfg2 == cfg
  x = np.random.default_rng(0).integers(0, 50, (2, N))
  np.testing.assert_array_equal(np.asarray(back(x, _l2r(2))), np.asarray(m(x, _l2r(2))))
  # Missing / misshapen / unknown tensors; a model_type that does not convert.
  save_file({k: v for k, v in tensors.items() if k != "model.layers.0.mlp.up_proj.weight"},
            weights)
  with pytest.raises(spec_lib.CheckpointSpecError, match=rf"^--checkpoint=causal:{folder}: "
                     rf"{weights}: missing tensor 'model.layers.0.mlp.up_proj.weight'$"):
    spec_lib.load(f"causal:{folder}")
  save_file(dict(tensors, **{"model.norm.weight": tensors["model.norm.weight"][:-1]}), weights)
  with pytest.raises(spec_lib.CheckpointSpecError, match=r"'model.norm.weight' has shape \(15,\)"):
    spec_lib.load(f"causal:{folder}")
  save_file(dict(tensors, **{"model.layers.0.extra": tensors["model.norm.weight"]}), weights)
  with pytest.raises(spec_lib.CheckpointSpecError, match=r"unexpected tensor\(s\) "
                                                         r"\['model.layers.0.extra'\]"):
    spec_lib.load(f"causal:{folder}")
  (folder / "config.json").write_text(json.dumps({**BASE, "model_type": "gemma2"}))
  with pytest.raises(spec_lib.CheckpointSpecError, match=r"model_type 'gemma2' is not one of"):
    spec_lib.load(f"causal:{folder}")
  with pytest.raises(SystemExit) as e:
    convert.main(["from-gpt", "--spec", f"causal:{folder}", "--out", str(tmp_path / "o")])
  assert len(str(e.value).splitlines()) == 1 and "gemma2" in str(e.value)
  assert not (tmp_path / "o").exists()


def test_defaults_are_the_published_architecture():
  """Every new field at its default is the model as before (published parameter shapes)."""
  cfg = model_lib.PRESETS["small"]
  assert (cfg.kv_heads, cfg.head_dim, cfg.mlp_width, cfg.mlp, cfg.rope_query) == (
      12, 64, 3072, "gelu", "target")
  assert cfg.learned_pos and not cfg.qkv_bias and cfg.norm_eps == 1e-5
  with pytest.raises(ValueError, match=r"^model.n_kv_head: 5 key/value heads do not divide "
                                       r"n_head=12$"):
    cfg.replace(n_kv_head=5)
  with pytest.raises(ValueError, match=r"^model.mlp: must be one of"):
    cfg.replace(mlp="relu")
  with pytest.raises(ValueError, match=r"^model.rope_query: must be one of"):
    cfg.replace(rope_query="key")


def _a2o_qwen():
  import importlib.util
  spec = importlib.util.spec_from_file_location("a2o_qwen", os.path.join(
      os.path.dirname(__file__), "..", "configs", "a2o_qwen.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.slow
@pytest.mark.torch
def test_a2o_qwen_tiny_converts_a_random_qwen2_and_starts_training_from_it(tmp_path):
  """configs/a2o_qwen.py: the full recipe's model is Qwen2.5-0.5B's conversion; ``:tiny``
  writes a random Qwen2, and a run (lr 0) starts from exactly its converted weights."""
  pytest.importorskip("transformers")
  from aogpt_jax import config as config_lib
  from aogpt_jax.checkpoints import store
  from aogpt_jax.train import loop
  mod = _a2o_qwen()
  big = mod.get_config("folder=/nowhere/qwen")
  assert big.train.init_from == "causal:/nowhere/qwen?block_size=2048"
  assert big.data.tokenizer == "causal:/nowhere/qwen" and big.model.n_kv_head == 2
  assert (big.model.mlp_hidden, big.model.vocab_size, big.model.rope_theta) == (4864, 151936, 1e6)
  cfg = mod.get_config(f"tiny,folder={tmp_path / 'src'}")
  mc = config_lib.resolve(cfg)
  want, wcfg, _ = spec_lib.load(cfg.train.init_from)
  assert {f: getattr(mc, f) for f in from_gpt.FUNCTION_FIELDS} == {
      f: getattr(wcfg, f) for f in from_gpt.FUNCTION_FIELDS}
  from aogpt_jax import recipes
  recipes.apply(cfg, {"total_steps": 1, "checkpoint_every": 1, "optimizer.lr": 0.0,
                      "batch_size": 8, "eval_every": 0, "data.cache_dir": str(tmp_path / "c")})
  loop.train(cfg, str(tmp_path / "run"))
  flat = lambda m: from_gpt.flatten(nnx.to_pure_dict(nnx.state(m, nnx.Param)))
  ref, got = flat(want), flat(store.load_model(str(tmp_path / "run"), which="params")[0])
  assert sorted(got) == sorted(ref)
  for k in ref:
    np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
