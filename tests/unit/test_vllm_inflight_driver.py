"""The vLLM in-flight stepping handle (zbrl.rollout.backends.vllm.inflight), driven by the
producer's loop (zbrl.rollout.inflight.generate_inflight), against a scripted stand-in for vLLM's
``LLMEngine``: which version each token is tagged with, when ``swap`` is called, what happens to
the prefix cache in each ``after_swap`` mode, and that nothing is left in the engine after an
error. No vLLM needed (tests/with_vllm/test_vllm_inflight.py runs the real engine)."""

from types import SimpleNamespace

import pytest
import torch

from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.backends.vllm.inflight import ResponseTrace, SteppedGeneration, start_stepping
from zbrl.rollout.inflight import InflightSwap, generate_inflight


class ScriptedEngine:
    """Each request emits one token per step from a script (the prompt's first id times 100
    plus the position), its log-prob ``-(version + 1)`` under the weights loaded at that step,
    and ends with ``stop`` after its script or ``length``. Records what the driver does to it."""

    def __init__(self, lengths: dict[int, tuple[int, str]]) -> None:
        self.lengths = lengths  # prompt first id -> (tokens, finish reason)
        self.loaded = 0  # the weights' version, set by the test's swap
        self.running: dict[str, list[int]] = {}
        self.emitted: dict[str, int] = {}
        self.calls: list[tuple] = []

    def add_request(self, request_id, prompt, params, lora_request=None):
        assert params == "n=1, delta"
        self.calls.append(("add", lora_request))
        self.running[request_id] = prompt["rendered"]
        self.emitted[request_id] = 0

    def has_unfinished_requests(self):
        return bool(self.running)

    def step(self):
        self.calls.append(("step", self.loaded))
        outs = []
        for rid, prompt in list(self.running.items()):
            total, reason = self.lengths[prompt[0]]
            i = self.emitted[rid]
            self.emitted[rid] += 1
            tok = prompt[0] * 100 + i
            done = i + 1 == total
            c = SimpleNamespace(
                token_ids=[tok],
                logprobs=[{tok: SimpleNamespace(logprob=-(self.loaded + 1.0))}],
                text=f"<{i}>",
                finish_reason=reason if done else None,
            )
            outs.append(SimpleNamespace(request_id=rid, outputs=[c]))
            if done:
                del self.running[rid]
        return outs

    def abort_request(self, request_ids):
        self.calls.append(("abort", sorted(request_ids)))
        for rid in request_ids:
            del self.running[rid]

    def reset_prefix_cache(self, reset_running_requests=False):
        self.calls.append(("reset", reset_running_requests, bool(self.running)))
        return reset_running_requests or not self.running


def swapper(engine: ScriptedEngine, publish_at: dict[int, int]):
    """A producer's swap: on its k-th call (0: before the generation) version ``publish_at[k]``
    is loaded into the engine, if given."""
    count = {"calls": 0}

    def swap() -> int:
        k = count["calls"]
        count["calls"] += 1
        if k in publish_at:
            engine.loaded = publish_at[k]
        return engine.loaded

    return swap, count


def render(rows):
    return [{"rendered": r} for r in rows]


def params(n=1):
    return SamplingParams(
        n=n, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=4, stop_strings=()
    )


class ScriptedBackend:
    """A backend over the scripted engine whose ``start`` adds one request per prompt (``lora``:
    the adapter to add them with, read at the start, as ``VllmBackend.start`` does)."""

    def __init__(self, engine, lora=None):
        self.engine = engine
        self.lora = lora

    def start(self, prompts, params, version, keep_cache):
        lora = self.lora() if self.lora is not None else None
        follows = self.lora is None or lora is not None
        return SteppedGeneration(
            self.engine,
            "n=1, delta",
            prompts,
            render,
            version,
            keep_cache=keep_cache,
            lora=lora,
            follows=follows,
        )


def drive(engine, rows, inflight, lora=None):
    """The completions of ``rows``, one each, as the producer's loop generates them."""
    groups = generate_inflight(ScriptedBackend(engine, lora), rows, params(), inflight)
    return [c for (c,) in groups]


def run(engine, rows, chunk, publish_at, keep=False):
    swap, count = swapper(engine, publish_at)
    inflight = InflightSwap(chunk, swap, keep_cache=keep)
    return drive(engine, rows, inflight), count["calls"]


def test_each_token_carries_the_version_loaded_when_its_step_ran():
    engine = ScriptedEngine({1: (7, "stop"), 2: (3, "stop"), 3: (10, "length")})
    out, swaps = run(engine, [[1, 9], [2], [3, 4]], chunk=3, publish_at={0: 4, 1: 5, 3: 6})
    assert [c.versions.tolist() for c in out] == [
        [4, 4, 4, 5, 5, 5, 5],
        [4, 4, 4],
        [4, 4, 4, 5, 5, 5, 5, 5, 5, 6],
    ]
    # the log-probs are those of the weights the engine ran each step with
    for c in out:
        assert c.logprobs.tolist() == [-(v + 1.0) for v in c.versions.tolist()]
    assert [c.token_ids.tolist() for c in out] == [
        list(range(100, 107)),
        [200, 201, 202],
        list(range(300, 310)),
    ]
    assert [c.finish_reason for c in out] == ["stop", "stop", "length"]
    assert out[0].text == "".join(f"<{i}>" for i in range(7))
    assert out[0].token_ids.dtype == out[0].versions.dtype == torch.int64
    assert out[0].logprobs.dtype == torch.float32
    # before the start, then after steps 3, 6 and 9 (step 10 ends the last request: no swap)
    assert swaps == 4


def test_recompute_resets_the_running_requests_once_per_new_version():
    engine = ScriptedEngine({1: (9, "stop")})
    run(engine, [[1]], chunk=2, publish_at={0: 0, 2: 1, 3: 1})
    resets = [c for c in engine.calls if c[0] == "reset"]
    # one preempting reset at the swap to version 1 (none when the swap found nothing new), then
    # a plain reset once the batch has ended
    assert resets == [("reset", True, True), ("reset", False, False)]
    steps = [c[1] for c in engine.calls if c[0] == "step"]
    assert steps == [0, 0, 0, 0, 1, 1, 1, 1, 1]


def test_keep_leaves_the_running_cache_and_clears_the_prefix_cache_after_the_batch():
    engine = ScriptedEngine({1: (9, "stop"), 2: (2, "stop")})
    out, _ = run(engine, [[1], [2]], chunk=2, publish_at={1: 3}, keep=True)
    assert out[0].versions.tolist() == [0, 0, 3, 3, 3, 3, 3, 3, 3]
    assert [c for c in engine.calls if c[0] == "reset"] == [("reset", False, False)]


def test_without_a_new_version_the_cache_is_never_reset():
    engine = ScriptedEngine({1: (5, "stop"), 2: (4, "length")})
    out, swaps = run(engine, [[1], [2]], chunk=1, publish_at={0: 2})
    assert [c.versions.tolist() for c in out] == [[2] * 5, [2] * 4]
    assert not [c for c in engine.calls if c[0] == "reset"]
    assert swaps == 5  # the start, then after steps 1-4


def test_an_error_in_a_swap_leaves_no_request_behind():
    engine = ScriptedEngine({1: (9, "stop"), 2: (1, "stop"), 3: (9, "stop")})
    calls = {"n": 0}

    def swap():
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("weights lost")
        return 0

    with pytest.raises(ConnectionError):
        drive(engine, [[1], [2], [3]], InflightSwap(2, swap))
    aborted = [c[1] for c in engine.calls if c[0] == "abort"]
    assert len(aborted) == 1 and len(aborted[0]) == 2  # the two still running; 2 had ended
    assert all(rid.endswith(("-0", "-2")) for rid in aborted[0])
    assert not engine.has_unfinished_requests()


def test_response_trace_refuses_what_vllm_should_never_return():
    trace = ResponseTrace()
    with pytest.raises(RuntimeError, match="no log-prob"):
        trace.add([5, 6], [-1.0], "ab", 0, None)
    trace.add([5], [-1.0], "a", 0, "abort")
    with pytest.raises(RuntimeError, match="already ended"):
        trace.add([6], [-1.0], "b", 0, None)
    with pytest.raises(RuntimeError, match="finish_reason='abort'"):
        trace.completion()


def fake_backend(async_scheduling: bool, lora_config=None, adapters=None):
    scheduler = SimpleNamespace(async_scheduling=async_scheduling)
    config = SimpleNamespace(scheduler_config=scheduler, lora_config=lora_config)
    engine = SimpleNamespace(vllm_config=config)
    return SimpleNamespace(llm=SimpleNamespace(llm_engine=engine), adapters=adapters)


def test_requests_are_added_with_the_adapter_loaded_by_the_first_swap():
    """LoRA served by vLLM: every request of the batch carries the LoRARequest that is current
    after the swap before the start (later versions replace it in place, under the same id)."""
    engine = ScriptedEngine({1: (4, "stop"), 2: (2, "stop")})
    current = {"request": None}
    count = {"calls": 0}

    def swap() -> int:
        count["calls"] += 1
        current["request"] = f"adapter after swap {count['calls']}"
        return count["calls"]

    drive(engine, [[1], [2]], InflightSwap(2, swap), lambda: current["request"])
    adds = [call for call in engine.calls if call[0] == "add"]
    assert adds == [("add", "adapter after swap 1")] * 2
    # a batch started on the base (no adapter version yet) takes no version in the middle: its
    # requests, added without an adapter, would go on with the base under the new version's tag
    on_base = ScriptedEngine({1: (7, "stop")})
    swap, count = swapper(on_base, {1: 1})
    (out,) = drive(on_base, [[1]], InflightSwap(2, swap), lambda: None)
    assert count["calls"] == 1 and out.versions.tolist() == [0] * 7
    plain = ScriptedEngine({1: (2, "stop")})
    drive(plain, [[1]], InflightSwap(2, lambda: 0))
    assert [call for call in plain.calls if call[0] == "add"] == [("add", None)]


@pytest.mark.parametrize(
    ("backend", "error", "message"),
    [
        (fake_backend(True), RuntimeError, "VllmSettings.inflight_updates=True"),
        (fake_backend(False, lora_config=object()), ValueError, "in place under one adapter id"),
    ],
)
def test_engines_that_cannot_swap_between_steps_are_refused(backend, error, message):
    with pytest.raises(error, match=message):
        start_stepping(backend.llm, backend.adapters, [[1, 2]], params(n=2), 0, False)
