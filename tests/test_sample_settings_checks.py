"""SampleSettings refuses temperatures that silently give wrong samples (issue 16 item 4):
infinity yields only padding, NaN nothing, and tiny values overflow the scaled logits."""

import math

import pytest

from aogpt_jax import config as config_lib
from aogpt_jax import sampler

from trainer_util import tiny_config

MODEL_CFG = config_lib.resolve(tiny_config("unused"))


@pytest.mark.parametrize("t", [math.inf, math.nan, 1e-308, 5e-324, 1e-31])
def test_non_finite_and_tiny_temperatures_are_refused(t):
  with pytest.raises(ValueError, match="sample.temperature"):
    sampler.SampleSettings(length=8, steps=8, temperature=t).validate(MODEL_CFG)


@pytest.mark.parametrize("t", [1e-6, 0.5, 1.0, 3.0])
def test_ordinary_temperatures_are_accepted(t):
  sampler.SampleSettings(length=8, steps=8, temperature=t).validate(MODEL_CFG)
