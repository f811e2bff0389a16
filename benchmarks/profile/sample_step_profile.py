"""Where one step of the KV-cached sampler spends its time (issue 10), at the sizes of
`benchmarks/vs_published.py` (4 layers, width 256, 4 heads, n = 256, vocabulary 50304, batch 8,
fp32, CPU): every piece jitted on its own (model pass, head, one read of the head weight,
float64 cast, top-p cut-off, inverse-CDF draw, the whole draw), and the whole samplers
(T = 256 and 16, AR), timed interleaved round by round, best of ``--repeats``. ``rows``: rows
of logits per step (8 at T = 256: one token per row; 128 at T = 16: 16 per row). Prints the
JSON (milliseconds) and writes it (`benchmarks/common.py`'s schema) to ``--out`` (default
benchmarks/results/sample_step_profile/<machine>.json).

    python benchmarks/profile/sample_step_profile.py [--repeats=10] [--only=pieces|samplers]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from aogpt_jax.model import aogpt as model_lib  # noqa: E402
from aogpt_jax.sampling import sampler
from aogpt_jax.sampling import tokens as tokens_lib  # noqa: E402

import common  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--repeats", type=int, default=10)
p.add_argument("--only", default="pieces,samplers")
p.add_argument("--out", default="", help="default: results/sample_step_profile/<machine>.json")
a = p.parse_args()
L, H, E, N, V, B = 4, 4, 256, 256, 50304, 8

m = model_lib.AOGPT(model_lib.ModelConfig(n_layer=L, n_head=H, n_embd=E, block_size=N,
                                          vocab_size=V, valid_vocab_size=50257),
                    rngs=nnx.Rngs(0))
graphdef, state = nnx.split(m)
rng = np.random.default_rng(0)


def piece_fns(rows: int, slots: int):
  """name -> (jitted fn, args) for one step with ``rows`` logits rows, ``slots`` per row."""
  h = jnp.asarray(rng.normal(size=(rows, 1, E)), jnp.float32)
  tgt = jnp.asarray(rng.integers(0, N, (rows, 1)), jnp.int32)
  logits = jax.jit(lambda s, h, t: nnx.merge(graphdef, s).head(h, t))(state, h, tgt)
  keys = tokens_lib.sample_keys(jax.random.key(0), rows).reshape(rows, 1)
  x64 = jax.jit(lambda l: tokens_lib.filter_logits(l))(logits)
  u = jnp.asarray(rng.random((rows, 1)))
  fns = {
      "head": (jax.jit(lambda s, h, t: nnx.merge(graphdef, s).head(h, t)), (state, h, tgt)),
      # one read of the head weight (51 MB): the memory-bound floor of the head
      "sum_head_weight": (jax.jit(jnp.sum), (m.lm_head.kernel[...],)),
      "cast64": (jax.jit(lambda l: tokens_lib.filter_logits(l)), (logits,)),
      "exp_sum64": (jax.jit(lambda x: jnp.sum(jnp.exp(x - jnp.max(x, -1, keepdims=True)), -1)),
                    (x64,)),
      "exp_sum32": (jax.jit(lambda x: jnp.sum(jnp.exp(x - jnp.max(x, -1, keepdims=True)), -1)),
                    (logits,)),
      "top_p_cutoff_0.95": (jax.jit(lambda x: tokens_lib.top_p_cutoff(x, 0.95, "published")),
                            (x64,)),
      "inverse_cdf": (jax.jit(tokens_lib.inverse_cdf), (x64, u)),
  }
  for tp in (1.0, 0.95):
    fns[f"sample_tokens_{tp}"] = (jax.jit(lambda l, k, tp=tp: tokens_lib.sample_tokens(
        l, k, top_p=tp)), (logits, keys))
  batch = rows // slots
  cache = m.init_cache(batch, N + slots)
  tok = jnp.asarray(rng.integers(0, 50257, (batch, slots)), jnp.int32)
  pos = jnp.asarray(rng.integers(1, N + 1, (batch, slots)), jnp.int32)
  tg = jnp.asarray(rng.integers(0, N, (batch, slots)), jnp.int32)
  wi = jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32) + 100, (batch, slots))
  mask = jnp.broadcast_to(jnp.arange(N + slots)[None, None, :] <= 100 + jnp.arange(slots)[
      None, :, None], (batch, slots, N + slots))
  fns["model_pass"] = (jax.jit(lambda s, c, *x: nnx.merge(graphdef, s).hidden_slots(
      x[0], x[1], x[2], mask=x[3], cache=c, write_index=x[4])), (state, cache, tok, pos, tg,
                                                                    mask, wi))
  return fns


def time_all(fns: dict, repeats: int) -> dict:
  for f, args in fns.values():
    jax.block_until_ready(f(*args))
  times = common.interleaved({k: (lambda f=f, args=args: f(*args)) for k, (f, args) in
                              fns.items()}, repeats, sync=jax.block_until_ready)
  return {k: round(1e3 * min(t), 3) for k, t in times.items()}


res = {"load_before": os.getloadavg()[0]}
with tokens_lib.exact_sampling():
  if "pieces" in a.only:
    for rows, slots in ((B, 1), (16 * B, 16)):
      res[f"pieces_ms rows={rows}"] = time_all(piece_fns(rows, slots), a.repeats)
  if "samplers" in a.only:
    built = {}
    for t in (256, 16):
      for tp in (1.0, 0.95):
        s = sampler.SampleSettings(length=N, steps=t, top_p=tp)
        pr = sampler.prepare(m.cfg, jax.random.key(1), s, batch=B)
        pl = sampler.plan([pr])[0]
        built[f"diffusion T={t} top_p={tp} ({pl.shape()})"] = sampler.compile_sampler(
            m, pr, pl, s)
    for tp in (1.0, 0.95):
      s = sampler.SampleSettings(length=N, method="ar", order="l2r", top_p=tp)
      pr = sampler.prepare(m.cfg, jax.random.key(1), s, batch=B)
      built[f"ar top_p={tp}"] = sampler.compile_sampler(m, pr, None, s)
    res["samplers_ms"] = time_all({k: (lambda r=r: r()[0], ()) for k, r in built.items()},
                                  max(2, a.repeats // 3))
res["load_after"] = os.getloadavg()[0]
print(json.dumps(res, indent=1))
common.write_result("sample_step_profile", a, res, out=a.out or None)
