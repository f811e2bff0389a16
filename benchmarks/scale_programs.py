"""The programs `scale_sim.py` compiles for one mesh of (fake) devices, from abstract inputs only.

  train     `train.build(...).step`: loss gradient, AdamW, EMA, on the config's shardings
  sample    the KV-cached diffusion sampler's scan (`sampler.sampler_program`), parameters sharded as
            in training, the sample batch over the batch axes
  ensemble  one call of the context-order ensemble evaluator (`ensembles.packed_logp_any`) for the
            longest prefix bucket (row length = seq_len), items over the batch axes

`measure(lowered)` compiles and reads XLA's memory analysis and the collectives of the compiled
HLO. Nothing here allocates a parameter: every input is a `jax.ShapeDtypeStruct` with its sharding.
"""

from __future__ import annotations

import pathlib
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from aogpt_jax import config as config_lib
from aogpt_jax.train import flops as flops_lib
from aogpt_jax.model import aogpt as model_lib
from aogpt_jax import recipes
from aogpt_jax.sampling import sampler as sampler_lib
from aogpt_jax.train import sharding as sharding_lib
from aogpt_jax.train import step as train_lib
from aogpt_jax.evaluation import ensembles
from aogpt_jax.sampling import tokens as tokens_lib

PROGRAMS = ("train", "sample", "ensemble")
H100, V5E = 80e9, 16e9
# Model fields of the paper recipe that a simulated program takes from it (the architecture comes
# from the size's preset: a tiny test model keeps its own).
RECIPE_MODEL_FIELDS = ("dtype", "loss_chunk", "remat", "remat_policy", "attention_impl")
_COLL = re.compile(r"\s(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                   r"(?:-start)?\(")
_ARR = re.compile(r"(bf16|f32|f16|s32|u32|pred|s8|u8|f64|s64)\[([0-9,]*)\]")
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1,
          "f64": 8, "s64": 8}


_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _ops(hlo: str):
  """(kind, result bytes, source op_name) of every collective in the compiled HLO text."""
  for line in hlo.splitlines():
    m = _COLL.search(line)
    if not m or " = " not in line:
      continue
    # The result type sits between the first " = " and the opcode (tuples may hold comments).
    rtype = line[line.index(" = ") + 3:m.start()]
    nbytes = 0
    for dt, dims in _ARR.findall(rtype):
      size = 1
      for d in filter(None, dims.split(",")):
        size *= int(d)
      nbytes += size * _BYTES[dt]
    name = _OP_NAME.search(line)
    yield m.group(1), nbytes, name.group(1)[:160] if name else "?"


def collectives(hlo: str) -> dict[str, dict[str, int]]:
  """{kind: {"count": c, "bytes": result bytes summed}} over the compiled HLO text."""
  out: dict[str, dict[str, int]] = {}
  for kind, nbytes, _ in _ops(hlo):
    e = out.setdefault(kind, {"count": 0, "bytes": 0})
    e["count"] += 1
    e["bytes"] += nbytes
  return out


def collective_sources(hlo: str, top: int = 8) -> list[dict]:
  """The ``top`` (kind, source op) groups by bytes: which jax operation issues them."""
  groups: dict[tuple[str, str], list[int]] = {}
  for kind, nbytes, name in _ops(hlo):
    g = groups.setdefault((kind, name), [0, 0])
    g[0] += 1
    g[1] += nbytes
  ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]
  return [{"kind": k, "op": n, "count": c, "bytes": b} for (k, n), (c, b) in ranked]


def measure(lower) -> dict:
  """Lowers (``lower()``), compiles and measures one program."""
  t0 = time.perf_counter()
  lowered = lower()
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  hlo = compiled.as_text()
  return {**flops_lib.compiled_memory(compiled), "lower_s": round(t1 - t0, 2),
          "compile_s": round(t2 - t1, 2), "collectives": collectives(hlo),
          "collective_sources": collective_sources(hlo)}


# Sizes that are a converted Hugging Face model (checkpoints/from_causal.py) of this shape: the
# AO-GPT that configs/a2o_qwen.py adapts (random weights: shapes only).
CONVERTED = {"qwen2.5-0.5b": "QWEN25_05B"}


def converted_model(size: str) -> model_lib.ModelConfig:
  """The AO-GPT a ``causal:`` conversion of ``size`` builds (its config.json from
  configs/a2o_qwen.py), at block_size 2048 (the recipe's)."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  from aogpt_jax.checkpoints import from_causal  # pylint: disable=import-outside-toplevel
  path = pathlib.Path(__file__).resolve().parent.parent / "configs" / "a2o_qwen.py"
  spec = importlib.util.spec_from_file_location("a2o_qwen", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  hf = getattr(mod, CONVERTED[size])
  return from_causal.model_config({**from_causal.DEFAULTS[hf["model_type"]], **hf},
                                  block_size=2048)


def setup(size: str, data: int, fsdp: int, tensor: int, per_device: int, seq_len: int,
          overrides: dict | None = None, devices=None):
  """(run config, model config, mesh) of the published recipe for ``size`` on this mesh."""
  n_dev = data * fsdp * tensor
  cfg = recipes.paper(size if size in ("small", "medium") else "small")
  recipes.apply(cfg, {"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor,
                      "batch_size": per_device * data * fsdp, "microbatches": 1,
                      "seq_len": seq_len})
  mc = converted_model(size) if size in CONVERTED else model_lib.preset(size)
  # The recipe's model settings (bf16, loss_chunk, remat, ...), then the caller's overrides.
  recipe = {k: v for k, v in cfg.model.items() if k != "preset" and v is not None
            and k in RECIPE_MODEL_FIELDS}
  mc = mc.replace(**{"block_size": max(seq_len, mc.block_size), **recipe, **(overrides or {})})
  mesh = sharding_lib.make_mesh(cfg, (devices or jax.devices())[:n_dev])
  return cfg, mc, mesh


def _batch_struct(mesh, shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding_lib.batch_sharding(mesh, len(shape)))


def _abstract_params(cfg, mc, mesh):
  """(graphdef, nnx.State of sharded ShapeDtypeStructs) of the model under ``mesh.rules``."""
  abstract = nnx.eval_shape(lambda: model_lib.AOGPT(mc, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  specs = sharding_lib.param_specs(state, config_lib.rules(cfg), mesh)
  flat = dict(nnx.to_flat_state(state))
  for path, var in flat.items():
    node = specs
    for k in path:
      node = node[k]
    var.value = jax.ShapeDtypeStruct(var.shape, var.dtype, sharding=NamedSharding(mesh, node))
  return graphdef, state


def train_lower(cfg, mc, mesh, seq_len: int):
  trainer = train_lib.build(cfg, mc, mesh)
  batch = {"tokens": _batch_struct(mesh, (cfg.batch_size, seq_len), jnp.int32)}
  return lambda: trainer.step.lower(trainer.abstract_state, batch)


def sample_lower(cfg, mc, mesh, seq_len: int, batch: int, steps: int, top_p: float = 1.0):
  """The cached diffusion sampler for ``batch`` rows of ``seq_len`` tokens in ``steps`` steps."""
  s = sampler_lib.SampleSettings(length=seq_len, steps=steps, top_p=top_p)
  prep = sampler_lib.prepare(mc, jax.random.key(0), s, batch=batch)
  plan = sampler_lib.plan([prep])[0]
  graphdef, params = _abstract_params(cfg, mc, mesh)
  args, kw = sampler_lib.program_args(prep, plan, s, False)
  rep = sharding_lib.replicated(mesh)
  order, tokens0, plen, keys = (_batch_struct(mesh, np.shape(a), a.dtype) for a in args[:4])
  passes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), args[4])
  abstract = (graphdef, params, order, tokens0, plen, keys, passes)

  def lower():
    with tokens_lib.exact_sampling(), _constraints(cfg, mesh):
      return sampler_lib.sampler_program.lower(*abstract, **kw)
  return lower


def ensemble_lower(cfg, mc, mesh, seq_len: int, items: int, blocks: int):
  """One `packed_logp_any` call of the longest bucket: ``items`` prefixes of up to seq_len slots."""
  group = ensembles.pack_prefixes(range(seq_len), seq_len)[-1]
  graphdef, params = _abstract_params(cfg, mc, mesh)
  rep = sharding_lib.replicated(mesh)
  i32 = jnp.int32
  tokens = jax.ShapeDtypeStruct((blocks, seq_len), i32, sharding=rep)
  sigma = jax.ShapeDtypeStruct((blocks, seq_len), i32, sharding=rep)
  ids = jax.ShapeDtypeStruct((blocks,), i32, sharding=rep)
  seed = jax.ShapeDtypeStruct((), jnp.uint32, sharding=rep)
  item_b, item_j = (_batch_struct(mesh, (items,), i32) for _ in range(2))
  item_r = _batch_struct(mesh, (items, group.ranks.shape[1]), i32)
  def lower():
    with _constraints(cfg, mesh):
      return ensembles.packed_logp_any.lower(graphdef, params, tokens, sigma, ids, seed, item_b,
                                          item_j, item_r, row_len=group.row_len,
                                          masked=group.masked)
  return lower


def _constraints(cfg, mesh):
  """The training step's activation constraints (batch over the batch axes, heads over tensor)
  while tracing the sampler / evaluator: without them XLA keeps FSDP-sharded kernels in place
  and all-reduces partial activations instead (64-way FSDP ensemble call: 252 GiB of
  all-reduces per device, against the kernels' all-gathers)."""
  return sharding_lib.activation_constraints(mesh, config_lib.rules(cfg))


def compile_program(program: str, size: str, data: int, fsdp: int, tensor: int,
                    per_device: int, seq_len: int, overrides: dict | None = None, *,
                    sample_per_device: int = 4, sample_steps: int = 256,
                    sample_top_p: float = 1.0, ensemble_per_device: int = 16) -> dict:
  """Compiles one program for one mesh; returns the measurements (memory per device)."""
  if program not in PROGRAMS:
    raise ValueError(f"program: must be one of {PROGRAMS}, got {program!r}")
  cfg, mc, mesh = setup(size, data, fsdp, tensor, per_device, seq_len, overrides)
  dp = sharding_lib.data_parallel_size(mesh)
  if program == "train":
    lower, shape = train_lower(cfg, mc, mesh, seq_len), f"{per_device * dp}x{seq_len}"
  elif program == "sample":
    lower = sample_lower(cfg, mc, mesh, seq_len, sample_per_device * dp, sample_steps,
                         sample_top_p)
    shape = f"{sample_per_device * dp}x{seq_len}, T={sample_steps}"
  else:
    lower = ensemble_lower(cfg, mc, mesh, seq_len, ensemble_per_device * dp, 1)
    shape = f"{ensemble_per_device * dp} prefixes x {seq_len} slots"
  r = measure(lower)
  return {"program": program, "size": size, "n_layer": mc.n_layer,
          "mesh": {"data": data, "fsdp": fsdp, "tensor": tensor}, "devices": mesh.size,
          "per_device_batch": per_device, "seq_len": seq_len, "shape": shape,
          "overrides": overrides or {}, **r,
          "fits_h100_80gb": r["peak_bytes"] <= H100, "fits_tpu_v5e_16gb": r["peak_bytes"] <= V5E}
