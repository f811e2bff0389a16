"""Where a speculative round's time goes: its pieces jitted in isolation, each run ``--rounds``
times inside one ``lax.fori_loop`` (no dispatch per round), timed interleaved (best of
``--repeats``), per round in milliseconds:

* ``round K=k LAYOUT``: the whole round of `sampling.speculative` (block k: k causal slots + the
  draft queries of ``sample.draft_queries=LAYOUT``, head, accept / residual / draw, cache and
  token writes);
* ``trunk K=k LAYOUT``: `AOGPT.hidden_slots` alone on the same slots, mask and cache;
* ``trunk causal K=k``: the same on the k causal slots only (no draft queries);
* ``AR step`` / ``AR trunk``: one step of the AR decoder (one slot per row, head, draw) and its
  `hidden_slots` alone.

    python benchmarks/profile/speculative_profile.py --workdir=/tmp/aogpt_quickstart --batch=8

Without ``--workdir``, random weights of configs/quickstart.py's model (preset tiny, float32;
the time does not depend on the weights). Writes JSON (`benchmarks/common.py`'s schema) to
``--out`` (default benchmarks/results/speculative_profile_batch<batch>/<machine>.json).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from aogpt_jax.checkpoints import store as checkpoint  # noqa: E402
from aogpt_jax.model import aogpt as model_lib  # noqa: E402
from aogpt_jax.model import orders as orders_lib  # noqa: E402
from aogpt_jax.sampling import speculative as spec  # noqa: E402
from aogpt_jax.sampling import tokens as tokens_lib  # noqa: E402
import common  # noqa: E402


def looped(fn, rounds: int):
  """jit of ``carry -> fn applied rounds times`` in a fori_loop."""
  return jax.jit(lambda carry: jax.lax.fori_loop(0, rounds, lambda _, c: fn(c), carry))


def spec_pieces(m, order, keys, K: int, queries: str, *, temperature: float):
  """(name, looped fn body, initial carry) for the round and its trunk at block K."""
  batch, n = order.shape
  grp = spec.query_layout(K, queries)[0]
  cache_len = n + grp.size
  filt = lambda lg: jax.nn.log_softmax(tokens_lib.filter_logits(lg, temperature=temperature),
                                       axis=-1)
  tokens = jnp.zeros((batch, n), jnp.int32)
  carry = (m.init_cache(batch, cache_len), tokens, jnp.zeros((batch,), jnp.int32),
           jnp.zeros((batch,), jnp.int32),
           jnp.zeros((batch, max(K - 1, 1), m.cfg.vocab_size), jnp.float64),
           jnp.zeros((batch,), jnp.int32), jnp.full((batch,), K, jnp.int32), jnp.int32(0), None)
  rnd = functools.partial(spec.speculative_round, m, order, keys, filt, K=K, kmax=K, cache_len=cache_len,
                          queries=queries, debug=False)
  # The trunk on the slots of a round at frontier n // 2 with K - 1 pending drafts.
  c = n // 2
  S = K + grp.size
  src = jnp.concatenate([c + jnp.arange(K), c + jnp.asarray(grp)]).astype(jnp.int32)
  src = jnp.broadcast_to(src, (batch, S))
  tok, pos = orders_lib.rank_slots(order, tokens, src)
  tgt = jnp.take_along_axis(order, jnp.minimum(src + 1, n - 1), axis=1)
  write = jnp.concatenate([src[:, :K], jnp.broadcast_to(n + jnp.arange(S - K), (batch, S - K))],
                          axis=1).astype(jnp.int32)
  kk = jnp.arange(cache_len)[None, None, :]
  mask = (kk < src[:, :, None]) | (kk == write[:, :, None])

  def trunk(sl):
    def body(state):
      cache, acc = state
      h, cache = m.hidden_slots(tok[:, sl], pos[:, sl], tgt[:, sl], mask=mask[:, sl],
                                cache=cache, write_index=write[:, sl])
      return cache, acc + jnp.sum(h)
    return body

  t0 = (m.init_cache(batch, cache_len), jnp.float32(0))
  name = f"K={K} {queries} ({S} slots)"
  out = [(f"round {name}", lambda cr: rnd(cr)[0], carry), (f"trunk {name}", trunk(slice(None)), t0)]
  if queries == "taper":
    out.append((f"trunk causal K={K} ({K} slots)", trunk(slice(0, K)), t0))
  return out


def ar_pieces(m, batch: int, n: int, keys, *, temperature: float):
  kk = jnp.arange(n)[None, None, :]
  tokens = jnp.zeros((batch, n), jnp.int32)
  r = jnp.full((batch, 1), n // 2, jnp.int32)
  identity = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, n))
  tok, pos = orders_lib.rank_slots(identity, tokens, r)
  tgt = orders_lib.slot_target(identity, r)
  mask = kk <= r[:, :, None]

  def step(state):
    cache, toks = state
    h, cache = m.hidden_slots(tok, pos, tgt, mask=mask, cache=cache, write_index=r)
    new = tokens_lib.sample_tokens(m.head(h, tgt), keys[:, None], temperature=temperature)
    return cache, toks.at[:, 0].add(new[:, 0])

  def trunk(state):
    cache, acc = state
    h, cache = m.hidden_slots(tok, pos, tgt, mask=mask, cache=cache, write_index=r)
    return cache, acc + jnp.sum(h)

  return [("AR step", step, (m.init_cache(batch, n), tokens)),
          ("AR trunk", trunk, (m.init_cache(batch, n), jnp.float32(0)))]


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", default="", help="a trained run (else random weights)")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--length", type=int, default=128)
  ap.add_argument("--drafts", default="2,4,8")
  ap.add_argument("--queries", default="taper,all", help="sample.draft_queries layouts")
  ap.add_argument("--temperature", type=float, default=1.0)
  ap.add_argument("--rounds", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--out", default="",
                  help="default: results/speculative_profile_batch<batch>/<machine>.json")
  args = ap.parse_args(argv)
  if args.workdir:
    m, _ = checkpoint.load_model(args.workdir, which="ema")
  else:
    m = model_lib.AOGPT(model_lib.preset("tiny", dtype="float32"), rngs=nnx.Rngs(0))
  b, n = args.batch, args.length
  order = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  pieces = []
  with tokens_lib.exact_sampling():
    keys = tokens_lib.stream(tokens_lib.sample_keys(jax.random.key(0), b), tokens_lib.TOKEN_STREAM)
    pieces += ar_pieces(m, b, n, keys, temperature=args.temperature)
    for q in args.queries.split(","):
      for k in [int(d) for d in args.drafts.split(",")]:
        pieces += spec_pieces(m, order, keys, k, q, temperature=args.temperature)
    fns = []
    for name, body, carry in pieces:
      f = looped(body, args.rounds)
      jax.block_until_ready(f(carry))
      fns.append((name, f, carry))
    load = [common.load_avg_1m()]
    best = common.best_of({name: functools.partial(f, carry) for name, f, carry in fns},
                          args.repeats, sync=jax.block_until_ready)
    load.append(common.load_avg_1m())
  ms = {name: round(1e3 * t / args.rounds, 3) for name, t in best.items()}
  result = {"benchmark": "speculative_profile", "load_avg_1m": load, "ms_per_round": ms}
  for name, v in ms.items():
    print(f"{name:24s} {v:8.3f} ms")
  common.write_result(f"speculative_profile_batch{args.batch}", args, result,
                      out=args.out or None)
  return result


if __name__ == "__main__":
  main()
