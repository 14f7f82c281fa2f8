"""An environment whose episode cannot go on (EpisodeFailure from ``start`` or ``step``: a server
that died or timed out) fails that episode: counted, ended, and its group dropped by the
producer, never trained on a made-up score; an ordinary exception only ends the episode. Every
episode with ``close()`` is closed once, however it ended. No OpenEnv needed: the environment
here is a stub (tests/unit/test_openenv_env.py plays a real OpenEnv server)."""

import pytest
from episode_stubs import ScriptedBackend, encoded, runner
from pydantic import ValidationError

from zbrl.config import RunConfig
from zbrl.environments import EnvTurn, EpisodeFailure
from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.episodes import episode_result

PARAMS = SamplingParams(3, 1.0, 1.0, -1, 20, ())


class Scripted:
    """Episode ``i`` of each batch: 0 goes on for two turns, 1 fails at its first step, 2 fails
    at its start; a turn saying ``boom`` raises an ordinary error."""

    def __init__(self):
        self.started = 0
        self.closed = []

    def start(self, example):
        i = self.started % 3
        self.started += 1
        if i == 2:
            raise EpisodeFailure("openenv_errors", "connection refused")
        return ScriptedEpisode(self, i)


class ScriptedEpisode:
    def __init__(self, env, i):
        self.env, self.i, self.turns = env, i, 0

    def step(self, text):
        self.turns += 1
        if self.i == 1:
            raise EpisodeFailure("openenv_timeouts", "no answer within 1 s")
        if text == "boom":
            raise RuntimeError("boom")
        if self.turns == 2:
            return EnvTurn(message=None, reward=1.0)
        return EnvTurn(message="again", reward=0.0)

    def close(self):
        self.env.closed.append(self.i)


def test_failed_episodes_are_marked_counted_and_closed():
    env = Scripted()
    backend = ScriptedBackend(lambda context, sample: "7")
    ((ok, timed_out, refused),) = runner(backend, env, score_final_turn=False).run(
        backend.generate, [encoded("q")], PARAMS
    )
    assert ok.failure is None and ok.counts["turns"] == 2
    assert episode_result(ok, None).reward == 1.0
    assert timed_out.failure == "openenv_timeouts: no answer within 1 s"
    assert timed_out.counts == {"turns": 1, "openenv_timeouts": 1, "env_failures": 1}
    assert refused.failure == "openenv_errors: connection refused"
    assert refused.counts == {"openenv_errors": 1, "env_failures": 1, "turns": 1}
    for failed in (timed_out, refused):
        assert episode_result(failed, None).reward == 0.0
    assert sorted(env.closed) == [0, 1]  # once each; the refused one never opened


def test_an_ordinary_error_ends_the_episode_without_failing_it():
    env = Scripted()
    backend = ScriptedBackend(lambda context, sample: "boom")
    ((ep, _, _),) = runner(backend, env).run(backend.generate, [encoded("q")], PARAMS)
    assert ep.failure is None and ep.counts["env_errors"] == 1 and env.closed.count(0) == 1


def test_the_openenv_section_names_its_fields():
    raw = {"type": "openenv", "server": "my_env:GuessEnv", "reset_fields": {"target": "gt_answer"}}
    env = RunConfig.model_validate({"environment": raw}).environment
    assert env.type == "openenv" and env.score_final_turn is False and env.action_field == "message"
    with pytest.raises(ValidationError, match=r"environment\.openenv\.server"):
        RunConfig.model_validate({"environment": {**raw, "server": "my_env.GuessEnv"}})
    with pytest.raises(ValidationError, match=r"environment\.openenv\.render"):
        RunConfig.model_validate({"environment": {**raw, "render": "nocolon"}})
    with pytest.raises(ValidationError, match=r"environment\.openenv\.max_sessions"):
        RunConfig.model_validate({"environment": {**raw, "max_sessions": 0}})
