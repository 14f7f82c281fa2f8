"""Episodes run in batches on an inference backend, token-exact.

Every live episode's context is its prompt ids followed by everything appended so far: the ids
the policy generated (kept as generated) and the ids of environment messages (tokenized once by
:class:`~zbrl.environments.turns.TurnFormatter`). The backend is called with those ids — never a
re-rendered conversation — so the sequence trained on is exactly what the policy saw and produced.
The first turn samples G episodes per prompt in one call (sharing the prompt); later turns
continue each live episode with one sample.

An episode's response is everything after the prompt; its loss mask is True on model tokens and
its behaviour log-probs are the sampled ones there (0 on environment tokens, which the mask
excludes). Limits: ``max_turns`` model turns, ``max_total_tokens`` after the prompt (a model turn
is cut at the budget; an environment message that leaves no room ends the episode).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from zbrl.environments.base import Environment, EnvTurn, Episode, stop_strings_of
from zbrl.environments.turns import TurnFormatter
from zbrl.rewards.base import RewardResult
from zbrl.rollout.backends.base import Completion, InferenceBackend, SamplingParams
from zbrl.types import EncodedPrompt

logger = logging.getLogger(__name__)

_STEP_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="zbrl-env-step")
"""Threads that answer the model turns of a batch's episodes at once (environments with
``parallel_steps``: the tools environment when all its tools are ``thread_safe``)."""


@dataclass(frozen=True)
class EpisodeLimitSettings:
    max_turns: int
    max_total_tokens: int


@dataclass
class EpisodeCompletion(Completion):
    """A whole episode as one completion: ``token_ids`` are all tokens after the prompt, ``text``
    is the last model turn (what the run's reward scores)."""

    loss_mask: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))
    """bool [L]: True on tokens the model generated."""
    turns: list[dict[str, Any]] = field(default_factory=list)
    """Per turn: ``role`` (model / env), ``start``/``end`` (token span in the response),
    ``text``, ``trained``; model turns have ``policy_version``, environment turns ``info``."""
    turn_reward: float = 0.0
    """Sum of the environment's per-turn rewards."""
    env_ans_acc: float | None = None
    """The environment's judgement of the episode, if it gave one."""
    counts: dict[str, int] = field(default_factory=dict)
    """Events (``turns``, ``tool_calls``, ``tool_errors``, ``turn_limit``, ``token_limit``, ...)."""
    transcript: str = ""
    """The response decoded with special tokens (for the rollout log)."""


@dataclass
class _Live:
    prompt_ids: list[int]
    episode: Episode | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    reward: float = 0.0
    ans_acc: float | None = None
    last_text: str = ""
    done: bool = False
    truncated: bool = False

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


class EpisodeRunner:
    """Runs episodes of ``environment`` with ``backend`` (see the module docstring)."""

    def __init__(
        self,
        backend: InferenceBackend,
        environment: Environment,
        formatter: TurnFormatter,
        limits: EpisodeLimitSettings,
        *,
        score_final_turn: bool = True,
    ) -> None:
        """``score_final_turn``: the run's reward scores each episode's last model turn (see
        :func:`episode_result`); False: the environment's turn rewards alone."""
        self.score_final_turn = score_final_turn
        self.backend = backend
        self.environment = environment
        self.formatter = formatter
        self.limits = limits
        self.extra_stops = stop_strings_of(environment)

    def run(
        self, prompts: list[EncodedPrompt], params: SamplingParams, version: int = 0
    ) -> list[list[EpisodeCompletion]]:
        """``params.n`` episodes per prompt; the turns are tagged with ``version``."""
        if not prompts:
            return []
        turn_params = replace(
            params,
            max_new_tokens=min(params.max_new_tokens, self.limits.max_total_tokens),
            stop_strings=tuple(dict.fromkeys(params.stop_strings + self.extra_stops)),
        )
        groups = [
            [_Live(list(p.prompt_ids), self._start(p.example)) for _ in range(params.n)]
            for p in prompts
        ]
        first = self.backend.generate([p.prompt_ids for p in prompts], turn_params)
        self._turns(
            [(s, c) for g, comps in zip(groups, first, strict=True) for s, c in zip(g, comps)],
            version,
        )
        single = replace(turn_params, n=1)
        while live := [s for g in groups for s in g if not s.done]:
            room = max(self.limits.max_total_tokens - len(s.ids) for s in live)
            budget = replace(single, max_new_tokens=max(1, min(single.max_new_tokens, room)))
            comps = self.backend.generate([s.prompt_ids + s.ids for s in live], budget)
            self._turns([(s, c[0]) for s, c in zip(live, comps, strict=True)], version)
        return [[self._completion(s) for s in g] for g in groups]

    def _turns(self, pairs: list[tuple[_Live, Completion]], version: int) -> None:
        """Append each episode's model turn, let the environment answer every episode that goes
        on (in parallel threads when it says its episodes may step concurrently), append the
        answers."""
        waiting = []
        for s, c in pairs:
            ids = self._model_turn(s, c, version)
            if ids is not None:
                waiting.append((s, ids))
        states = [s for s, _ in waiting]
        if getattr(self.environment, "parallel_steps", False) and len(states) > 1:
            answers = list(_STEP_POOL.map(self._step, states))
        else:
            answers = [self._step(s) for s in states]
        for (s, ids), turn in zip(waiting, answers, strict=True):
            self._environment_turn(s, ids, turn)

    def _start(self, example: dict[str, Any]) -> Episode | None:
        try:
            return self.environment.start(example)
        except Exception:
            logger.exception("environment.start failed; the episode ends after its first turn")
            return None

    def _model_turn(self, s: _Live, c: Completion, version: int) -> list[int] | None:
        """Append a model turn; its ids when the environment is to answer it, None when the
        episode ends with it (cut at a limit, or generation ran out of budget)."""
        room = self.limits.max_total_tokens - len(s.ids)
        ids = c.token_ids.tolist()[:room]
        cut = len(ids) < int(c.token_ids.numel())
        start = len(s.ids)
        s.ids += ids
        s.logprobs += c.logprobs.tolist()[: len(ids)]
        s.mask += [True] * len(ids)
        s.last_text = c.text if not cut else self._decode(ids, skip=True)
        s.count("turns")
        s.turns.append(
            {
                "role": "model",
                "start": start,
                "end": len(s.ids),
                "text": s.last_text,
                "trained": True,
                "policy_version": version,
            }
        )
        if cut or c.finish_reason == "length":
            if cut or len(s.ids) >= self.limits.max_total_tokens:
                s.count("token_limit")
            s.done = s.truncated = True
            return None
        return ids

    def _environment_turn(self, s: _Live, ids: list[int], turn: EnvTurn) -> None:
        """The environment's answer ``turn`` to the model turn ``ids``: counted, and appended
        unless the episode ends here."""
        s.reward += turn.reward
        if turn.ans_acc is not None:
            s.ans_acc = turn.ans_acc
        for name, n in turn.counts.items():
            s.count(name, n)
        if turn.info:  # what the environment did with this turn (tool calls and results)
            s.turns[-1]["info"] = turn.info
        if turn.message is None:
            s.done = True
            return
        if s.counts["turns"] >= self.limits.max_turns:
            s.count("turn_limit")
            s.done = True
            return
        env_ids, env_text = self.formatter.environment_ids(ids, turn.message)
        if len(s.ids) + len(env_ids) >= self.limits.max_total_tokens:
            s.count("token_limit")
            s.done = s.truncated = True
            return
        s.turns[-1].pop("info", None)  # shown with the environment's turn instead
        start = len(s.ids)
        s.ids += env_ids
        s.logprobs += [0.0] * len(env_ids)
        s.mask += [False] * len(env_ids)
        s.turns.append(
            {
                "role": "env",
                "start": start,
                "end": len(s.ids),
                "text": env_text,
                "trained": False,
                "info": turn.info,
            }
        )

    def _step(self, s: _Live) -> EnvTurn:
        if s.episode is None:
            s.count("env_errors")
            return EnvTurn(message=None)
        try:
            return s.episode.step(s.last_text)
        except Exception as e:  # a failing environment ends its episode, never the producer
            logger.warning("environment step failed: %s: %s", type(e).__name__, e)
            s.count("env_errors")
            return EnvTurn(message=None, info={"error": f"{type(e).__name__}: {e}"})

    def _decode(self, ids: list[int], *, skip: bool) -> str:
        return self.formatter.tokenizer.decode(ids, skip_special_tokens=skip)

    def _completion(self, s: _Live) -> EpisodeCompletion:
        return EpisodeCompletion(
            token_ids=torch.tensor(s.ids, dtype=torch.long),
            logprobs=torch.tensor(s.logprobs, dtype=torch.float32),
            text=s.last_text,
            finish_reason="length" if s.truncated else "stop",
            loss_mask=torch.tensor(s.mask, dtype=torch.bool),
            turns=s.turns,
            turn_reward=s.reward,
            env_ans_acc=s.ans_acc,
            counts=s.counts,
            transcript=self._decode(s.ids, skip=False),
        )


def episode_result(c: EpisodeCompletion, scored: RewardResult | None) -> RewardResult:
    """The episode's reward: the run's reward of the final turn (``scored``; None when the
    environment alone rewards) plus the environment's turn rewards."""
    if scored is None:
        acc = c.env_ans_acc if c.env_ans_acc is not None else float(c.turn_reward > 0)
        return RewardResult(reward=c.turn_reward, format_acc=1.0, ans_acc=acc)
    if c.turn_reward == 0.0:
        return scored
    return replace(scored, reward=scored.reward + c.turn_reward)


def sum_counts(completions: list[EpisodeCompletion]) -> dict[str, float]:
    """Events of a group's episodes added up (``env/<name>`` metrics per group)."""
    out: dict[str, float] = {}
    for c in completions:
        for name, n in c.counts.items():
            out[name] = out.get(name, 0.0) + n
    return out
