"""``python -m aogpt_jax.figures``: see aogpt_jax/figures/cli.py."""

from aogpt_jax.figures.cli import main

if __name__ == "__main__":
  main()
