"""Memory-bounded token log-probs and entropies from logits or from the last hidden state.

Alignment convention: the caller passes logits already aligned with the tokens they score —
``logits_BTV[:, t]`` is the distribution that predicts ``tokens_BT[:, t]``. For a causal LM
whose output at position ``i`` predicts token ``i + 1``, that means slicing
``logits[:, P-1 : P+R-1]`` against ``tokens[:, P : P+R]`` (prompt length P, response R) before
calling in here; no shifting happens inside.

Temperature: logits are divided by ``temperature`` before the softmax. Use the temperature that
*sampled* the tokens (the behaviour policy's), so that the PPO ratio compares like with like.

Memory: the ``B·T`` rows are processed in chunks of ``chunk_size`` rows, each upcast to float32
on its own and then worked on in place, so one ``[chunk, V]`` float32 buffer exists at a time
(two when the entropy is requested) — never a float32 copy of the whole ``[B, T, V]`` and never a
saved ``log_softmax`` output. Backward (a custom
autograd function) recomputes each chunk's softmax from the saved input logits and one float32
log-sum-exp per row, and writes the gradient (in the logits' dtype) chunk by chunk.
:func:`logprobs_from_hidden` goes one step further and never materialises the full logits.
All outputs are float32.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def _check_args(temperature: float, chunk_size: int) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")


def _check_tokens(tokens: torch.Tensor, vocab_size: int) -> None:
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must be an integer tensor; got dtype {tokens.dtype}")
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab_size)).any()):
        raise ValueError(
            f"tokens must be ids in [0, {vocab_size}) (the vocabulary of the logits); got "
            f"min {int(tokens.min())}, max {int(tokens.max())}. Replace padding ids such as "
            f"-100 with a valid id and mask those positions instead."
        )


_FLOAT32_MIN = torch.finfo(torch.float32).min


def _scaled_float(logits_CV: torch.Tensor, temperature: float) -> torch.Tensor:
    """A fresh float32 buffer holding ``logits / temperature`` (the caller's tensor untouched)."""
    x_CV = logits_CV.float()  # a new buffer unless the input is already float32
    if x_CV.data_ptr() == logits_CV.data_ptr():
        x_CV = x_CV.clone()
    if temperature != 1.0:
        x_CV.div_(temperature)
    return x_CV


def _logsumexp_(x_CV: torch.Tensor) -> torch.Tensor:
    """Row-wise log-sum-exp that overwrites ``x`` (with ``exp(x - max)``) instead of allocating."""
    max_C1 = x_CV.amax(dim=1, keepdim=True)
    max_C1 = torch.where(torch.isfinite(max_C1), max_C1, 0.0)  # rows of all -inf stay -inf
    return max_C1.squeeze(1) + x_CV.sub_(max_C1).exp_().sum(dim=1).log()


class _ChunkedLogprobEntropy(torch.autograd.Function):
    """rows [N, V] (+ tokens [N]) -> (logprobs [N], entropy [N]) float32, chunked both ways."""

    @staticmethod
    def forward(ctx, logits_NV, tokens_N, temperature, chunk_size, want_logp, want_entropy):
        num_rows = logits_NV.shape[0]
        device = logits_NV.device
        lse_N = torch.empty(num_rows, dtype=torch.float32, device=device)
        logp_N = torch.empty(num_rows if want_logp else 0, dtype=torch.float32, device=device)
        ent_N = torch.empty(num_rows if want_entropy else 0, dtype=torch.float32, device=device)
        for start in range(0, num_rows, chunk_size):
            end = min(start + chunk_size, num_rows)
            x_CV = _scaled_float(logits_NV[start:end], temperature)
            if want_logp:
                picked_C = x_CV.gather(1, tokens_N[start:end].unsqueeze(1)).squeeze(1)
            if want_entropy:  # H = -Σ_j p_j·log p_j (no lse - Σ p·x cancellation); 2 buffers
                lse_C = torch.logsumexp(x_CV, dim=-1)
                logp_CV = x_CV.sub_(lse_C.unsqueeze(1))  # in place: x -> log p
                p_CV = torch.exp(logp_CV)
                # -inf logits (e.g. padded vocabulary): p·log p = 0·(-inf) would be NaN.
                ent_N[start:end] = -(p_CV.mul_(logp_CV.clamp_min_(_FLOAT32_MIN)).sum(dim=1))
                del p_CV
                del logp_CV
            else:
                lse_C = _logsumexp_(x_CV)  # destroys x: a single [C, V] float32 buffer
            lse_N[start:end] = lse_C
            if want_logp:
                logp_N[start:end] = picked_C - lse_C
            del x_CV
        ctx.save_for_backward(logits_NV, tokens_N, lse_N, ent_N)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.want_logp = want_logp
        ctx.want_entropy = want_entropy
        ctx.set_materialize_grads(False)
        if not want_logp:
            ctx.mark_non_differentiable(logp_N)
        if not want_entropy:
            ctx.mark_non_differentiable(ent_N)
        return logp_N, ent_N

    @staticmethod
    def backward(ctx, grad_logp_N, grad_ent_N):
        logits_NV, tokens_N, lse_N, ent_N = ctx.saved_tensors
        if not ctx.want_logp:
            grad_logp_N = None
        if not ctx.want_entropy:
            grad_ent_N = None
        if grad_logp_N is None and grad_ent_N is None:
            return None, None, None, None, None, None
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        grad_logits_NV = torch.empty_like(logits_NV)
        for start in range(0, logits_NV.shape[0], chunk_size):
            end = min(start + chunk_size, logits_NV.shape[0])
            x_CV = _scaled_float(logits_NV[start:end], temperature)
            logp_CV = x_CV.sub_(lse_N[start:end].unsqueeze(1))  # in place: x -> log p
            # d logp_tok / dx_j = 1[j = tok] - p_j ;  dH / dx_j = -p_j (log p_j + H)
            if grad_ent_N is not None:  # needs log p and p: two [C, V] buffers
                p_CV = torch.exp(logp_CV)
                logp_CV.clamp_min_(_FLOAT32_MIN)  # p = 0 where log p = -inf: keep 0·x finite
                g_ent_C1 = grad_ent_N[start:end].float().unsqueeze(1)
                grad_x_CV = logp_CV.add_(ent_N[start:end].unsqueeze(1)).mul_(p_CV).mul_(-g_ent_C1)
                if grad_logp_N is not None:
                    g_logp_C1 = grad_logp_N[start:end].float().unsqueeze(1)
                    grad_x_CV.sub_(p_CV.mul_(g_logp_C1))
                del p_CV
            else:  # log-probs only: everything in place in one buffer
                g_logp_C1 = grad_logp_N[start:end].float().unsqueeze(1)
                grad_x_CV = logp_CV.exp_().mul_(-g_logp_C1)
            if grad_logp_N is not None:
                grad_x_CV.scatter_add_(1, tokens_N[start:end].unsqueeze(1), g_logp_C1)
            if temperature != 1.0:
                grad_x_CV.div_(temperature)
            grad_logits_NV[start:end] = grad_x_CV
            del x_CV, logp_CV, grad_x_CV
        return grad_logits_NV, None, None, None, None, None


def _rows(
    logits_NV: torch.Tensor,
    tokens_N: torch.Tensor | None,
    temperature: float,
    chunk_size: int,
    with_logp: bool,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if tokens_N is None:
        tokens_N = torch.zeros(logits_NV.shape[0], dtype=torch.long, device=logits_NV.device)
    return _ChunkedLogprobEntropy.apply(
        logits_NV, tokens_N.long(), float(temperature), int(chunk_size), with_logp, with_entropy
    )


def logprobs_and_entropy(
    logits_BTV: torch.Tensor,
    tokens_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs_BT, entropy_BT or None)`` float32, in one chunked pass over the logits.

    ``logits_BTV`` may be any float dtype (bf16 is upcast per chunk); gradients flow back to it.
    ``entropy_BT`` is the entropy of the temperature-scaled distribution at each position.
    """
    _check_args(temperature, chunk_size)
    if logits_BTV.dim() != 3 or tuple(tokens_BT.shape) != tuple(logits_BTV.shape[:2]):
        raise ValueError(
            f"logits_BTV {tuple(logits_BTV.shape)} must be [B, T, V] and tokens_BT "
            f"{tuple(tokens_BT.shape)} must be [B, T] with the same B and T (aligned: "
            f"logits[:, t] predicts tokens[:, t])"
        )
    batch, length, vocab = logits_BTV.shape
    _check_tokens(tokens_BT, vocab)
    logp_N, ent_N = _rows(
        logits_BTV.reshape(batch * length, vocab),
        tokens_BT.reshape(-1),
        temperature,
        chunk_size,
        True,
        with_entropy,
    )
    entropy_BT = ent_N.view(batch, length) if with_entropy else None
    return logp_N.view(batch, length), entropy_BT


def logprobs_from_logits(
    logits_BTV: torch.Tensor,
    tokens_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """``log softmax(logits / temperature)[tokens]`` as ``[B, T]`` float32, chunked."""
    logprobs_BT, _ = logprobs_and_entropy(
        logits_BTV, tokens_BT, temperature=temperature, chunk_size=chunk_size, with_entropy=False
    )
    return logprobs_BT


def entropy_from_logits(
    logits_BTV: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` at each position, ``[B, T]`` float32."""
    _check_args(temperature, chunk_size)
    if logits_BTV.dim() != 3:
        raise ValueError(f"logits_BTV must be [B, T, V]; got {tuple(logits_BTV.shape)}")
    batch, length, vocab = logits_BTV.shape
    _, ent_N = _rows(
        logits_BTV.reshape(batch * length, vocab), None, temperature, chunk_size, False, True
    )
    return ent_N.view(batch, length)


def _hidden_chunk(
    hidden_CH: torch.Tensor,
    weight_VH: torch.Tensor,
    tokens_C: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits_CV = hidden_CH @ weight_VH.t()  # in the model's dtype, like the lm_head itself
    return _ChunkedLogprobEntropy.apply(
        logits_CV, tokens_C, temperature, max(1, logits_CV.shape[0]), True, with_entropy
    )


def logprobs_from_hidden(
    hidden_BTH: torch.Tensor,
    lm_head_weight_VH: torch.Tensor,
    tokens_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs_BT, entropy_BT or None)`` from the final hidden state and the LM-head weight.

    Equivalent to ``logprobs_and_entropy(hidden @ W.T, tokens)`` (bias-free LM head, as in
    Llama/Qwen) but only one chunk of logits exists at a time: each chunk of ``chunk_size`` rows is
    wrapped in ``torch.utils.checkpoint``, so backward recomputes that chunk's logits instead of
    keeping every chunk's. Gradients flow to both ``hidden_BTH`` and ``lm_head_weight_VH``.
    ``hidden_BTH`` must be aligned like logits (``hidden[:, t]`` predicts ``tokens[:, t]``).
    """
    _check_args(temperature, chunk_size)
    if hidden_BTH.dim() != 3 or tuple(tokens_BT.shape) != tuple(hidden_BTH.shape[:2]):
        raise ValueError(
            f"hidden_BTH {tuple(hidden_BTH.shape)} must be [B, T, H] and tokens_BT "
            f"{tuple(tokens_BT.shape)} must be [B, T] with the same B and T"
        )
    if lm_head_weight_VH.dim() != 2 or lm_head_weight_VH.shape[1] != hidden_BTH.shape[2]:
        raise ValueError(
            f"lm_head_weight_VH {tuple(lm_head_weight_VH.shape)} must be [V, H] with "
            f"H = {hidden_BTH.shape[2]} (the hidden size)"
        )
    batch, length, hidden_size = hidden_BTH.shape
    _check_tokens(tokens_BT, lm_head_weight_VH.shape[0])
    needs_grad = torch.is_grad_enabled() and (
        hidden_BTH.requires_grad or lm_head_weight_VH.requires_grad
    )
    hidden_chunks = hidden_BTH.reshape(batch * length, hidden_size).split(chunk_size)
    token_chunks = tokens_BT.reshape(-1).long().split(chunk_size)
    logp_parts, ent_parts = [], []
    for hidden_CH, tokens_C in zip(hidden_chunks, token_chunks, strict=True):
        args = (hidden_CH, lm_head_weight_VH, tokens_C, float(temperature), with_entropy)
        if needs_grad:
            logp_C, ent_C = checkpoint(_hidden_chunk, *args, use_reentrant=False)
        else:
            logp_C, ent_C = _hidden_chunk(*args)
        logp_parts.append(logp_C)
        ent_parts.append(ent_C)
    if not logp_parts:  # B·T == 0
        empty_BT = hidden_BTH.new_zeros((batch, length), dtype=torch.float32)
        return empty_BT, (empty_BT.clone() if with_entropy else None)
    logprobs_BT = torch.cat(logp_parts).view(batch, length)
    entropy_BT = torch.cat(ent_parts).view(batch, length) if with_entropy else None
    return logprobs_BT, entropy_BT
