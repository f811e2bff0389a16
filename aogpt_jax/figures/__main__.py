"""``python -m aogpt_jax.figures``: see aogpt_jax/figures/cli.py. Ctrl-C: one line, status 130
(--verbose: the traceback)."""

import os
import signal
import sys

if __name__ == "__main__":
  from aogpt_jax import errors
  errors.exit_on_ctrl_c("aogpt_jax.figures")   # importing cli (JAX, numpy) takes seconds
  try:
    from aogpt_jax.figures.cli import main
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
  except KeyboardInterrupt as e:   # a run stopped by Ctrl-C saved its checkpoint first
    if "--verbose" in sys.argv:
      raise
    print(f"aogpt_jax.figures: interrupted{': ' + str(e) if str(e) else ' (Ctrl-C)'}",
          file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Not SystemExit: an interpreter shut down mid-compile can crash in XLA's threads (SIGSEGV);
    # a stopped run has saved its checkpoint already.
    os._exit(130)
