"""The tiny model and the enumeration shared by the exactness tests (`test_sampler_exact`,
`test_speculative`): 3 valid tokens (+1 padding id), length 4 (81 sequences), init std 0.5 so the
conditionals are far from uniform. Use in a test module as ``model, seqs = exact_tiny.model,
exact_tiny.seqs`` (pytest picks the fixtures up from the module)."""

import pytest

from sampler_testlib import all_sequences, tiny_model

N_SAMPLES = 20000
V, LEN = 3, 4


@pytest.fixture(scope="module")
def model():
  return tiny_model(vocab=4, valid=V, block=LEN, std=0.5)


@pytest.fixture(scope="module")
def seqs():
  return all_sequences(V, LEN)
