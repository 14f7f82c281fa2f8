"""The packed layout (each unique prompt once, its responses after it, a block-causal mask, a few
rows as wide as the largest prompt block, no padding inside them) against full prompt + response
rows and the shared-prompt layout: the same log-probs of every trained token, the same loss and
gradients, episodes' environment tokens still outside the loss, token-balanced micro-batches, and
the combinations it refuses."""

from __future__ import annotations

import pytest
import torch
from test_model_inputs import make_row, random_rows, token_logprobs

from zbrl.training.model_inputs import block_causal_allowed
from zbrl.training.rows import (
    MicroBatching,
    collate,
    packed_row_plan,
    packed_tokens,
    plan_packed,
    row_shape,
    split,
)


def test_packed_row_tensors():
    rows = [
        make_row([1, 2, 3], [4, 5]),
        make_row([6], [7, 8, 9]),
        make_row([1, 2, 3], [10]),
        make_row([6], []),
        make_row([11], [12]),
    ]
    mb = collate(rows, pad_id=99, packed=True)
    p = mb.packed
    # block A: prompt [1,2,3], response [4,5] but its last token, response [10] (nothing fed): 4
    # tokens, the widest, so rows are 4 wide; block B: prompt [6], response [7,8,9] fed [7,8],
    # the empty response: 3 tokens, its own row; block C: prompt [11] (response [12] feeds
    # nothing): 1 token, after B, which it fits beside
    assert p.input_ids_PN.tolist() == [[1, 2, 3, 4], [6, 7, 8, 11]]
    assert p.position_ids_PN.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0]]
    assert p.group_PN.tolist() == [[0, 0, 0, 0], [1, 1, 1, 2]]
    assert p.block_PN.tolist() == [[-1, -1, -1, 0], [-1, 1, 1, -1]]
    assert p.keep_K.tolist() == [0, 1, 2, 3]  # every column predicts something in some row
    # the flat index row * 4 + column; targets 4 and 10 are predicted by A's last prompt column
    assert p.gather_BR.tolist() == [[2, 3, 0], [4, 5, 6], [2, 0, 0], [0, 0, 0], [7, 0, 0]]
    assert mb.targets_BT.tolist() == [
        [4, 5, 99],
        [7, 8, 9],
        [10, 99, 99],
        [99, 99, 99],
        [12, 99, 99],
    ]
    assert mb.mask_BT.tolist() == [
        [True, True, False],
        [True, True, True],
        [True, False, False],
        [False, False, False],
        [True, False, False],
    ]
    assert packed_tokens([row_shape(r) for r in rows]) == 8


def test_packed_rows_are_padded_and_keep_only_predicting_columns():
    rows = [make_row([1, 2, 3], [4, 5, 6]), make_row([7, 8], [9]), make_row([7, 8], [])]
    p = collate(rows, pad_id=99, packed=True).packed
    # block [1,2,3,4,5] (5 tokens) then block [7,8] (2: its responses feed nothing) in a row of
    # its own, padded; column 0 predicts nothing in either row
    assert p.input_ids_PN.tolist() == [[1, 2, 3, 4, 5], [7, 8, 99, 99, 99]]
    assert p.group_PN.tolist() == [[0, 0, 0, 0, 0], [1, 1, -1, -1, -1]]
    assert p.block_PN.tolist() == [[-1, -1, -1, 0, 0], [-1, -1, -2, -2, -2]]
    assert p.keep_K.tolist() == [1, 2, 3, 4]
    assert p.gather_BR.tolist() == [[1, 2, 3], [4, 0, 0], [0, 0, 0]]


def test_packed_row_plan_is_first_fit_decreasing_within_the_largest_block():
    assert packed_row_plan([5]) == [0]
    # 9 fills row 0 (rows are 9 wide); 6 opens row 1 and 3 fits beside it; 2 and 1 fit in
    # neither and share row 2
    assert packed_row_plan([3, 9, 2, 6, 1]) == [1, 0, 2, 1, 2]
    assert packed_row_plan([4, 4, 4, 4]) == [0, 1, 2, 3]  # equal blocks: a row each
    assert packed_row_plan([4, 1, 1, 1, 1]) == [0, 1, 1, 1, 1]


def test_block_causal_mask():
    # prompt A (2), response 0 (2), response 1 (1), prompt B (1), response 2 (1), padding (2)
    group = torch.tensor([[0, 0, 0, 0, 0, 1, 1, -1, -1]])
    block = torch.tensor([[-1, -1, 0, 0, 1, -1, 2, -2, -2]])
    allowed = block_causal_allowed(group, block)
    assert allowed.shape == (1, 1, 9, 9)
    assert allowed[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 0, 0],  # response 1 sees the prompt and itself, not response 0
        [0, 0, 0, 0, 0, 1, 0, 0, 0],  # prompt B sees nothing of group A
        [0, 0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 1, 0],  # padding sees padding only, so never nothing
        [0, 0, 0, 0, 0, 0, 0, 1, 1],
    ]
    # rows are independent: the same tokens in a second row give the same mask
    two = block_causal_allowed(group.repeat(2, 1), block.repeat(2, 1))
    assert two.shape == (2, 1, 9, 9) and torch.equal(two[1], allowed[0])


def episode_rows(vocab: int) -> list:
    """Multi-turn episodes: environment tokens inside the responses, outside the loss."""
    rows = []
    for prompt, response, model_tokens in (
        ([5, 6, 7], [8, 9, 10, 11, 12, 13], [1, 1, 0, 0, 1, 1]),
        ([5, 6, 7], [14, 15, 16], [1, 0, 1]),
        ([17], [18, 19, 20, 21], [1, 1, 1, 0]),
    ):
        row = make_row(prompt, [t % vocab for t in response])
        row.loss_mask = torch.tensor(model_tokens, dtype=torch.bool)
        rows.append(row)
    return rows


def layout_results(model, rows, layouts):
    results = {}
    for layout in layouts:
        model.zero_grad(set_to_none=True)
        mb = collate(rows, pad_id=0, share_prompts=layout == "shared", packed=layout == "packed")
        logp, loss = token_logprobs(model, mb)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[layout] = (logp.detach(), loss.detach(), grads)
    return results


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("seed", [0, 1])
def test_packed_gives_full_row_logprobs_loss_and_gradients(tiny_model_dir, seed, attention):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=attention
    )
    model.train()
    rows = random_rows(model.config.vocab_size, seed)
    packed = collate(rows, pad_id=0, packed=True).packed
    assert packed.input_ids_PN.shape[0] > 1  # several packed rows,
    assert (packed.group_PN == -1).any()  # with padding
    results = layout_results(model, rows, ("full", "shared", "packed"))
    logp_full, loss_full, grads_full = results["full"]
    assert logp_full.numel() == sum(int(r.response_ids.numel()) for r in rows if r.trained)
    for layout in ("shared", "packed"):
        logp, loss, grads = results[layout]
        torch.testing.assert_close(logp, logp_full, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loss, loss_full, rtol=1e-5, atol=1e-5)
        assert grads.keys() == grads_full.keys()
        for name, grad in grads_full.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_packed_episodes_mask_environment_tokens(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    rows = episode_rows(model.config.vocab_size)
    mb = collate(rows, pad_id=0, packed=True)
    assert mb.mask_BT.tolist() == [
        [True, True, False, False, True, True],
        [True, False, True, False, False, False],
        [True, True, True, False, False, False],
    ]
    results = layout_results(model, rows, ("full", "packed"))
    (logp_full, loss_full, grads_full), (logp, loss, grads) = results["full"], results["packed"]
    assert logp.numel() == 4 + 2 + 3
    torch.testing.assert_close(logp, logp_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, loss_full, rtol=1e-5, atol=1e-5)
    for name, grad in grads_full.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_plan_packed_balances_tokens_and_keeps_groups_together():
    # three groups: prompt lengths 10, 4, 2; responses (their fed tokens are one fewer)
    rows = (
        [make_row(list(range(10)), [1] * 21) for _ in range(2)]
        + [make_row([7] * 4, [1] * 11) for _ in range(3)]
        + [make_row([8, 8], [1] * 6) for _ in range(2)]
    )
    shapes = [row_shape(r) for r in rows]
    batching = MicroBatching(size=2, tokens=60, share_prompts=True, packing=True)
    plan = plan_packed(shapes, batching)
    assert plan == [[0, 1], [2, 3, 4, 5, 6]]  # the row cap does not apply to packed rows
    assert [packed_tokens([shapes[i] for i in micro]) for micro in plan] == [50, 46]
    # a group over the budget is cut into pieces that fit, each with its prompt
    plan = plan_packed(shapes, MicroBatching(size=8, tokens=34, share_prompts=True, packing=True))
    assert sorted(i for micro in plan for i in micro) == list(range(7))
    assert all(packed_tokens([shapes[i] for i in micro]) <= 34 for micro in plan)
    assert [0] in plan and [1] in plan
    # without a budget: ``size`` rows in ticket order, as the padded layouts
    plain = MicroBatching(size=3, tokens=None, share_prompts=True, packing=True)
    assert [len(micro) for micro in split(rows, plain)] == [3, 3, 1]


class _Tok:
    pad_token_id = 0


@pytest.mark.parametrize(
    "extra",
    [(), ("training.train_microbatch_tokens=40",), ("model.lora.rank=4", "model.lora.alpha=8")],
    ids=["rows", "budget", "lora"],
)
def test_trainer_steps_match_between_padded_and_packed(tiny_model_dir, extra):
    """A whole GRPO step (advantages, rows, micro-batches, loss, accumulation) reaches the
    optimizer with the same gradients and metrics packed as padded; with a token budget the
    packed micro-batches hold several groups each (two of the four); LoRA adapters too."""
    from role_settings import run_config

    from helpers.data_parallel import Case, first_step, make_groups
    from zbrl.assembly.models import build_trainer

    results = []
    for packing in ("false", "true"):
        overrides = ["algorithm.lr=1e-3", "training.train_microbatch_size=4", *extra]
        cfg = run_config(*overrides, "training.share_prompts=true", f"training.packing={packing}")
        torch.manual_seed(0)  # the same LoRA initialisation
        trainer = build_trainer(cfg, tiny_model_dir, _Tok(), total_steps=10)
        assert trainer.settings.micro.packing == (packing == "true")
        groups = make_groups(Case("layouts", (), 4, group_size=3), vocab=50)
        results.append(first_step(trainer, groups))
    (g_padded, m_padded), (g_packed, m_packed) = results
    assert g_packed.keys() == g_padded.keys()
    for name, grad in g_padded.items():
        torch.testing.assert_close(g_packed[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    for key in ("loss", "grad_norm", "ratio_mean", "entropy", "num_tokens"):
        assert m_packed[key] == pytest.approx(m_padded[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.preset=ppo"], "training.packing with algorithm.critic"),
        (
            [
                "launch.num_consumers=2",
                "training.engine=fsdp2",
                "training.engine.context_parallel_size=2",
            ],
            "context_parallel_size=2: context parallelism splits full rows",
        ),
        (["training.share_prompts=false"], "training.share_prompts is false"),
    ],
)
def test_packing_refuses_what_it_does_not_support(overrides, message):
    from zbrl.config import ConfigError, load_config

    assert load_config(None, ["training.packing=true"]).training.packing
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["training.packing=true", *overrides])


def test_packing_refuses_attention_without_a_4d_mask():
    from types import SimpleNamespace

    from zbrl.training.model_inputs import packed_attention_mask

    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    with pytest.raises(ValueError, match="needs attention that takes a 4-D mask"):
        packed_attention_mask(model, torch.ones((1, 1, 2, 2), dtype=torch.bool))


def test_packed_groups_go_to_ranks_by_tokens():
    from helpers.data_parallel import Case, make_groups
    from zbrl.training.train_step import group_shapes, micro_batch_count, rank_groups

    groups = make_groups(Case("ranks", (), 5, group_size=3, seed=11), vocab=50)
    sizes = [packed_tokens(group_shapes(g)) for g in groups]
    packed = MicroBatching(size=2, tokens=24, share_prompts=True, packing=True)
    mine = [rank_groups(groups, rank, 2, packed) for rank in range(2)]
    assert sizes == [18, 17, 4, 12, 13]
    # largest first to the least loaded rank: 18 → 0, 17 → 1, 13 → 1, 12 → 0, 4 → 0
    assert mine == [[0, 2, 3], [1, 4]]
    assert [sum(sizes[i] for i in m) for m in mine] == [34, 30]  # by count: 35 and 29
    # padded layouts keep the contiguous slices by count
    padded = MicroBatching(size=2, tokens=24, share_prompts=True)
    assert [rank_groups(groups, rank, 2, padded) for rank in range(2)] == [[0, 1], [2, 3, 4]]
    counts = [len(split([r for i in m for r in rows_of(groups[i])], packed)) for m in mine]
    assert micro_batch_count(groups, 2, packed) == max(counts)


def rows_of(group):
    from zbrl.training.rows import build_rows

    return build_rows(
        [group], torch.zeros(1, group.group_size), filter_truncated=False, loss_filter_range=None
    )
