"""Exactness: sample frequencies match the model's distribution computed by enumeration.

Tiny model and enumeration: `helpers.exact_tiny`. Expected distributions are built from ordinary
causal (gather-path) forwards only: a parallel step's query for target sigma_{m+j} is the causal
forward of the order with ranks m and m+j swapped, at rank m. Chi-square with fixed seeds; every
test also checks that the wrong alternative (e.g. one-token-at-a-time when steps < n) is
rejected, so the test has the power to fail.
"""

import math

import jax
import numpy as np
import pytest

from aogpt_jax.sampling import sampler
from aogpt_jax.sampling import prompts
from helpers import exact_tiny
from helpers.sampler import chisquare_p, histogram, mixture_over_orders, parallel_logprob

N_SAMPLES, V, LEN = exact_tiny.N_SAMPLES, exact_tiny.V, exact_tiny.LEN
model, seqs = exact_tiny.model, exact_tiny.seqs     # the shared fixtures


def _draw(model, key, **settings):
  s = sampler.SampleSettings(length=LEN, **settings)
  out = sampler.generate(model, jax.random.key(key), s, batch=N_SAMPLES)
  assert (out.tokens < V).all(), "a padding id was sampled"
  return histogram(out.tokens, V)


def test_ancestral_sampling_t_equals_n(model, seqs):
  hist = _draw(model, 0, steps=LEN)
  exact = mixture_over_orders(model, seqs, range(LEN), [1] * LEN)
  assert abs(exact.sum() - 1) < 1e-9
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  wrong = mixture_over_orders(model, seqs, range(LEN), [2, 2])
  assert chisquare_p(hist, wrong, N_SAMPLES) < 1e-6


def test_parallel_steps_deterministic_counts(model, seqs):
  hist = _draw(model, 6, steps=2)                           # linear: reveals 2 then 2
  exact = mixture_over_orders(model, seqs, range(LEN), [2, 2])
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  ancestral = mixture_over_orders(model, seqs, range(LEN), [1] * LEN)
  assert chisquare_p(hist, ancestral, N_SAMPLES) < 1e-6


def test_parallel_steps_stochastic_counts(model, seqs):
  """Lemma 4.1 with T = 2 (linear): k_1 ~ Binomial(4, 1/2), then the rest."""
  hist = _draw(model, 2, steps=2, count_mode="stochastic")
  exact = np.zeros(len(seqs))
  for k1 in range(LEN + 1):
    counts = [c for c in (k1, LEN - k1) if c > 0]
    exact += math.comb(LEN, k1) / 2 ** LEN * mixture_over_orders(model, seqs, range(LEN), counts)
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  det = mixture_over_orders(model, seqs, range(LEN), [2, 2])
  assert chisquare_p(hist, det, N_SAMPLES) < 1e-6


@pytest.mark.parametrize("rule", ["published", "nucleus"])
def test_temperature_and_top_p(model, seqs, rule):
  kw = dict(temperature=0.7, top_p=0.8, top_p_rule=rule)
  hist = _draw(model, 3, steps=LEN, **kw)
  exact = mixture_over_orders(model, seqs, range(LEN), [1] * LEN, **kw)
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  plain = mixture_over_orders(model, seqs, range(LEN), [1] * LEN)
  assert chisquare_p(hist, plain, N_SAMPLES) < 1e-6


def test_infilling_is_the_conditional_of_the_prompt(model, seqs):
  """Position 1 given (token 2), the rest generated in random order in 2 steps (1 then 2)."""
  prompt = prompts.pairs_prompt([{1: 2}] * N_SAMPLES, LEN, V)
  s = sampler.SampleSettings(length=LEN, steps=2)
  out = sampler.generate(model, jax.random.key(4), s, prompt=prompt)
  assert (out.tokens[:, 1] == 2).all()
  keep = seqs[:, 1] == 2
  hist = histogram(out.tokens, V)[keep]
  exact = mixture_over_orders(model, seqs, [0, 2, 3], [1, 2], prefix=(1,))[keep]
  assert abs(exact.sum() - 1) < 1e-9
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  wrong = mixture_over_orders(model, seqs, [0, 2, 3], [3], prefix=(1,))[keep]
  assert chisquare_p(hist, wrong, N_SAMPLES) < 1e-6


def test_ar_decoding_is_the_left_to_right_distribution(model, seqs):
  hist = _draw(model, 5, steps=LEN, method="ar")
  exact = np.exp(parallel_logprob(model, seqs, np.arange(LEN), [1] * LEN))
  assert chisquare_p(hist, exact, N_SAMPLES) > 1e-3
  any_order = mixture_over_orders(model, seqs, range(LEN), [1] * LEN)
  assert chisquare_p(hist, any_order, N_SAMPLES) < 1e-6
