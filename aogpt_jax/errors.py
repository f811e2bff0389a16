"""One way for every command line of the project (``aogpt_jax.main``, ``aogpt_jax.data.prepare``,
``aogpt_jax.checkpoints.convert``, ``aogpt_jax.evaluation.lmeval``) to end on a user error: one
line on stderr, ``PROG: Type: message``, and exit status 1; ``--verbose`` anywhere in the
arguments shows the full traceback instead. Ctrl-C ends with one line and status 130.

    from aogpt_jax import errors
    if __name__ == "__main__":
      errors.run_cli(main, sys.argv[1:], prog="aogpt_jax.data.prepare")

The lowest layer of the package: it imports nothing of aogpt_jax.
"""

from __future__ import annotations

import json
import sys
from typing import Callable, Sequence

# What a user's mistake raises (a bad value, a missing or unwritable file, a malformed JSON, a
# non-finite loss); anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, KeyError, FloatingPointError, json.JSONDecodeError)


def _root(e: BaseException) -> BaseException:
  """What went wrong under the layers that re-raised it: the exception of the chain that says
  "did you mean", else the innermost cause."""
  seen, chain = set(), []
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    chain.append(e)
    e = e.__cause__ or e.__context__
  hinted = [x for x in chain if "did you mean" in str(x).lower()]
  return hinted[0] if hinted else chain[-1]


def one_line(e: BaseException) -> str:
  """``e``'s message on one line (KeyError's "did you mean" included)."""
  msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
  msg = "; ".join(line.strip() for line in str(msg).splitlines() if line.strip())
  return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def verbose(argv: Sequence[str]) -> bool:
  return any(a in ("--verbose", "--verbose=true", "--verbose=True", "--verbose=1") for a in argv)


def message(e: BaseException) -> str:
  """The line for a user error: ``e``'s own message (the layers that re-raise add what they
  were doing), or the cause's that says "did you mean"."""
  root = _root(e)
  return one_line(root if "did you mean" in str(root).lower() else e)


def run_cli(fn: Callable[[list[str]], object], argv: Sequence[str] | None = None, *,
            prog: str, errors: tuple[type[BaseException], ...] = USER_ERRORS,
            where: str = "") -> object:
  """Runs ``fn(argv)`` (argv without the program name, ``--verbose`` removed); a user error
  (``errors``) ends the process with one line ``PROG: [WHERE: ]Type: message (--verbose for the
  traceback)`` and status 1, Ctrl-C with one line and status 130; ``--verbose`` in argv
  re-raises instead (the traceback)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  loud = verbose(argv)
  argv = [a for a in argv if not verbose([a])]
  try:
    return fn(argv)
  except KeyboardInterrupt:
    if loud:
      raise
    print(f"{prog}: interrupted (Ctrl-C)", file=sys.stderr)
    raise SystemExit(130) from None
  except errors as e:
    if loud:
      raise
    msg = message(e)
    if where and where not in msg:
      msg = f"{where}: {msg}"
    raise SystemExit(f"{prog}: {msg} (--verbose for the traceback)") from None


def exit_on_ctrl_c(prog: str) -> None:
  """While a command line starts (JAX, numpy and the rest import for seconds): a Ctrl-C ends
  the process at once with one line and status 130. ``os._exit``, not an exception: raised in
  an import, a finalizer or a C callback, an exception is swallowed ("Exception ignored") or
  turned into an ImportError; nothing has been written yet. The command restores
  ``signal.default_int_handler`` once it starts its work."""
  import os  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top

  def handler(signum, frame):
    del signum, frame
    try:
      sys.stdout.flush()
      print(f"{prog}: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    finally:
      os._exit(130)

  signal.signal(signal.SIGINT, handler)


def _in_gc_callback(frame) -> bool:
  """Whether ``frame`` (or a caller) runs one of ``gc.callbacks`` (JAX registers one): an
  exception raised there is printed as "Exception ignored" and lost."""
  import gc  # pylint: disable=g-import-not-at-top
  codes = {getattr(cb, "__code__", None) for cb in gc.callbacks} - {None}
  while frame is not None and codes:
    if frame.f_code in codes:
      return True
    frame = frame.f_back
  return False


def ctrl_c_handler(signum, frame):
  """SIGINT once a command has started: KeyboardInterrupt, as Python's default, except inside a
  gc callback, where it would be swallowed and the run go on: there the interrupt is delivered
  again 50 ms later, outside the callback."""
  del signum
  if _in_gc_callback(frame):
    import _thread  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top
    threading.Timer(0.05, _thread.interrupt_main).start()
    return
  raise KeyboardInterrupt


def exit_interrupted(prog: str, detail: str = "") -> None:
  """The one line of a Ctrl-C and status 130, without the interpreter's teardown: XLA's
  compiler threads (a first step still compiling) or grain's readers still running at teardown
  crashed it ("Fatal Python error: Segmentation fault", status 139). Every ``finally`` of the
  command has run by now (checkpoints saved or closed, locks released); logs are flushed."""
  import logging  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  try:
    sys.stdout.flush()
    print(f"{prog}: interrupted{': ' + detail if detail else ' (Ctrl-C)'}", file=sys.stderr,
          flush=True)
    logging.shutdown()
  finally:
    os._exit(130)
