"""Evaluation: zero-shot perplexity, context-order ensembles, generative perplexity (a JAX GPT-2
scorer) and checkpoint import/export. `aogpt_jax.evaluation.zero_shot` is the entry point that runs them."""
