"""``environment.type: agent`` as an environment of the one episode runner.

The runner hands an agent environment the same ``generate`` it gives every environment
(:meth:`EpisodeRunner.run` calls :meth:`AgentEnvironment.run_episodes`): for each sample an
episode is opened on the endpoint and the agent is started with that episode's key; the runner's
thread then answers the endpoint's calls in batches with ``generate`` until every agent has
returned. Each episode becomes an :class:`EpisodeCompletion` from the tokens the endpoint
recorded, scored like any other episode (:meth:`EpisodeRunner.score`).

A group's prompt is what its episodes' first requests share (the longest common prefix of their
prompt ids); the rest of each episode, its own prompt remainder included, is its response, with
the loss on the model's tokens only. An agent that times out, crashes or returns something
malformed fails its episode: the episode carries ``failure`` and its group is dropped by the
buffer, never trained on a made-up score (``env/agent_*`` counts).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import torch

from zbrl.rollout.agents.launch import AgentLauncher, AgentOutcome
from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.endpoint.calls import answer
from zbrl.rollout.endpoint.conversation import ConversationTokens, TokenSegment
from zbrl.rollout.endpoint.server import Endpoint, EpisodeBudget
from zbrl.rollout.episodes import EpisodeCompletion, EpisodeLimitSettings, Generate
from zbrl.types import EncodedPrompt, Segment

POLL_S = 0.05
"""How often the runner's thread looks again for calls (and for hung episodes) while agents
work."""


@dataclass(frozen=True)
class AgentSettings:
    """How an agent environment runs its episodes."""

    on_history_change: str
    """``segment`` or ``refuse`` (:class:`~zbrl.rollout.endpoint.server.EpisodeBudget`)."""
    timeout_s: float
    """An episode that makes no request and no progress this long is ended, failed."""
    retries: int
    """Times a failed episode is run again with a fresh agent before it counts as failed."""


class AgentEnvironment:
    """Episodes run by a user's agent through ``endpoint`` (see the module docstring)."""

    def __init__(
        self, endpoint: Endpoint, launcher: AgentLauncher, settings: AgentSettings
    ) -> None:
        self.endpoint = endpoint
        self.launcher = launcher
        self.settings = settings

    def run_episodes(
        self,
        generate: Generate,
        prompts: list[EncodedPrompt],
        params: SamplingParams,
        version: int,
        limits: EpisodeLimitSettings,
    ) -> list[list[EpisodeCompletion]]:
        """``params.n`` agent episodes per prompt, every call answered by ``generate``; a
        failed episode is run again, with a fresh agent, up to ``retries`` times."""
        self.endpoint.start()
        self.endpoint.episode_params = replace(params, n=1)
        budget = EpisodeBudget(
            limits.max_turns, limits.max_total_tokens, self.settings.on_history_change
        )
        examples = [p.example for p in prompts for _ in range(params.n)]
        done: list[Any] = [None] * len(examples)
        todo = list(range(len(examples)))
        retried = [0] * len(examples)
        for attempt in range(self.settings.retries + 1):
            results = self._attempt(generate, [examples[i] for i in todo], budget, version)
            for i, episode in zip(todo, results, strict=True):
                done[i] = episode
            todo = [i for i in todo if _failure(*done[i]) is not None]
            if not todo or attempt == self.settings.retries:
                break
            for i in todo:
                retried[i] += 1
        episodes = [
            (t, replace(o, counts={**o.counts, "agent_retries": r}) if r else o)
            for (t, o), r in zip(done, retried, strict=True)
        ]
        return [
            _group(episodes[k * params.n : (k + 1) * params.n], version)
            for k in range(len(prompts))
        ]

    def _attempt(
        self,
        generate: Generate,
        examples: list[dict[str, Any]],
        budget: EpisodeBudget,
        version: int,
    ) -> list[tuple[ConversationTokens, AgentOutcome]]:
        """One episode per example, each with a fresh agent; a watchdog ends an episode that
        makes no request and no progress for ``timeout_s`` (``agent_timeouts``)."""
        base_url = self.endpoint.base_url
        keys = [self.endpoint.open_episode(budget) for _ in examples]
        futures = [
            self.launcher.launch(base_url, key, ex) for key, ex in zip(keys, examples, strict=True)
        ]
        for f in futures:
            f.add_done_callback(lambda _: self.endpoint.queue.wake())
        hung: dict[int, AgentOutcome] = {}

        def running() -> int:
            return sum(not f.done() and i not in hung for i, f in enumerate(futures))

        while running():
            batch = self.endpoint.queue.take(running, timeout_s=POLL_S)
            if batch:
                answer(batch, generate, version)
            self._watch(keys, futures, hung)
        self.endpoint.queue.cancel_pending("the episode's agent has ended")
        return [
            (self.endpoint.close_episode(key), hung[i] if i in hung else f.result())
            for i, (key, f) in enumerate(zip(keys, futures, strict=True))
        ]

    def _watch(self, keys: list[str], futures: list[Future], hung: dict[int, AgentOutcome]) -> None:
        limit = self.settings.timeout_s
        for i, (key, f) in enumerate(zip(keys, futures, strict=True)):
            if i in hung or f.done() or self.endpoint.idle_s(key) < limit:
                continue
            f.cancel()  # a program's process is killed; a function is cancelled at its next await
            hung[i] = AgentOutcome(
                failure="agent_timeouts", detail=f"no request and no progress for {limit} s"
            )


def _failure(t: ConversationTokens, outcome: AgentOutcome) -> str | None:
    """Why an episode failed (None: it did not)."""
    if outcome.failure is not None:
        return outcome.failure
    return None if t.calls_made() else "agent_no_calls"


def _group(
    episodes: list[tuple[ConversationTokens, AgentOutcome]], version: int
) -> list[EpisodeCompletion]:
    """A group's episodes after their shared prompt (see the module docstring)."""
    firsts = [t.segments()[0] for t, _ in episodes]
    shared = _shared_prefix([s.ids[: s.prompt_len] for s in firsts])
    return [_completion(t, o, shared, version) for t, o in episodes]


def _shared_prefix(prompts: list[list[int]]) -> list[int]:
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return first[:n]


def _completion(
    t: ConversationTokens, outcome: AgentOutcome, shared: list[int], version: int
) -> EpisodeCompletion:
    """The episode as a completion: its first segment after the group's prompt, its later
    segments (a changed history) as :class:`~zbrl.types.Segment` s of their own."""
    first, *later = t.segments()
    start = len(shared)
    counts = dict(t.counts)
    for name, n in outcome.counts.items():
        counts[name] = counts.get(name, 0) + n
    counts["turns"] = t.calls_made()
    counts["segments"] = 1 + len(later)
    failure = _failure(t, outcome)
    if failure == "agent_no_calls":
        outcome = replace(outcome, detail="the agent never called")
    if failure is not None:
        counts[failure] = counts.get(failure, 0) + 1
        counts["agent_failures"] = 1
    last_segment = later[-1] if later else first
    last = last_segment.calls[-1] if last_segment.calls else None
    versions = first.versions[start:]
    turns = _turns(t, first, start)
    for k, seg in enumerate(later, start=1):
        turns += [{**turn, "segment": k} for turn in _turns(t, seg, seg.prompt_len)]
    if turns:
        turns[-1].setdefault("info", {})["agent"] = (
            {"reward": outcome.reward, "correct": outcome.correct}
            if outcome.reward is not None
            else {"answer": outcome.answer}
            if outcome.answer is not None
            else {"failure": outcome.failure, "detail": outcome.detail}
        )
    return EpisodeCompletion(
        token_ids=torch.tensor(first.ids[start:], dtype=torch.long),
        logprobs=torch.tensor(first.logprobs[start:], dtype=torch.float32),
        text=outcome.answer if outcome.answer is not None else (last["text"] if last else ""),
        finish_reason="length"
        if t.ended or (last and last["finish_reason"] == "length")
        else "stop",
        versions=(
            torch.tensor(versions, dtype=torch.long)
            if any(v != version for v in versions)
            else None
        ),
        loss_mask=torch.tensor(first.mask[start:], dtype=torch.bool),
        turns=turns,
        counts=counts,
        prompt_ids=shared,
        given_reward=outcome.reward,
        env_ans_acc=None if outcome.correct is None else float(outcome.correct),
        failure=None if failure is None else f"{failure}: {outcome.detail}",
        segments=[_segment(seg) for seg in later],
    )


def _segment(seg: TokenSegment) -> Segment:
    p = seg.prompt_len
    return Segment(
        prompt_ids=seg.ids[:p],
        response_ids=torch.tensor(seg.ids[p:], dtype=torch.long),
        behaviour_logprobs=torch.tensor(seg.logprobs[p:], dtype=torch.float32),
        loss_mask=torch.tensor(seg.mask[p:], dtype=torch.bool),
        token_versions=torch.tensor(seg.versions[p:], dtype=torch.long),
    )


def _turns(t: ConversationTokens, seg: TokenSegment, start: int) -> list[dict[str, Any]]:
    """A segment turn by turn after its first ``start`` ids: rendered stretches (``env``,
    untrained) and calls (``model``)."""
    turns: list[dict[str, Any]] = []
    at = start
    for call in seg.calls:
        begin = call["prompt_tokens"]
        end = begin + len(call["completion_ids"])
        if begin > at:
            turns.append(_turn("env", t, seg.ids, at, begin, start, trained=False))
        turns.append(_turn("model", t, seg.ids, begin, end, start, trained=True))
        turns[-1]["policy_version"] = call["version"]
        if call["tool_calls"]:
            turns[-1]["info"] = {"tool_calls": call["tool_calls"]}
        at = end
    return turns


def _turn(
    role: str, t: ConversationTokens, ids: list[int], a: int, b: int, start: int, *, trained: bool
) -> dict[str, Any]:
    text = t.renderer.decode(ids[a:b], skip_special=False)
    return {"role": role, "start": a - start, "end": b - start, "text": text, "trained": trained}
