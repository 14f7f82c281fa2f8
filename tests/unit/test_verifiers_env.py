"""``environment.type: verifiers``: a verifiers environment (the taskset of vf_arith.py, played
by zbrl's in-process ChatHarness) runs each episode through the endpoint with verifiers' own
episode code; the task's reward reaches the group; the trained tokens are the endpoint's; a
failed verifiers episode is counted and never scored.

The tests that load the environment are in the slow tier: importing verifiers alone takes 6-13 s
on the 2-core machine."""

import asyncio
import os

import pytest
from episode_stubs import EOS, TOKENIZER, ScriptedBackend, encoded
from role_settings import sampling_params
from test_agent_episodes import LastNumber, agent_runner

from zbrl.config.environments import VerifiersEnvironment
from zbrl.errors import RunError
from zbrl.rollout.agents.build import build_agent
from zbrl.rollout.endpoint.server import Endpoint

pytest.importorskip("verifiers")
needs_verifiers = pytest.mark.slow


def verifiers_agent(**overrides):
    return build_agent(VerifiersEnvironment(**{"taskset": "vf_arith", **overrides}))


def sum_of(context, sample):
    """Answers the question's sum."""
    question = context.split("What is ")[1].split("?")[0]
    a, b = question.split("+")
    return f"<answer>{int(a) + int(b)}</answer>"


@needs_verifiers
def test_verifiers_rewards_reach_the_group_on_the_endpoint_tokens():
    backend = ScriptedBackend(sum_of)
    agent = verifiers_agent()
    runner = agent_runner(agent)
    prompts = [
        encoded("What is 12+30?", uid="a", gt="42"),
        encoded("What is 7+8?", uid="b", gt="16"),
    ]
    groups = runner.run(backend.generate, prompts, sampling_params(n=2, max_new_tokens=20))
    # the task's reward: right on a (its answer is the sum), wrong on b
    assert [[c.given_reward for c in group] for group in groups] == [[1.0, 1.0], [0.0, 0.0]]
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            assert c.failure is None and c.prompt_ids == prompt.prompt_ids
            (turn,) = c.turns
            ids = c.token_ids.tolist()
            assert turn["role"] == "model" and (prompt.prompt_ids, ids) in backend.generated
            assert c.loss_mask.all() and len(ids) == len(c.loss_mask)
    scored = runner.score(LastNumber(), [p.example for p in prompts], groups)
    assert [[r.reward for r in results] for _, results in scored] == [[1.0, 1.0], [0.0, 0.0]]
    asyncio.run(agent.aclose())


@needs_verifiers
def test_a_failed_verifiers_episode_is_counted_and_never_scored():
    backend = ScriptedBackend(sum_of)
    runner = agent_runner(verifiers_agent())
    prompt = [encoded("What is 2+3?", gt="raise")]  # the task's reward raises
    (group,) = runner.run(backend.generate, prompt, sampling_params(n=2, max_new_tokens=20))
    assert all(c.failure.startswith("agent_crashes") for c in group), [c.failure for c in group]
    assert all("the grader is broken" in c.failure for c in group)
    assert all(c.counts["agent_crashes"] == 1 for c in group)
    ((_, results),) = runner.score(LastNumber(), [prompt[0].example], [group])
    assert [r.reward for r in results] == [0.0, 0.0]


@needs_verifiers
def test_the_sample_fields_map_onto_the_task_data():
    agent = verifiers_agent(fields={"answer": "gt_answer", "name": "uid"})
    task = agent.task(
        {"messages": [{"role": "user", "content": "What is 1+2?"}], "gt_answer": "3", "uid": "q7"}
    )
    assert (task.data.answer, task.data.name) == ("3", "q7")
    assert task.data.prompt[0].content == "What is 1+2?"
    with pytest.raises(KeyError, match="no gt_answer"):
        agent.task({"messages": []})


@needs_verifiers
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"fields": {"solution": "gt_answer"}},
            "environment.fields: solution not a field of ArithData",
        ),
        (
            {"taskset": "no_such_taskset"},
            "cannot load the verifiers environment of taskset 'no_such_taskset'",
        ),
        ({"taskset": "missing/file.py"}, "environment.taskset: no file missing/file.py"),
    ],
)
def test_a_bad_verifiers_environment_is_refused_naming_the_field(overrides, message):
    with pytest.raises(RunError, match=message):
        verifiers_agent(**overrides)


@needs_verifiers
def test_embedded_model_verifiers_episodes_are_the_generated_tokens(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    backend = TransformersBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir), TOKENIZER)
    calls = []

    def generate(contexts, params):
        out = backend.generate(contexts, params)
        calls.extend((ctx, c[0].token_ids.tolist()) for ctx, c in zip(contexts, out, strict=True))
        return out

    runner = agent_runner(verifiers_agent(), eos_ids=frozenset({EOS}))
    prompts = [
        encoded("What is 12+30?", uid="a", gt="42"),
        encoded("What is 7+8?", uid="b", gt="15"),
    ]
    groups = runner.run(generate, prompts, sampling_params(n=2, max_new_tokens=8))
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            assert c.failure is None and c.prompt_ids == prompt.prompt_ids
            assert c.given_reward in (0.0, 1.0)
            assert (prompt.prompt_ids, c.token_ids.tolist()) in calls  # exactly as generated
            assert c.loss_mask.all() and c.logprobs.lt(0).all()


@needs_verifiers
def test_dotted_module_ids_load_from_the_working_directory(tmp_path, monkeypatch):
    """verifiers' own loader refuses a dotted module id; zbrl imports it (here a package in the
    working directory, and zbrl's harness module by its dotted name) and the episode runs."""
    package = tmp_path / "vfpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "addition.py").write_text(
        "from vf_arith import ArithTaskset\n__all__ = ['ArithTaskset']\n"
    )
    monkeypatch.chdir(tmp_path)
    agent = verifiers_agent(
        taskset="vfpkg.addition", harness="zbrl.rollout.agents.verifiers_harness"
    )
    assert type(agent.env.taskset).__name__ == "ArithTaskset"
    backend = ScriptedBackend(sum_of)
    prompts = [encoded("What is 12+30?", uid="a", gt="42")]
    (group,) = agent_runner(agent).run(backend.generate, prompts, sampling_params(n=1))
    assert [(c.failure, c.given_reward) for c in group] == [(None, 1.0)]
    with pytest.raises(RunError, match=r"environment.taskset: cannot import 'vfpkg.nope' "):
        verifiers_agent(taskset="vfpkg.nope")
    asyncio.run(agent.aclose())


@needs_verifiers
def test_concurrent_episodes_are_named_by_their_own_keys_and_leave_nothing_behind(monkeypatch):
    """Each episode's requests reach the endpoint under its own key (the X-Zbrl-Episode header
    the harness sends), no key is ever in the process's environment, and verifiers' one client
    serves every episode: a second round of episodes opens no more files (sockets)."""
    opened, asked = [], []
    open_episode, handle = Endpoint.open_episode, Endpoint.handle

    def recording_open(self, budget):
        opened.append(open_episode(self, budget))
        return opened[-1]

    def recording_handle(self, path, key, body):
        asked.append((key, body["messages"][-1]["content"]))
        return handle(self, path, key, body)

    monkeypatch.setattr(Endpoint, "open_episode", recording_open)
    monkeypatch.setattr(Endpoint, "handle", recording_handle)
    backend = ScriptedBackend(sum_of)
    in_environment = []

    def generate(contexts, params):
        in_environment.append([k for k in os.environ.values() if k in opened])
        return backend.generate(contexts, params)

    runner = agent_runner(verifiers_agent())
    files = []
    for _ in range(2):
        prompts = [encoded(f"What is {i}+5?", uid=str(i), gt=str(i + 5)) for i in range(4)]
        groups = runner.run(generate, prompts, sampling_params(n=2, max_new_tokens=20))
        for prompt, group in zip(prompts, groups, strict=True):
            for c in group:
                assert c.failure is None and c.prompt_ids == prompt.prompt_ids
                assert c.given_reward == 1.0 and c.counts["turns"] == 1
        files.append(len(os.listdir("/proc/self/fd")))
    # 16 episodes, one request each, each under its own key, asking its own question
    assert sorted(key for key, _ in asked) == sorted(opened) and len(set(opened)) == 16
    for i, key in enumerate(opened):
        assert dict(asked)[key] == f"What is {i % 8 // 2}+5?"
    assert in_environment == [[], []]  # two batches of 8 concurrent calls; no key in os.environ
    # a client (and a connection) per episode would add 2 open files per episode: 16 here
    assert files[1] - files[0] < 8, files
