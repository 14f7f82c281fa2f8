"""Advantage estimators against plain-Python loop references, plus their edge cases."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

import zbrl.algorithms as algorithms
from zbrl.algorithms import ADVANTAGE_ESTIMATORS, MIN_GROUP_SIZE, compute_advantages

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
EPS = 1e-6


# ---------------------------------------------------------------- loop references (python floats)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def std(values: list[float], unbiased: bool) -> float:
    m = mean(values)
    squared = sum((v - m) ** 2 for v in values)
    return math.sqrt(squared / (len(values) - 1 if unbiased else len(values)))


def all_equal(values: list[float]) -> bool:
    return all(v == values[0] for v in values)


def ref_grpo(rewards: list[list[float]], unbiased: bool) -> list[list[float]]:
    out = []
    for group in rewards:
        if all_equal(group):
            out.append([0.0] * len(group))
            continue
        m, s = mean(group), std(group, unbiased)
        out.append([(r - m) / (s + EPS) for r in group])
    return out


def ref_dr_grpo(rewards: list[list[float]], unbiased: bool) -> list[list[float]]:
    out = []
    for group in rewards:
        m = mean(group)
        out.append([0.0 if all_equal(group) else r - m for r in group])
    return out


def ref_rloo(rewards: list[list[float]], unbiased: bool) -> list[list[float]]:
    out = []
    for group in rewards:
        row = []
        for i, r in enumerate(group):
            others = [group[j] for j in range(len(group)) if j != i]
            row.append(0.0 if all_equal(group) else r - mean(others))
        out.append(row)
    return out


def ref_reinforce_pp(
    rewards: list[list[float]], unbiased: bool, group_baseline: bool = True
) -> list[list[float]]:
    centered = ref_dr_grpo(rewards, unbiased) if group_baseline else rewards
    flat = [x for group in centered for x in group]
    if all_equal(flat):
        return [[0.0] * len(group) for group in rewards]
    m, s = mean(flat), std(flat, unbiased)
    out = []
    for group, x_group in zip(rewards, centered, strict=True):
        constant = group_baseline and all_equal(group)
        out.append([0.0 if constant else (x - m) / (s + EPS) for x in x_group])
    return out


REFERENCES = {
    "grpo": ref_grpo,
    "dr_grpo": ref_dr_grpo,
    "rloo": ref_rloo,
    "reinforce_pp": ref_reinforce_pp,
}


def random_rewards(seed: int) -> torch.Tensor:
    """Mixed batch: binary-accuracy groups, continuous groups and at least one constant group."""
    gen = torch.Generator().manual_seed(seed)
    batch, group = 6, 2 + seed % 5
    binary = torch.randint(0, 2, (batch, group), generator=gen).float()
    continuous = torch.randn(batch, group, generator=gen) * 3.0 + 1.0
    rewards = torch.where(torch.arange(batch).unsqueeze(1) % 2 == 0, binary, continuous)
    rewards[1] = 0.7  # a constant group
    return rewards


# ---------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("unbiased", [True, False])
def test_estimator_matches_loop_reference(seed: int, name: str, unbiased: bool) -> None:
    rewards = random_rewards(seed)
    got = compute_advantages(name, rewards, eps=EPS, std_unbiased=unbiased)
    want = torch.tensor(REFERENCES[name](rewards.double().tolist(), unbiased), dtype=torch.float32)
    assert got.dtype == torch.float32
    assert got.shape == rewards.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_pp_without_group_baseline(seed: int) -> None:
    rewards = random_rewards(seed)
    got = compute_advantages("reinforce_pp", rewards, eps=EPS, group_baseline=False)
    want = ref_reinforce_pp(rewards.double().tolist(), True, group_baseline=False)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=1e-5, atol=1e-5)
    # Without a group baseline a constant group is still whitened against the batch: non-zero.
    assert got[1].abs().sum() > 0


def test_rloo_is_scaled_group_centering() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]])
    group = rewards.shape[1]
    expected = (rewards - rewards.mean(dim=1, keepdim=True)) * group / (group - 1)
    torch.testing.assert_close(compute_advantages("rloo", rewards), expected)


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -3.3])
def test_identical_rewards_give_exact_zero(name: str, value: float) -> None:
    # G = 7: the float mean of seven equal values is not always exactly that value (e.g. 0.1).
    rewards = torch.tensor(
        [[value] * 7, [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [value] * 7], dtype=torch.float64
    )
    got = compute_advantages(name, rewards)
    assert not torch.isnan(got).any()
    assert torch.equal(got[0], torch.zeros(7))
    assert torch.equal(got[2], torch.zeros(7))
    assert got[1].abs().sum() > 0


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "reinforce_pp"])
def test_group_of_one_gives_zero(name: str) -> None:
    rewards = torch.tensor([[0.0], [1.0], [0.5]])
    got = compute_advantages(name, rewards)
    assert torch.equal(got, torch.zeros(3, 1))
    assert MIN_GROUP_SIZE[name] == 1


def test_rloo_group_of_one_raises_clear_error() -> None:
    assert MIN_GROUP_SIZE["rloo"] == 2
    with pytest.raises(ValueError, match=r"'rloo'.*at least 2 completions per prompt.*G = 1"):
        compute_advantages("rloo", torch.tensor([[1.0], [0.0]]))


@pytest.mark.parametrize("group_baseline", [True, False])
def test_reinforce_pp_constant_batch_is_zero(group_baseline: bool) -> None:
    rewards = torch.full((4, 3), 0.25)
    got = compute_advantages("reinforce_pp", rewards, group_baseline=group_baseline)
    assert torch.equal(got, torch.zeros(4, 3))


def test_grpo_scale_is_unit_std_per_group() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(8, 16, generator=gen) * 5.0 + 2.0
    got = compute_advantages("grpo", rewards, eps=0.0)
    torch.testing.assert_close(got.mean(dim=1), torch.zeros(8), atol=1e-5, rtol=0)
    torch.testing.assert_close(got.std(dim=1), torch.ones(8), atol=1e-5, rtol=0)


def test_estimators_accept_extra_kwargs_and_ints() -> None:
    rewards = torch.tensor([[1, 0, 1], [0, 0, 1]])  # integer rewards
    for name in ESTIMATORS:
        got = compute_advantages(name, rewards, eps=1e-4, std_unbiased=False, unused_option=3)
        assert got.dtype == torch.float32
        assert torch.isfinite(got).all()


def test_bad_inputs_have_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"rewards_BG must have shape \[B, G\]"):
        compute_advantages("grpo", torch.zeros(4))
    with pytest.raises(ValueError, match="NaN or inf"):
        compute_advantages("grpo", torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(KeyError, match="unknown advantage estimator 'gpro'"):
        compute_advantages("gpro", torch.zeros(2, 2))


def test_registry_and_import_path() -> None:
    assert set(ESTIMATORS) <= set(ADVANTAGE_ESTIMATORS.names())
    rewards = torch.tensor([[0.0, 1.0, 1.0]])
    by_path = compute_advantages("zbrl.algorithms.advantages:dr_grpo", rewards)
    torch.testing.assert_close(by_path, compute_advantages("dr_grpo", rewards))


def test_algorithms_import_neither_ray_nor_torch_distributed() -> None:
    package_dir = Path(algorithms.__file__).parent
    for source in package_dir.glob("*.py"):
        tree = ast.parse(source.read_text(), filename=str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith("ray"), f"{source.name} imports {name}"
                assert not name.startswith("torch.distributed"), f"{source.name} imports {name}"
