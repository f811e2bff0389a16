"""The model: AO-GPT (`aogpt`), its blocks and layers, attention and its kernels, the fused
cross-entropy, token orders, the training objectives, the encoder-only MDM baseline (`encoder`)
and `jit`, the one way this package jits a function of a model."""
