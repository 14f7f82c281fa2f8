"""OpenEnv environments (environment.type: openenv): zbrl starts the environment's server on
loopback and stops it, plays episodes through OpenEnv's own client on the one episode path
(token-exact, environment turns outside the loss), and drops the group of an episode whose
server died. The environments are in openenv_envs.py (a guessing game with a step budget).

Each test starts a server process, which imports OpenEnv (and through it fastapi, fastmcp and
gradio): seconds of CPU each, so the module is in the slow tier."""

import os

import pytest
from episode_stubs import TOKENIZER, ScriptedBackend, encoded, runner
from pydantic import ValidationError

pytest.importorskip("openenv.core", reason="OpenEnv is not installed: pip install 'zbrl[openenv]'")

from zbrl.config import RunConfig
from zbrl.environments.build import build_environment
from zbrl.errors import RunError
from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.episodes import episode_result

pytestmark = pytest.mark.slow


def section(**fields):
    raw = {"type": "openenv", "server": "openenv_envs:GuessEnv", "message_role": "user"}
    raw.update(reset_fields={"target": "gt_answer"}, max_sessions=8, start_timeout_s=120)
    raw.update(fields)
    return RunConfig.model_validate({"environment": raw}).environment


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def guesser(script):
    """A model that plays ``script``: its n-th turn in an episode is ``script[n]``."""

    def play(context, sample):
        return script[context.count("<|assistant|>") - 1]

    return play


PARAMS = SamplingParams(2, 1.0, 1.0, -1, 20, ())


def test_a_bad_server_value_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match=r"environment\.openenv\.server"):
        section(server="openenv_envs.GuessEnv")
    with pytest.raises(RunError, match=r"environment\.server: cannot import nowhere_mod:Env"):
        build_environment(section(server="nowhere_mod:Env"))
    with pytest.raises(RunError, match=r"environment.server: .*Environment\[MyAction"):
        build_environment(section(server="openenv_envs:Untyped"))
    with pytest.raises(RunError, match=r"environment\.render: cannot import"):
        build_environment(section(render="openenv_envs:no_such_function"))
    with pytest.raises(RunError, match=r"environment\.action_field: 'text' is not a field of "):
        build_environment(section(action_field="text"))
    with pytest.raises(RunError, match=r"GuessAction, the action of .*its fields: .*message"):
        build_environment(section(action_field="text"))


def test_a_server_that_cannot_start_is_an_error_with_its_stderr():
    env = build_environment(section(server="openenv_envs:SingleSessionEnv"))
    with pytest.raises(RunError, match=r"(?s)environment.server: .*cannot serve it.*SUPPORTS_CONC"):
        env.start({"gt_answer": "5"})
    assert gone(env.server.pid)
    env.close()


def test_episodes_are_token_exact_and_the_server_stops_with_close():
    # two sessions at most: the second batch starts only if the first one's sessions were closed
    env = build_environment(section(render="openenv_envs:hint_and_budget", max_sessions=2))
    backend = ScriptedBackend(guesser(["3", "9", "7"]))
    episodes = runner(backend, env, max_turns=4, score_final_turn=False)
    prompt = encoded("Guess", gt="7")
    try:
        groups = [episodes.run(backend.generate, [prompt], PARAMS) for _ in range(2)]
        pid = env.server.pid
        assert pid is not None and not gone(pid)
    finally:
        env.close()
    assert gone(pid)
    for ep in (ep for g in groups for ep in g[0]):
        assert ep.failure is None
        assert [t["text"] for t in ep.turns] == [
            "3",
            "<|user|>higher (2 left)<|end|><|assistant|>",
            "9",
            "<|user|>lower (1 left)<|end|><|assistant|>",
            "7",
        ]
        assert ep.turns[-1]["info"] == {"reward": 1.0, "done": True}
        assert episode_result(ep, None).reward == pytest.approx(1.0 - 0.2)
        # trained: exactly the ids the model generated, each from the context it was given
        ids = ep.token_ids.tolist()
        for turn in ep.turns[0::2]:
            context = prompt.prompt_ids + ids[: turn["start"]]
            assert (context, ids[turn["start"] : turn["end"]]) in backend.generated
        model_ids = [i for t in ep.turns[0::2] for i in ids[t["start"] : t["end"]]]
        assert ep.token_ids[ep.loss_mask].tolist() == model_ids
        # the environment's messages: their text tokenized once, outside the loss
        assert ep.token_ids[~ep.loss_mask].tolist() == TOKENIZER.encode(
            ep.turns[1]["text"] + ep.turns[3]["text"], add_special_tokens=False
        )


def test_a_server_that_dies_mid_episode_fails_the_episode():
    env = build_environment(section())
    backend = ScriptedBackend(guesser(["3", "DIE", "7"]))
    episodes = runner(backend, env, max_turns=4, score_final_turn=False)
    try:
        ((a, b),) = episodes.run(backend.generate, [encoded("Guess", gt="7")], PARAMS)
        pid = env.server.pid
    finally:
        env.close()
    for ep in (a, b):
        assert ep.failure is not None and ep.failure.startswith("openenv_errors")
        assert ep.counts["env_failures"] == 1 and ep.counts["openenv_errors"] == 1
        assert episode_result(ep, None).reward == 0.0
    assert gone(pid)
    # a new episode on the dead server fails at its start, and is dropped the same way
    env2 = build_environment(section())
    env2.server.start()
    os.kill(env2.server.pid, 9)
    env2.server.proc.wait()
    try:
        ((c, _),) = runner(backend, env2, score_final_turn=False).run(
            backend.generate, [encoded("Guess", gt="7")], PARAMS
        )
    finally:
        env2.close()
    assert c.failure is not None and c.counts["openenv_errors"] == 1
