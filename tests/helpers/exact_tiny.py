"""The tiny models and the enumeration shared by the exactness tests (`test_sampler_exact`,
`test_speculative`, `test_sampler_encoder`): 3 valid tokens (+1 padding id, the encoder's
[MASK]), length 4 (81 sequences), init std 0.5 so the conditionals are far from uniform. Use in a
test module as ``model, seqs = exact_tiny.model, exact_tiny.seqs`` (an AO-GPT) or
``model, seqs = exact_tiny.encoder_model, exact_tiny.seqs`` (the encoder-only MDM model); pytest
picks the fixtures up under the names they are bound to."""

import pytest

from helpers.sampler import all_sequences, tiny_encoder, tiny_model

N_SAMPLES = 20000
V, LEN = 3, 4


@pytest.fixture(scope="module")
def model():
  return tiny_model(vocab=4, valid=V, block=LEN, std=0.5)


@pytest.fixture(scope="module")
def encoder_model():
  return tiny_encoder(vocab=4, valid=V, block=LEN, std=0.5)


@pytest.fixture(scope="module")
def seqs():
  return all_sequences(V, LEN)
