"""The FSDP2 engine with context parallelism trains exactly like one process: the same batch on
2 spawned gloo ranks (one context-parallel group of 2) and on 4 (one group of 4; two data-parallel
groups of 2), against the single-process engine: gradients of every optimizer step, updated
weights and metrics within float32 tolerance, for token-mean and seq-mean-token-mean aggregation
(whose per-row token counts span the ranks of a group), gradient accumulation over uneven
micro-batches (with 2 data-parallel slices one runs a padding micro-batch), several optimizer
steps per batch, and the KL reference (which runs split as well)."""

from __future__ import annotations

import pytest
import torch

from helpers.data_parallel import Case, run_case, run_distributed

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # spawned FSDP2 groups: ~1-2 min

ACCUMULATE = ("training.train_microbatch_size=2", "algorithm.lr=1e-4")
BASE = [
    Case("token-mean", ("algorithm.loss_aggregation=token-mean", *ACCUMULATE), 3, seed=1),
    Case(
        "seq-mean-token-mean",
        ("algorithm.loss_aggregation=seq-mean-token-mean", *ACCUMULATE),
        3,
        seed=2,
    ),
    Case(
        "minibatches-kl",
        ("training.train_minibatch_size=2", "algorithm.beta=0.1", *ACCUMULATE),
        5,
        seed=7,
    ),
]


def with_context(size: int) -> list[Case]:
    option = f"training.engine.context_parallel_size={size}"
    return [
        Case(f"{c.name}-cp{size}", (*c.overrides, option), c.num_groups, seed=c.seed) for c in BASE
    ]


@pytest.fixture(scope="module")
def single_results(tiny_model_dir):
    return {case.name: run_case(case, "single", 1, tiny_model_dir) for case in BASE}


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cp2") / "results.pt"
    return run_distributed("fsdp2", with_context(2), tiny_model_dir, out, world_size=2)


@pytest.fixture(scope="module")
def four_ranks(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cp4") / "results.pt"
    cases = with_context(4) + with_context(2)  # one group of 4; 2 data-parallel x 2 context
    return run_distributed("fsdp2", cases, tiny_model_dir, out, world_size=4)


def _assert_dicts_close(got, want, atol, what):
    assert set(got) == set(want), what
    for name, ref in want.items():
        torch.testing.assert_close(got[name], ref, atol=atol, rtol=0, msg=f"{what}: {name}")


def _assert_matches(got, want, what):
    assert len(got["grads"]) == len(want["grads"]) >= 1, what
    for step, (g, w) in enumerate(zip(got["grads"], want["grads"], strict=True)):
        _assert_dicts_close(g, w, 1e-6, f"{what} gradient of optimizer step {step}")
    _assert_dicts_close(got["weights"], want["weights"], 1e-5, f"{what} weights")
    for key in ("loss", "trained_tokens", "num_tokens", "ratio_max", "pg_loss", "entropy"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], abs=1e-5), (what, key)


@pytest.mark.parametrize("case", BASE, ids=lambda c: c.name)
def test_one_group_of_two_matches_one_process(two_ranks, single_results, case):
    _assert_matches(two_ranks[f"{case.name}-cp2"], single_results[case.name], "cp2 on 2")


@pytest.mark.parametrize("size", [4, 2], ids=["cp4", "dp2xcp2"])
@pytest.mark.parametrize("case", BASE, ids=lambda c: c.name)
def test_four_ranks_match_one_process(four_ranks, single_results, case, size):
    _assert_matches(four_ranks[f"{case.name}-cp{size}"], single_results[case.name], f"cp{size}")
