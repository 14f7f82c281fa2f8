"""Chunked log-probs / entropy (from logits and from hidden states) against the naive path."""

from __future__ import annotations

import math

import pytest
import torch

from zbrl.algorithms import (
    entropy_from_logits,
    logprobs_and_entropy,
    logprobs_from_hidden,
    logprobs_from_logits,
)

B, T, V, H = 3, 7, 37, 6  # B·T = 21 rows
FLOAT32_TOL = {"rtol": 1e-4, "atol": 1e-5}


def naive(logits, tokens, temperature):
    """The reference: float32 log_softmax over the full logits, then gather."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    logprobs = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logprobs, entropy


def make(seed: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=gen) * 3.0).to(dtype)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    weights = torch.randn(B, T, generator=gen), torch.randn(B, T, generator=gen)
    return logits, tokens, weights


def tolerances(dtype: torch.dtype) -> dict:
    # Both paths round in float32 in different orders (|error| ~1e-6 against float64); bf16
    # gradients are additionally rounded to bf16 by both paths: allow a couple of bf16 ulps.
    return {"rtol": 2e-2, "atol": 2e-3} if dtype == torch.bfloat16 else FLOAT32_TOL


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 8, 21, 1024])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_matches_naive_values_and_grads(chunk_size, dtype, temperature) -> None:
    logits, tokens, (w_logp, w_ent) = make(chunk_size, dtype)
    chunked_in = logits.clone().requires_grad_(True)
    naive_in = logits.clone().requires_grad_(True)

    logp, entropy = logprobs_and_entropy(
        chunked_in, tokens, temperature=temperature, chunk_size=chunk_size, with_entropy=True
    )
    want_logp, want_entropy = naive(naive_in, tokens, temperature)
    assert logp.dtype == torch.float32 and entropy.dtype == torch.float32
    torch.testing.assert_close(logp, want_logp, **FLOAT32_TOL)
    torch.testing.assert_close(entropy, want_entropy, **FLOAT32_TOL)

    (logp * w_logp + entropy * w_ent).sum().backward()
    (want_logp * w_logp + want_entropy * w_ent).sum().backward()
    assert chunked_in.grad.dtype == dtype
    torch.testing.assert_close(chunked_in.grad.float(), naive_in.grad.float(), **tolerances(dtype))


@pytest.mark.parametrize("chunk_size", [2, 5, 1024])
def test_logprobs_only_and_entropy_only(chunk_size: int) -> None:
    logits, tokens, (w_logp, w_ent) = make(7, torch.float32)
    for which in ("logp", "entropy"):
        chunked_in = logits.clone().requires_grad_(True)
        naive_in = logits.clone().requires_grad_(True)
        want_logp, want_entropy = naive(naive_in, tokens, 0.7)
        if which == "logp":
            got = logprobs_from_logits(chunked_in, tokens, temperature=0.7, chunk_size=chunk_size)
            want, weight = want_logp, w_logp
        else:
            got = entropy_from_logits(chunked_in, temperature=0.7, chunk_size=chunk_size)
            want, weight = want_entropy, w_ent
        torch.testing.assert_close(got, want, **FLOAT32_TOL)
        (got * weight).sum().backward()
        (want * weight).sum().backward()
        torch.testing.assert_close(chunked_in.grad, naive_in.grad, **FLOAT32_TOL)


def test_gradient_through_entropy_only_when_both_computed() -> None:
    logits, tokens, (_, w_ent) = make(3, torch.float32)
    chunked_in = logits.clone().requires_grad_(True)
    naive_in = logits.clone().requires_grad_(True)
    _, entropy = logprobs_and_entropy(chunked_in, tokens, chunk_size=4, with_entropy=True)
    (entropy * w_ent).sum().backward()
    (naive(naive_in, tokens, 1.0)[1] * w_ent).sum().backward()
    torch.testing.assert_close(chunked_in.grad, naive_in.grad, **FLOAT32_TOL)


def test_temperature_is_applied() -> None:
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    tokens = torch.tensor([[0]])
    for temperature in (1.0, 0.5, 2.0):
        scaled = [x / temperature for x in (2.0, 0.0, -1.0)]
        log_z = math.log(sum(math.exp(x) for x in scaled))
        expected = scaled[0] - log_z
        got = logprobs_from_logits(logits, tokens, temperature=temperature)
        assert got.item() == pytest.approx(expected, abs=1e-6)
        probs = [math.exp(x - log_z) for x in scaled]
        entropy = -sum(p * math.log(p) for p in probs)
        assert entropy_from_logits(logits, temperature=temperature).item() == pytest.approx(
            entropy, abs=1e-6
        )


@pytest.mark.parametrize("with_entropy", [False, True])
def test_large_and_minus_inf_logits_are_stable(with_entropy: bool) -> None:
    logits, tokens, _ = make(4, torch.float32)
    logits = logits * 1000.0  # exp would overflow without the max subtraction
    logits[..., -3:] = float("-inf")  # e.g. padded vocabulary entries
    logits.requires_grad_(True)
    tokens = tokens.clamp_max(V - 4)
    got, entropy = logprobs_and_entropy(logits, tokens, chunk_size=4, with_entropy=with_entropy)
    want_logp, _ = naive(logits, tokens, 1.0)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want_logp, **FLOAT32_TOL)
    loss = got.sum()
    if with_entropy:  # the naive formula gives NaN here (0 · -inf); this one must not
        assert entropy is not None and torch.isfinite(entropy).all()
        loss = loss + entropy.sum()
    loss.backward()
    assert torch.isfinite(logits.grad).all()
    assert torch.equal(logits.grad[..., -3:], torch.zeros(B, T, 3))


def test_inputs_are_not_modified_and_no_grad_mode_works() -> None:
    logits, tokens, _ = make(1, torch.float32)
    before = logits.clone()
    with torch.no_grad():
        logp = logprobs_from_logits(logits, tokens, temperature=0.7, chunk_size=4)
    assert torch.equal(logits, before)
    torch.testing.assert_close(logp, naive(logits, tokens, 0.7)[0])


def test_forward_saves_no_float32_copy_of_the_logits() -> None:
    """Autograd keeps only the caller's bf16 logits and per-row vectors, never [N, V] float32."""
    logits, tokens, _ = make(2, torch.bfloat16)
    logits.requires_grad_(True)
    saved: list[torch.Tensor] = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outputs = logprobs_and_entropy(logits, tokens, chunk_size=4, with_entropy=True)
    assert outputs[0].requires_grad and outputs[1].requires_grad
    assert saved, "expected the backward to save something"
    for tensor in saved:
        is_input = tensor.data_ptr() == logits.data_ptr()
        assert is_input or tensor.numel() <= B * T, f"saved {tensor.dtype} {tuple(tensor.shape)}"
    # The naive path, by contrast, would keep a float32 [B, T, V] log_softmax output.
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        naive(logits, tokens, 1.0)
    assert any(t.dtype == torch.float32 and t.numel() == B * T * V for t in saved)


@pytest.mark.parametrize("chunk_size", [1, 4, 8, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_from_hidden_matches_naive_values_and_grads(chunk_size: int, temperature: float) -> None:
    gen = torch.Generator().manual_seed(chunk_size)
    hidden = torch.randn(B, T, H, generator=gen)
    weight = torch.randn(V, H, generator=gen)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    w_logp, w_ent = torch.randn(B, T, generator=gen), torch.randn(B, T, generator=gen)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)

    logp, entropy = logprobs_from_hidden(
        h1, w1, tokens, temperature=temperature, chunk_size=chunk_size, with_entropy=True
    )
    want_logp, want_entropy = naive(h2 @ w2.t(), tokens, temperature)
    torch.testing.assert_close(logp, want_logp, **FLOAT32_TOL)
    torch.testing.assert_close(entropy, want_entropy, **FLOAT32_TOL)

    (logp * w_logp + entropy * w_ent).sum().backward()
    (want_logp * w_logp + want_entropy * w_ent).sum().backward()
    torch.testing.assert_close(h1.grad, h2.grad, **FLOAT32_TOL)
    torch.testing.assert_close(w1.grad, w2.grad, **FLOAT32_TOL)


def test_from_hidden_bf16_and_without_entropy() -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, H, generator=gen).bfloat16().requires_grad_(True)
    weight = torch.randn(V, H, generator=gen).bfloat16().requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    logp, entropy = logprobs_from_hidden(hidden, weight, tokens, temperature=0.7, chunk_size=5)
    assert entropy is None and logp.dtype == torch.float32
    want = naive(hidden.detach() @ weight.detach().t(), tokens, 0.7)[0]
    torch.testing.assert_close(logp, want, **FLOAT32_TOL)
    logp.sum().backward()
    assert hidden.grad.dtype == torch.bfloat16 and torch.isfinite(hidden.grad.float()).all()
    with torch.no_grad():
        again, _ = logprobs_from_hidden(hidden, weight, tokens, temperature=0.7, chunk_size=5)
    torch.testing.assert_close(again, logp.detach())


def test_bad_inputs_are_clear_errors() -> None:
    logits, tokens, _ = make(0, torch.float32)
    with pytest.raises(ValueError, match=r"tokens must be ids in \[0, 37\)"):
        logprobs_from_logits(logits, torch.full((B, T), -100))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        logprobs_from_logits(logits, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        logprobs_from_logits(logits, tokens, chunk_size=0)
    with pytest.raises(ValueError, match="must be \\[B, T\\] with the same B and T"):
        logprobs_from_logits(logits, tokens[:, :-1])
    with pytest.raises(ValueError, match="must be \\[V, H\\]"):
        logprobs_from_hidden(torch.zeros(B, T, H), torch.zeros(V, H + 1), tokens)
