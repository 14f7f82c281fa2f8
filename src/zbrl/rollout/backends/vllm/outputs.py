"""vLLM's outputs as :class:`~zbrl.rollout.backends.base.Completion` s, and zbrl's sampling
parameters as vLLM's (used by :mod:`.backend` and :mod:`.inflight`; vLLM is imported only inside
:func:`request_params`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from zbrl.rollout.backends.base import Completion, SamplingParams


def request_params(params: SamplingParams) -> Any:
    """vLLM's ``SamplingParams`` for ``params``: the sampled token's log-prob with each token,
    stop strings kept in the text."""
    from vllm import SamplingParams as VllmSamplingParams

    return VllmSamplingParams(
        n=params.n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else 0,
        max_tokens=params.max_new_tokens,
        stop=list(params.stop_strings) or None,
        include_stop_str_in_output=True,
        logprobs=0,
        skip_special_tokens=True,
    )


def completion_from_output(out: Any) -> Completion:
    """The :class:`Completion` of one finished ``CompletionOutput`` of ``LLM.generate``."""
    ids = list(out.token_ids)
    if out.logprobs is None or len(out.logprobs) != len(ids):
        raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
    return completion_of(ids, sampled_logprobs(ids, out.logprobs), out.text, out.finish_reason)


def sampled_logprobs(token_ids: Sequence[int], steps: Iterable[Any] | None) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-token ``{token_id: Logprob}`` maps
    (``logprobs=0``: the sampled token's only); none without maps."""
    if steps is None:
        return []
    return [float(step[tok].logprob) for tok, step in zip(token_ids, steps)]


def completion_of(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    text: str,
    finish_reason: str | None,
    versions: Sequence[int] | None = None,
) -> Completion:
    """The :class:`Completion` of one vLLM response that ended (``stop`` or ``length``; any
    other reason is a RuntimeError)."""
    if finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM ended a completion with finish_reason={finish_reason!r}")
    return Completion(
        token_ids=torch.tensor(token_ids, dtype=torch.long),
        logprobs=torch.tensor(logprobs, dtype=torch.float32),
        text=text,
        finish_reason=finish_reason,
        versions=None if versions is None else torch.tensor(versions, dtype=torch.long),
    )
