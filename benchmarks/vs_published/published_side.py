"""The published AO-GPT code's half of `benchmarks/vs_published.py` (run by it in a subprocess).

Imports the published model classes from ``--published`` (a scratch copy whose generate() uses
block_size; `vs_published.py` makes it) and times, on CPU in fp32 with 2 torch threads, eager:
``train`` (forward, backward, clip 1.0, AdamW, the EMA update) or ``sample`` (``generate()`` at
each T of ``--steps`` and top-p of ``--top_p``). Prints one JSON line."""
import argparse, contextlib, io, json, os, statistics, sys, time

p = argparse.ArgumentParser()
p.add_argument("part", choices=("train", "sample"))
p.add_argument("--published", required=True)
p.add_argument("--runs", type=int, default=3)
p.add_argument("--steps", default="16,64,256")
p.add_argument("--top_p", default="1.0,0.95")
a = p.parse_args()
sys.path.insert(0, a.published)
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
import torch  # noqa: E402
import model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm as M  # noqa: E402
import model_AOGPT_generate as G  # noqa: E402
from ema import ExponentialMovingAverage  # noqa: E402

torch.set_num_threads(2)
torch.manual_seed(0)
L, H, E, T, V, B = 4, 4, 256, 256, 50304, 8


def cfg(mod):
  return mod.AOGPTConfig(n_layer=L, n_head=H, n_embd=E, block_size=T, vocab_size=V, bias=True,
                         dropout=0.0)


def best(fn, runs):
  fn()
  ts = []
  for _ in range(runs):
    t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
  return min(ts), ts


res = {}
X = torch.randint(0, 50257, (B, T))
if a.part == "train":
  model = M.AOGPT(cfg(M)); model.train()
  opt = model.configure_optimizers(0.05, 6e-4, (0.9, 0.95), "cpu")
  ema = ExponentialMovingAverage(model.parameters(), decay=1 - 1e-4)

  def step():
    _, loss = model(X, mode="Random_CL", random_ratio=0.9)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    ema.update(model.parameters())
  s, ts = best(step, a.runs)
  res["train"] = dict(step_s=round(s, 3), runs=[round(t, 3) for t in ts])
else:
  model = G.AOGPT(cfg(G)).eval()
  for top_p in [float(x) for x in a.top_p.split(",")]:
    for steps in [int(x) for x in a.steps.split(",")]:
      def gen():
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
          out = model.generate(B, steps, "cpu", schedules="linear", topp=top_p, temperature=1.0)
        assert out.shape == (B, T), out.shape
      s, ts = best(gen, a.runs)
      res[f"sample T={steps} top_p={top_p}"] = dict(wall_s=round(s, 3),
                                                    runs=[round(t, 3) for t in ts])
print(json.dumps(res))
