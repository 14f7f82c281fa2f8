"""The memory plan against the measured peak of real training steps on CPU
(``bench/memory_plan.py``: the CPU allocator's events under the profiler), embedded model."""

from __future__ import annotations

import pytest

from memory_plan import MODELS, measure

pytestmark = pytest.mark.slow

BOUND = 0.15


@pytest.mark.parametrize("setting", ["fp32", "bf16", "fp32+ckpt"])
def test_the_embedded_consumer_plan_is_within_15_percent_of_its_measured_peak(
    setting, tiny_model_dir
):
    row = measure("embedded", tiny_model_dir, MODELS["embedded"], setting)
    assert row.measured > row.state  # the step allocated on top of the weights and AdamW
    assert abs(row.error) < BOUND, row
