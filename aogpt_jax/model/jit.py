"""Split the graph definition, then jit: the one way this package jits a function of a model.

An NNX model is a Python object; ``jax.jit`` needs arrays. `jit` turns ``fn(model, *args)``
into a jitted ``fn(graphdef, state, *args)`` whose graph definition is a static argument (one
compile per model architecture and static setting) and whose state is traced; `call` splits a
model and calls it::

    @model_jit.jit("order_name")
    def _nll(model, tokens, *, order_name): ...

    nll = model_jit.call(_nll, m, tokens, order_name="uniform")

The jitted function keeps jax.jit's methods (``lower``, ``_cache_size``), so benchmarks and
tests can lower or count compiles with an explicit ``(graphdef, state)``; `Compiles` counts
the programs lowered while it is open (tests and benchmarks: "no compile after the first
update").
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
from flax import nnx


def jit(*static_argnames: str,
        compiler_options: dict[str, Any] | None = None) -> Callable[[Callable], Any]:
  """Decorator: ``fn(model, *args, **kw)`` -> jitted ``fn(graphdef, state, *args, **kw)`` with
  ``graphdef`` and ``static_argnames`` static (``compiler_options``: XLA options of this
  program only, as ``jax.jit``'s)."""
  def wrap(fn):
    def jitted(graphdef, state, *args, **kw):
      return fn(nnx.merge(graphdef, state), *args, **kw)
    # Not functools.wraps: jax.jit reads the signature to find ``graphdef``.
    jitted.__name__, jitted.__qualname__, jitted.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    return jax.jit(jitted, static_argnames=("graphdef", *static_argnames),
                   compiler_options=compiler_options)
  return wrap


def call(jitted, model: nnx.Module, *args, **kw):
  """``jitted(graphdef, state, *args, **kw)`` for ``model`` (also works on ``jitted.lower``)."""
  graphdef, state = nnx.split(model)
  return jitted(graphdef, state, *args, **kw)


def bind(jitted, model: nnx.Module) -> Callable[..., Any]:
  """``jitted`` with ``model`` split once: for a loop of calls on the same weights (`call`
  splits on every call, serial with the dispatch: milliseconds per call for small models)."""
  graphdef, state = nnx.split(model)
  return functools.partial(jitted, graphdef, state)


def compile_ahead(jitted, model: nnx.Module, *args, **kw) -> Callable[[], Any]:
  """Lowers and compiles ``jitted`` for ``model`` and these arguments now; returns a function of
  no arguments that runs the compiled code on them (compile time apart from run time)."""
  graphdef, state = nnx.split(model)
  compiled = jitted.lower(graphdef, state, *args, **kw).compile()
  return lambda: compiled(state, *args)


class Compiles:
  """Counts compilations while open: ``with Compiles() as c:`` then ``c.count``. It counts
  jax's lowering events (jaxpr to an MLIR module), which every compilation starts with, whether
  XLA then compiles or the persistent compilation cache the tests share answers: a program
  compiled again for new argument placements (committed or not) is a cache hit there, so
  counting XLA's own compile events would miss it."""

  EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"

  def __init__(self):
    self.count = 0
    self._listener = self._listen

  def _listen(self, event, duration, **kw):
    del duration, kw
    self.count += event == self.EVENT

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self._listener)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listener)
