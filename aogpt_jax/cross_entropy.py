"""Mean cross-entropy of the output head without a [tokens, vocab] logits tensor.

`fused_mean_nll(x, w, b, targets, ...)` equals ``mean(logsumexp(l) - l[target])`` for
``l = x @ w + b`` (padding ids at -inf), with its gradients with respect to ``x``, ``w`` and ``b``;
it runs over chunks of ``chunk`` tokens in a `lax.scan` and, in the same pass, computes what the
backward pass needs: for a chunk, ``dl = (softmax(l) - onehot(target)) / N``, then
``dx = dl @ w.T``, ``dw += x.T @ dl``, ``db += sum(dl)``. Only those (the size of ``x`` and of the
weights) are kept for the backward pass, which scales them by the incoming cotangent: no
[N, V] tensor outlives its chunk (the plain path keeps N x V fp32 logits and their softmax, 5 GiB
for AO-GPT Small at 8 x 1024 tokens), and on CPU the step is faster too (README, measured results).

The per-token NLLs are returned as well, for metrics, without a gradient (`stop_gradient`): the
precomputed gradients are those of the MEAN, so only the mean may be differentiated.

Matmul inputs are cast to ``dtype`` (bf16 on accelerators) with fp32 accumulation; the softmax,
the log-sum-exp and the gradient of the logits are fp32, as in the plain path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def _chunks(a: jax.Array, chunk: int) -> jax.Array:
  n = a.shape[0]
  pad = (-n) % chunk
  a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
  return a.reshape((n + pad) // chunk, chunk, *a.shape[1:])


def _forward(x, w, b, targets, valid_vocab, chunk, dtype):
  n, v = x.shape[0], w.shape[1]
  wd = w.astype(dtype)
  # padding ids: -inf in the bias, so no [c, V] select is needed
  bias = jnp.where(jnp.arange(v) < valid_vocab, b.astype(jnp.float32), -jnp.inf)
  weight = _chunks(jnp.full((n,), 1.0 / n, jnp.float32), chunk)   # 0 on the padding tokens

  def body(carry, xs):
    dw, db = carry
    xc, tc, wc = xs
    xd = xc.astype(dtype)
    logits = jnp.dot(xd, wd, preferred_element_type=jnp.float32) + bias
    lse = jax.nn.logsumexp(logits, axis=-1)
    rows = jnp.arange(xc.shape[0])
    nll = lse - logits[rows, tc]
    dl = jnp.exp(logits - lse[:, None]).at[rows, tc].add(-1.0) * wc[:, None]
    dld = dl.astype(dtype)
    dx = jnp.dot(dld, wd.T, preferred_element_type=jnp.float32)
    dw = dw + jnp.dot(xd.T, dld, preferred_element_type=jnp.float32)
    return (dw, db + jnp.sum(dl, axis=0)), (nll, dx)

  zeros = (jnp.zeros(w.shape, jnp.float32), jnp.zeros((v,), jnp.float32))
  (dw, db), (nll, dx) = jax.lax.scan(body, zeros, (_chunks(x, chunk), _chunks(targets, chunk),
                                                   weight))
  nll = nll.reshape(-1)[:n]
  return jnp.sum(nll) / n, nll, (dx.reshape(-1, x.shape[1])[:n], dw, db)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _mean_nll(x, w, b, targets, valid_vocab, chunk, dtype):
  mean, nll, _ = _forward(x, w, b, targets, valid_vocab, chunk, dtype)
  return mean, nll


def _mean_nll_fwd(x, w, b, targets, valid_vocab, chunk, dtype):
  mean, nll, grads = _forward(x, w, b, targets, valid_vocab, chunk, dtype)
  # zero-size arrays carry the primal dtypes (and the targets' shape) to the backward pass
  dtypes = tuple(jnp.zeros((0,), a.dtype) for a in (x, w, b))
  return (mean, nll), (grads, dtypes, jnp.zeros(targets.shape + (0,), jnp.int8))


def _mean_nll_bwd(valid_vocab, chunk, dtype, res, cot):
  del valid_vocab, chunk, dtype
  grads, dtypes, tshape = res
  g = cot[0]   # the per-token output is stop-gradient'ed by the caller
  dx, dw, db = ((g * d).astype(t.dtype) for d, t in zip(grads, dtypes))
  return dx, dw, db, np.zeros(tshape.shape[:-1], jax.dtypes.float0)


_mean_nll.defvjp(_mean_nll_fwd, _mean_nll_bwd)


def fused_mean_nll(x: jax.Array, w: jax.Array, b: jax.Array | None, targets: jax.Array, *,
                   valid_vocab: int, chunk: int = 1024, dtype=jnp.float32):
  """(mean NLL, per-token NLL without gradient) of ``x [..., D] @ w [D, V] + b [V]`` against
  ``targets [...]``; ids >= ``valid_vocab`` are padding (probability 0)."""
  shape = targets.shape
  x2 = x.reshape(-1, x.shape[-1])
  b = jnp.zeros((w.shape[1],), w.dtype) if b is None else b
  chunk = max(1, min(int(chunk), x2.shape[0]))
  mean, nll = _mean_nll(x2, w, b, targets.reshape(-1).astype(jnp.int32), int(valid_vocab),
                        chunk, jnp.dtype(dtype))
  return mean, jax.lax.stop_gradient(nll).reshape(shape)
