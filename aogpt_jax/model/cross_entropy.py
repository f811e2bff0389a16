"""Mean cross-entropy of the output head without a [tokens, vocab] logits tensor.

`fused_mean_nll(x, w, b, targets, ...)` equals ``mean(logsumexp(l) - l[target])`` for
``l = x @ w + b`` (padding ids at -inf), with its gradients with respect to ``x``, ``w`` and ``b``;
it runs over chunks of about ``chunk`` tokens (a few positions of every row) in a `lax.scan` and,
in the same pass, computes what the backward pass needs: for a chunk,
``dl = (softmax(l) - onehot(target)) / N``, then ``dx = dl @ w.T``, ``dw += x.T @ dl``,
``db += sum(dl)``. Only those (the size of ``x`` and of the
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
  """x [R, n, D], targets [R, n]: chunks of ``chunk`` positions of ALL R rows (positions-major:
  the rows, split over the batch mesh axes, stay a separate dimension, so no device needs
  another's rows)."""
  r, n, v = x.shape[0], x.shape[1], w.shape[1]
  wd = w.astype(dtype)
  # padding ids: -inf in the bias, so no [c, V] select is needed
  bias = jnp.where(jnp.arange(v) < valid_vocab, b.astype(jnp.float32), -jnp.inf)
  weight = _chunks(jnp.full((n, r), 1.0 / (n * r), jnp.float32), chunk)  # 0 on padding positions

  ones = jnp.ones((1, chunk * r), jnp.float32)     # db as a dot: XLA:CPU's reduce was ~40x slower

  def body(carry, xs):
    dw, db = carry
    xc, tc, wc = xs                                  # [c, R, D], [c, R], [c, R]
    xd = xc.astype(dtype)
    logits = jnp.einsum("crd,dv->crv", xd, wd, preferred_element_type=jnp.float32) + bias
    top = jnp.max(logits, axis=-1, keepdims=True)    # finite: padding ids alone are -inf
    e = jnp.exp(logits - top)                         # one exp per logit, for lse and softmax
    total = jnp.sum(e, axis=-1, keepdims=True)
    picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)
    nll = (top + jnp.log(total) - picked)[..., 0]
    onehot = jnp.arange(v, dtype=tc.dtype) == tc[..., None]
    dl = (e * (1.0 / total) - onehot) * wc[..., None]
    dld = dl.astype(dtype)
    dx = jnp.einsum("crv,dv->crd", dld, wd, preferred_element_type=jnp.float32)
    dw = dw + jnp.einsum("crd,crv->dv", xd, dld, preferred_element_type=jnp.float32)
    db = db + jnp.dot(ones, dl.reshape(-1, v))[0]
    return (dw, db), (nll, dx)

  zeros = (jnp.zeros(w.shape, jnp.float32), jnp.zeros((v,), jnp.float32))
  xs = (_chunks(jnp.swapaxes(x, 0, 1), chunk), _chunks(targets.T, chunk), weight)
  (dw, db), (nll, dx) = jax.lax.scan(body, zeros, xs)
  nll = nll.reshape(-1, r)[:n].T                                       # [R, n]
  dx = jnp.swapaxes(dx.reshape(-1, r, x.shape[2])[:n], 0, 1)           # [R, n, D]
  return jnp.sum(nll) / (n * r), nll, (dx, dw, db)


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
  """(mean NLL, per-token NLL without gradient) of ``x [..., n, D] @ w [D, V] + b [V]`` against
  ``targets [..., n]``; ids >= ``valid_vocab`` are padding (probability 0). A chunk is
  ``max(1, chunk // R)`` positions of all R rows (R: the product of the leading dims, e.g. the
  batch), so about ``chunk`` tokens, and the rows are never merged with the positions."""
  shape = targets.shape
  n = shape[-1] if len(shape) else 1
  x3 = x.reshape(-1, n, x.shape[-1])
  b = jnp.zeros((w.shape[1],), w.dtype) if b is None else b
  positions = max(1, min(int(chunk) // x3.shape[0], n))
  mean, nll = _mean_nll(x3, w, b, targets.reshape(-1, n).astype(jnp.int32), int(valid_vocab),
                        positions, jnp.dtype(dtype))
  return mean, jax.lax.stop_gradient(nll).reshape(shape)
