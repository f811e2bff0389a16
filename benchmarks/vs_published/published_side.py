"""The published AO-GPT code's half of `benchmarks/vs_published.py` (run by it in a subprocess).

Imports the published model classes from ``--published`` (a scratch copy whose generate() uses
block_size; `vs_published.py` makes it) and times, eager, on CPU in fp32 with 2 torch threads
(``--device=cpu``) or on the first GPU under ``torch.autocast("cuda", bfloat16)`` as the published
trainer runs (``--device=gpu``; fused AdamW, as its ``configure_optimizers`` picks on CUDA):
``train`` (forward, backward, clip 1.0, AdamW, the EMA update) or ``sample`` (``generate()`` at
each T of ``--steps`` and top-p of ``--top_p``) or ``ensembles`` (``eval_ppl_AOGPT_ensemble.py``'s
inner loop on one sequence: a base ``forward_fn_ppl`` pass, then for every rank i and ordering
j = 1..M-1 a reshuffled context and one full-length ``forward_fn_ppl`` pass keeping row i; the
``--passes`` timed passes, spread over the ranks, are extrapolated linearly to all 1 + n (M - 1)
of them, since every pass costs the same full-length forward). ``forward_fn_ppl`` of
``model_AOGPT_generate.py`` cannot run as published (it calls its KV-cache blocks without a cache),
so the pass is the trainer model's ``forward_fn`` (the same computation) plus the per-token
cross-entropy of every row, as ``forward_fn_ppl`` computes it. Prints one JSON line."""
import argparse, contextlib, io, json, os, sys, time

p = argparse.ArgumentParser()
p.add_argument("part", choices=("train", "sample", "ensembles"))
p.add_argument("--published", required=True)
p.add_argument("--runs", type=int, default=3)
p.add_argument("--steps", default="16,64,256")
p.add_argument("--top_p", default="1.0,0.95")
p.add_argument("--max_m", type=int, default=8)
p.add_argument("--passes", type=int, default=24, help="ensembles: timed passes (0: all)")
p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
a = p.parse_args()
sys.path.insert(0, a.published)
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm as M  # noqa: E402
import model_AOGPT_generate as G  # noqa: E402
from ema import ExponentialMovingAverage  # noqa: E402

DEV = "cuda" if a.device == "gpu" else "cpu"
if DEV == "cpu":
  torch.set_num_threads(2)
torch.manual_seed(0)
AMP = (torch.autocast("cuda", dtype=torch.bfloat16) if DEV == "cuda"
       else contextlib.nullcontext())
L, H, E, T, V, B = 4, 4, 256, 256, 50304, 8


def cfg(mod):
  return mod.AOGPTConfig(n_layer=L, n_head=H, n_embd=E, block_size=T, vocab_size=V, bias=True,
                         dropout=0.0)


def best(fn, runs):
  def timed():
    t0 = time.perf_counter()
    fn()
    if DEV == "cuda":
      torch.cuda.synchronize()
    return time.perf_counter() - t0
  timed()
  ts = [timed() for _ in range(runs)]
  return min(ts), ts


res = {}
X = torch.randint(0, 50257, (B, T), device=DEV)
if a.part == "train":
  model = M.AOGPT(cfg(M)).to(DEV); model.train()
  opt = model.configure_optimizers(0.05, 6e-4, (0.9, 0.95), DEV)
  ema = ExponentialMovingAverage(model.parameters(), decay=1 - 1e-4)

  def step():
    with AMP:   # the forward only, as the published trainer
      _, loss = model(X, mode="Random_CL", random_ratio=0.9)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    ema.update(model.parameters())
  s, ts = best(step, a.runs)
  res["train"] = dict(step_s=round(s, 5), runs=[round(t, 5) for t in ts])
elif a.part == "ensembles":
  model = M.AOGPT(cfg(M)).to(DEV).eval()
  x1 = X[:1]

  def ppl_pass(orders):    # forward_fn_ppl: logits of every row, per-token CE of every row
    logits, _ = model(x1, mode=None, orders=orders)
    tgt = torch.gather(x1, 1, orders)
    return None, F.cross_entropy(logits[:, :-1].permute(0, 2, 1), tgt, reduction="none")
  total = 1 + T * (a.max_m - 1)
  items = [(i, j) for i in range(T) for j in range(1, a.max_m)]
  if a.passes:
    items = items[::max(1, len(items) // a.passes)][:a.passes]

  def ensemble():
    with torch.no_grad(), AMP:
      orders = torch.randperm(T, device=DEV)[None]
      _, base = ppl_pass(orders)
      out = torch.zeros([1, T, a.max_m], dtype=torch.float64, device=DEV)
      out[:, :, 0] = base
      for i, j in items:
        reshuffle = torch.randperm(i, device=DEV)[None]
        oe = torch.cat((torch.gather(orders[:, :i], dim=1, index=reshuffle), orders[:, i:]), dim=1)
        _, cur = ppl_pass(oe)
        out[:, i, j] = cur[:, i]
  s, ts = best(ensemble, a.runs)
  scale = total / (1 + len(items))
  res["ensembles"] = dict(wall_s=round(s * scale, 5), measured_s=round(s, 5),
                          passes_timed=1 + len(items), passes_total=total,
                          extrapolated=scale != 1.0)
else:
  model = G.AOGPT(cfg(G)).to(DEV).eval()
  for top_p in [float(x) for x in a.top_p.split(",")]:
    for steps in [int(x) for x in a.steps.split(",")]:
      def gen():
        with torch.no_grad(), AMP, contextlib.redirect_stdout(io.StringIO()):
          out = model.generate(B, steps, DEV, schedules="linear", topp=top_p, temperature=1.0)
        assert out.shape == (B, T), out.shape
      s, ts = best(gen, a.runs)
      res[f"sample T={steps} top_p={top_p}"] = dict(wall_s=round(s, 5),
                                                    runs=[round(t, 5) for t in ts])
print(json.dumps(res))
