"""In-flight weight updates for the vLLM backend: the in-process engine stepped by hand, new
weights between engine steps (docs/algorithms.md, In-flight weight updates).

Instead of ``LLM.generate``, every sample is its own request (``n=1``) added to the engine
(``LLMEngine.add_request``), and the engine is stepped (``LLMEngine.step``) until all of them end.
Each step samples at most one token per running request and returns the new tokens, their
log-probs and text as deltas (``RequestOutputKind.DELTA``); each token is tagged with the version
loaded when its step ran. :class:`SteppedGeneration` is the backend's stepping handle: its caller
(the producer, :func:`zbrl.rollout.inflight.generate_inflight`) advances it ``chunk_tokens``
steps that sampled a token at a time and, between advances, loads a newer version if it has one
(through ``VllmBackend.load_weights``: the workers' ``reload_weights`` in place, between two
steps, so a step never sees two versions) and says so (``weights_loaded``). EOS, stop
strings, ``max_tokens``, detokenization and log-probs are the engine's own, as in
``LLM.generate``, which adds the same requests (``n`` samples fan out into ``n`` requests there
too) and steps the same engine.

After a swap the running requests' key/value cache is **recomputed** under the new weights by
default (AReaL's choice, ``after_swap: recompute``): ``reset_prefix_cache(
reset_running_requests=True)`` preempts every running request and clears the prefix cache, and
vLLM resumes each one by prefilling its prompt and tokens so far under the new weights (its
recompute preemption), so every later token is sampled by, and its log-prob is, the version it is
tagged with. ``after_swap: keep`` (PipelineRL's choice) leaves the running requests' cache as the
old weights computed it; a request still waiting for a KV slot at the swap may also reuse prompt
blocks cached under the old weights. The prefix cache is cleared once the batch has ended
(``load_weights``' own reset fails while requests hold blocks), so the next batch starts clean.

The engine must step synchronously (vLLM's asynchronous scheduling, its GPU default, queues the
next step before the current one returns, which would run it under the old weights but tag its
tokens with the new version): ``VllmSettings.inflight_updates`` turns it off, and a generation on
an engine that schedules asynchronously is refused. LoRA adapters served by vLLM
(``lora_mode: adapters``) swap the same way: with in-flight updates every version replaces the
last under one adapter id (:class:`zbrl.rollout.backends.vllm.lora.VllmAdapters`, ``in_place``),
which the running requests keep; an engine that gives each version a new id is refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from zbrl.rollout.backends.base import Completion, SamplingParams, grouped
from zbrl.rollout.backends.vllm.lora import MergedAdapters, VllmAdapters
from zbrl.rollout.backends.vllm.outputs import completion_of, request_params, sampled_logprobs

REQUEST_PREFIX = "zbrl-inflight"
"""Request ids of in-flight generations (``LLM.generate`` numbers its own from 0)."""

_calls = itertools.count()


class SteppedEngine(Protocol):
    """What the driver uses of vLLM's in-process ``LLMEngine``."""

    def add_request(
        self, request_id: str, prompt: Any, params: Any, lora_request: Any = None
    ) -> Any: ...

    def step(self) -> list[Any]: ...

    def has_unfinished_requests(self) -> bool: ...

    def abort_request(self, request_ids: list[str]) -> None: ...

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool: ...


@dataclass
class ResponseTrace:
    """One request's response, assembled from the engine's per-step deltas."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    """vLLM's reason once the request ended (``stop``, ``length``, ``abort``); None: running."""

    def add(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        text: str,
        version: int,
        finish_reason: str | None,
    ) -> None:
        """Append one step's delta: its new tokens (sampled by ``version``), their log-probs
        and text."""
        if self.finish_reason is not None:
            raise RuntimeError("vLLM returned tokens for a request that had already ended")
        if len(logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
        self.token_ids.extend(int(t) for t in token_ids)
        self.logprobs.extend(float(x) for x in logprobs)
        self.versions.extend([version] * len(token_ids))
        self.text += text
        self.finish_reason = finish_reason

    def completion(self) -> Completion:
        return completion_of(
            self.token_ids, self.logprobs, self.text, self.finish_reason, self.versions
        )


class SteppedGeneration:
    """One in-flight generation of already expanded rows (one request per sample): the stepping
    handle (:class:`~zbrl.rollout.backends.base.GenerationHandle`) of the vLLM backend."""

    def __init__(
        self,
        engine: SteppedEngine,
        request_params: Any,
        rows: list[list[int]],
        render: Callable[[list[list[int]]], list[Any]],
        version: int,
        *,
        keep_cache: bool = False,
        lora: Any = None,
        follows: bool = True,
        n: int = 1,
        greedy: bool = False,
    ) -> None:
        """Add a request for each of ``rows`` (prompt token ids) to ``engine``, sampled by
        ``version`` (the weights loaded now). ``request_params``: vLLM ``SamplingParams`` with
        ``n=1`` and delta outputs; ``render``: prompt token ids to the engine's inputs
        (``LLM.generate``'s rendering); ``keep_cache``: keep the running requests' cache after
        new weights; ``lora``: the ``LoRARequest`` to add the requests with (LoRA adapters served
        by vLLM, each version loaded in place under that id; None: plain weights or the base);
        ``follows``: whether the requests follow new weights (False for requests added on the
        base in place of adapters: they would go on with the base under a newer version's tag,
        so the batch then runs to its end in one advance); ``n`` and ``greedy``: how rows group
        into prompts (:func:`~zbrl.rollout.backends.base.grouped`)."""
        self.engine = engine
        self.version = version
        self.keep_cache = keep_cache
        self.follows = follows
        self.n = n
        self.greedy = greedy
        call = next(_calls)
        self.ids = [f"{REQUEST_PREFIX}-{call}-{i}" for i in range(len(rows))]
        self.traces = {rid: ResponseTrace() for rid in self.ids}
        self.swapped_while_running = False
        try:
            for rid, prompt in zip(self.ids, render(rows), strict=True):
                engine.add_request(rid, prompt, request_params, lora_request=lora)
        except BaseException:
            self.close()
            raise

    @property
    def done(self) -> bool:
        return not self.engine.has_unfinished_requests()

    def advance(self, steps: int) -> None:
        """Step the engine until ``steps`` steps sampled a token (all steps when the requests do
        not follow new weights) or no request runs."""
        sampled = 0
        while self.engine.has_unfinished_requests():
            if self._step(self.traces, self.version):
                sampled += 1
            if self.follows and sampled >= steps:
                return

    def weights_loaded(self, version: int) -> None:
        """Tag the next steps' tokens with ``version`` and, unless ``keep_cache``, have vLLM
        recompute the running requests under the new weights (preempt them)."""
        self.version = version
        self.swapped_while_running = True
        if not self.keep_cache:
            self.engine.reset_prefix_cache(reset_running_requests=True)

    def results(self) -> list[list[Completion]]:
        """The completions, grouped by prompt; after a swap the prefix cache is cleared, so the
        next batch reuses no key/values the old weights computed."""
        if self.swapped_while_running and not self.engine.reset_prefix_cache():
            raise RuntimeError(
                "vLLM could not clear its prefix cache after an in-flight weight update: the "
                "next batch would reuse key/values computed by the old weights"
            )
        done = [self.traces[rid].completion() for rid in self.ids]
        return grouped(done, self.n, self.greedy)

    def close(self) -> None:
        """Abort the requests still running (an error mid-generation): none is left behind in
        the engine."""
        running = [rid for rid, t in self.traces.items() if t.finish_reason is None]
        if running:
            self.engine.abort_request(running)

    def _step(self, traces: dict[str, ResponseTrace], version: int) -> bool:
        """One engine step; whether it sampled a token."""
        sampled = False
        for out in self.engine.step():
            trace = traces.get(out.request_id)
            if trace is None:
                raise RuntimeError(
                    f"vLLM returned output for request {out.request_id!r}, which this in-flight "
                    "generation did not add (the engine must serve one generation at a time)"
                )
            (c,) = out.outputs
            ids = list(c.token_ids)
            trace.add(ids, sampled_logprobs(ids, c.logprobs), c.text, version, c.finish_reason)
            sampled = sampled or bool(ids)
        return sampled


def render_token_prompts(llm: Any, rows: list[list[int]]) -> list[Any]:
    """``rows`` (prompt token ids) as the engine's inputs, rendered as ``LLM.generate`` renders
    its prompts: parsed for the model, then the engine's renderer with its default completion
    tokenization settings (what ``LLMEngine.add_request`` asks for instead of raw prompts)."""
    from vllm.inputs import TokensPrompt
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    renderer = llm.renderer
    parsed = [parse_model_prompt(llm.model_config, TokensPrompt(prompt_token_ids=r)) for r in rows]
    return list(renderer.render_cmpl(parsed, renderer.default_cmpl_tok_params.with_kwargs()))


def start_stepping(
    llm: Any,
    adapters: VllmAdapters | MergedAdapters | None,
    prompts: list[list[int]],
    params: SamplingParams,
    version: int,
    keep_cache: bool,
) -> SteppedGeneration:
    """``VllmBackend.start``: the stepping handle of a generation of ``params.n`` completions
    per prompt on the engine of ``llm`` (a ``vllm.LLM``) that serves LoRA ``adapters`` (None:
    plain weights) and holds ``version``."""
    engine = llm.llm_engine
    in_place = isinstance(adapters, VllmAdapters) and adapters.in_place
    if engine.vllm_config.lora_config is not None and not in_place:
        raise ValueError(
            "in-flight weight updates with LoRA adapters served by vLLM need every version "
            "loaded in place under one adapter id (a running request keeps the id it started "
            "with); build the backend with VllmSettings.inflight_updates=True (zbrl does when "
            "rollout.inflight_updates.enabled=true)"
        )
    if engine.vllm_config.scheduler_config.async_scheduling:
        raise RuntimeError(
            "in-flight weight updates on vLLM need synchronous engine steps, but this engine "
            "schedules asynchronously; build the backend with VllmSettings.inflight_updates=True "
            "(zbrl does when rollout.inflight_updates.enabled=true)"
        )
    from vllm.sampling_params import RequestOutputKind

    greedy = params.temperature == 0
    per_prompt = 1 if greedy else params.n  # greedy: decode once, copy (as without in-flight)
    one_each = request_params(replace(params, n=1))
    one_each.output_kind = RequestOutputKind.DELTA
    rows = [list(p) for p in prompts for _ in range(per_prompt)]
    # LoRA served in place: the adapter current now, which later versions replace under its id
    lora = adapters.request if in_place else None
    return SteppedGeneration(
        engine,
        one_each,
        rows,
        lambda rows: render_token_prompts(llm, rows),
        version,
        keep_cache=keep_cache,
        lora=lora,
        follows=not in_place or lora is not None,
        n=params.n,
        greedy=greedy,
    )
