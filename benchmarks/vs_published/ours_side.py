"""aogpt_jax's half of `benchmarks/vs_published.py` (run by it in a subprocess): the same sizes
as `published_side.py` (4 layers, width 256, 4 heads, n = 256, vocab 50304 of which 50257 valid,
batch 8; fp32 on CPU, bf16 compute on ``--device=gpu``). ``train``: the trainer's own jitted step
(AdamW, clip 1.0, EMA) of the paper recipe at this size; ``sample``: the KV-cached sampler
(linear schedule, deterministic counts, temperature 1, the published top-p rule) at each T and
top-p, and AR decoding. Compile time is reported apart. ``ensembles``: context-order ensembles
(Eq. 4) of one 256-token sequence, M = 8 (`evaluation.ensembles`: the any-order base forward plus
the prefix forwards); the first call counts compilation. ``sample_hlo``: no timing, the sampler
programs of ``sample`` compiled, each as the hash and op counts of its optimised HLO without
source locations (`benchmarks/profile/ours_ab.py --parts=sample_hlo`). Prints one JSON line."""
import argparse, json, os, sys, time
os.environ.setdefault("JAX_PLATFORMS", "cuda" if "--device=gpu" in sys.argv else "cpu")
import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from aogpt_jax import config as config_lib, recipes
from aogpt_jax.model import aogpt as model_lib  # noqa: E402
from aogpt_jax.sampling import sampler  # noqa: E402
from aogpt_jax.train import sharding
from aogpt_jax.train import step as train_lib  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("part", choices=("train", "sample", "ensembles", "sample_hlo"))
p.add_argument("--runs", type=int, default=3)
p.add_argument("--steps", default="16,64,256")
p.add_argument("--top_p", default="1.0,0.95")
p.add_argument("--max_m", type=int, default=8)
p.add_argument("--layout", default="pairs",
               help="ensembles: pairs (the evaluator's default) | buckets")
p.add_argument("--num_buckets", type=int, default=-1, help="-1: the evaluator's default")
p.add_argument("--loss_chunk", type=int, default=-1, help="-1: the recipe's")
p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
a = p.parse_args()
L, H, E, T, V, B = 4, 4, 256, 256, 50304, 8
DTYPE = "bfloat16" if a.device == "gpu" else "float32"
MODEL = dict(n_layer=L, n_head=H, n_embd=E, block_size=T, vocab_size=V, valid_vocab_size=50257,
             dtype=DTYPE)


def best(fn, runs):
  t0 = time.perf_counter(); fn(); first = time.perf_counter() - t0
  ts = []
  for _ in range(runs):
    t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
  return min(ts), ts, first


def program_hlo(m, s_) -> dict:
  """The compiled sampler program that `sampler.generate` runs for ``s_``: sha256 and op counts
  (``dtype[shape] opcode``) of its HLO with metadata and source locations removed."""
  import collections, hashlib, re
  from aogpt_jax.model import jit as model_jit
  from aogpt_jax.sampling import tokens as tokens_lib
  p_ = sampler.prepare(m.cfg, jax.random.key(1), s_, batch=B)
  pl = (None if s_.method in sampler.PLANLESS_METHODS else
        sampler.plan([p_], method=s_.method)[0])
  args, kw = sampler.program_args(p_, pl, s_, False)
  with tokens_lib.exact_sampling():
    hlo = model_jit.call(sampler.sampler_program.lower, m, *args, **kw).compile().as_text()
  lines = [re.sub(r", (metadata=\{[^}]*\}|stack_frame_id=\d+)", "", x) for x in hlo.splitlines()
           if x.startswith(("%", "ENTRY", " "))]   # computations only: no file/line tables
  ops = collections.Counter(m_.group(1) + " " + m_.group(2) for x in lines if (
      m_ := re.search(r"= (\w+\[[\d,]*\])\S* ([a-z-]+)\(", x)))
  return dict(hlo_sha256=hashlib.sha256("\n".join(lines).encode()).hexdigest(),
              ops=dict(sorted(ops.items())))


res = {}
if a.part == "train":
  c = recipes.paper("small")
  recipes.apply(c, {"model.dtype": DTYPE, "seq_len": T, "batch_size": B, "microbatches": 1,
                    "total_steps": 1000})
  c.model.n_layer, c.model.n_embd, c.model.n_head, c.model.block_size = L, E, H, T
  if a.loss_chunk >= 0:
    c.model.loss_chunk = a.loss_chunk
  mc = config_lib.resolve(c)
  mesh = sharding.make_mesh(c)
  rng = np.random.default_rng(0)
  with jax.set_mesh(mesh):
    tr = train_lib.build(c, mc, mesh)
    st = [tr.init()]

    def step():
      b = sharding.global_batch({"tokens": rng.integers(0, 50257, (B, T), dtype=np.int32)}, mesh)
      st[0], m = tr.step(st[0], b)
      jax.block_until_ready(m)
    s, ts, first = best(step, a.runs)
  res["train"] = dict(step_s=round(s, 5), runs=[round(t, 5) for t in ts],
                      first_incl_compile_s=round(first, 1), loss_chunk=mc.loss_chunk)
elif a.part == "ensembles":
  from aogpt_jax.evaluation import ensembles as ens, perplexity as ppl
  m = model_lib.AOGPT(model_lib.ModelConfig(**MODEL), rngs=nnx.Rngs(0))
  x = np.random.default_rng(0).integers(0, 50257, (1, T), dtype=np.int32)
  ids = np.zeros((1,), np.int32)
  kw = dict(layout=a.layout)
  if a.num_buckets > 0:
    kw["num_buckets"] = a.num_buckets

  def ensemble():
    nll, sigma = ppl.token_nll(m, x, ids, order="uniform", seed=0)
    lp = ens.ensemble_logp(m, x, ids, np.asarray(sigma), -np.asarray(nll), max_m=a.max_m, **kw)
    assert np.isfinite(lp).all()
  s, ts, first = best(ensemble, a.runs)
  res["ensembles"] = dict(wall_s=round(s, 5), runs=[round(t, 5) for t in ts],
                          first_incl_compile_s=round(first, 2), **kw)
else:
  m = model_lib.AOGPT(model_lib.ModelConfig(**MODEL), rngs=nnx.Rngs(0))
  runs = [(f"sample T={t} top_p={tp}", dict(steps=int(t), top_p=float(tp)))
          for tp in a.top_p.split(",") for t in a.steps.split(",")]
  runs.append(("AR decoding", dict(method="ar", order="l2r")))
  for name, kw in runs:
    s_ = sampler.SampleSettings(length=T, **kw)
    if a.part == "sample_hlo":
      res[name] = program_hlo(m, s_)
      continue
    k = [0]

    def gen():
      k[0] += 1
      np.asarray(sampler.generate(m, jax.random.key(k[0]), s_, batch=B).tokens)
    s, ts, first = best(gen, a.runs)
    res[name] = dict(wall_s=round(s, 5), runs=[round(t, 5) for t in ts],
                     first_incl_compile_s=round(first, 1))
print(json.dumps(res))
