"""Reduce a per-token loss to the scalar that is back-propagated — exactly, under accumulation.

Modes (``m`` = mask, ``ℓ`` = per-token loss, sums over the whole optimizer step's tokens):

=========================== ==================================================================
``token-mean``              ``Σ_{s,t} ℓ·m / N_tokens``
``seq-mean-token-mean``     ``Σ_s [Σ_t ℓ·m / len_s] / N_seqs``  (len-0 sequences contribute 0)
``seq-mean-token-sum``      ``Σ_{s,t} ℓ·m / N_seqs``
``seq-mean-token-sum-norm`` ``Σ_{s,t} ℓ·m / (N_seqs · L)``  (Dr.GRPO; ``L`` = the generation
                            budget ``max_new_tokens``, a constant)
=========================== ==================================================================

Why the normalisers are passed in: ``N_tokens`` and ``N_seqs`` are counted over the *whole
optimizer step* (every micro-batch, and every data-parallel rank), not over the micro-batch being
reduced. Each mode is then a sum over sequences of terms that depend only on that sequence, divided
by constants, so ``Σ_micro aggregate(micro) == aggregate(whole batch)`` and accumulating gradients
over micro-batches gives exactly the full-batch gradient, whatever the padding or split.

Usage for one optimizer step::

    norm = normalisers_for(step_mask_BT, norm_tokens=max_new_tokens)  # whole step, this rank
    # data parallel: all-reduce (SUM) norm.tokens and norm.seqs over ranks before using them,
    # e.g. t = torch.tensor([norm.tokens, norm.seqs]); dist.all_reduce(t); norm = Normalisers(
    #     tokens=t[0].item(), seqs=t[1].item(), norm_tokens=norm.norm_tokens)
    # and, since DDP/FSDP *average* gradients over ranks, multiply each rank's loss by world_size.
    for micro in micro_batches:
        aggregate(loss_BT(micro), micro.mask_BT, mode, norm).backward()
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AGGREGATION_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


@dataclass
class Normalisers:
    """Denominators for :func:`aggregate`, counted once per optimizer step (all micro-batches,
    all ranks).

    tokens: number of valid (mask=1) tokens.
    seqs: number of sequences with at least one valid token.
    norm_tokens: constant token budget for ``seq-mean-token-sum-norm`` (``max_new_tokens``).
    """

    tokens: float
    seqs: float
    norm_tokens: float = 1.0

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.seqs < 0:
            raise ValueError(f"Normalisers must be non-negative; got {self}")
        if self.norm_tokens <= 0:
            raise ValueError(
                f"Normalisers.norm_tokens must be > 0 (the generation budget, max_new_tokens); "
                f"got {self.norm_tokens}"
            )

    def __add__(self, other: Normalisers) -> Normalisers:
        """Combine the counts of two disjoint parts of a step (``norm_tokens`` must agree)."""
        if self.norm_tokens != other.norm_tokens:
            raise ValueError(
                f"cannot add Normalisers with different norm_tokens "
                f"({self.norm_tokens} vs {other.norm_tokens})"
            )
        return Normalisers(self.tokens + other.tokens, self.seqs + other.seqs, self.norm_tokens)


def normalisers_for(mask_BT: torch.Tensor, *, norm_tokens: float = 1.0) -> Normalisers:
    """Count valid tokens and non-empty sequences of ``mask_BT`` (pass the whole step's mask,
    or add up per-micro-batch results with ``+``)."""
    if mask_BT.dim() != 2:
        raise ValueError(f"mask_BT must have shape [B, T]; got {tuple(mask_BT.shape)}")
    valid_BT = mask_BT != 0
    counts = torch.stack([valid_BT.sum(), valid_BT.any(dim=1).sum()]).tolist()  # one sync
    return Normalisers(tokens=float(counts[0]), seqs=float(counts[1]), norm_tokens=norm_tokens)


def _safe(denominator: float) -> float:
    # Only 0 when the whole step has no valid token, and then every numerator is 0 as well.
    return denominator if denominator > 0 else 1.0


def aggregate(
    loss_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str, norm: Normalisers
) -> torch.Tensor:
    """Scalar loss of this micro-batch's share of the optimizer step (see module docstring).

    Masked positions are excluded with ``where`` (not multiplied by 0), so garbage there — even
    inf or NaN from padding — reaches neither the value nor the gradient.
    """
    if loss_BT.shape != mask_BT.shape or loss_BT.dim() != 2:
        raise ValueError(
            f"aggregate: loss_BT {tuple(loss_BT.shape)} and mask_BT {tuple(mask_BT.shape)} "
            f"must both have shape [B, T]"
        )
    valid_BT = mask_BT != 0  # any non-zero entry is a valid token, as in normalisers_for
    masked_BT = torch.where(valid_BT, loss_BT, torch.zeros_like(loss_BT))
    if mode == "token-mean":
        return masked_BT.sum() / _safe(norm.tokens)
    if mode == "seq-mean-token-mean":
        seq_len_B = valid_BT.sum(dim=1).clamp_min(1).to(loss_BT.dtype)
        return (masked_BT.sum(dim=1) / seq_len_B).sum() / _safe(norm.seqs)
    if mode == "seq-mean-token-sum":
        return masked_BT.sum() / _safe(norm.seqs)
    if mode == "seq-mean-token-sum-norm":
        return masked_BT.sum() / (_safe(norm.seqs) * norm.norm_tokens)
    raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {AGGREGATION_MODES}")
