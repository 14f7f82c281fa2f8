"""lr_factor: linear warmup from 1/warmup, then cosine decay to a floor (or constant)."""

import itertools
import math

import pytest
import torch

from zbrl.training.schedule import lr_factor


def cosine(step, warmup, total, min_ratio):
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def test_warmup_is_linear_from_one_over_warmup_to_one():
    factors = [
        lr_factor(s, warmup_steps=4, total_steps=20, decay="cosine", min_ratio=0.1)
        for s in range(5)
    ]
    assert factors == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    diffs = [b - a for a, b in itertools.pairwise(factors[:4])]
    assert diffs == pytest.approx([0.25, 0.25, 0.25])


def test_warmup_applies_to_constant_decay_too():
    assert lr_factor(0, warmup_steps=2, total_steps=10, decay="constant", min_ratio=0.1) == 0.5
    assert lr_factor(1, warmup_steps=2, total_steps=10, decay="constant", min_ratio=0.1) == 1.0


def test_no_warmup_starts_at_peak():
    assert lr_factor(0, warmup_steps=0, total_steps=10, decay="cosine", min_ratio=0.2) == 1.0
    assert lr_factor(0, warmup_steps=0, total_steps=10, decay="constant", min_ratio=0.2) == 1.0


@pytest.mark.parametrize("warmup", [0, 3])
@pytest.mark.parametrize("min_ratio", [0.0, 0.1, 0.5])
def test_cosine_reaches_min_ratio_at_total_steps_and_stays(warmup, min_ratio):
    total = 17
    kw = dict(warmup_steps=warmup, total_steps=total, decay="cosine", min_ratio=min_ratio)
    assert lr_factor(total, **kw) == pytest.approx(min_ratio)
    assert lr_factor(total + 5, **kw) == pytest.approx(min_ratio)
    assert lr_factor(10_000, **kw) == pytest.approx(min_ratio)
    assert lr_factor(total - 1, **kw) > min_ratio
    # the midpoint of the decay is halfway between the peak and the floor
    mid = warmup + (total - warmup) / 2
    if mid == int(mid):
        assert lr_factor(int(mid), **kw) == pytest.approx((1 + min_ratio) / 2)


def test_cosine_matches_reference_formula():
    for step in range(3, 30):
        got = lr_factor(step, warmup_steps=3, total_steps=25, decay="cosine", min_ratio=0.05)
        assert got == pytest.approx(cosine(step, 3, 25, 0.05)), step


def test_constant_decay_stays_at_peak_after_warmup():
    values = [
        lr_factor(s, warmup_steps=2, total_steps=10, decay="constant", min_ratio=0.1)
        for s in range(2, 40)
    ]
    assert values == [1.0] * len(values)


@pytest.mark.parametrize("warmup,total", [(0, 10), (5, 50), (10, 11), (10, 5)])
def test_monotone_non_increasing_after_warmup_and_bounded(warmup, total):
    kw = dict(warmup_steps=warmup, total_steps=total, decay="cosine", min_ratio=0.1)
    values = [lr_factor(s, **kw) for s in range(warmup, total + 20)]
    assert values[0] == pytest.approx(1.0)
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(values))
    assert all(0.1 - 1e-12 <= v <= 1.0 for v in values)
    assert values[-1] == pytest.approx(0.1)


def test_lambda_lr_drives_optimizer_lr():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=2.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_factor(s, warmup_steps=2, total_steps=6, decay="cosine", min_ratio=0.0),
    )
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[:3] == pytest.approx([1.0, 2.0, 2.0])
    assert seen[6:] == pytest.approx([0.0, 0.0])
    assert seen[3] == pytest.approx(2.0 * cosine(3, 2, 6, 0.0))
