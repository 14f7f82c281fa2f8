"""In-flight weight updates, driven by the producer (docs/algorithms.md, In-flight weight
updates): the backend starts a generation and returns a stepping handle; this loop advances it
``chunk_tokens`` at a time and, between advances, loads the newest received version
(``InflightSwap.swap``, the producer's) and tells the handle. Control stays here: no backend
calls back into the producer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from zbrl.rollout.backends.base import Completion, InferenceBackend, SamplingParams


@dataclass(frozen=True)
class InflightSwap:
    """How a generation takes new weights while it runs."""

    chunk_tokens: int
    """Tokens generated between two calls of ``swap``."""
    swap: Callable[[], int]
    """Loads the newest received version if there is one (through the backend's
    ``load_weights``) and returns the version loaded now; called before the generation starts
    (before any prompt is prefilled) and between chunks."""
    keep_cache: bool = False
    """After a swap, continue from the cache the old weights computed instead of recomputing it
    under the new ones (PipelineRL's choice; False: AReaL's)."""


def generate_inflight(
    backend: InferenceBackend,
    prompts: list[list[int]],
    params: SamplingParams,
    inflight: InflightSwap,
) -> list[list[Completion]]:
    """``params.n`` completions per prompt, generated in chunks with new weights between them;
    each completion's ``versions`` holds the version that sampled each of its tokens."""
    if not prompts:
        return []
    version = inflight.swap()  # the newest weights before anything runs under them
    handle = backend.start(prompts, params, version, inflight.keep_cache)
    try:
        handle.advance(inflight.chunk_tokens)
        while not handle.done:
            newer = inflight.swap()
            if newer != version:
                handle.weights_loaded(newer)
                version = newer
            handle.advance(inflight.chunk_tokens)
        return handle.results()
    finally:
        handle.close()
