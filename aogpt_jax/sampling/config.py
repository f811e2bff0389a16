"""The ``sample`` config group (``--config.sample.steps=128`` etc.) and its translation into
`SampleSettings` and a prompt."""

from __future__ import annotations

from typing import Any

import ml_collections

from aogpt_jax import config_groups
from aogpt_jax.model.aogpt import ModelConfig
from aogpt_jax.sampling import prompts
from aogpt_jax.sampling.sampler import SampleSettings


def sample_config() -> ml_collections.ConfigDict:
  """Defaults of the ``sample`` config group (``--config.sample.steps=128`` etc.)."""
  return ml_collections.ConfigDict(dict(
      method="diffusion",          # diffusion | ar | uncached | speculative | adaptive |
                                   # encoder (MDM model; adaptive fits it too)
      draft="auto",                # speculative: drafts per round, "auto" or an integer ("4")
      draft_queries="taper",       # speculative: taper (fewer after early slots) | all
      policy="max_prob",           # adaptive: max_prob | confidence | margin | entropy | random |
                                   # threshold (or a registered one)
      candidates=0,                # adaptive: positions queried per step (0: every masked one)
      threshold=0.9,               # adaptive, policy=threshold: commit max prob >= this
      policy_temperature=0.0,      # adaptive: > 0 draws the positions from softmax(scores / it)
                                   # (max_prob | margin | entropy | threshold; exact order logp)
      order_head=False,            # adaptive: the model's order head (trained by --mode=rl with
                                   # rl.order_head=K) re-scores the policy's top K
      num_samples=8,
      batch_size=8,
      length=0,                    # 0: the length the run trained on (its seq_len), else
                                   # model.block_size (a published checkpoint)
      # 1..length (ignored by ar); None (the default): length, one position per step
      steps=ml_collections.FieldReference(None, field_type=int),
      schedule="linear",           # linear | cosine
      count_mode="deterministic",  # deterministic (released code) | stochastic (Lemma 4.1)
      order="random",              # random | l2r | any registered order distribution
      top_p=1.0,
      top_p_rule="published",    # published (the released code's rule) | nucleus
      temperature=1.0,
      greedy=False,
      seed=0,
      prompt="",                   # text given at the start (prefix prompting)
      suffix="",                   # text given at the end (with prompt: infilling)
      prompt_pairs="",             # extra given tokens, "position:token_id,..."
      which="",                    # weights to load: ema | params; "" = ema (a converted
                                   # folder: the weights it holds, without a warning)
      name="",                     # output file stem ("" -> derived from the settings)
  ))


def _run_sample_group() -> ml_collections.ConfigDict:
  """The ``sample`` group of a run's config: `sample_config` with ``method`` "" (= the
  objective's: diffusion | encoder; config.follow_objective; adaptive fits both)."""
  c = sample_config()
  c.method = ""
  return c


config_groups.register("sample", _run_sample_group)


def default_length(c: ml_collections.ConfigDict, cfg: ModelConfig,
                   trained_length: int | None = None) -> int:
  """``sample.length``, or when it is 0 the sequence length the model was trained on
  (``trained_length``, the run's ``seq_len``; positions beyond it were never trained), else
  ``model.block_size``."""
  return int(c.length) or min(int(trained_length or cfg.block_size), cfg.block_size)


def settings_from_config(c: ml_collections.ConfigDict, cfg: ModelConfig,
                         trained_length: int | None = None) -> SampleSettings:
  steps = None if c.steps is None else int(c.steps)
  return SampleSettings(length=default_length(c, cfg, trained_length), steps=steps,
                        schedule=c.schedule, count_mode=c.count_mode, order=c.order,
                        temperature=float(c.temperature), top_p=float(c.top_p),
                        top_p_rule=str(c.get("top_p_rule", "published")),
                        greedy=bool(c.greedy), method=c.method,
                        draft=parse_draft(c.get("draft", "auto")),
                        draft_queries=str(c.get("draft_queries", "taper")),
                        policy=str(c.get("policy", "max_prob")),
                        candidates=parse_candidates(c.get("candidates", 0)),
                        threshold=float(c.get("threshold", 0.9)),
                        policy_temperature=float(c.get("policy_temperature", 0.0)),
                        order_head=check_bool(c.get("order_head", False), "sample.order_head"))


def check_bool(value, key: str) -> bool:
  """A config flag: True or False, else one line naming ``key``."""
  if not isinstance(value, bool):
    raise ValueError(f"{key}: expected True or False, got {value!r}")
  return value


def parse_candidates(value) -> int | None:
  """``sample.candidates`` from a config: 0 (every masked position) -> None, else the int."""
  try:
    v = int(value)
  except (TypeError, ValueError):
    raise ValueError(f"sample.candidates: must be an integer (0: every masked position), got "
                     f"{value!r}") from None
  return None if v == 0 else v


def parse_draft(value) -> Any:
  """``sample.draft`` from a config: "auto" or an integer (given as int or string)."""
  v = str(value).strip()
  if v == "auto":
    return v
  try:
    return int(v)
  except ValueError:
    raise ValueError(f"sample.draft: must be 'auto' or an integer, got {value!r}") from None


def config_prompt(c: ml_collections.ConfigDict, tokenizer, length: int, vocab: int):
  """The pairs of a config's prompt / suffix / prompt_pairs, or None when all are empty."""
  pairs = list(enumerate(tokenizer.encode(c.prompt))) if c.prompt else []
  if c.suffix:
    suffix = tokenizer.encode(c.suffix)
    if len(pairs) + len(suffix) > length:
      raise ValueError(f"sample.prompt + sample.suffix: {len(pairs)} + {len(suffix)} tokens "
                       f"exceed sample.length {length}")
    pairs += [(length - len(suffix) + i, t) for i, t in enumerate(suffix)]
  for item in filter(None, (x.strip() for x in str(c.prompt_pairs).split(","))):
    try:
      pos, tok = (int(v) for v in item.split(":"))
    except ValueError:
      raise ValueError(f"sample.prompt_pairs: expected 'position:token_id', got {item!r}")
    pairs.append((pos, tok))
  if not pairs:
    return None
  if len(pairs) > length:
    raise ValueError(f"sample.prompt: {len(pairs)} given tokens exceed sample.length {length}")
  return prompts.pairs_prompt([pairs], length, vocab)
