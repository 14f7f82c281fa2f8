"""Token-exact episodes with SmolLM2-135M-Instruct's real ChatML template and tokenizer (BPE, a
default system message, ``<|im_end|>\\n`` between turns): the ids trained are, turn by turn, the
ids generated and the tool messages' ids appended once; the model's own log-probs of the trained
sequence are the ones it sampled with."""

import json
import sys
from pathlib import Path

import pytest
import torch

from zbrl.config import load_config
from zbrl.environments.base import EnvTurn
from zbrl.environments.tool_env import ToolEnvironment, ToolSettings
from zbrl.environments.tools import Calculator, SandboxedPython
from zbrl.models import catalogue
from zbrl.rollout.backends.base import Completion, SamplingParams
from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
from zbrl.rollout.transcripts import ChatTranscript
from zbrl.rollout.turns import TurnFormatter
from zbrl.types import EncodedPrompt

pytestmark = pytest.mark.realmodel

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "zbrl"
sys.path.insert(0, str(REPO / "tests" / "unit"))


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return catalogue.pull("smollm2-135m", CACHE)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def params(n, max_new_tokens=48):
    return SamplingParams(
        n=n, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=max_new_tokens, stop_strings=()
    )


def prompt(tokenizer, question):
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return EncodedPrompt("q", list(ids), {"messages": messages, "gt_answer": "0"})


class Scripted:
    """Model turns from a list, in order (BPE-encoded, ``<|im_end|>`` appended); every context
    and the ids generated from it are recorded."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns = tokenizer, turns
        self.eos_ids = {tokenizer.eos_token_id}
        self.generated = []

    def generate(self, prompts, p):
        out = []
        for context in prompts:
            text = self.turns[len(self.generated)]
            ids = [
                *self.tokenizer.encode(text, add_special_tokens=False),
                self.tokenizer.eos_token_id,
            ]
            self.generated.append((list(context), ids))
            logprobs = torch.full((len(ids),), -0.5)
            out.append([Completion(torch.tensor(ids), logprobs, text, "stop")])
        return out


def test_chatml_episode_is_token_exact_and_renders_as_the_template(tokenizer):
    calls = [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347*628"}}\n</tool_call>',
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7 + 1)"}}\n</tool_call>',
        "The product is 217916.",
    ]
    backend = Scripted(tokenizer, calls)
    env = ToolEnvironment(
        [Calculator(), SandboxedPython(timeout_s=5.0, memory_mb=256, backend="rlimits")],
        ToolSettings("hermes", "reply", 200, 5.0, False),
    )
    runner = EpisodeRunner(
        env,
        ChatTranscript(TurnFormatter(tokenizer, "tool", eos_ids=backend.eos_ids)),
        EpisodeLimitSettings(max_turns=4, max_total_tokens=400),
    )
    p = prompt(tokenizer, "What is 347*628?")
    ((episode,),) = runner.run(backend.generate, [p], params(1))
    response = episode.token_ids.tolist()
    for turn in episode.turns:
        span = response[turn["start"] : turn["end"]]
        if turn["role"] == "model":
            assert (p.prompt_ids + response[: turn["start"]], span) in backend.generated
        else:
            assert tokenizer.encode(turn["text"], add_special_tokens=False) == span
    assert [t["role"] for t in episode.turns] == ["model", "env", "model", "env", "model"]
    assert episode.turns[1]["text"] == (
        "\n<|im_start|>tool\n<tool_response>\n217916\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert "<tool_response>\n43\n</tool_response>" in episode.turns[3]["text"]
    assert int(episode.loss_mask.sum()) == sum(len(ids) for _, ids in backend.generated)
    # the trained text is what the chat template writes for the whole conversation
    messages = [
        {"role": "user", "content": "What is 347*628?"},
        {"role": "assistant", "content": calls[0]},
        {"role": "tool", "content": "<tool_response>\n217916\n</tool_response>"},
        {"role": "assistant", "content": calls[1]},
        {"role": "tool", "content": "<tool_response>\n43\n</tool_response>"},
        {"role": "assistant", "content": calls[2]},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    trained = tokenizer.decode(p.prompt_ids + response, skip_special_tokens=False)
    assert rendered == trained + "\n"  # the template's last "\n" follows the final EOS


def test_smollm2_samples_episodes_whose_trained_logprobs_match(smollm2_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    class Nudge:
        def start(self, example):
            return self

        def step(self, text):
            return EnvTurn(message="Are you sure? Answer again with one number.")

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    backend = TransformersBackend(model, tokenizer)
    runner = EpisodeRunner(
        Nudge(),
        ChatTranscript(TurnFormatter(tokenizer, "user", eos_ids=backend.eos_ids)),
        EpisodeLimitSettings(max_turns=2, max_total_tokens=160),
    )
    p = prompt(tokenizer, "What is 2+3? Answer with one number.")
    (episodes,) = runner.run(backend.generate, [p], params(2, max_new_tokens=24))
    for ep in episodes:
        sequence = torch.tensor([p.prompt_ids + ep.token_ids.tolist()])
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, -1).gather(1, sequence[0, 1:, None])[:, 0]
        response = logprobs[len(p.prompt_ids) - 1 :]
        torch.testing.assert_close(
            response[ep.loss_mask], ep.logprobs[ep.loss_mask], atol=1e-3, rtol=0
        )
    assert any(ep.counts["turns"] == 2 for ep in episodes)


def test_python_tool_recipe_validates_and_runs_two_steps(smollm2_dir, tmp_path):
    from zbrl.launch.driver import run_training

    cfg = load_config(
        str(REPO / "recipes" / "smollm2_python_tool_cpu.yaml"),
        [
            f"logging.cache_dir={CACHE}",
            f"logging.run_dir={tmp_path / 'run'}",
            "logging.progress=false",
            "training.max_steps=2",
            "logging.log_rollout_interval=1",
            "eval.sets={}",
        ],
    )
    summary = run_training(cfg)
    assert summary["steps"] == 2
    rollouts = (Path(summary["run_dir"]) / "rollouts.jsonl").read_text()
    assert '"turns"' in rollouts and '"trained_tokens"' in rollouts
    # the model is told about its tool: SmolLM2's template renders no tools, so the python
    # tool's name, description and call format are in the system prompt of every logged prompt
    records = [json.loads(line) for line in rollouts.splitlines()]
    prompts = [r["prompt"] for r in records if "prompt" in r]
    assert prompts
    for text in prompts:
        assert SandboxedPython.DESCRIPTION in text and "- python:" in text
        assert '<tool_call>{"name": "TOOL_NAME"' in text


def test_smollm2_prompts_describe_each_tool(tokenizer, tmp_path):
    """The prompts of a tools run on SmolLM2 (its template renders no tools) carry each tool's
    description and the call format in the system message, after the recipe's own prompt."""
    from zbrl.assembly.datasets import encode_prompts

    data = tmp_path / "q.jsonl"
    question = {"messages": [{"role": "user", "content": "What is 123*456?"}], "gt_answer": "1"}
    data.write_text(json.dumps(question) + "\n")
    cfg = load_config(
        str(REPO / "recipes" / "smollm2_python_tool_cpu.yaml"),
        [
            "data.source=null",
            f"data.train_path={data}",
            "eval.sets={}",
            "reward={type: last_number}",
            "environment.tools=[calculator, {type: python}]",
        ],
    )
    (p,), _ = encode_prompts(str(data), cfg, tokenizer)
    text = tokenizer.decode(p.prompt_ids)
    assert text.startswith("<|im_start|>system\nEnd with only the final number.\n\nYou can call")
    assert Calculator.DESCRIPTION in text and SandboxedPython.DESCRIPTION in text
    assert text.endswith("<|im_start|>user\nWhat is 123*456?<|im_end|>\n<|im_start|>assistant\n")
