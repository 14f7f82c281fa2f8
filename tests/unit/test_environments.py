"""The environment section, building environments and tools (built-in and by import path), the
chat-template checks, the episode's reward, and what episodes put in the logs and metrics."""

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from episode_stubs import TOKENIZER
from pydantic import ValidationError

from zbrl.config import RunConfig
from zbrl.config.environments import CalculatorTool, PythonTool, ToolsEnvironment
from zbrl.environments.build import build_environment
from zbrl.environments.tool_env import ToolEnvironment
from zbrl.environments.tools import Calculator, SandboxedPython
from zbrl.errors import RunError
from zbrl.rewards.base import RewardResult
from zbrl.rollout.episodes import EpisodeCompletion, episode_result
from zbrl.rollout.transcripts import sum_counts
from zbrl.rollout.turns import TurnFormatter
from zbrl.training.consumer import _env_metrics, _episode_fields
from zbrl.types import RolloutGroup


def cfg(environment):
    return RunConfig.model_validate({"environment": environment})


def test_no_environment_is_single_turn_and_shorthands_expand():
    assert RunConfig().environment is None
    env = cfg("tools").environment
    assert isinstance(env, ToolsEnvironment) and env.tools == [CalculatorTool()]
    env = cfg({"call_format": "tags", "tools": ["calculator", {"type": "python"}]}).environment
    assert env.type == "tools" and isinstance(env.tools[1], PythonTool)
    assert env.limits.max_turns == 4 and env.message_role == "tool"


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"type": "tools", "options": {}}, "environment.tools.options"),
        ({"type": "tools", "tools": []}, "at least 1 item"),
        ({"type": "tools", "tools": [{"type": "python", "tag": "a b"}]}, "pattern"),
        ({"type": "tools", "limits": {"max_turns": 0}}, "greater than or equal to 1"),
        ({"type": "gym"}, "gym"),
    ],
)
def test_bad_sections_are_refused_by_name(environment, message):
    with pytest.raises(ValidationError, match=message):
        cfg(environment)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_env_mod.py").write_text(
        textwrap.dedent(
            """
            from zbrl.environments import EnvTurn

            class Guess:
                def __init__(self, secret=7):
                    self.secret = secret

                def start(self, example):
                    return GuessEpisode(self.secret)

            class GuessEpisode:
                def __init__(self, secret):
                    self.secret = secret

                def step(self, text):
                    if text.strip() == str(self.secret):
                        return EnvTurn(message=None, reward=1.0, ans_acc=1.0)
                    return EnvTurn(message="higher", reward=-0.1)

            class Shout:
                name, tag, argument = "shout", "shout", "text"
                description = "Upper-cases the text."
                parameters = {"type": "object", "properties": {"text": {"type": "string"}}}

                def call(self, arguments):
                    return arguments["text"].upper()

            class NotATool:
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_env_mod"
    sys.modules.pop("my_env_mod", None)


def test_user_environment_and_tool_by_import_path(user_module):
    env = build_environment(
        cfg({"type": f"{user_module}:Guess", "options": {"secret": 3}}).environment
    )
    episode = env.start({})
    assert episode.step("1").message == "higher"
    assert episode.step("3").ans_acc == 1.0
    tools = build_environment(
        cfg({"tools": [{"type": f"{user_module}:Shout"}], "call_format": "tags"}).environment
    )
    assert tools.start({}).step("<shout>hi</shout>").message == "HI"


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"type": "nowhere_mod:Env"}, "cannot import nowhere_mod:Env"),
        ({"type": "{m}:Guess", "options": {"colour": 1}}, "environment.options do not fit"),
        ({"type": "{m}:NotATool"}, "no start\\(example\\) method"),
        ({"tools": [{"type": "{m}:NotATool"}]}, "lacks name, description, parameters, tag"),
        ({"tools": ["calculator", {"type": "calculator"}]}, "two tools share a name"),
    ],
)
def test_build_errors_name_the_field(user_module, environment, message):
    raw = {
        k: (v.format(m=user_module) if isinstance(v, str) else v) for k, v in environment.items()
    }
    if "tools" in raw:
        raw["tools"] = [
            {**t, "type": t["type"].format(m=user_module)} if isinstance(t, dict) else t
            for t in raw["tools"]
        ]
    with pytest.raises(RunError, match=message):
        build_environment(cfg(raw).environment)


def test_built_in_tools_get_the_limits():
    env = build_environment(
        cfg(
            {
                "tools": ["calculator", {"type": "python", "memory_mb": 128}],
                "limits": {"tool_timeout_s": 2},
            }
        ).environment
    )
    assert isinstance(env, ToolEnvironment)
    calc, python = env.tools["calculator"], env.tools["python"]
    assert isinstance(calc, Calculator) and isinstance(python, SandboxedPython)
    assert (python.timeout_s, python.memory_mb) == (2.0, 128)


def test_formatter_refuses_a_role_the_template_does_not_know():
    with pytest.raises(RunError, match=r"set environment\.message_role"):
        TurnFormatter(TOKENIZER, "tool", eos_ids={TOKENIZER.eos_token_id})


def test_formatter_refuses_a_template_that_rewrites_earlier_turns():
    class Rewriting:
        """Drops every assistant message but the last (as some reasoning templates do)."""

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
            kept = [m for i, m in enumerate(messages) if m["role"] != "assistant" or i == last]
            if messages[-1]["role"] != "assistant":
                kept = [m for m in kept if m["role"] != "assistant"]
            return "".join(f"[{m['role']}]{m['content']}" for m in kept)

    with pytest.raises(RunError, match="not prefix-preserving"):
        TurnFormatter(Rewriting(), "user", eos_ids=set())


def episode(**kw):
    base = dict(token_ids=torch.zeros(3, dtype=torch.long), logprobs=torch.zeros(3), text="t")
    return EpisodeCompletion(**base, finish_reason="stop", **kw)


def test_episode_reward_adds_the_environments_turn_rewards():
    scored = RewardResult(reward=1.0, format_acc=1.0, ans_acc=1.0)
    assert episode_result(episode(turn_reward=-0.25), scored).reward == 0.75
    assert episode_result(episode(), scored) is scored
    alone = episode_result(episode(turn_reward=0.5, env_ans_acc=0.0), None)
    assert (alone.reward, alone.ans_acc) == (0.5, 0.0)
    assert episode_result(episode(turn_reward=0.5), None).ans_acc == 1.0
    counts = sum_counts(
        [episode(counts={"turns": 2, "tool_calls": 1}), episode(counts={"turns": 1})]
    )
    assert counts == {"turns": 3.0, "tool_calls": 1.0}


def test_rollout_log_and_metrics_of_episodes():
    turns = [
        {"role": "model", "start": 0, "end": 2, "text": "<calc>", "trained": True},
        {"role": "env", "start": 2, "end": 4, "text": "6", "trained": False},
    ]
    group = RolloutGroup(
        uid="u",
        prompt_ids=[1],
        response_ids=[torch.arange(4), torch.arange(2)],
        behaviour_logprobs=[torch.zeros(4), torch.zeros(2)],
        rewards=[1.0, 0.0],
        format_acc=[1.0, 1.0],
        ans_acc=[1.0, 0.0],
        truncated=[False, False],
        policy_version=0,
        temperature=1.0,
        producer=0,
        loss_masks=[torch.tensor([True, True, False, False]), torch.tensor([True, True])],
        episodes=[turns, turns[:1]],
        env_counts={"turns": 3.0, "tool_calls": 1.0},
    )
    fields = _episode_fields(group)
    assert fields["trained_tokens"] == [2, 2] and fields["response_tokens"] == [4, 2]
    assert fields["turns"][0][1]["trained"] is False
    assert _env_metrics([group], 2) == {"env/tool_calls": 0.5, "env/turns": 1.5}
    single = RolloutGroup(
        **{**group.__dict__, "loss_masks": None, "episodes": None, "env_counts": {}}
    )
    assert _episode_fields(single) == {} and _env_metrics([single], 2) == {}


def test_the_documented_custom_environment_runs(tmp_path, monkeypatch):
    """docs/environments.md's example, copied into a module as a user would, plays a game."""
    from episode_stubs import ScriptedBackend, encoded, runner

    from zbrl.rollout.backends.base import SamplingParams
    from zbrl.rollout.episodes import episode_result

    doc = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    code = doc.split("## A custom environment", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_envs_doc.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = cfg(
        {
            "type": "my_envs_doc:GuessTheNumber",
            "options": {"wrong_guess_reward": -0.05},
            "message_role": "user",
            "score_final_turn": False,
        }
    ).environment
    guesses = {"": "50", "higher": "75", "higherlower": "hmm", "higherlowerGuess a number.": "60"}

    def play(context, sample):
        hints = "".join(part.split("<|end|>")[0] for part in context.split("<|user|>")[2:])
        return guesses.get(hints, "62")

    backend = ScriptedBackend(play)
    episodes = runner(backend, build_environment(config), max_turns=6)
    params = SamplingParams(1, 1.0, 1.0, -1, 20, ())
    ((ep,),) = episodes.run(backend.generate, [encoded("Guess", gt="62")], params)
    model_turns = [t["text"] for t in ep.turns if t["role"] == "model"]
    assert model_turns == ["50", "75", "hmm", "60", "62"]
    assert [t.get("info", {}).get("guess") for t in ep.turns][1::2] == [50, 75, None, 60]
    assert ep.turns[-1]["info"] == {"guess": 62} and ep.counts["no_guess"] == 1
    result = episode_result(ep, None)
    assert result.reward == pytest.approx(1.0 - 4 * 0.05) and result.ans_acc == 1.0
    sys.modules.pop("my_envs_doc", None)


def test_the_documented_custom_tool_runs(tmp_path, monkeypatch):
    doc = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    section = doc.split("A custom tool for the `tools` environment", 1)[1]
    (tmp_path / "my_tools_doc.py").write_text(section.split("```python\n", 1)[1].split("```")[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    env = build_environment(
        cfg(
            {
                "call_format": "tags",
                "tools": [
                    "calculator",
                    {"type": "my_tools_doc:WordCount", "options": {"tag": "words"}},
                ],
            }
        ).environment
    )
    turn = env.start({}).step("<words>one two three</words><calc>2+2</calc>")
    assert turn.message == "3\n4" and turn.counts == {"tool_calls": 2}
    sys.modules.pop("my_tools_doc", None)


def test_a_python_tool_asking_for_bwrap_where_it_does_not_work_is_refused_when_built(monkeypatch):
    import zbrl.sandbox.bubblewrap as bubblewrap

    broken = bubblewrap.BwrapProbe(path=None, error="bwrap is not installed")
    monkeypatch.setattr(bubblewrap, "probe_bwrap", lambda: broken)
    with pytest.raises(RunError, match=r"python tool 'python' has backend=bwrap.*not installed"):
        build_environment(cfg({"tools": [{"type": "python", "backend": "bwrap"}]}).environment)
    env = build_environment(cfg({"tools": [{"type": "python", "backend": "auto"}]}).environment)
    assert env.tools["python"].backend == "auto"  # auto falls back when it runs, as the reward does
