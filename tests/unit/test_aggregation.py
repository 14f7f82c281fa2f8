"""Loss aggregation: loop references, and exact gradient accumulation over micro-batches."""

from __future__ import annotations

import pytest
import torch

from zbrl.algorithms import (
    AGGREGATION_MODES,
    LossConfig,
    LossInputs,
    Normalisers,
    aggregate,
    compute_policy_loss,
    logprobs_from_logits,
    normalisers_for,
)

NORM_TOKENS = 12.0


def ref_aggregate(loss: list[list[float]], mask: list[list[int]], mode: str, norm) -> float:
    total = 0.0
    for row_loss, row_mask in zip(loss, mask, strict=True):
        seq_sum = 0.0
        seq_len = 0
        for value, m in zip(row_loss, row_mask, strict=True):
            if m:
                seq_sum += value
                seq_len += 1
        if mode == "seq-mean-token-mean":
            total += seq_sum / seq_len if seq_len > 0 else 0.0
        else:
            total += seq_sum
    if mode == "token-mean":
        return total / norm.tokens
    if mode == "seq-mean-token-sum":
        return total / norm.seqs
    if mode == "seq-mean-token-sum-norm":
        return total / (norm.seqs * norm.norm_tokens)
    return total / norm.seqs  # seq-mean-token-mean


def random_mask(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0] = 0
    lengths[-1] = length
    return torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_aggregate_matches_loop_reference(seed: int, mode: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(6, 10, generator=gen)
    mask = random_mask(gen, 6, 10)
    norm = normalisers_for(mask, norm_tokens=NORM_TOKENS)
    got = aggregate(loss, mask, mode, norm).item()
    want = ref_aggregate(loss.tolist(), mask.int().tolist(), mode, norm)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_normalisers_for_counts_tokens_and_non_empty_sequences() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 1]])
    norm = normalisers_for(mask, norm_tokens=7.0)
    assert norm == Normalisers(tokens=6.0, seqs=3.0, norm_tokens=7.0)
    halves = normalisers_for(mask[:2], norm_tokens=7.0) + normalisers_for(mask[2:], norm_tokens=7.0)
    assert halves == norm
    assert normalisers_for(mask.bool()) == Normalisers(6.0, 3.0)


def test_masked_garbage_is_ignored_and_empty_step_is_zero() -> None:
    loss = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [0, 1]])
    for mode in AGGREGATION_MODES:
        value = aggregate(loss, mask, mode, normalisers_for(mask))
        assert torch.isfinite(value)
    empty = torch.zeros(2, 2, dtype=torch.bool)
    for mode in AGGREGATION_MODES:
        value = aggregate(loss, empty, mode, normalisers_for(empty))
        value.backward()
        assert value.item() == 0.0
        assert torch.equal(loss.grad, torch.zeros(2, 2))


def test_bad_mode_and_normalisers_are_clear_errors() -> None:
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'mean'"):
        aggregate(torch.zeros(2, 3), mask, "mean", normalisers_for(mask))
    with pytest.raises(ValueError, match="must both have shape"):
        aggregate(torch.zeros(2, 4), mask, "token-mean", normalisers_for(mask))
    with pytest.raises(ValueError, match="norm_tokens must be > 0"):
        Normalisers(tokens=1.0, seqs=1.0, norm_tokens=0.0)


# ------------------------------------------------------------------ gradient accumulation


BATCH, LENGTH, HIDDEN, VOCAB = 8, 7, 5, 11


def make_step(seed: int):
    """A tiny 'model' (one linear layer producing logits) and one optimizer step's batch."""
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(HIDDEN, VOCAB)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen) * 0.5)
        layer.bias.copy_(torch.randn(VOCAB, generator=gen) * 0.1)
    features = torch.randn(BATCH, LENGTH, HIDDEN, generator=gen)
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=gen)
    mask = random_mask(gen, BATCH, LENGTH)
    mask[3] = False  # an empty sequence in the middle too
    with torch.no_grad():  # behaviour log-probs from a slightly different policy
        noisy = layer(features) + torch.randn(BATCH, LENGTH, VOCAB, generator=gen) * 0.3
        old_logprobs = logprobs_from_logits(noisy, tokens)
    advantages = torch.randn(BATCH, generator=gen)
    return layer, features, tokens, mask, old_logprobs, advantages


def accumulated_grad(seed: int, mode: str, num_micro: int, *, global_norm: bool = True):
    layer, features, tokens, mask, old_logprobs, advantages = make_step(seed)
    cfg = LossConfig(clip_eps_low=0.2, clip_eps_high=0.28, beta=0.0, aggregation=mode)
    step_norm = normalisers_for(mask, norm_tokens=NORM_TOKENS)
    layer.zero_grad()
    total = 0.0
    for rows in torch.arange(BATCH).chunk(num_micro):
        # Pad per micro-batch: trim trailing columns that no row of this micro-batch uses.
        used = int(mask[rows].sum(dim=1).max())
        width = max(used, 1)
        micro_mask = mask[rows, :width]
        logprobs = logprobs_from_logits(layer(features[rows, :width]), tokens[rows, :width])
        inputs = LossInputs(
            logprobs_BT=logprobs,
            old_logprobs_BT=old_logprobs[rows, :width],
            advantages_B_or_BT=advantages[rows],
            mask_BT=micro_mask,
        )
        norm = step_norm if global_norm else normalisers_for(micro_mask, norm_tokens=NORM_TOKENS)
        out = compute_policy_loss("ppo_clip", inputs, cfg, norm)
        out.loss.backward()
        total += out.loss.item()
    return total, layer.weight.grad.clone(), layer.bias.grad.clone()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("num_micro", [1, 2, 4])
def test_gradient_accumulation_is_exact(seed: int, mode: str, num_micro: int) -> None:
    whole_loss, whole_w, whole_b = accumulated_grad(seed, mode, 1)
    loss, grad_w, grad_b = accumulated_grad(seed, mode, num_micro)
    assert whole_w.abs().sum() > 0  # the test would be vacuous with a zero gradient
    assert loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-7)
    assert torch.allclose(grad_w, whole_w, atol=1e-6, rtol=1e-5)
    assert torch.allclose(grad_b, whole_b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_local_normalisers_would_be_wrong(mode: str) -> None:
    """Negative control: normalising by each micro-batch's own counts changes the gradient."""
    _, whole_w, _ = accumulated_grad(0, mode, 1)
    _, local_w, _ = accumulated_grad(0, mode, 4, global_norm=False)
    assert not torch.allclose(local_w, whole_w, atol=1e-6, rtol=1e-5)
