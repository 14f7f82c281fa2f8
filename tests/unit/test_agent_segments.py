"""Changed histories become segments: a request whose history is not the episode's tokens (a
Qwen3-style template that drops past ``<think>`` content, an agent that shortens its own
history) closes the episode's segment and starts the next, rendered afresh; each segment is
trained as a row of its own with its episode's advantage (the group baseline unchanged)."""

import pickle

import torch
from endpoint_templates import tokenizer
from episode_stubs import ScriptedBackend, encoded
from role_settings import sampling_params
from test_agent_episodes import agent_runner
from test_train_rows import make_group

from zbrl.algorithms.advantages import compute_advantages
from zbrl.training.rows import build_rows
from zbrl.training.train_step import group_shapes
from zbrl.types import Segment

QWEN_LIKE = tokenizer(drop_past_thinking=True)


def think_then_calc(context, sample):
    """Reasons in <think>, calls the calculator; answers once a result is in the context."""
    if context.count("<|user|>") > 1:
        return "<answer>" + context.rsplit("<|user|>", 1)[1].split("<|end|>")[0] + "</answer>"
    question = context.rsplit("<|user|>", 1)[1].split("<|end|>")[0]
    return f"<think>{question} it is</think><calc>{question}</calc>"


async def resending_agent(client, example):
    """Sends the answer back unchanged (the template drops its reasoning), streams the second
    call."""
    messages = list(example["messages"])
    first = await client.chat.completions.create(model="policy", messages=messages)
    text = first.choices[0].message.content
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "408"}]
    stream = await client.chat.completions.create(model="policy", messages=messages, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def shortening_agent(client, example):
    """Drops the reasoning of its first answer itself before sending it back."""
    messages = list(example["messages"])
    first = await client.chat.completions.create(model="policy", messages=messages)
    text = first.choices[0].message.content.split("</think>")[-1]
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "408"}]
    second = await client.chat.completions.create(model="policy", messages=messages)
    return second.choices[0].message.content


def test_a_template_that_drops_past_thinking_makes_two_segments():
    for agent in (resending_agent, shortening_agent):
        backend = ScriptedBackend(think_then_calc)
        runner = agent_runner(agent, tokenizer=QWEN_LIKE)
        prompt = encoded("12*34", gt="408")
        (group,) = runner.run(backend.generate, [prompt], sampling_params(n=2, max_new_tokens=60))
        (ctx1, gen1), _, (ctx2, gen2), _ = backend.generated
        for c in group:
            assert c.failure is None and c.text == "<answer>408</answer>"
            assert c.counts["segments"] == 2 and c.counts["turns"] == 2
            # the first segment: the prompt and the first answer, with its reasoning, as sampled
            assert c.prompt_ids + c.token_ids.tolist() == ctx1 + gen1
            assert c.loss_mask.all() and c.logprobs.lt(0).all()
            # the second: the conversation rendered afresh (the reasoning dropped), its answer
            (seg,) = c.segments
            assert seg.prompt_ids + seg.response_ids.tolist() == ctx2 + gen2
            assert QWEN_LIKE.decode(seg.prompt_ids) == (
                "<|bos|><|user|>12*34<|end|><|assistant|><calc>12*34</calc><|end|>"
                "<|user|>408<|end|><|assistant|>"
            )
            assert seg.loss_mask.all() and seg.token_versions.tolist() == [0] * len(gen2)
            assert [t.get("segment", 0) for t in c.turns] == [0, 1]


def test_refuse_keeps_the_409():
    backend = ScriptedBackend(think_then_calc)
    runner = agent_runner(shortening_agent, tokenizer=QWEN_LIKE, on_change="refuse")
    (group,) = runner.run(backend.generate, [encoded("12*34")], sampling_params(n=1))
    (c,) = group
    assert c.failure.startswith("agent_crashes") and c.counts["prefix_mismatches"] == 1
    assert "ConflictError" in c.failure and "prefix_mismatch" in c.failure
    assert c.counts["segments"] == 1 and c.segments == []


def test_segments_train_as_rows_with_their_episodes_advantage():
    group = make_group([5, 6], [[11, 12], [13, 14, 15]], ans_acc=[0.0, 1.0], seed=1)
    later = Segment(
        prompt_ids=[5, 6, 9],
        response_ids=torch.tensor([16, 17, 18]),
        behaviour_logprobs=torch.tensor([-0.5, 0.0, -0.25]),
        loss_mask=torch.tensor([True, False, True]),
        token_versions=torch.tensor([2, 2, 3]),
    )
    group.segments = [[], [later]]
    group = pickle.loads(pickle.dumps(group))  # as it crosses processes
    advantages = compute_advantages("grpo", torch.tensor([group.rewards]))
    assert advantages.shape == (1, 2)  # the group baseline is over its two episodes
    rows = build_rows(
        [group], advantages, filter_truncated=False, loss_filter_range=None, trained_version=4
    )
    assert [r.prompt_ids for r in rows] == [[5, 6], [5, 6], [5, 6, 9]]
    assert [r.advantage for r in rows] == [
        float(advantages[0, 0]),
        float(advantages[0, 1]),
        float(advantages[0, 1]),
    ]
    seg = rows[2]
    assert seg.response_ids.tolist() == [16, 17, 18] and seg.reward == 1.0
    assert seg.loss_mask.tolist() == [True, False, True] and seg.trained_tokens() == 2
    assert seg.token_behind.tolist() == [2, 2, 1]
    assert seg.old_logprobs.tolist() == [-0.5, 0.0, -0.25]
    assert [(s.prompt, s.response) for s in group_shapes(group)] == [
        ((5, 6), 2),
        ((5, 6), 3),
        ((5, 6, 9), 3),
    ]


def test_the_segments_demo_agent_streams_and_confirms_in_a_second_segment():
    from test_endpoint import calc_then_answer

    from zbrl.embedded.calculator_agent import solve_streaming_shortened

    backend = ScriptedBackend(calc_then_answer)
    runner = agent_runner(solve_streaming_shortened)
    (group,) = runner.run(backend.generate, [encoded("12*34")], sampling_params(n=2))
    for c in group:
        assert c.failure is None and c.text == "<answer>408</answer>"
        assert c.counts["segments"] == 2 and c.counts["turns"] == 3
        # the first segment: the call and the answer, token-exact on the intact history
        assert [t["text"] for t in c.turns if t.get("segment") is None] == [
            "<calc>12*34</calc><|end|>",
            "<|user|>408<|end|><|assistant|>",
            "<answer>408</answer><|end|>",
        ]
        (seg,) = c.segments
        assert QWEN_LIKE.decode(seg.prompt_ids) == (
            "<|bos|><|user|>12*34<|end|><|assistant|><calc></calc><|end|><|user|>408<|end|>"
            "<|assistant|><answer>408</answer><|end|><|user|>Confirm the answer.<|end|>"
            "<|assistant|>"
        )
