"""Agent episodes of SmolLM2-135M-Instruct through the endpoint, checked against its ChatML
rendering: the trained ids are the ids the model generated, turn by turn, and the episode's text
is what the chat template writes for the conversation the agent sent."""

import sys
from pathlib import Path

import pytest
import torch

from zbrl.models import catalogue
from zbrl.rollout.backends.base import SamplingParams
from zbrl.types import EncodedPrompt

pytestmark = pytest.mark.realmodel

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))

LAST_REQUESTS = []


async def chatting_agent(client, example):
    """Three turns: the model's answer goes back with a follow-up question each time."""
    messages = list(example["messages"])
    for question in ("Why?", "Say it in one word."):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": question}]
    await client.chat.completions.create(model="policy", messages=messages)
    LAST_REQUESTS.append(messages)
    return 1.0


def test_smollm2_agent_episodes_are_token_exact_against_chatml():
    from test_agent_episodes import agent_runner
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    model_dir = catalogue.pull("smollm2-135m", REPO / ".cache" / "zbrl")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    backend = TransformersBackend(AutoModelForCausalLM.from_pretrained(model_dir), tokenizer)
    calls = []

    def generate(contexts, params):
        out = backend.generate(contexts, params)
        calls.extend((ctx, c[0].token_ids.tolist()) for ctx, c in zip(contexts, out, strict=True))
        return out

    runner = agent_runner(
        chatting_agent, timeout_s=600.0, tokenizer=tokenizer, eos_ids=backend.eos_ids
    )
    prompts = []
    for i, question in enumerate(["What is 2+2?", "Name a colour."]):
        messages = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(ids, add_special_tokens=False)
        prompts.append(EncodedPrompt(f"q{i}", ids, {"messages": messages}))
    params = SamplingParams(
        n=2, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=16, stop_strings=()
    )
    torch.manual_seed(0)
    groups = runner.run(generate, prompts, params)
    for group in groups:
        for c in group:
            assert c.failure is None and c.given_reward == 1.0
            full = c.prompt_ids + c.token_ids.tolist()
            n = len(c.prompt_ids)
            models = [t for t in c.turns if t["role"] == "model"]
            assert len(models) == 3
            for turn in models:
                start, end = n + turn["start"], n + turn["end"]
                assert (full[:start], full[start:end]) in calls
            # the text before the last model turn is the template's rendering of the
            # conversation the agent sent last (its messages re-sent as the endpoint answered)
            last = models[-1]
            sent = tokenizer.decode(full[: n + last["start"]], skip_special_tokens=False)
            assert sent in {
                tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
                for m in LAST_REQUESTS
            }
