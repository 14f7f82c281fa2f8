"""The inference backend interface the Producer and the Evaluator call.

A backend turns prompts (token ids) into completions with the sampled tokens' log-probs, swaps in
new weights, can release its memory, and declares what it can do (``capabilities``, plain data
declared on its config variant, :class:`zbrl.config.rollout.BackendCapabilities`). Each backend
is a sub-package of :mod:`zbrl.rollout.backends` (``transformers/``, ``vllm/``) and plugs in
without touching the Producer (docs/backends.md, Adding a backend).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

import torch

from zbrl.config.rollout import BackendCapabilities


@dataclass(frozen=True)
class SamplingParams:
    """How to sample (every field is filled by ``zbrl.assembly.settings.sampling_params`` or
    ``eval_sampling_params``; none has a default of its own)."""

    n: int
    """Completions per prompt."""
    temperature: float
    """Sampling temperature; 0 means greedy."""
    top_p: float
    """Nucleus sampling mass (1.0: off)."""
    top_k: int
    """Top-k sampling (-1: off)."""
    max_new_tokens: int
    """Generation budget per completion."""
    stop_strings: tuple[str, ...]
    """Strings that end a completion."""


@dataclass
class Completion:
    """One sampled response."""

    token_ids: torch.Tensor
    """int64 [L]: sampled tokens up to and including EOS or the stop string."""
    logprobs: torch.Tensor
    """float32 [L]: log-prob of each sampled token under the sampling policy (logits / T)."""
    text: str
    """Decoded response (special tokens skipped)."""
    finish_reason: Literal["stop", "length"]
    """``stop``: EOS or a stop string ended it; ``length``: it hit ``max_new_tokens``."""
    versions: torch.Tensor | None = None
    """int64 [L]: the policy version that sampled each token (in-flight updates); None: the
    version loaded when the generation started sampled every token."""

    def copy(self) -> Completion:
        """An independent copy (its tensors cloned): greedy decoding samples once and copies."""
        versions = None if self.versions is None else self.versions.clone()
        return Completion(
            self.token_ids.clone(), self.logprobs.clone(), self.text, self.finish_reason, versions
        )


@dataclass(frozen=True)
class InflightSwap:
    """How a generation takes new weights while it runs (in-flight updates)."""

    chunk_tokens: int
    """Tokens generated between two calls of ``swap``."""
    swap: Callable[[], int]
    """Loads the newest received version if there is one (through the backend's
    ``load_weights``) and returns the version loaded now; called before the generation starts
    (before any prompt is prefilled) and between chunks."""
    keep_cache: bool = False
    """After a swap, continue from the cache the old weights computed instead of recomputing it
    under the new ones (PipelineRL's choice; False: AReaL's)."""


class InferenceBackend(Protocol):
    """Generation engine of a producer or evaluator."""

    capabilities: ClassVar[BackendCapabilities]
    """What it can do: the ``capabilities`` of its config variant."""

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        inflight: InflightSwap | None = None,
    ) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, in prompt order. With ``inflight`` the
        backend generates in chunks, calls ``inflight.swap`` between them and fills each
        completion's ``versions``; backends that cannot raise ``ValueError``."""
        ...

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Replace the policy weights (names as in the trained model's ``state_dict``)."""
        ...

    def release_memory(self) -> None:
        """Free caches (KV cache, CUDA cache) between phases."""
        ...
