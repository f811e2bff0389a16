"""Building blocks of the samplers (the public entry points are in `aogpt_jax.sampling.sampler`).

  schedules.py  noise schedules, reveal counts (deterministic / Lemma 4.1), the static step plan
  tokens.py     temperature, top-p, float64 Gumbel-max, per-sample key streams (shared)
  prompts.py    prompts as (position, token) pairs, prefix / infill builders, prompt-first orders
  diffusion.py  the KV-cached scan sampler and its uncached twin
  encoder.py    the encoder-only MDM baseline's sampler (full bidirectional forward per step)
  ar.py         plain left-to-right decoding with a KV cache
  timing.py     wall time of the samplers, interleaved runs (benchmarks/sample_speed.py, colabs)
"""
