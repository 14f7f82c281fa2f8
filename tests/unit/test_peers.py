"""The pure parts of bench/peers_trl.py: the comparison table's maths, zbrl's clock at its
checkpoints, the config -> TRL GRPOConfig translation and the reward wrapper (no TRL needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from peerlib.curves import (
    CurvePoint,
    accuracy_at_budget,
    median_time,
    median_value,
    per_core_rate,
    ratio,
    steps_per_second,
    time_to_accuracy,
    with_startup,
)
from peerlib.trl_args import grpo_config_kwargs
from peerlib.trl_reward import make_trl_reward
from peerlib.zbrl_clock import checkpoint_times, clock_origin, save_overhead
from zbrl.assembly.rewards import build_reward_fn
from zbrl.config import load_config
from zbrl.embedded.addition_task import make_row, reference_completion
from zbrl.telemetry.spans import GENERATE, STARTUP, TRAIN_STEP, WAIT_FOR_DATA, Span

DEMO = str(Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml")

CURVE = [
    CurvePoint(0, 0.0, 0.40),
    CurvePoint(10, 5.0, 0.62),
    CurvePoint(20, 10.0, 0.71),
    CurvePoint(30, 15.0, 0.76),
    CurvePoint(40, 20.0, 0.74),
]


@pytest.mark.parametrize(
    ("target", "expected"), [(0.4, 0.0), (0.6, 5.0), (0.7, 10.0), (0.75, 15.0), (0.8, None)]
)
def test_time_to_accuracy_is_the_first_point_at_or_above(target, expected) -> None:
    assert time_to_accuracy(CURVE, target) == expected
    assert time_to_accuracy(list(reversed(CURVE)), target) == expected  # order-independent


@pytest.mark.parametrize(
    ("budget", "expected"), [(0.0, 0.40), (4.9, 0.40), (12.0, 0.71), (20.0, 0.74), (25.0, None)]
)
def test_accuracy_at_budget_is_the_last_point_within_it(budget, expected) -> None:
    assert accuracy_at_budget(CURVE, budget) == expected


def test_rates_medians_and_ratios() -> None:
    assert steps_per_second(CURVE) == 2.0  # 40 steps in 20 s
    assert steps_per_second([CurvePoint(0, 0.0, 0.4)]) is None
    assert median_time([10.0, None, 12.0]) == 12.0  # "never" sorts last
    assert median_time([None, None, 3.0]) is None  # the median run never got there
    assert median_time([10.0, None]) is None  # (10 + inf) / 2
    assert median_time([]) is None
    assert median_value([0.5, None, 0.7]) == 0.6
    assert median_value([None]) is None
    assert ratio(30.0, 20.0) == 1.5
    assert ratio(None, 20.0) is None and ratio(30.0, None) is None
    assert per_core_rate(1000.0, 2.0, 2) == 250.0
    assert per_core_rate(1000.0, 0.0, 2) is None
    with pytest.raises(ValueError, match="at least one point"):
        time_to_accuracy([], 0.5)


def _span(name, start, end, role="consumer", **attrs) -> Span:
    return Span(worker=f"{role}-0", role=role, name=name, start=start, end=end, attrs=attrs)


def test_zbrl_clock_at_checkpoints_and_their_cost() -> None:
    spans = [
        _span(STARTUP, 90.0, 99.0, role="producer"),
        _span(GENERATE, 100.0, 101.0, role="producer"),
        _span(WAIT_FOR_DATA, 100.0, 101.0),
        _span(TRAIN_STEP, 101.0, 102.0, step=0),
        _span(WAIT_FOR_DATA, 102.1, 103.0),  # gap 0.1 after step 1 (no checkpoint)
        _span(TRAIN_STEP, 103.0, 104.0, step=1),
        _span(WAIT_FOR_DATA, 104.6, 105.0),  # gap 0.6 after step 2 (checkpoint)
        _span(TRAIN_STEP, 105.0, 106.0, step=2),
        _span(WAIT_FOR_DATA, 106.1, 107.0),  # gap 0.1 after step 3
        _span(TRAIN_STEP, 107.0, 108.0, step=3),
        _span(WAIT_FOR_DATA, 108.4, 109.0),  # gap 0.4 after step 4 (checkpoint)
    ]
    assert clock_origin(spans) == 100.0  # start-up is not training time
    assert checkpoint_times(spans, [2, 4, 6]) == {2: 4.0, 4: 8.0}  # no span for step 6
    assert save_overhead(spans, 2) == pytest.approx((0.6 - 0.1) + (0.4 - 0.1))
    with pytest.raises(ValueError, match="no spans after start-up"):
        clock_origin([spans[0]])


def test_demo_config_translates_to_the_same_grpo_step() -> None:
    cfg = load_config(DEMO)
    t = grpo_config_kwargs(cfg, output_dir="out", max_steps=300, threads=2)
    k = t.kwargs
    # 8 prompts x 8 completions generated together and trained with one optimizer step
    assert k["per_device_train_batch_size"] == 64 and k["generation_batch_size"] == 64
    assert k["gradient_accumulation_steps"] == 1 and k["num_generations"] == 8
    assert k["max_completion_length"] == 32 and k["max_steps"] == 300
    assert k["learning_rate"] == 1e-4 and (k["adam_beta1"], k["adam_beta2"]) == (0.9, 0.99)
    assert k["weight_decay"] == 0.0 and k["max_grad_norm"] == 1.0
    assert k["lr_scheduler_type"] == "constant_with_warmup" and k["warmup_steps"] == 0
    assert k["loss_type"] == "dapo"  # token-mean
    assert k["scale_rewards"] == "group"  # grpo advantage: (r - mean) / std
    assert (k["epsilon"], k["epsilon_high"]) == (0.2, 0.2)
    assert k["beta"] == 0.0 and k["num_iterations"] == 1
    assert (k["temperature"], k["top_p"], k["top_k"]) == (1.0, 1.0, 0)  # zbrl's -1: no top-k
    assert k["bf16"] is True and k["fp16"] is False  # bfloat16 compute, as the demo trains
    assert k["activation_checkpointing"] is False and k["seed"] == 0
    assert "lr_scheduler_kwargs" not in k
    threads = next(n for n in t.unmatched if n.startswith("threads"))
    assert "launch.torch_threads=1" in threads and "with 2 threads" in threads
    assert not any(n.startswith("KL") for n in t.unmatched)


def test_other_settings_translate_or_are_refused_by_name() -> None:
    cfg = load_config(
        DEMO,
        [
            "algorithm.loss_aggregation=seq-mean-token-mean",
            "algorithm.beta=0.01",
            "algorithm.lr_schedule.decay=cosine",
            "algorithm.lr_schedule.warmup_steps=5",
            "rollout.generation.top_k=20",
        ],
    )
    t = grpo_config_kwargs(cfg, output_dir="out", max_steps=10, threads=1)
    assert t.kwargs["loss_type"] == "grpo" and t.kwargs["beta"] == 0.01
    assert t.kwargs["lr_scheduler_type"] == "cosine_with_min_lr"
    assert t.kwargs["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1}
    assert t.kwargs["warmup_steps"] == 5 and t.kwargs["top_k"] == 20
    assert any(n.startswith("KL") for n in t.unmatched)
    for override, named in [
        ("algorithm.loss_aggregation=seq-mean-token-sum", "algorithm.loss_aggregation"),
        ("training.train_minibatch_size=4 training.train_microbatch_size=8", "minibatch"),
        ("algorithm.correction=tis", "algorithm.correction"),
    ]:
        with pytest.raises(ValueError, match=named):
            grpo_config_kwargs(
                load_config(DEMO, override.split()), output_dir="out", max_steps=1, threads=1
            )


def test_trl_reward_scores_with_the_zbrl_reward() -> None:
    # length shaping on, so that a truncated response (no EOS) is scored differently
    cfg = load_config(DEMO, ["reward.soft_overlong_punishment=true", "reward.cache_length=8"])
    row = make_row(37, 48)
    reward = make_trl_reward(build_reward_fn(cfg), {"a": row}, max_new_tokens=32, eos_ids={2})
    right = reference_completion(row)  # <think>...</think><answer>85</answer>
    wrong = right.replace("85", "86")
    values = reward(
        prompts=[row["messages"]] * 3,
        completions=[[{"role": "assistant", "content": t}] for t in (right, wrong, right)],
        completion_ids=[[5, 6, 2], [5, 6, 2], [5, 6, 7]],
        uid=["a", "a", "a"],
        trainer_state=None,
    )
    assert values[0] == 1.0 and values[1] == 0.0
    # a completion that does not end with EOS is truncated: the penalty -overlong_penalty
    assert values[2] == pytest.approx(1.0 - cfg.reward.overlong_penalty)
    assert reward([], ["plain text"], [[2]], ["a"]) == [0.0]


def test_times_to_accuracy_count_each_systems_start_up():
    table = {
        "trl": {"time_to": {"0.7": 27.8, "0.75": None}},
        "zbrl-async": {"time_to": {"0.7": 16.0, "0.75": 30.0}},
    }
    lines = with_startup(table, {"trl": 4.8, "zbrl-async": 5.4})
    assert lines[1].split() == ["trl", "4.80", "32.6", "never"]
    assert lines[2].split() == ["zbrl-async", "5.40", "21.4", "35.4"]
    # 32.6 / 21.4; 0.75 has no ratio since TRL never reached it
    assert lines[3:] == ["zbrl-async reaches 0.7 1.52x as soon as TRL counting start-up"]
