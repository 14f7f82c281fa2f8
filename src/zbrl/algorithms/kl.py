"""Per-token KL estimators between the current policy and a reference policy.

Schulman's estimators (http://joschu.net/blog/kl-approx.html) of ``KL(π ‖ π_ref)`` from samples
drawn from π, with ``log r = log π_ref(x) - log π(x)``:

- ``k1 = -log r = logπ - logπ_ref``              unbiased, high variance, can be negative;
- ``k2 = ½ (log r)²``                             biased, low variance, always >= 0;
- ``k3 = (r - 1) - log r = exp(ref - logπ) - (ref - logπ) - 1``  unbiased, low variance, >= 0.

Numerical safety: ``k3`` exponentiates the log-ratio, so the log-ratio is clamped to
``[-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP]`` (±20) before ``exp``; beyond the clamp the value
is capped and its gradient is zero. ``k1`` and ``k2`` involve no ``exp`` and are not clamped.
All estimators are computed in float32 whatever the input dtype.
"""

from __future__ import annotations

from typing import Literal

import torch

KLKind = Literal["k1", "k2", "k3"]
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")

#: Bound on |log π_ref - log π| inside k3's exp (e^20 ≈ 4.9e8, far from float32 overflow).
KL_LOG_RATIO_CLAMP = 20.0


def kl_estimate(
    logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, kind: KLKind
) -> torch.Tensor:
    """Per-token estimate of ``KL(π ‖ π_ref)``, same shape as the inputs, float32.

    ``logprobs_BT`` are the current policy's log-probs of the sampled tokens (gradients flow
    through them), ``ref_logprobs_BT`` the reference model's log-probs of the same tokens.
    """
    if logprobs_BT.shape != ref_logprobs_BT.shape:
        raise ValueError(
            f"kl_estimate: logprobs shape {tuple(logprobs_BT.shape)} != ref_logprobs shape "
            f"{tuple(ref_logprobs_BT.shape)}"
        )
    log_ratio_BT = ref_logprobs_BT.float() - logprobs_BT.float()  # log(π_ref / π)
    if kind == "k1":
        return -log_ratio_BT
    if kind == "k2":
        return 0.5 * log_ratio_BT.square()
    if kind == "k3":
        log_ratio_BT = log_ratio_BT.clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
        return torch.expm1(log_ratio_BT) - log_ratio_BT  # expm1: accurate for small ratios
    raise ValueError(f"unknown KL estimator kind {kind!r}; choose one of {KL_KINDS}")
