"""Group filters used by the rollout buffer."""

from __future__ import annotations

import pytest
import torch

from zbrl.algorithms import group_in_accuracy_range, is_zero_variance, truncation_keep_mask


@pytest.mark.parametrize(
    ("accuracies", "filter_range", "keep"),
    [
        ([1.0, 0.0, 1.0, 0.0], (0.01, 0.99), True),
        ([1.0, 1.0, 1.0, 1.0], (0.01, 0.99), False),  # all solved
        ([0.0, 0.0, 0.0, 0.0], (0.01, 0.99), False),  # all failed
        ([1.0, 0.0], (0.5, 0.99), False),  # mean == low: strict bound drops it
        ([1.0, 0.0], (0.0, 0.5), False),  # mean == high: strict bound drops it
        ([1.0, 0.0, 0.0, 0.0], (0.2, 0.3), True),
        ([1.0, 1.0, 1.0, 1.0], None, True),  # no filter keeps everything
        ([0.0], None, True),
    ],
)
def test_group_in_accuracy_range(accuracies, filter_range, keep) -> None:
    assert group_in_accuracy_range(accuracies, filter_range) is keep


def test_group_in_accuracy_range_bad_inputs() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        group_in_accuracy_range([0.5], (0.9, 0.1))
    with pytest.raises(ValueError, match="empty"):
        group_in_accuracy_range([], (0.0, 1.0))


def test_is_zero_variance() -> None:
    assert is_zero_variance([1.0, 1.0, 1.0])
    assert is_zero_variance([0.5])
    assert is_zero_variance([1.0, 1.0 + 1e-10])
    assert not is_zero_variance([1.0, 1.0 + 1e-6])
    assert is_zero_variance([1.0, 1.0 + 1e-6], tol=1e-5)
    assert not is_zero_variance([0.0, 1.0, 0.0])
    assert is_zero_variance(torch.tensor([2.0, 2.0]))
    assert not is_zero_variance(torch.tensor([2.0, -2.0]))
    with pytest.raises(ValueError, match="empty"):
        is_zero_variance([])


def test_truncation_keep_mask() -> None:
    assert truncation_keep_mask([True, False, False, True]) == [False, True, True, False]
    assert truncation_keep_mask([]) == []
    assert truncation_keep_mask(torch.tensor([True, False]).tolist()) == [False, True]
