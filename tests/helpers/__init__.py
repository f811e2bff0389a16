"""Helpers shared by the tests (import as ``from helpers import trainer as tu``; tests/conftest.py
puts tests/ on sys.path):

- ``helpers.trainer``: a very small run config, its command-line form, subprocess runs of
  ``python -m aogpt_jax.main`` on CPU.
- ``helpers.published``: tiny checkpoints in the formats a new user meets (converted folder,
  Hugging Face GPT-2 evaluator folder), built without downloads.
- ``helpers.sampler``: tiny models and exact distributions by enumeration for the sampler tests.
- ``helpers.torch_published``: a PyTorch mirror of the published architecture and random
  published-format checkpoints of it (needs torch).
- ``helpers.docs``: code blocks and `python -m aogpt_jax` commands extracted from Markdown.
- ``helpers.shared``: folders (trained runs) made once per test session and shared by every test
  file and pytest-xdist worker.
- ``helpers.posttrain``: the post-training run tests' config at test size and their shared
  starting Sudoku runs.
- ``helpers.exact_tiny``: the module-scoped fixtures (``model``, ``encoder_model``, ``seqs``)
  shared by the exactness tests.
"""
