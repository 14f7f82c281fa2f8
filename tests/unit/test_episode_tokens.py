"""Token-exact episodes: the ids trained are, turn by turn, the ids the policy was given and
generated, with the environment's ids appended once; the loss covers the model's tokens only."""

import pickle

import pytest
import torch
from episode_stubs import EOS, TOKENIZER, ScriptedBackend, calculator_script, encoded, runner
from role_settings import producer_settings, sampling_params

from zbrl.environments.base import EnvTurn
from zbrl.environments.tool_env import ToolEnvironment, ToolSettings
from zbrl.environments.tools import Calculator
from zbrl.rewards.base import BaseReward, RewardResult
from zbrl.rollout.producer import Producer
from zbrl.telemetry.spans import SpanRecorder
from zbrl.training.rows import build_rows, collate, response_span, trained_token_count
from zbrl.types import EncodedPrompt


def calculator_env(**kw):
    s = dict(
        call_format="tags",
        on_error="reply",
        max_result_chars=100,
        tool_timeout_s=2.0,
        stop_after_call=False,
    )
    return ToolEnvironment([Calculator()], ToolSettings(**{**s, **kw}))


def params(n=2, max_new_tokens=60):
    return sampling_params(n=n, temperature=1.0, max_new_tokens=max_new_tokens)


def check_exact(backend, prompt, episode):
    """Every model turn: the context it was generated from is prompt + response so far, and its
    ids are the response's ids there; every environment turn: its ids are its text tokenized
    once."""
    response = episode.token_ids.tolist()
    for turn in episode.turns:
        span = response[turn["start"] : turn["end"]]
        if turn["role"] == "model":
            assert (prompt.prompt_ids + response[: turn["start"]], span) in backend.generated
        else:
            assert TOKENIZER.encode(turn["text"], add_special_tokens=False) == span
    assert [t["start"] for t in episode.turns[1:]] == [t["end"] for t in episode.turns[:-1]]
    assert episode.turns[-1]["end"] == len(response)


def test_embedded_tokenizer_episode_is_token_exact():
    backend = ScriptedBackend(calculator_script)
    prompt = encoded("12*34", gt="408")
    (episodes,) = runner(backend, calculator_env()).run(
        backend.generate, [prompt], params(), version=7
    )
    tool_user, direct = episodes
    assert TOKENIZER.decode(prompt.prompt_ids + tool_user.token_ids.tolist()) == (
        "<|bos|><|user|>12*34<|end|><|assistant|><calc>12*34</calc><|end|>"
        "<|user|>408<|end|><|assistant|><answer>408</answer><|end|>"
    )
    check_exact(backend, prompt, tool_user)
    assert [t["role"] for t in tool_user.turns] == ["model", "env", "model"]
    assert [t.get("policy_version") for t in tool_user.turns] == [7, None, 7]
    assert tool_user.text == "<answer>408</answer>"
    assert tool_user.counts == {"turns": 2, "tool_calls": 1}
    assert direct.counts == {"turns": 1} and len(direct.turns) == 1
    # the loss mask and the behaviour log-probs: model tokens only
    for ep in episodes:
        mask = torch.zeros(len(ep.token_ids), dtype=torch.bool)
        for t in ep.turns:
            mask[t["start"] : t["end"]] = t["role"] == "model"
        assert torch.equal(ep.loss_mask, mask)
        assert bool((ep.logprobs[mask] < 0).all()) and bool((ep.logprobs[~mask] == 0).all())


def test_turn_ended_by_a_stop_string_gets_the_template_close():
    """Without an EOS (a stop string ended the turn) the environment's text starts with the
    template's end of turn, so the sequence is what the template would have written."""
    backend = ScriptedBackend(calculator_script, eos=False)
    prompt = encoded("2*3", gt="6")
    (episodes,) = runner(backend, calculator_env()).run(backend.generate, [prompt], params(n=1))
    (ep,) = episodes
    assert ep.turns[1]["text"] == "<|end|><|user|>6<|end|><|assistant|>"
    assert TOKENIZER.decode(ep.token_ids.tolist()) == (
        "<calc>2*3</calc><|end|><|user|>6<|end|><|assistant|><answer>6</answer>"
    )
    check_exact(backend, prompt, ep)


def test_turn_limit_ends_the_episode():
    backend = ScriptedBackend(lambda context, j: "<calc>1+1</calc>")  # calls forever
    (episodes,) = runner(backend, calculator_env(), max_turns=3).run(
        backend.generate, [encoded("x")], params(n=1)
    )
    (ep,) = episodes
    assert ep.counts == {"turns": 3, "tool_calls": 3, "turn_limit": 1}
    assert [t["role"] for t in ep.turns] == ["model", "env", "model", "env", "model"]
    assert ep.finish_reason == "stop" and ep.turns[-1]["info"]["tool_calls"][0]["result"] == "2"


def test_token_limit_cuts_the_model_turn():
    backend = ScriptedBackend(lambda context, j: "<calc>1+1</calc>" if j == 0 else "9" * 80)
    limits = dict(max_turns=10, max_total_tokens=40)
    (episodes,) = runner(backend, calculator_env(), **limits).run(
        backend.generate, [encoded("x")], params(n=2)
    )
    calls, long = episodes
    assert len(calls.token_ids) <= 40 and calls.counts["token_limit"] == 1
    assert calls.finish_reason == "length"
    assert len(long.token_ids) == 40 and long.counts == {"turns": 1, "token_limit": 1}
    assert long.finish_reason == "length" and bool(long.loss_mask.all())
    check_exact(backend, encoded("x"), calls)


def test_a_failing_environment_ends_its_episode_only():
    class Flaky:
        def start(self, example):
            return self

        def step(self, text):
            if "boom" in text:
                raise RuntimeError("environment bug")
            return EnvTurn(message="again", reward=0.25, counts={"pokes": 1})

    backend = ScriptedBackend(lambda context, j: "boom" if j == 0 and "ok" not in context else "ok")
    (episodes,) = runner(backend, Flaky(), max_turns=3).run(
        backend.generate, [encoded("x")], params(n=2)
    )
    broken, fine = episodes
    assert broken.counts == {"turns": 1, "env_errors": 1}
    assert "environment bug" in broken.turns[-1]["info"]["error"]
    assert fine.counts == {"turns": 3, "pokes": 3, "turn_limit": 1}
    assert fine.turn_reward == pytest.approx(0.75)


class ExactReward(BaseReward):
    name = "exact"

    def score(self, response, example, ctx):
        ok = response == f"<answer>{example['gt_answer']}</answer>"
        return RewardResult(reward=float(ok), format_acc=1.0, ans_acc=float(ok))


def produce(backend, prompts, n=2):
    episodes = runner(backend, calculator_env())
    producer = Producer(
        producer_settings(inference_batch_size=len(prompts), sampling=params(n=n)),
        prompts,
        backend,
        ExactReward(),
        None,
        None,
        SpanRecorder("producer-0", "producer"),
        episodes,
    )
    chunk = [(p, 0, 1.0) for p in prompts]
    return producer._rollout(chunk, list(range(len(prompts))), version=3)


def test_producer_groups_carry_masks_turns_and_counts():
    backend = ScriptedBackend(calculator_script)
    (group,) = produce(backend, [encoded("12*34", gt="408")])
    assert group.rewards == [1.0, 0.0] and group.ans_acc == [1.0, 0.0]
    assert group.env_counts == {"turns": 3.0, "tool_calls": 1.0}
    assert [len(e) for e in group.episodes] == [3, 1]
    assert "<|user|>408<|end|>" in group.response_texts[0]
    assert [int(m.sum()) for m in group.loss_masks] == [
        sum(t["end"] - t["start"] for t in e if t["trained"]) for e in group.episodes
    ]
    back = pickle.loads(pickle.dumps(group))
    assert all(torch.equal(a, b) for a, b in zip(back.loss_masks, group.loss_masks, strict=True))
    assert back.loss_masks[0].dtype == torch.bool and back.episodes == group.episodes


@pytest.mark.parametrize("shared", [False, True])
def test_rows_train_exactly_the_episode_with_model_tokens_in_the_loss(shared):
    backend = ScriptedBackend(calculator_script)
    groups = produce(backend, [encoded("12*34", gt="408"), encoded("5*6", gt="30")])
    rows = build_rows(groups, torch.ones(2, 2), filter_truncated=True, loss_filter_range=None)
    mb = collate(rows, pad_id=0, share_prompts=shared)
    for i, (row, (g, j)) in enumerate(zip(rows, [(0, 0), (0, 1), (1, 0), (1, 1)], strict=True)):
        group = groups[g]
        span = response_span(row, shared=shared)
        sequence = group.prompt_ids + group.response_ids[j].tolist()
        trained = mb.targets_BT[i, span].tolist()
        assert trained == group.response_ids[j].tolist()
        if not shared:
            assert mb.input_ids_BT[i, : len(sequence)].tolist() == sequence
        assert torch.equal(mb.mask_BT[i, span], group.loss_masks[j])
        assert int(mb.mask_BT[i].sum()) == int(group.loss_masks[j].sum())
        model = group.loss_masks[j]
        assert torch.equal(mb.old_logprobs_BT[i, span][model], group.behaviour_logprobs[j][model])
    tokens, seqs = trained_token_count(rows)
    assert tokens == int(mb.mask_BT.sum()) and seqs == 4
    assert tokens < sum(int(r.response_ids.numel()) for r in rows)  # the tool results are out


def test_policy_logprobs_of_the_trained_sequence_match_the_sampled_ones(tiny_model_dir):
    """Through the real transformers backend and a random embedded model: a forward pass over the
    trained sequence gives the model's tokens the log-probs they were sampled with — the policy
    saw exactly this sequence."""
    from transformers import AutoModelForCausalLM

    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    class Echo:
        stop_strings = tuple("0123456789 ")  # a random model's turns end soon

        def start(self, example):
            return self

        def step(self, text):
            return EnvTurn(message=f"you said {len(text)} chars")

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    backend = TransformersBackend(model, TOKENIZER)
    prompt = encoded("1+1")
    (episodes,) = runner(backend, Echo(), max_turns=3, max_total_tokens=120).run(
        backend.generate, [prompt], params(n=2, max_new_tokens=40)
    )
    for ep in episodes:
        assert ep.counts["turns"] >= 2
        sequence = torch.tensor([prompt.prompt_ids + ep.token_ids.tolist()])
        with torch.no_grad():
            logits = model(input_ids=sequence).logits[0, :-1].float()
        targets = sequence[0, 1:]
        logprobs = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
        response = logprobs[len(prompt.prompt_ids) - 1 :]
        mask = ep.loss_mask
        torch.testing.assert_close(response[mask], ep.logprobs[mask], atol=2e-4, rtol=0)
        env_ids = ep.token_ids[~mask].tolist()
        assert TOKENIZER.decode(env_ids).count("<|end|><|user|>you said") == len(ep.turns) // 2


def test_the_tool_demos_warm_start_trains_the_sequences_episodes_produce():
    """The warm start's sequences (prompt, turns, loss mask) are the ones the episode runner
    builds when the model follows the trace."""
    from zbrl.embedded import multiplication_task
    from zbrl.embedded.warm_start_tasks import episode_sequence
    from zbrl.rollout.turns import TurnFormatter

    row = multiplication_task.make_rows(1, seed=0, split="train", tools=True)[0]
    a, b = multiplication_task.operands(row)
    assert row["gt_answer"] == str(a * b) and min(a, b) >= 100 and max(a, b) <= 999
    formatter = TurnFormatter(TOKENIZER, "user", eos_ids={EOS})
    prompt_ids, ids, mask = episode_sequence(TOKENIZER, formatter, row, tools=True)
    turns = [c for role, c in multiplication_task.trace(row, tools=True) if role == "assistant"]
    backend = ScriptedBackend(lambda context, j: turns[context.count("<|assistant|>") - 1])
    template = TOKENIZER.apply_chat_template(row["messages"], add_generation_prompt=True)
    prompt = EncodedPrompt("d", list(template["input_ids"]), row)
    ((ep,),) = runner(backend, calculator_env()).run(backend.generate, [prompt], params(n=1))
    assert prompt_ids == prompt.prompt_ids
    assert ep.token_ids.tolist() == ids and ep.loss_mask.tolist() == mask
    assert ep.text == f"<answer>{a * b}</answer>"
    plain = episode_sequence(
        TOKENIZER, formatter, multiplication_task.make_row(a, b, tools=False), tools=False
    )
    assert TOKENIZER.decode(plain[1]) == f"<answer>{a * b}</answer><|end|>" and all(plain[2])


def test_tool_calls_of_a_batch_run_in_parallel_only_for_thread_safe_tools():
    import threading

    from zbrl.environments.tool_env import ToolEnvironment, ToolSettings

    class Meeting:
        """Two calls must be inside ``call`` at the same time, else the barrier breaks."""

        name, tag, argument = "meet", "meet", "x"

        def __init__(self, thread_safe):
            self.thread_safe = thread_safe
            self.barrier = threading.Barrier(2, timeout=2.0)

        def call(self, arguments):
            self.barrier.wait()
            return "met"

    settings = ToolSettings("tags", "reply", 100, 5.0, False)
    script = ScriptedBackend(lambda context, j: "<meet>1</meet>" if "met" not in context else "ok")
    env = ToolEnvironment([Meeting(thread_safe=True)], settings)
    assert env.parallel_steps
    episode_runner = runner(script, env)
    (episodes,) = episode_runner.run(script.generate, [encoded("x")], params(n=2))
    assert [ep.counts.get("tool_crashes", 0) for ep in episodes] == [0, 0]
    transcripts = [episode_runner.sample_record(ep)["transcript"] for ep in episodes]
    assert all("<|user|>met<|end|>" in t for t in transcripts)
    serial = ToolEnvironment([Meeting(thread_safe=False)], settings)
    assert (
        not serial.parallel_steps
        and not ToolEnvironment([Calculator(), Meeting(False)], settings).parallel_steps
    )
