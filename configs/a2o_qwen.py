"""Qwen2.5-0.5B -> an AO-GPT: starts from the Hugging Face model converted so that the AO-GPT
computes its logits under the left-to-right order (`train.init_from=causal:DIR?block_size=2048`,
checkpoints/from_causal.py), then teaches it every order: the curriculum from all L2R to the
paper's 10% mixture, peak lr 1e-4 after 500 warm-up steps, 20k steps of 0.5M tokens, 2048-token
blocks, the model's own tokenizer (``data.tokenizer=causal:DIR``). docs/training.md, "Starting
from a GPT".

  python -m aogpt_jax.main --config=configs/a2o_qwen.py:folder=/models/Qwen2.5-0.5B --workdir=W

DIR is a local folder holding the model's config.json, safetensors and tokenizer.json
(``folder=PATH``; default $AOGPT_QWEN_DIR, else ~/models/Qwen2.5-0.5B).

``:tiny`` is the CPU analogue: a random Qwen2 of the same kind (grouped-query attention, q/k/v
biases, SwiGLU, tied head; 2 layers, d 64, the 257 byte ids) written with transformers into
``folder`` (default /tmp/aogpt_qwen_tiny_src, built once; needs torch and transformers), converted
and adapted for 300 steps on the byte-level python_stdlib corpus:

  python -m aogpt_jax.main --config=configs/a2o_qwen.py:tiny --workdir=/tmp/aogpt_a2o_qwen_tiny
"""

import os

from aogpt_jax import recipes
from aogpt_jax.checkpoints import from_causal, from_gpt

# config.json of Qwen/Qwen2.5-0.5B (the fields the conversion reads).
QWEN25_05B = dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                  bos_token_id=151643, eos_token_id=151643)
# The CPU analogue: the same family at tiny size, over the byte tokenizer's 257 ids.
TINY = dict(QWEN25_05B, vocab_size=257, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, bos_token_id=256, eos_token_id=256)
TINY_FOLDER = "/tmp/aogpt_qwen_tiny_src"


def model_fields(hf: dict, block_size: int, target_dim: int) -> dict:
  """The run's model.* fields: those of the AO-GPT the conversion of ``hf`` builds."""
  mc = from_causal.model_config({**from_causal.DEFAULTS[hf["model_type"]], **hf},
                                block_size=block_size, target_dim=target_dim)
  return {f"model.{f}": getattr(mc, f) for f in from_gpt.FUNCTION_FIELDS}


def write_tiny(folder: str, hf: dict = TINY, seed: int = 0) -> str:
  """A random transformers model with config ``hf`` saved in ``folder`` (once)."""
  if os.path.exists(os.path.join(folder, "config.json")):
    return folder
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  cfg = transformers.AutoConfig.for_model(**hf)
  transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
  return folder


def get_config(arg=None):
  tokens = [t.strip() for t in (arg or "").split(",") if t.strip()]
  folders = [t.partition("=")[2] for t in tokens if t.startswith("folder=")]
  rest = [t for t in tokens if not t.startswith("folder=")]
  if rest not in ([], ["tiny"]) or len(folders) > 1:
    raise ValueError(f"config argument {arg!r}: expected nothing, 'tiny' and/or 'folder=PATH'")
  if rest:
    folder = write_tiny(folders[0] if folders else TINY_FOLDER)
    c = recipes.apply(recipes.tiny(recipes.paper("small")), model_fields(TINY, 128, 128))  # the spec: 128
    recipes.apply(c, {"seq_len": 128})
    return recipes.adapt(c, f"causal:{folder}?block_size=128", steps=300, curriculum_steps=100,
                         lr=1e-3, warmup_steps=10)
  folder = folders[0] if folders else os.environ.get(
      "AOGPT_QWEN_DIR", os.path.expanduser("~/models/Qwen2.5-0.5B"))
  c = recipes.apply(recipes.paper("small"), model_fields(QWEN25_05B, 2048, 128))
  recipes.apply(c, {"data.tokenizer": f"causal:{folder}", "seq_len": 2048, "batch_size": 256,
                    "microbatches": 8, "eval_every": 1000, "checkpoint_every": 1000,
                    "checkpoint.keep_every": 5000})
  return recipes.adapt(c, f"causal:{folder}?block_size=2048", steps=20_000,
                       curriculum_steps=5_000, lr=1e-4, warmup_steps=500)
