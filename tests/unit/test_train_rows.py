"""build_rows / collate / split / trained_token_count: per-micro-batch right padding, masks."""

import random

import pytest
import torch

from zbrl.training.rows import (
    MicroBatching,
    Row,
    build_rows,
    collate,
    plan_micro_batches,
    split,
    trained_token_count,
)
from zbrl.types import RolloutGroup

PAD = 0


def make_group(prompt, responses, *, ans_acc=None, truncated=None, temperature=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = len(responses)
    return RolloutGroup(
        uid=f"u{seed}@e0",
        prompt_ids=list(prompt),
        response_ids=[torch.tensor(r, dtype=torch.long) for r in responses],
        behaviour_logprobs=[-torch.rand(len(r), generator=gen) - 0.01 for r in responses],
        rewards=list(ans_acc or [0.0] * g),
        format_acc=[1.0] * g,
        ans_acc=list(ans_acc or [0.0] * g),
        truncated=list(truncated or [False] * g),
        policy_version=0,
        temperature=temperature,
        producer=0,
    )


def two_groups():
    a = make_group([5, 6, 7], [[11, 12], [13, 14, 15, 16]], ans_acc=[0.0, 1.0], seed=1)
    b = make_group(
        [8], [[21], [22, 23, 24]], ans_acc=[1.0, 1.0], truncated=[False, True], seed=2,
        temperature=0.7,
    )  # fmt: skip
    return [a, b]


def test_build_rows_one_row_per_completion_in_order():
    groups = two_groups()
    adv = torch.tensor([[-1.0, 1.0], [0.5, -0.5]])
    rows = build_rows(groups, adv, filter_truncated=False, loss_filter_range=None)
    assert len(rows) == 4
    assert [r.advantage for r in rows] == [-1.0, 1.0, 0.5, -0.5]
    assert [r.prompt_ids for r in rows] == [[5, 6, 7], [5, 6, 7], [8], [8]]
    assert [r.response_ids.tolist() for r in rows] == [
        [11, 12],
        [13, 14, 15, 16],
        [21],
        [22, 23, 24],
    ]
    assert [r.temperature for r in rows] == [1.0, 1.0, 0.7, 0.7]
    assert all(r.trained for r in rows)
    assert torch.equal(rows[3].old_logprobs, groups[1].behaviour_logprobs[1])


def test_filter_truncated_masks_only_truncated_rows():
    groups = two_groups()
    adv = torch.zeros(2, 2)
    rows = build_rows(groups, adv, filter_truncated=True, loss_filter_range=None)
    assert [r.trained for r in rows] == [True, True, True, False]
    assert trained_token_count(rows) == (2 + 4 + 1, 3)
    rows = build_rows(groups, adv, filter_truncated=False, loss_filter_range=None)
    assert trained_token_count(rows) == (2 + 4 + 1 + 3, 4)


def test_loss_filter_range_masks_whole_groups():
    groups = two_groups()  # group a mean acc 0.5, group b mean acc 1.0
    adv = torch.zeros(2, 2)
    rows = build_rows(groups, adv, filter_truncated=False, loss_filter_range=(0.01, 0.99))
    assert [r.trained for r in rows] == [True, True, False, False]
    rows = build_rows(groups, adv, filter_truncated=False, loss_filter_range=(0.6, 1.1))
    assert [r.trained for r in rows] == [False, False, True, True]
    mb = collate(rows, PAD)
    assert not mb.mask_BT[:2].any()
    assert mb.mask_BT[2:].sum() == 1 + 3


def row(prompt, response, adv=0.0, trained=True, temperature=1.0):
    response = torch.tensor(response, dtype=torch.long)
    return Row(
        prompt_ids=list(prompt),
        response_ids=response,
        old_logprobs=-(torch.arange(response.numel(), dtype=torch.float32) + 1) / 10,
        advantage=adv,
        temperature=temperature,
        trained=trained,
        reward=adv,
        behind=0,
    )


def test_collate_right_pads_to_micro_batch_max():
    rows = [row([1, 2, 3], [4, 5]), row([6], [7, 8, 9, 10, 11]), row([12, 13], [])]
    mb = collate(rows, pad_id=99)
    width = max(3 + 2, 1 + 5, 2 + 0)
    assert mb.input_ids_BT.shape == (3, width)
    assert mb.attention_BT.shape == (3, width)
    assert mb.targets_BT.shape == mb.mask_BT.shape == mb.old_logprobs_BT.shape == (3, width - 1)
    assert mb.input_ids_BT.tolist() == [
        [1, 2, 3, 4, 5, 99],
        [6, 7, 8, 9, 10, 11],
        [12, 13, 99, 99, 99, 99],
    ]
    assert mb.attention_BT.tolist() == [
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0, 0],
    ]
    assert torch.equal(mb.targets_BT, mb.input_ids_BT[:, 1:])
    assert mb.mask_BT.dtype == torch.bool


def test_collate_mask_covers_exactly_response_targets_with_aligned_old_logprobs():
    rows = [row([1, 2, 3], [4, 5], adv=1.5), row([6], [7, 8, 9, 10, 11], adv=-2.0)]
    mb = collate(rows, PAD)
    for i, r in enumerate(rows):
        m = mb.mask_BT[i]
        assert int(m.sum()) == r.response_ids.numel()
        assert torch.equal(mb.targets_BT[i][m], r.response_ids)
        assert torch.equal(mb.old_logprobs_BT[i][m], r.old_logprobs)
        assert (mb.old_logprobs_BT[i][~m] == 0).all()
        positions = m.nonzero().flatten().tolist()
        p = len(r.prompt_ids)
        assert positions == list(range(p - 1, p - 1 + r.response_ids.numel()))
    assert mb.advantages_B.tolist() == [1.5, -2.0]
    assert mb.temperatures_B.tolist() == [1.0, 1.0]


def test_collate_untrained_row_has_no_mask_but_keeps_tokens():
    rows = [row([1, 2], [3, 4, 5], trained=False), row([6, 7], [8], trained=True)]
    mb = collate(rows, PAD)
    assert not mb.mask_BT[0].any()
    assert mb.input_ids_BT[0].tolist() == [1, 2, 3, 4, 5]
    assert mb.mask_BT[1].tolist() == [False, True, False, False]


def test_split_pads_each_micro_batch_to_its_own_max():
    rows = [row([1], [2]), row([1], [2, 3]), row([1], [2, 3, 4, 5, 6, 7, 8]), row([1], [2])]
    parts = split(rows, MicroBatching(2, None, False))
    assert [len(p) for p in parts] == [2, 2]
    widths = [collate(p, PAD).input_ids_BT.shape[1] for p in parts]
    assert widths == [3, 8]
    assert [len(p) for p in split(rows, MicroBatching(3, None, False))] == [3, 1]
    assert split(rows, MicroBatching(3, None, False))[1][0] is rows[3]


def test_collate_with_built_rows_and_temperatures():
    groups = two_groups()
    rows = build_rows(groups, torch.ones(2, 2), filter_truncated=True, loss_filter_range=None)
    mb = collate(rows, PAD)
    assert mb.temperatures_B.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7])
    # truncated row 3 is masked; the others have exactly their response targets masked
    assert mb.mask_BT.sum(dim=1).tolist() == [2, 4, 1, 0]
    assert mb.targets_BT[3].tolist() == [22, 23, 24, PAD, PAD, PAD]


# ------------------------------------------------------------------ micro-batch plans


def padded_tokens(lengths, plan):
    return sum(len(mb) * max(lengths[i] for i in mb) for mb in plan)


def test_fixed_size_keeps_ticket_order():
    assert plan_micro_batches([5, 1, 9, 2, 7], MicroBatching(2, None, False)) == [
        [0, 1],
        [2, 3],
        [4],
    ]


def test_token_budget_groups_longest_first_against_hand_worked_plan():
    lengths = [13, 4, 8, 5, 10, 4, 5]
    # sorted: 13 (0), 10 (4), 8 (2), 5 (3), 5 (6), 4 (1), 4 (5); budget 20:
    # [13] (26 > 20 with a second row), [10, 8] (3 rows would be 30), [5, 5, 4, 4] (20)
    plan = plan_micro_batches(lengths, MicroBatching(8, 20, False))
    assert plan == [[0], [4, 2], [3, 6, 1, 5]]
    assert padded_tokens(lengths, plan) == 13 + 20 + 20
    # the row limit still holds under the budget
    assert plan_micro_batches(lengths, MicroBatching(2, 100, False)) == [
        [0, 4],
        [2, 3],
        [6, 1],
        [5],
    ]
    # a row longer than the budget goes alone
    assert plan_micro_batches([50, 3, 3], MicroBatching(8, 10, False)) == [[0], [1, 2]]


@pytest.mark.parametrize("seed", range(20))
def test_token_budget_plans_cover_every_row_once_within_budget(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(2, 48) for _ in range(rng.randint(1, 70))]
    size, budget = rng.randint(1, 64), rng.randint(16, 2000)
    plan = plan_micro_batches(lengths, MicroBatching(size, budget, False))
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert len(mb) <= size
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= budget
    # sorting never pads more than the fixed plan with the same row count per pass
    fixed = plan_micro_batches(lengths, MicroBatching(size, None, False))
    if all(len(mb) * max(lengths[i] for i in mb) <= budget for mb in fixed):
        assert len(plan) <= len(fixed) + 1
