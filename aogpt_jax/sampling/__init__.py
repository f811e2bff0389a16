"""Sampling: the public API, and the samplers' building blocks.

    from aogpt_jax import sampling
    s = sampling.SampleSettings(length=128, steps=32, order="random", top_p=0.95)
    out = sampling.generate(model, jax.random.key(0), s, batch=4)   # out.tokens int32 [4, 128]
    p = sampling.prompts.infill_prompt([[72, 105]], [[46]], 128, model.cfg.valid_vocab_size)
    out = sampling.generate(model, jax.random.key(1), s, prompt=p)

  sampler.py      SampleSettings (every sampler's settings, validated before compiling),
                  prepare / plan / sample_batch / generate, the one jitted program behind them
  config.py       the ``sample`` config group -> SampleSettings and a prompt
  write.py        ``--mode=sample``: samples to WORKDIR/samples/NAME.jsonl + NAME.json
  diffusion.py    the KV-cached scan sampler (parallel-generation mask) and its uncached twin
  ar.py           plain left-to-right decoding with a KV cache
  speculative.py  exact any-order speculative decoding (Figure 10 draft queries)
  adaptive.py     adaptive order: the model's own scores choose the positions written next
                  (policy registry; Figure 10 candidate queries in one cached pass per step)
  encoder.py      the encoder-only MDM baseline's sampler (full bidirectional forward per step)
  schedules.py    noise schedules, reveal counts (deterministic / Lemma 4.1), the static step plan
  tokens.py       temperature, top-p, the inverse-CDF token draw, per-sample key streams
  prompts.py      prompts as (position, token) pairs, prefix / infill builders, prompt-first orders
  state.py        the static shapes and draw settings the jitted samplers take
  timing.py       wall time of the samplers, interleaved runs (benchmarks, colabs)

Names are imported on first use, so ``from aogpt_jax.sampling import tokens`` stays light.
"""

from aogpt_jax import lazy_exports

_EXPORTS = {
    "SampleSettings": "sampler", "Samples": "sampler", "METHODS": "sampler",
    "generate": "sampler", "prepare": "sampler", "plan": "sampler",
    "sample_batch": "sampler", "compile_sampler": "sampler",
    "write_samples": "write",
}
_MODULES = ("sampler", "config", "write", "diffusion", "ar", "speculative", "adaptive", "encoder",
            "schedules", "tokens", "prompts", "state", "timing")

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, _MODULES)
