"""The memory plan's consumer prediction for SmolLM2-135M against the measured peak of a real
training step on CPU (``bench/memory_plan.py``; about 15 minutes on 2 shared cores)."""

from __future__ import annotations

import pytest

from memory_plan import CACHE, MODELS, measure
from zbrl.models import catalogue

pytestmark = pytest.mark.realmodel


# the profiler records every allocation of two SmolLM2 steps: minutes, past pytest's default
# 600 s on a busy machine
@pytest.mark.timeout(1800)
def test_the_smollm2_consumer_plan_is_within_15_percent_of_its_measured_peak():
    smollm2_dir = catalogue.pull("smollm2-135m", CACHE)
    row = measure("smollm2-135m", smollm2_dir, MODELS["smollm2-135m"], "fp32")
    assert abs(row.error) < 0.15, row
