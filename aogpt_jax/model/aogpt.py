"""AO-GPT: a decoder-only transformer conditioned on the position of the token it predicts next.

Sequence layout (docs/method.md, "Slot layout"; the rules live in orders.py), one slot per token
in sigma order:
  slot 0 = START (learned vector, position-embedding row 0); slot r = token x_{order[r-1]} plus the
  embedding of its original position order[r-1] + 1; slot r is conditioned on the target position
  order[r] and its output predicts x_{order[r]}. Attention is causal over slots.

Two equivalent attention paths:
  * ``gather`` (default): permute into order space and run causal attention (flash-capable).
  * ``mask``: keep the original order ``[START, x_0, ..., x_{n-1}]`` and mask by ranks.

The general entry point, `AOGPT.forward_slots`, takes explicit per-slot tokens, positions and
targets, any boolean "who may see whom" mask, and optionally a preallocated KV cache; the sampler
and the ensemble evaluator build their own slot layouts on it.

Public API::

    cfg = model.PRESETS["small"]                       # or ModelConfig(...) / preset(name, **kw)
    m = model.AOGPT(cfg, rngs=nnx.Rngs(0))
    logits = m(tokens, order)                          # [B, n, V]; logits[b, r] predicts
                                                       # tokens[b, order[b, r]] from order[b, :r]
    mean_nll, per_token_nll = model.loss(m, tokens, order)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from aogpt_jax.model import cross_entropy, packing
from aogpt_jax.model import orders as orders_lib
from aogpt_jax.model.attention import ATTENTION_IMPLS
from aogpt_jax.model.blocks import (REMAT_POLICIES, Block, condition, dropout, fold_key,
                                    modulation_tables, remat_module, run_block, table_lookup)
from aogpt_jax.model.layers import (BATCH, NORMS, Dense, Embed, Norm, check_choice, constrain,
                                    grid_codes, grid_shape, matmul, trunc_normal)

TARGETS = ("adaln", "sigma_gpt", "repeat", "per_block", "none")
ATTENTION_PATHS = ("gather", "mask")
GELUS = ("exact", "tanh")
MLPS = ("gelu", "swiglu", "geglu")
ROPE_QUERIES = ("target", "token")
# How a prompt's rank-slots attend (`prompt_block`): causal in the order (the published model), or
# bidirectionally among themselves. ``bidirectional``: rank-slots 0..m-1 (START and the first m-1
# prompt tokens), whose keys and values depend on the prompt only, so every KV cache stays exact;
# ``bidirectional_target``: rank-slots 0..m, which adds the last prompt token's slot, conditioned
# on the FIRST answer position (an ablation: training and one-pass likelihoods only).
PROMPT_ATTENTIONS = ("causal", "bidirectional", "bidirectional_target")
# How the blank block's queries see each other (model.blank_attention, model/blanks.py): all of
# them ("block"), or each the blanks at positions up to its own ("causal": Eso-LM(B)'s masks
# causal among the blanks, Sahoo et al. 2025, arXiv 2506.01928, whose code also holds the
# "block" mask, unused; Eso-LM(B) orders its blanks by a denoising order drawn in advance, which a
# decoder that picks its next cell by confidence does not know, so here the order among blanks
# is the positions': fixed, so the cached sampler, the search and the likelihood agree exactly).
BLANK_ATTENTIONS = ("block", "causal")
START = orders_lib.START          # slot token id meaning "the START vector"
NO_TARGET = orders_lib.NO_TARGET  # slot target meaning "no conditioning" (zero vector)
RESIDUAL_DTYPE = jnp.float32  # residual stream (embeddings, adds, norms) under any compute dtype

# KV cache: one (k, v) pair per layer, each [batch, kv_heads, cache_len, head_dim].
KVCache = tuple[tuple[jax.Array, jax.Array], ...]
# Per block its six adaLN tables [block_size + 1, d] (shift, scale, gate of attention and MLP),
# then the final norm's two (`AOGPT.modulation_tables`).
ModulationTables = tuple[tuple[jax.Array, ...], ...]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every architectural choice; the defaults are the published AO-GPT (Small) model."""
  vocab_size: int = 50304            # GPT-2's 50257 padded to a multiple of 64
  valid_vocab_size: int = 50257      # ids >= this are padding: never scored, never sampled
  block_size: int = 1024             # maximum sequence length n
  n_layer: int = 12
  n_head: int = 12
  n_embd: int = 768
  target: str = "adaln"              # one of TARGETS: how the target position enters
  target_dim: int = 128              # width of the adaLN target embedding
  norm: str = "rmsnorm"              # rmsnorm | layernorm
  qk_norm: bool = True               # RMSNorm per head on queries and keys
  rope: bool = False                 # also rotary embeddings: keys turned by their token's
                                     # position, queries by their TARGET position, so a score
                                     # sees the offset target - key (not in the published model)
  rope_theta: float = 10_000.0       # the rotary base (model.rope)
  rope_query: str = "target"         # one of ROPE_QUERIES: where model.rope turns a query: at
                                     # its TARGET's position (the default above) or at its own
                                     # TOKEN's (a converted Llama / Qwen: exactly the source's
                                     # scores under L2R; the target enters through adaLN only)
  learned_pos: bool = True           # the learned position table wpe (START row 0); False: none
                                     # (a converted RoPE model: positions by rotation alone)
  n_kv_head: int = 0                 # key/value heads (grouped-query attention; 0: n_head); the
                                     # KV cache holds these heads only
  head_size: int = 0                 # width of a head (0: n_embd // n_head; Qwen3, Gemma)
  bias: bool = True                  # biases in the linear layers (and LayerNorm)
  qkv_bias: bool = False             # biases on q / k / v only (Qwen2), whatever ``bias`` says
  mlp: str = "gelu"                  # one of MLPS: gelu | swiglu (silu(gate) * up) | geglu
                                     # (gelu(gate) * up, model.gelu's variant; Gemma)
  mlp_ratio: int = 4
  mlp_hidden: int = 0                # the MLP's hidden width (0: mlp_ratio * n_embd)
  norm_eps: float = 1e-5             # epsilon of every norm
  embed_scale: float = 1.0           # token embeddings multiplied by this (Gemma: sqrt(n_embd))
  tie_embeddings: bool = False       # False: separate output head
  head_bias: bool = True             # bias on the output head
  init_std: float = 0.02             # residual projections get init_std / sqrt(2L)
  init_truncation: float = 3.0       # truncated normal cut at this many std; 0: plain normal
  zero_init_modulation: bool = False # the published model does NOT zero-init adaLN
  gelu: str = "exact"                # exact | tanh (GPT-2's tanh approximation, "gelu_new")
  gate_offset: float = 0.0           # adaLN branch gates are gate_offset + g (g the projected
                                     # gate): 1.0 with zero_init_modulation starts every block
                                     # as the unconditioned GPT block (a converted GPT-2)
  zero_init_target: bool = False     # sigma_gpt / repeat / per_block target embeddings start
                                     # at zero (adaln keeps its random ones: with zero-init
                                     # modulation they are not used yet, and a zero table
                                     # would get no gradient)
  dropout: float = 0.0
  attention: str = "gather"          # gather | mask (same numbers; gather is faster)
  attention_impl: str = "auto"       # auto | xla | cudnn | splash | blockwise (layers.py)
  attention_block: int = 256         # query/key block of attention_impl='blockwise'
  dtype: str = "float32"             # compute dtype (bfloat16 on accelerators)
  param_dtype: str = "float32"
  remat: bool = False                # rematerialise each block in the backward pass,
  remat_policy: str = "block"        # keeping what this policy saves (blocks.REMAT_POLICIES):
                                     # block (its inputs only) | attention | dots_no_batch | dots
  loss_chunk: int = 0                # > 0: training loss without [B, n, V] logits, about this
                                     # many tokens (positions x all rows) at a time
                                     # (cross_entropy.py); 0: plain logits
  pack: int = 1                      # training losses run this many rows as one attention row
                                     # (block-diagonal mask; model/packing.py): same numbers,
                                     # fewer and longer rows; 1: one row each
  prompt_attention: str = "causal"   # one of PROMPT_ATTENTIONS: how the rank-slots of a prompt
                                     # (a puzzle's givens, an SFT question) attend to each other
                                     # (`prompt_block`); no effect on rows without a prompt
  blank_block: bool = False          # the blanks get a place to think: every unwritten position
                                     # has a query slot, and the queries attend to each other
                                     # (an MDM-style block over the blanks on top of the causal
                                     # written prefix; model/blanks.py); trained by cutting each
                                     # order at a random rank, decoded by the adaptive sampler
  blank_attention: str = "block"     # one of BLANK_ATTENTIONS, with blank_block: "block" (every
                                     # blank query sees every other) or "causal" (Eso-LM(B)-like:
                                     # a blank sees the blanks at positions up to its own)
  position_init: str = ""            # "": random position tables; "grid:R,C,BR,BC": start the
                                     # position and target-position rows of an R x C grid (boxes
                                     # BR x BC, Sudoku's) as row + column + box codes (trainable;
                                     # `layers.grid_codes`); a run's "grid" is its task's grid

  def __post_init__(self):
    self.validate()

  def validate(self) -> None:
    def bad(field, msg):
      raise ValueError(f"model.{field}: {msg}")

    for f in ("vocab_size", "valid_vocab_size", "block_size", "n_layer", "n_head", "n_embd",
              "target_dim", "mlp_ratio"):
      if int(getattr(self, f)) < 1:
        bad(f, f"must be >= 1, got {getattr(self, f)}")
    if self.valid_vocab_size > self.vocab_size:
      bad("valid_vocab_size", f"{self.valid_vocab_size} exceeds vocab_size {self.vocab_size}")
    for f in ("n_kv_head", "head_size", "mlp_hidden"):
      if int(getattr(self, f)) < 0:
        bad(f, f"must be >= 0 (0: the default width), got {getattr(self, f)}")
    if not self.head_size and self.n_embd % self.n_head:
      bad("n_head", f"{self.n_head} heads do not divide n_embd={self.n_embd}")
    if self.n_head % self.kv_heads:
      bad("n_kv_head", f"{self.n_kv_head} key/value heads do not divide n_head={self.n_head}")
    for f in ("rope_theta", "norm_eps", "embed_scale"):
      if not float(getattr(self, f)) > 0:
        bad(f, f"must be > 0, got {getattr(self, f)}")
    check_choice("model.mlp", self.mlp, MLPS)
    check_choice("model.rope_query", self.rope_query, ROPE_QUERIES)
    check_choice("model.target", self.target, TARGETS)
    check_choice("model.norm", self.norm, NORMS)
    check_choice("model.attention", self.attention, ATTENTION_PATHS)
    check_choice("model.gelu", self.gelu, GELUS)
    check_choice("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
    check_choice("model.remat_policy", self.remat_policy, tuple(REMAT_POLICIES))
    check_choice("model.prompt_attention", self.prompt_attention, PROMPT_ATTENTIONS)
    if not isinstance(self.blank_block, bool):
      bad("blank_block", f"must be True or False, got {self.blank_block!r}")
    check_choice("model.blank_attention", self.blank_attention, BLANK_ATTENTIONS)
    if self.blank_attention != "block" and not self.blank_block:
      bad("blank_attention", f"{self.blank_attention!r} is how the blank block's queries see "
          f"each other; it needs model.blank_block=True (or keep 'block')")
    if self.blank_block and self.prompt_attention == "bidirectional_target":
      bad("blank_block", "True needs model.prompt_attention 'causal' or 'bidirectional': "
          "'bidirectional_target' puts the first blank's query into the prompt block")
    if int(self.attention_block) < 1:
      bad("attention_block", f"must be >= 1, got {self.attention_block}")
    if int(self.pack) < 1:
      bad("pack", f"must be >= 1 (1: no packing), got {self.pack}")
    if int(self.loss_chunk) < 0:
      bad("loss_chunk", f"must be >= 0 (0: plain logits), got {self.loss_chunk}")
    if not self.init_truncation >= 0:
      bad("init_truncation", f"must be >= 0 (0: plain normal), got {self.init_truncation}")
    if not 0.0 <= self.dropout < 1.0:
      bad("dropout", f"must be in [0, 1), got {self.dropout}")
    if self.position_init:
      try:
        cells = grid_shape(self.position_init)
      except ValueError as e:
        bad("position_init", str(e))
      if cells[0] * cells[1] > self.block_size:
        bad("position_init", f"{self.position_init!r} has {cells[0] * cells[1]} cells, more "
            f"than block_size={self.block_size}")
    for f in ("dtype", "param_dtype"):
      try:
        jnp.dtype(getattr(self, f))
      except TypeError:
        bad(f, f"unknown dtype {getattr(self, f)!r}")

  @property
  def head_dim(self) -> int:
    return self.head_size or self.n_embd // self.n_head

  @property
  def kv_heads(self) -> int:
    return self.n_kv_head or self.n_head

  @property
  def mlp_width(self) -> int:
    return self.mlp_hidden or self.mlp_ratio * self.n_embd

  def replace(self, **kw) -> "ModelConfig":
    unknown = sorted(set(kw) - {f.name for f in dataclasses.fields(self)})
    if unknown:
      raise ValueError(f"unknown model config field(s): {unknown}")
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


PRESETS: dict[str, ModelConfig] = {
    # Byte-level CPU model for the quickstart and tests (257 real ids: 256 bytes + end-of-text).
    "tiny": ModelConfig(vocab_size=320, valid_vocab_size=257, block_size=256, n_layer=4,
                        n_head=4, n_embd=128, target_dim=32),
    "small": ModelConfig(n_layer=12, n_head=12, n_embd=768),
    "medium": ModelConfig(n_layer=24, n_head=16, n_embd=1024),
}


# The published sigma-GPT baseline (model_sigmaGPT.py), field by field: target position added
# once at the input, LayerNorm (with bias), no QK-norm, output head tied to the token embedding
# and without bias, plain normal init (not truncated).
SIGMA_GPT_FIELDS = dict(target="sigma_gpt", norm="layernorm", qk_norm=False, tie_embeddings=True,
                        head_bias=False, init_truncation=0.0)


def preset(name: str, **overrides) -> ModelConfig:
  if name not in PRESETS:
    raise ValueError(f"model.preset: unknown preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[name].replace(**overrides)


class AOGPT(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    cfg.validate()
    self.cfg = cfg
    dtype, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    std, d = cfg.init_std, cfg.n_embd
    ekw = dict(rngs=rngs, std=std, dtype=dtype, param_dtype=pdt, truncation=cfg.init_truncation)
    # The residual stream is fp32 whatever the compute dtype (as the published trainer under
    # bf16 autocast, whose embeddings and residual adds stay fp32): embeddings are looked up in
    # fp32, norms compute and return fp32, only matmul inputs are cast to ``dtype``.
    rkw = dict(ekw, dtype=RESIDUAL_DTYPE)
    self.wte = Embed(cfg.vocab_size, d, axes=("vocab", "embed"), **rkw)
    if cfg.learned_pos:
      self.wpe = Embed(cfg.block_size + 1, d, axes=(None, "embed"), **rkw)  # row 0: START
    self.wnone = nnx.Param(trunc_normal(rngs.params(), (d,), std, pdt, cfg.init_truncation),
                           logical_axes=("embed",))
    if cfg.target == "adaln":
      self.wtpe = Embed(cfg.block_size, cfg.target_dim, axes=(None, "cond"), **ekw)
    elif cfg.target in ("sigma_gpt", "repeat"):
      self.wtpe = Embed(cfg.block_size, d, axes=(None, "embed"), **ekw)
      if cfg.zero_init_target:
        self.wtpe.embedding[...] = jnp.zeros_like(self.wtpe.embedding[...])
    if cfg.position_init:
      self._init_grid_positions(rngs, std, pdt)
    self.h = nnx.List([Block(cfg, rngs=rngs, dtype=dtype, param_dtype=pdt)
                       for _ in range(cfg.n_layer)])
    self.ln_f = Norm(d, kind=cfg.norm, use_bias=cfg.bias, eps=cfg.norm_eps, dtype=jnp.float32,
                     param_dtype=pdt)
    if cfg.target == "adaln":
      self.adaLN_final = Dense(cfg.target_dim, 2 * d, axes=("cond", "mod"), rngs=rngs, std=std,
                               zero_init=cfg.zero_init_modulation, dtype=dtype, param_dtype=pdt,
                               truncation=cfg.init_truncation)
    if not cfg.tie_embeddings:
      self.lm_head = Dense(d, cfg.vocab_size, axes=("embed", "vocab"), rngs=rngs, std=std,
                           use_bias=cfg.head_bias, dtype=dtype, param_dtype=pdt,
                           truncation=cfg.init_truncation)
    elif cfg.head_bias:
      self.lm_head_bias = nnx.Param(jnp.zeros((cfg.vocab_size,), pdt), logical_axes=("vocab",))

  def _init_grid_positions(self, rngs: nnx.Rngs, std: float, pdt) -> None:
    """``position_init="grid:..."``: the position rows 1..R*C (row 0 is START's) and the target
    rows 0..R*C-1 start as row + column + box codes, each a fresh table of ``std``."""
    cfg = self.cfg
    shape = grid_shape(cfg.position_init)
    cells = shape[0] * shape[1]
    table = self.wpe.embedding[...]
    code = grid_codes(rngs.params(), shape, table.shape[1], std, cfg.init_truncation)
    self.wpe.embedding[...] = table.at[1:cells + 1].set(code.astype(table.dtype))
    if cfg.target in ("adaln", "sigma_gpt", "repeat"):
      table = self.wtpe.embedding[...]
      code = grid_codes(rngs.params(), shape, table.shape[1], std, cfg.init_truncation)
      self.wtpe.embedding[...] = table.at[:cells].set(code.astype(pdt))

  @property
  def start_vector(self) -> nnx.Param:
    """The learned START vector [d], rank-slot 0's input. Stored as ``wnone`` (the published
    ``wnonee``) so that checkpoints and converted weights keep loading."""
    return self.wnone

  # ------------------------------------------------------------------ general slot interface

  def hidden_slots(self, slot_tokens: jax.Array, slot_pos: jax.Array, slot_tgt: jax.Array, *,
                   mask: jax.Array | None = None, cache: KVCache | None = None,
                   write_index: jax.Array | None = None, dropout_key: jax.Array | None = None,
                   query: jax.Array | None = None, mask_causal: bool = False,
                   tables: ModulationTables | None = None):
    """Runs the block stack over explicit slots; returns (hidden [B, S, d], new cache or None).

    slot_tokens: int32 [B, S], token ids or START (-1).
    slot_pos:    int32 [B, S], position-embedding rows: 0 for START, p + 1 for position p.
    slot_tgt:    int32 [B, S], target positions, or NO_TARGET (-1) for zero conditioning.
    mask:        None for causal attention over the S slots, else bool [B, S, K] with K = S
                 (no cache) or K = cache length: ``mask[b, i, j]`` lets slot i see key j.
    cache:       per-layer (k, v) [B, N, K, H]; this call's keys/values are first written at
                 ``write_index`` int32 [B, S] (indices >= K are dropped), then attended to.
    query:       int32 [B, G] (no cache): return only these slots' hidden states [B, G, d]. The
                 last block then computes keys and values at every slot and everything else
                 (queries, attention rows, projection, MLP) at these slots only: for callers
                 that read a few slots of long rows (the ensemble evaluator), about a quarter
                 of a 4-layer stack's work.
    mask_causal: the mask lets no slot see a later slot (``mask[b, i, j]`` only for j <= i;
                 packed causal rows, no cache): the ``xla`` kernel then skips the score blocks
                 above the diagonal (`attention.attention`).
    tables:      `modulation_tables()` computed once by the caller (adaLN only), for many
                 programs on the same weights; None: each block projects its own.
    """
    cfg = self.cfg
    if (cache is None) != (write_index is None):
      raise ValueError("hidden_slots: cache and write_index go together")
    if cache is not None and mask is None:
      raise ValueError("hidden_slots: a cache needs an explicit mask")
    if cache is not None and query is not None:
      raise ValueError("hidden_slots: query slots take no cache")
    tok = self.wte(jnp.maximum(slot_tokens, 0))
    if cfg.embed_scale != 1.0:
      tok = tok * jnp.asarray(cfg.embed_scale, tok.dtype)
    x = jnp.where((slot_tokens == START)[..., None], self.start_vector[...].astype(RESIDUAL_DTYPE),
                  tok)
    if cfg.learned_pos:
      x = x + self.wpe(slot_pos)
    cond_table = None
    if cfg.target == "adaln":
      cond_table = self._cond_table()
    elif cfg.target in ("sigma_gpt", "repeat"):
      tgt_emb = table_lookup(self.wtpe.embedding[...], slot_tgt).astype(RESIDUAL_DTYPE)
      if cfg.target == "sigma_gpt":
        x = x + tgt_emb
    x = dropout(x, cfg.dropout, fold_key(dropout_key, cfg.n_layer))
    new_cache = []
    run = lambda *a: run_block(*a, mask_causal=mask_causal)  # noqa: E731 (a static flag)
    run = remat_module(run, cfg.remat_policy) if cfg.remat else run
    for i, block in enumerate(self.h):
      if cfg.target == "repeat":
        x = x + tgt_emb
      layer_cache = None if cache is None else cache[i]
      x, c = run(block, constrain(x, (BATCH, None, None)), slot_tgt, cond_table, mask,
                 layer_cache, write_index, fold_key(dropout_key, i),
                 query if i == cfg.n_layer - 1 else None, None if tables is None else tables[i],
                 slot_pos)
      new_cache.append(c)
    return x, (tuple(new_cache) if cache is not None else None)

  def head(self, h: jax.Array, slot_tgt: jax.Array,
           tables: ModulationTables | None = None) -> jax.Array:
    """Final norm (adaLN-modulated for ``adaln``) and output head; fp32 logits [..., V] with the
    padding ids set to -inf so they never receive probability (``tables``: as `hidden_slots`)."""
    return self.feature_logits(self.head_features(h, slot_tgt, tables))

  def head_and_features(self, h: jax.Array, slot_tgt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(`head`'s logits, `head_features`: their input [..., d] fp32), in one computation: what
    an order head (`model.order_head`) reads beside the logits."""
    x = self.head_features(h, slot_tgt)
    return self.feature_logits(x), x

  def feature_logits(self, x: jax.Array) -> jax.Array:
    """The output head's logits [..., V] (fp32, padding ids -inf) of `head_features` ``x``."""
    w, b = self.output_layer()
    return matmul(x.astype(self.cfg.dtype), w.astype(self.cfg.dtype),
                  preferred_element_type=jnp.float32) + b

  def head_features(self, h: jax.Array, slot_tgt: jax.Array,
                    tables: ModulationTables | None = None) -> jax.Array:
    """The output head's input: the final norm, adaLN-modulated for ``adaln`` (fp32)."""
    cfg = self.cfg
    x = self.ln_f(h)
    if cfg.target == "adaln":
      final = (modulation_tables(self.adaLN_final, self._cond_table(), 2) if tables is None
               else tables[-1])
      shift, scale = (condition(t, slot_tgt).astype(jnp.float32) for t in final)
      x = x * (1 + scale) + shift
    return x

  def modulation_tables(self) -> ModulationTables | None:
    """adaLN only (else None): every block's six modulation tables and, last, the final norm's
    two (`blocks.modulation_tables`: each target row projected; they depend on the weights
    only). A caller that runs many programs on the same weights computes them once and passes
    them to `hidden_slots` and `head`: the ensemble evaluator, whose every prefix program
    projected all n + 1 rows in every layer (~6% of its time on CPU)."""
    if self.cfg.target != "adaln":
      return None
    cond = self._cond_table()
    return (tuple(tuple(modulation_tables(b.adaLN, cond, 6)) for b in self.h)
            + (tuple(modulation_tables(self.adaLN_final, cond, 2)),))

  def _cond_table(self) -> jax.Array:
    """adaLN: the target-position embedding rows the modulation tables project."""
    return self.wtpe.embedding[...].astype(self.cfg.dtype)

  def output_layer(self) -> tuple[jax.Array, jax.Array]:
    """(w [d, V], b [V] fp32) of the output head: the untied head or the token embedding, and
    the head bias (or 0) with the padding ids at -inf (a [V] vector, so the mask costs nothing
    on the [..., V] logits)."""
    cfg = self.cfg
    if cfg.tie_embeddings:
      w = self.wte.embedding[...].T
      b = self.lm_head_bias[...] if cfg.head_bias else None
    else:
      w = self.lm_head.kernel[...]
      b = self.lm_head.bias[...] if self.lm_head.bias is not None else None
    b = jnp.zeros((cfg.vocab_size,), jnp.float32) if b is None else b.astype(jnp.float32)
    return w, jnp.where(jnp.arange(cfg.vocab_size) < cfg.valid_vocab_size, b, -jnp.inf)

  def forward_slots(self, slot_tokens, slot_pos, slot_tgt, **kw):
    """`hidden_slots` then `head`: returns (logits [B, S, V], new cache or None)."""
    h, cache = self.hidden_slots(slot_tokens, slot_pos, slot_tgt, **kw)
    return self.head(h, slot_tgt), cache

  def init_cache(self, batch: int, length: int, dtype=None) -> KVCache:
    """A zeroed KV cache with room for ``length`` slots per row."""
    cfg = self.cfg
    shape = (batch, cfg.kv_heads, length, cfg.head_dim)   # heads-major (blocks.Attention)
    dt = jnp.dtype(dtype or cfg.dtype)
    return tuple((jnp.zeros(shape, dt), jnp.zeros(shape, dt)) for _ in range(cfg.n_layer))

  # ------------------------------------------------------------------ tokens + order interface

  def __call__(self, tokens: jax.Array, order: jax.Array, *,
               dropout_key: jax.Array | None = None,
               prompt_len: jax.Array | None = None, pack: int = 1) -> jax.Array:
    """Logits [B, n, V]: ``logits[b, r]`` predicts ``tokens[b, order[b, r]]`` from the tokens at
    ``order[b, :r]``. ``tokens`` are in ORIGINAL order; ``order`` is a permutation per row.
    ``prompt_len`` int [B]: the first ``prompt_len[b]`` positions of ``order[b]`` are a prompt
    (`orders.prompt_first`), attended as ``model.prompt_attention`` says (`prompt_block`).
    ``pack``: run this many rows as one attention row (`packing`; the training loss passes
    ``model.pack``), the same numbers."""
    return self.head(self.hidden(tokens, order, dropout_key=dropout_key, prompt_len=prompt_len,
                                 pack=pack), order)

  def hidden(self, tokens: jax.Array, order: jax.Array, *,
             dropout_key: jax.Array | None = None,
             prompt_len: jax.Array | None = None, pack: int = 1) -> jax.Array:
    """The block stack's output [B, n, d] in ORDER space: row r predicts ``tokens[order[r]]``
    (its target position is ``order[r]``); ``prompt_len`` and ``pack`` as `__call__`."""
    self._check_shapes(tokens, order)
    if self.cfg.blank_block:
      raise ValueError("model.blank_block=True: this model predicts from a query block over the "
                       "blanks (model/blanks.py), not from the one-pass chain model(tokens, "
                       "order); decode it with sample.method='adaptive' and score it with "
                       "posttrain.likelihood.sequence_logp or --mode=solve")
    block = prompt_block(self.cfg, prompt_len)
    if self.cfg.attention == "gather":
      slots = gather_slots(tokens, order)
      mask = None
      if block is not None:   # causal but for the prompt block (an explicit mask array)
        tied = orders_lib.block_ranks(orders_lib.all_ranks(order), block)
        mask = orders_lib.mask_from_ranks(tied, tied)
      return packing.hidden(self, pack, *slots, mask, dropout_key=dropout_key)
    slot_tokens, slot_pos, slot_tgt, mask = mask_slots(tokens, order, block)
    h = packing.hidden(self, pack, slot_tokens, slot_pos, slot_tgt, mask, dropout_key=dropout_key)
    # Back to order space: in the original-order layout, rank-slot r sits at its position row.
    _, idx = orders_lib.rank_slot_source(order, orders_lib.all_ranks(order))
    return jnp.take_along_axis(h, idx[..., None], axis=1)

  def _check_shapes(self, tokens, order):
    if tokens.ndim != 2 or tokens.shape != order.shape:
      raise ValueError(f"tokens {tokens.shape} and order {order.shape} must both be [batch, n]")
    check_length(self.cfg, tokens.shape[1])


def check_length(cfg: ModelConfig, n: int) -> None:
  """A model run on ``n`` tokens per row: at most ``model.block_size`` (position embeddings)."""
  if n > cfg.block_size:
    raise ValueError(f"sequence length {n} exceeds model.block_size {cfg.block_size}")


def gather_slots(tokens: jax.Array, order: jax.Array):
  """Slots in order space for the gather path: rank-slots 0..n-1 (the last token is never an
  input), rank-slot r targeting ``order[r]``."""
  rank = orders_lib.all_ranks(order)
  slot_tokens, slot_pos = orders_lib.rank_slots(order, tokens, rank)
  return slot_tokens, slot_pos, orders_lib.slot_target(order, rank)


def mask_slots(tokens: jax.Array, order: jax.Array, block: jax.Array | None = None):
  """Slots in original order ``[START, x_0, ..., x_{n-1}]`` with the rank mask (mask path): the
  slot of position p is rank-slot ``ranks(order)[p] + 1`` (START is rank-slot 0), so it targets
  `slot_target` of that rank (none for the last token). ``block`` [B]: the prompt block
  (`prompt_block`), its rank-slots tied (`orders.block_ranks`)."""
  b, n = tokens.shape
  rank = orders_lib.slot_ranks(order)                       # [B, n+1]
  slot_tokens = jnp.concatenate([jnp.full((b, 1), START, jnp.int32), tokens], axis=1)
  slot_pos = jnp.broadcast_to(jnp.arange(n + 1, dtype=jnp.int32), (b, n + 1))
  slot_tgt = jnp.where(rank < n, orders_lib.slot_target(order, rank), NO_TARGET)
  tied = orders_lib.block_ranks(rank, block)
  return (slot_tokens.astype(jnp.int32), slot_pos, slot_tgt.astype(jnp.int32),
          orders_lib.mask_from_ranks(tied, tied))


def prompt_block(cfg: ModelConfig, prompt_len: jax.Array | None) -> jax.Array | None:
  """int32 [B]: how many leading rank-slots of each row attend to each other both ways, for rows
  whose first ``prompt_len`` ranks are a prompt (`orders.prompt_first`); None (all causal) for
  ``model.prompt_attention='causal'`` or no prompt. ``bidirectional``: ``prompt_len`` (START and
  the prompt tokens but the last, whose rank-slot ``prompt_len`` carries the first answer
  position: so the block depends on the prompt alone); ``bidirectional_target``: one more (that
  slot too), for rows with a prompt and an answer."""
  if prompt_len is None or cfg.prompt_attention == "causal":
    return None
  m = jnp.asarray(prompt_len, jnp.int32)
  if cfg.prompt_attention == "bidirectional_target":
    m = jnp.where(m > 0, m + 1, 0)
  return m


# ----------------------------------------------------------------------------- loss


def nll_from_logits(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Cross-entropy per token: -log softmax(logits)[target], in fp32 (not to be confused with
  `evaluation.perplexity.token_nll`, which runs a model over evaluation blocks)."""
  logits = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  return lse - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]


def loss(m: AOGPT, tokens: jax.Array, order: jax.Array, *, dropout_key: jax.Array | None = None,
         prompt: jax.Array | None = None,
         denominator: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Any-order NLL: returns (mean NLL over all tokens, per-token NLL [B, n] in ORDER space,
  i.e. ``per_token[b, r] = -log p(x_{order[b, r]} | x_{order[b, :r]})``).

  ``prompt`` (bool [B, n], original order; prompt-conditioned training, e.g. a puzzle's given
  cells or an SFT question): ``order`` must put the prompt first (`orders.prompt_first`); the
  mean then covers only the ranks after the prompt (`orders.scored_ranks`), divided by their
  count, or by ``denominator`` when given (gradient accumulation: the whole batch's count over
  the number of microbatches, so the microbatches add up to one big batch). ``per_token`` keeps
  every rank; the prompt's are not part of the loss. The model attends to the prompt as
  ``model.prompt_attention`` says (`prompt_block`)."""
  targets = orders_lib.permute(tokens, order)
  cfg = m.cfg
  if cfg.loss_chunk:
    if prompt is not None:
      raise ValueError("model.loss_chunk: the chunked loss scores every token; prompt-"
                       "conditioned training needs model.loss_chunk=0")
    # No [B, n, V] logits: the head and its gradients chunk by chunk (model/cross_entropy.py).
    x = m.head_features(m.hidden(tokens, order, dropout_key=dropout_key, pack=cfg.pack), order)
    w, b = m.output_layer()
    return cross_entropy.fused_mean_nll(x, w, b, targets, valid_vocab=cfg.vocab_size,
                                        chunk=cfg.loss_chunk, dtype=cfg.dtype)
  prompt_len = None if prompt is None else jnp.sum(prompt, axis=-1, dtype=jnp.int32)
  per_token = nll_from_logits(m(tokens, order, dropout_key=dropout_key, prompt_len=prompt_len,
                                pack=cfg.pack), targets)
  if prompt is None:
    return jnp.mean(per_token), per_token
  scored = orders_lib.scored_ranks(prompt)
  total = jnp.sum(jnp.where(scored, per_token, 0.0))
  count = jnp.maximum(jnp.sum(scored), 1) if denominator is None else denominator
  return total / count, per_token


def loss_metrics(per_token: jax.Array, order: jax.Array,
                 scored: jax.Array | None = None) -> dict[str, jax.Array]:
  """Sums and counts for the loss over all sequences and split into left-to-right and
  random-order sequences (so they can be summed over steps and hosts before dividing).
  ``scored`` (bool [B, n], order space): only these ranks count (prompt-conditioned training);
  a row is "left to right" when its ranks after the prompt are in ascending position."""
  if scored is None:
    l2r = orders_lib.is_l2r(order)
    scored = jnp.ones(per_token.shape, bool)
  else:
    later = jnp.where(scored, order, -1)
    l2r = jnp.all(later[:, 1:] >= later[:, :-1], axis=-1)
  seq = jnp.sum(jnp.where(scored, per_token.astype(jnp.float32), 0.0), axis=-1)
  count = jnp.sum(scored, axis=-1).astype(jnp.float32)
  return {
      "nll_sum": jnp.sum(seq), "token_count": jnp.sum(count),
      "nll_sum_l2r": jnp.sum(jnp.where(l2r, seq, 0.0)),
      "token_count_l2r": jnp.sum(jnp.where(l2r, count, 0.0)),
      "nll_sum_random": jnp.sum(jnp.where(l2r, 0.0, seq)),
      "token_count_random": jnp.sum(jnp.where(l2r, 0.0, count)),
  }


def count_params(m: nnx.Module) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
