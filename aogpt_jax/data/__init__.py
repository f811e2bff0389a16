"""Data: tokenizers, detokenizers, raw sources, preparation into array_record, grain pipelines.

The interface the trainer / evaluator use: `train_iterator`, `eval_batches`, `get_tokenizer`,
`padded_vocab_size`, `default_config` (the ``data`` config group). Preparation:
``from aogpt_jax.data.prepare import prepare; prepare(data_cfg, block_size=...)``, what
``python -m aogpt_jax.data.prepare`` (and ``main.py --mode=prepare``) run.

Names are imported on first use, so tokenizer worker processes (which import this package) do not
pay for grain / JAX.
"""

from aogpt_jax import lazy_exports

_EXPORTS = {
    "default_config": "config",
    "eval_batches": "pipeline", "open_prepared": "pipeline", "pack": "pipeline",
    "prepared_path": "pipeline", "train_iterator": "pipeline",
    "token_stream": "build",
    "SOURCES": "sources", "ZERO_SHOT": "sources",
    "get_tokenizer": "tokenizers", "padded_vocab_size": "tokenizers",
    "register_tokenizer": "tokenizers",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
