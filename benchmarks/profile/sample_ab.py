"""Before/after of a change to the token draw (`aogpt_jax/sampling/tokens.py`), interleaved in one
process at the `benchmarks/vs_published.py` sizes (4 layers, width 256, 4 heads, n = 256,
vocabulary 50304, batch 8, fp32, CPU): every sampler is compiled twice, once with the
`tokens.py` found at ``--old`` (a file, e.g. ``git show REV:aogpt_jax/sampling/tokens.py``)
and once with the current one, and the two are timed round by round. Samples must be equal.

    git show 97b14b8:aogpt_jax/sampling/tokens.py > /tmp/tokens_old.py
    python benchmarks/profile/sample_ab.py --old=/tmp/tokens_old.py [--rounds=3]

Prints the JSON and writes it (`benchmarks/common.py`'s schema) to ``--out`` (default
benchmarks/results/sample_ab/<machine>.json).
"""
import argparse
import importlib.util
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from aogpt_jax.model import aogpt as model_lib  # noqa: E402
from aogpt_jax.sampling import sampler
from aogpt_jax.sampling import ar, diffusion, tokens as tokens_new  # noqa: E402

import common  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--old", required=True)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--steps", default="16,64,256")
p.add_argument("--top_p", default="1.0,0.95")
p.add_argument("--out", default="", help="default: results/sample_ab/<machine>.json")
a = p.parse_args()
spec = importlib.util.spec_from_file_location("tokens_old", a.old)
tokens_old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tokens_old)

m = model_lib.AOGPT(model_lib.ModelConfig(n_layer=4, n_head=4, n_embd=256, block_size=256,
                                          vocab_size=50304, valid_vocab_size=50257),
                    rngs=nnx.Rngs(0))
configs = [(f"T={t} top_p={tp}", dict(steps=int(t), top_p=float(tp)))
           for tp in a.top_p.split(",") for t in a.steps.split(",")]
configs.append(("AR top_p=1.0", dict(method="ar", order="l2r")))
res = {"load_before": os.getloadavg()[:3]}
runs = {}
for which, mod in (("old", tokens_old), ("new", tokens_new)):
  diffusion.tokens_lib = ar.tokens_lib = mod
  jax.clear_caches()
  for name, kw in configs:
    s = sampler.SampleSettings(length=256, **kw)
    pr = sampler.prepare(m.cfg, jax.random.key(1), s, batch=8)
    pl = None if s.method == "ar" else sampler.plan([pr])[0]
    runs[(name, which)] = sampler.compile_sampler(m, pr, pl, s)
diffusion.tokens_lib = ar.tokens_lib = tokens_new
times = {k: [] for k in runs}
out = {}
for r in range(a.rounds):
  for name, _ in configs:
    for which in ("old", "new"):
      t0 = time.perf_counter()
      toks = np.asarray(runs[(name, which)]()[0])
      times[(name, which)].append(time.perf_counter() - t0)
      out[(name, which)] = toks
for name, _ in configs:
  assert (out[(name, "old")] == out[(name, "new")]).all(), f"{name}: samples differ"
  o, n = min(times[(name, "old")]), min(times[(name, "new")])
  res[name] = dict(old_s=round(o, 3), new_s=round(n, 3), new_over_old=round(n / o, 3))
res["load_after"] = os.getloadavg()[:3]
print(json.dumps(res, indent=1))
common.write_result("sample_ab", a, res, out=a.out or None)
