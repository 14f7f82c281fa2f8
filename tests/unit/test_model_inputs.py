"""The shared-prompt layout (prompts once, responses on their cached keys and values) against
full prompt + response rows: the same log-probs of every trained token, the same gradients, and
tensors aligned with the targets."""

from __future__ import annotations

import random

import pytest
import torch

from zbrl.training.rows import Row, collate, response_span


def make_row(prompt: list[int], response: list[int], *, trained: bool = True) -> Row:
    resp = torch.tensor(response, dtype=torch.long)
    return Row(
        prompt_ids=prompt,
        response_ids=resp,
        old_logprobs=-(torch.arange(resp.numel(), dtype=torch.float32) + 1) / 10,
        advantage=0.5,
        temperature=1.0,
        trained=trained,
        reward=1.0,
        behind=0,
    )


def test_response_layout_tensors():
    shared_prompt = [1, 2, 3]
    rows = [
        make_row(shared_prompt, [4, 5]),
        make_row([6], [7, 8, 9]),
        make_row(shared_prompt, [10]),
        make_row([6], [], trained=True),
    ]
    mb = collate(rows, pad_id=99, share_prompts=True)
    p = mb.prompts
    assert p.prompt_ids_UP.tolist() == [[1, 2, 3], [99, 99, 6]]  # left-padded, first seen first
    assert p.prompt_attention_UP.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert p.prompt_index_B.tolist() == [0, 1, 0, 1]
    assert mb.input_ids_BT.tolist() == [[4, 5, 99], [7, 8, 9], [10, 99, 99], [99, 99, 99]]
    assert torch.equal(mb.targets_BT, mb.input_ids_BT)
    assert mb.attention_BT.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert mb.mask_BT.tolist() == [
        [True, True, False],
        [True, True, True],
        [True, False, False],
        [False, False, False],
    ]
    assert mb.old_logprobs_BT[1].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert response_span(rows[1], shared=True) == slice(0, 3)
    assert response_span(rows[1]) == slice(0, 3)  # full rows: prompt [6] → targets from 0


def test_all_empty_responses_still_have_one_column():
    mb = collate([make_row([1, 2], []), make_row([3], [])], pad_id=0, share_prompts=True)
    assert mb.input_ids_BT.shape == (2, 1)
    assert not mb.mask_BT.any()


def random_rows(vocab: int, seed: int) -> list[Row]:
    """Groups of ragged responses to prompts of different lengths (a prompt repeated in two
    groups too), a response of length 0 and one excluded from the loss."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 9))] for _ in range(3)]
    prompts.append(list(prompts[0]))  # same content, another group
    rows = []
    for p in prompts:
        for _ in range(rng.randint(1, 4)):
            response = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 7))]
            rows.append(make_row(p, response, trained=rng.random() > 0.15))
    rows.append(make_row(prompts[1], []))
    rng.shuffle(rows)
    return rows


def token_logprobs(model, mb) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs of the masked targets in row order, the loss Σ logp·mask)."""
    logits = mb.model_inputs().logits(model)
    logp_BT = torch.log_softmax(logits.float(), -1).gather(-1, mb.targets_BT[..., None])[..., 0]
    return logp_BT[mb.mask_BT], torch.where(mb.mask_BT, logp_BT, 0.0).sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shared_prompts_give_full_row_logprobs_and_gradients(tiny_model_dir, seed):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.train()
    rows = random_rows(model.config.vocab_size, seed)
    results = {}
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        mb = collate(rows, pad_id=0, share_prompts=shared)
        logp, loss = token_logprobs(model, mb)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[shared] = (logp.detach(), grads)
    (logp_full, grads_full), (logp_shared, grads_shared) = results[False], results[True]
    assert logp_full.numel() == sum(int(r.response_ids.numel()) for r in rows if r.trained)
    torch.testing.assert_close(logp_shared, logp_full, rtol=1e-5, atol=1e-5)
    assert grads_shared.keys() == grads_full.keys()
    for name, grad in grads_full.items():
        torch.testing.assert_close(grads_shared[name], grad, rtol=1e-4, atol=1e-5, msg=name)


class _Tok:
    pad_token_id = 0


def test_trainer_steps_match_between_layouts(tiny_model_dir):
    """A whole GRPO step (advantages, rows, micro-batches, loss, accumulation) reaches the
    optimizer with the same gradients and reports the same metrics in either layout."""
    from role_settings import run_config

    from helpers.data_parallel import Case, first_step, make_groups
    from zbrl.assembly.models import build_trainer

    results = []
    for shared in ("false", "true"):
        cfg = run_config(
            "algorithm.lr=1e-3",
            "training.train_microbatch_size=4",
            f"training.share_prompts={shared}",
        )
        trainer = build_trainer(cfg, tiny_model_dir, _Tok(), total_steps=10)
        assert trainer.settings.micro.share_prompts == (shared == "true")
        # 12 rows in micro-batches of 4: groups of 3 straddle micro-batches
        groups = make_groups(Case("layouts", (), 4, group_size=3), vocab=50)
        results.append(first_step(trainer, groups))
    (g_full, m_full), (g_shared, m_shared) = results
    assert g_shared.keys() == g_full.keys()
    for name, grad in g_full.items():
        torch.testing.assert_close(g_shared[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    for key in ("loss", "grad_norm", "ratio_mean", "entropy", "num_tokens"):
        assert m_shared[key] == pytest.approx(m_full[key], rel=1e-4, abs=1e-6), key


def test_a_critic_trains_on_full_rows():
    from dataclasses import replace

    from role_settings import step_settings

    from zbrl.training.train_step import Trainer

    assert step_settings().micro.share_prompts
    ppo = step_settings("algorithm.preset=ppo")
    assert not ppo.micro.share_prompts

    class EngineWithCritic:
        has_reference = has_critic = True

    with pytest.raises(ValueError, match="value model takes full rows"):
        Trainer(EngineWithCritic(), replace(ppo, micro=replace(ppo.micro, share_prompts=True)))
