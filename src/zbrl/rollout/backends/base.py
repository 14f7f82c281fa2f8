"""The inference backend interface the Producer and the Evaluator call.

A backend turns prompts (token ids) into completions with the sampled tokens' log-probs, swaps in
new weights, can release its memory, and declares what it can do (``capabilities``, plain data
declared on its config variant, :class:`zbrl.config.rollout.BackendCapabilities`). Each backend
is a sub-package of :mod:`zbrl.rollout.backends` (``transformers/``, ``vllm/``) and plugs in
without touching the Producer (docs/backends.md, Adding a backend).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

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


def one_sample(temperature: float, max_new_tokens: int) -> SamplingParams:
    """One completion per prompt from the whole distribution at ``temperature`` (0: greedy; no
    top-p or top-k cut, no stop strings): what ``zbrl serve`` samples unless a request says
    otherwise, and what the embedded default's probes sample."""
    return SamplingParams(
        n=1,
        temperature=temperature,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=max_new_tokens,
        stop_strings=(),
    )


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


def grouped(done: list[Completion], n: int, greedy: bool) -> list[list[Completion]]:
    """``n`` completions per prompt from the rows of one generation: ``n`` consecutive rows per
    prompt, or (``greedy``: one row per prompt, since greedy decoding gives the same answer n
    times) each row and ``n - 1`` copies of it."""
    if greedy:
        return [[c.copy() for _ in range(n)] for c in done]
    return [done[i : i + n] for i in range(0, len(done), n)]


class GenerationHandle(Protocol):
    """One running generation batch that its caller advances (in-flight updates: the producer
    owns the loop, :func:`zbrl.rollout.inflight.generate_inflight`). Between two advances the
    caller may load new weights into the backend (``load_weights``) and tell the handle
    (:meth:`weights_loaded`); every token records the version that sampled it. The backend never
    calls back into its caller."""

    @property
    def done(self) -> bool:
        """Every response of the batch has ended."""
        ...

    def advance(self, steps: int) -> None:
        """Generate until ``steps`` more tokens per running response are sampled (transformers:
        one ``generate`` call of at most ``steps`` tokens; vLLM: engine steps that sample a
        token) or the batch is done. A batch whose running responses cannot follow new weights
        (vLLM requests added without a LoRA adapter, before the first version) runs to its end."""
        ...

    def weights_loaded(self, version: int) -> None:
        """The backend now holds ``version`` (loaded between two advances): the tokens sampled
        from now on are tagged with it, and the running responses' key/value cache is recomputed
        under it unless the handle was started with ``keep_cache``."""
        ...

    def results(self) -> list[list[Completion]]:
        """``params.n`` completions per prompt, in prompt order, each with its per-token
        ``versions`` (once :attr:`done`)."""
        ...

    def close(self) -> None:
        """Release what the batch still holds in the engine (after an error mid-generation)."""
        ...


class InferenceBackend(Protocol):
    """Generation engine of a producer or evaluator."""

    capabilities: ClassVar[BackendCapabilities]
    """What it can do: the ``capabilities`` of its config variant."""
    context_len: int | None
    """Longest prompt + completion it serves, in tokens (the engine's ``max_model_len``, or the
    model config's positions); None: not known."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, in prompt order, all sampled by the weights
        loaded now."""
        ...

    def start(
        self, prompts: list[list[int]], params: SamplingParams, version: int, keep_cache: bool
    ) -> GenerationHandle:
        """Start a generation that the caller advances and may load new weights into between
        steps (backends whose ``capabilities.inflight_updates``): ``version`` is the one loaded
        now; ``keep_cache``: after new weights, continue from the cache the old ones computed
        (PipelineRL's choice) instead of recomputing it (AReaL's)."""
        ...

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Replace the policy weights (names as in the trained model's ``state_dict``)."""
        ...

    def release_memory(self) -> None:
        """Free caches (KV cache, CUDA cache) between phases."""
        ...


POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Where transformers model configs give their number of positions."""


def positions_of(config: Any) -> int | None:
    """The number of positions a transformers model config declares (its ``text_config``'s for
    a multimodal one); None when it declares none."""
    for source in (config, getattr(config, "text_config", None)):
        for name in POSITION_FIELDS:
            value = getattr(source, name, None)
            if isinstance(value, int) and value > 0:
                return value
    return None
