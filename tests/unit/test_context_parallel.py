"""Ulysses context parallelism is the same math as one rank: the embedded model's per-token
log-probs and the gradient of a token-weighted loss, with each row's tokens split over a group,
equal the whole-sequence forward within float32 tolerance. Fast tier: 2 spawned gloo ranks, one
group of 2, with the model's own heads and with grouped-query attention (2 key/value heads, split).
Slow tier: 4 ranks, groups of 2 (two groups side by side) and of 4, and grouped-query attention
whose 2 key/value heads do not split over 4 ranks (repeated before the exchange). Rows are
right-padded and uneven, so the padding to a multiple of the group size is exercised."""

from __future__ import annotations

import pytest
import torch

from helpers.context_parallel import LENGTHS, run_spawned

pytestmark = pytest.mark.multiprocess

TWO_RANKS = {"cp2": (2, None), "cp2-gqa": (2, 2)}
FOUR_RANKS = {"cp2-of-4": (2, None), "cp4": (4, None), "cp4-gqa-repeated": (4, 2)}


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    return run_spawned(tiny_model_dir, 2, TWO_RANKS, tmp_path_factory.mktemp("cp2") / "r.pt")


@pytest.fixture(scope="module")
def four_ranks(tiny_model_dir, tmp_path_factory):
    return run_spawned(tiny_model_dir, 4, FOUR_RANKS, tmp_path_factory.mktemp("cp4") / "r.pt")


@pytest.mark.slow  # 2 spawned ranks, ~12-25 s; the engine-level CP tests are slow too
@pytest.mark.parametrize("case", list(TWO_RANKS))
def test_split_over_two_ranks_matches_the_whole_forward(two_ranks, case):
    _assert_matches(two_ranks[case], TWO_RANKS[case][0])


@pytest.mark.slow  # 4 spawned ranks: ~25 s of CPU
@pytest.mark.parametrize("case", list(FOUR_RANKS))
def test_split_over_four_ranks_matches_the_whole_forward(four_ranks, case):
    _assert_matches(four_ranks[case], FOUR_RANKS[case][0])


def _assert_matches(got, size):
    assert got["local_width"] == -(-max(LENGTHS) // size)  # each rank ran 1/C of the tokens
    assert got["want_logp"].abs().sum() > 0
    torch.testing.assert_close(got["logp"], got["want_logp"], atol=1e-5, rtol=0)
    assert set(got["grads"]) == set(got["want_grads"])
    for name, want in got["want_grads"].items():
        assert want.abs().max() > 0, name
        torch.testing.assert_close(got["grads"][name], want, atol=1e-5, rtol=1e-4, msg=name)


def test_heads_must_divide_the_group():
    from types import SimpleNamespace

    from zbrl.training.engine.context_parallel import check_heads

    check_heads(SimpleNamespace(num_attention_heads=4), 2)
    with pytest.raises(ValueError, match=r"context_parallel_size=3 must divide .* \(4\)"):
        check_heads(SimpleNamespace(num_attention_heads=4), 3)
