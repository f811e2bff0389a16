"""Device mesh, logical-axis sharding of parameters, global batches and multi-host start-up.

The mesh has three axes, ``(data, fsdp, tensor)``, sized by ``mesh.*`` (-1 = all remaining
devices). Every ``nnx.Param`` carries ``logical_axes`` metadata (``vocab``, ``embed``, ``qkv``,
``heads``, ``mlp``, ``cond``, ``mod``, ``norm``, ``head_dim`` or None); ``mesh.rules`` maps each
logical axis to mesh axes, which gives the sharding of the parameters, of the optimizer moments
and of the EMA. Batches are split over ``(data, fsdp)``. The same code runs on 1 CPU device, 8
fake CPU devices, a GPU host and a TPU pod.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from aogpt_jax import config as config_lib
from aogpt_jax.model import layers

MESH_AXES = config_lib.MESH_AXES
BATCH_AXES = ("data", "fsdp")


# ----------------------------------------------------------------------------- multi-host


def distributed_requested(cfg) -> bool:
  return bool(cfg.distributed.enabled) or os.environ.get("AOGPT_DISTRIBUTED", "") == "1"


def maybe_initialize_distributed(cfg) -> bool:
  """Calls ``jax.distributed.initialize`` when ``distributed.enabled`` or AOGPT_DISTRIBUTED=1.

  Empty / zero / -1 options are left to JAX's auto-detection (TPU pods, SLURM, ...) and the
  JAX_COORDINATOR_ADDRESS-style environment variables. Must run before anything touches the
  devices. CPU collectives across processes go through gloo.
  """
  if not distributed_requested(cfg) or jax.distributed.is_initialized():
    return False
  d = cfg.distributed
  kw = {}
  if d.coordinator_address:
    kw["coordinator_address"] = d.coordinator_address
  if d.num_processes:
    kw["num_processes"] = int(d.num_processes)
  if d.process_id >= 0:
    kw["process_id"] = int(d.process_id)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kw)
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True


# ----------------------------------------------------------------------------- mesh


def mesh_shape(cfg, n_devices: int) -> tuple[int, int, int]:
  """Sizes of (data, fsdp, tensor) for ``n_devices``; one axis may be -1 (filled)."""
  sizes = [int(cfg.mesh[a]) for a in MESH_AXES]
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if n_devices % fixed:
      raise config_lib.ConfigError(
          f"mesh: the fixed axes ({_describe(cfg)}) multiply to {fixed}, which does not divide "
          f"the {n_devices} devices")
    sizes[sizes.index(-1)] = n_devices // fixed
  elif fixed != n_devices:
    raise config_lib.ConfigError(
        f"mesh: mesh.data * mesh.fsdp * mesh.tensor = {fixed} ({_describe(cfg)}) does not match "
        f"the {n_devices} devices")
  return tuple(sizes)


def _describe(cfg) -> str:
  return ", ".join(f"mesh.{a}={cfg.mesh[a]}" for a in MESH_AXES)


def make_mesh(cfg, devices=None) -> jax.sharding.Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(cfg, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def data_parallel_size(mesh) -> int:
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_batch_sizes(cfg, mesh) -> None:
  """Batch sizes must split evenly over the batch axes and over the processes."""
  dp = data_parallel_size(mesh)
  where = f"mesh.data * mesh.fsdp = {mesh.shape['data']} * {mesh.shape['fsdp']} = {dp}"
  if cfg.batch_size % dp:
    raise config_lib.ConfigError(f"batch_size: {cfg.batch_size} is not divisible by the data "
                                 f"axes ({where})")
  micro = cfg.batch_size // cfg.microbatches
  if micro % dp:
    raise config_lib.ConfigError(
        f"microbatches: each of the {cfg.microbatches} microbatches has {micro} sequences, not "
        f"divisible by the data axes ({where})")
  if cfg.microbatches > 1 and micro // dp == 1 and all(mesh.shape[a] > 1 for a in MESH_AXES):
    # Found by tests/test_train_step.py: on a data x fsdp x tensor mesh, XLA's SPMD partitioner
    # (jax 0.10.2) miscomputes the gradients of a scanned microbatch with one row per device.
    raise config_lib.ConfigError(
        f"microbatches: {cfg.microbatches} microbatches leave one sequence per device per "
        f"microbatch on a mesh whose data, fsdp and tensor axes are all > 1 ({where}, "
        f"mesh.tensor = {mesh.shape['tensor']}); XLA computes wrong gradients for that layout. "
        f"Use fewer microbatches, or mesh.data=1 or mesh.fsdp=1")
  pack = cfg.model.get("pack") or 1
  if pack > 1 and (micro // dp) % pack:
    raise config_lib.ConfigError(
        f"model.pack: {pack} does not divide the {micro // dp} rows per device of a microbatch "
        f"({micro} rows, {where}); packed rows must not straddle devices")
  eval_bs = cfg.eval.batch_size or cfg.batch_size
  if eval_bs % dp:
    raise config_lib.ConfigError(f"eval.batch_size: {eval_bs} is not divisible by the data axes "
                                 f"({where})")
  if pack > 1 and (eval_bs // dp) % pack:
    raise config_lib.ConfigError(
        f"model.pack: {pack} does not divide the {eval_bs // dp} held-out rows per device "
        f"(eval.batch_size={eval_bs}, {where})")
  for key, bs in (("batch_size", cfg.batch_size), ("eval.batch_size", eval_bs)):
    if bs % jax.process_count():
      raise config_lib.ConfigError(f"{key}: {bs} is not divisible by the "
                                   f"{jax.process_count()} processes")


# ----------------------------------------------------------------------------- shardings


def logical_to_spec(logical_axes, shape, rules: dict[str, tuple[str, ...]], mesh,
                    name: str = "") -> P:
  """PartitionSpec for one parameter; a mesh axis that does not divide the dimension (or that
  an earlier dimension already uses) is dropped, i.e. that dimension is replicated over it."""
  if logical_axes is None:
    return P()
  if len(logical_axes) != len(shape):
    raise ValueError(f"parameter {name}: logical axes {logical_axes} do not match shape {shape}")
  used: set[str] = set()
  spec = []
  for dim, logical in zip(shape, logical_axes):
    axes = []
    for a in rules.get(logical, ()) if logical else ():
      size = math.prod(mesh.shape[x] for x in axes) * mesh.shape[a]
      if a in used or dim % size:
        if mesh.shape[a] > 1 and a not in used:
          logging.info("sharding: %s dim %d (%s) not divisible by mesh axis %s; replicated",
                       name, dim, logical, a)
        continue
      axes.append(a)
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
  return P(*spec)


def param_specs(abstract_state: nnx.State, rules, mesh) -> dict:
  """Pure dict (same structure as ``nnx.to_pure_dict``) of PartitionSpecs from the
  ``logical_axes`` metadata of every parameter."""
  out: dict = {}
  for path, var in nnx.to_flat_state(abstract_state):
    meta = var.get_metadata()
    spec = logical_to_spec(meta.get("logical_axes"), var.shape, rules, mesh,
                           "/".join(map(str, path)))
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = spec
  return out


def named(mesh, specs):
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                      is_leaf=lambda x: isinstance(x, P))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh, ndim: int = 2) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def global_batch(local: dict[str, np.ndarray], mesh) -> dict[str, jax.Array]:
  """Global arrays from this process's rows (process p holds rows [p*L, (p+1)*L))."""
  out = {}
  for k, v in local.items():
    v = np.asarray(v)
    shape = (v.shape[0] * jax.process_count(),) + v.shape[1:]
    out[k] = jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v, shape)
  return out


# ----------------------------------------------------------------------------- activations


def activation_rules(rules: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
  """Logical activation axis -> mesh axes: the batch over the batch axes; heads, MLP and vocab
  columns over the mesh axes of their parameters' rules, less the batch axes (the ``embed``
  rule shards parameters over fsdp, but the activations' feature dim stays whole)."""
  def cols(logical):
    return tuple(a for a in rules.get(logical, ()) if a not in BATCH_AXES)
  return {layers.BATCH: BATCH_AXES, layers.HEADS: cols("heads"), layers.MLP_ACT: cols("mlp"),
          layers.VOCAB_ACT: cols("vocab")}


@contextlib.contextmanager
def activation_constraints(mesh, rules):
  """While tracing inside this context, `layers.constrain` pins activations (the residual
  stream, per-head q/k/v and attention output, the MLP hidden) to their mesh axes: with
  ``mesh.tensor > 1`` heads and MLP columns stay split over ``tensor`` (Megatron layout)."""
  act = activation_rules(rules)

  def fn(x, axes):
    return jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, logical_to_spec(axes, x.shape, act, mesh)))
  fn.placement = lambda axes, shape: (mesh, logical_to_spec(axes, shape, act, mesh))
  with layers.activation_sharding(fn):
    yield
