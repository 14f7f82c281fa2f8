"""RunConfig → the plain components the workers are made of (no Ray here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zbrl.algorithms.policy_loss import LossConfig
from zbrl.config import RunConfig
from zbrl.data.dataset import load_examples
from zbrl.data.prompts import PromptEncoder, resolve_system_prompt
from zbrl.rewards import CombinedReward, LengthShaping, build_reward
from zbrl.rewards.base import RewardFunction
from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.producer import ProducerSettings
from zbrl.training.train_step import StepSettings
from zbrl.transport.buffer import BufferSettings
from zbrl.types import EncodedPrompt


def answer_field(cfg: RunConfig) -> str:
    return "test_cases" if cfg.reward.type == "code" else "gt_answer"


def build_reward_fn(cfg: RunConfig) -> RewardFunction:
    """The primary reward with its options, plus weighted extra rewards."""
    rw = cfg.reward
    primary = build_reward(rw.type, **_primary_options(cfg))
    if not rw.extra:
        return primary
    parts: list[tuple[RewardFunction, float]] = [(primary, 1.0)]
    parts += [(build_reward(e.type, **e.options), e.weight) for e in rw.extra]
    return CombinedReward(parts)


def _primary_options(cfg: RunConfig) -> dict[str, Any]:
    rw = cfg.reward
    if rw.type == "code":
        from zbrl.rewards.sandbox import SandboxLimits

        return {
            "limits": SandboxLimits(timeout_s=rw.sandbox.timeout_s, memory_mb=rw.sandbox.memory_mb),
            "max_workers": rw.sandbox.max_workers,
            "correct_reward": rw.correct_reward,
        }
    if ":" in rw.type:
        return {}
    options: dict[str, Any] = {
        "correct_reward": rw.correct_reward,
        "wrong_reward": rw.wrong_reward,
        "length_shaping": length_shaping(cfg),
    }
    if rw.format_tags is not None:
        options["tags"] = tuple(rw.format_tags)
    return options


def length_shaping(cfg: RunConfig) -> LengthShaping | None:
    rw = cfg.reward
    if not rw.soft_overlong_punishment:
        return None
    return LengthShaping(
        max_new_tokens=cfg.rollout.generation.max_new_tokens,
        cache_length=cfg.cache_length,
        max_penalty=rw.overlong_penalty,
        truncated_value=rw.truncated_penalty,
    )


def sampling_params(cfg: RunConfig) -> SamplingParams:
    g = cfg.rollout.generation
    return SamplingParams(
        n=g.num_generations,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        max_new_tokens=g.max_new_tokens,
        stop_strings=tuple(g.stop_strings),
    )


def eval_sampling_params(cfg: RunConfig) -> SamplingParams:
    g = cfg.rollout.generation
    return SamplingParams(
        n=cfg.eval.num_samples,
        temperature=cfg.eval.temperature,
        top_p=g.top_p if cfg.eval.temperature > 0 else 1.0,
        top_k=g.top_k if cfg.eval.temperature > 0 else -1,
        max_new_tokens=cfg.eval_max_new_tokens,
        stop_strings=tuple(g.stop_strings),
    )


def producer_settings(cfg: RunConfig, index: int) -> ProducerSettings:
    schedule = cfg.rollout.generation.temperature_schedule
    return ProducerSettings(
        index=index,
        num_producers=cfg.launch.num_producers,
        sampling=sampling_params(cfg),
        inference_batch_size=cfg.rollout.inference_batch_size,
        inference_microbatch_size=cfg.rollout.inference_microbatch_size,
        num_epochs=cfg.data.num_epochs,
        seed=cfg.data.seed,
        shuffle=cfg.data.shuffle,
        final_temperature=schedule.final if schedule else None,
        anneal_fraction=schedule.over_fraction if schedule else 1.0,
    )


def buffer_settings(cfg: RunConfig) -> BufferSettings:
    a = cfg.algorithm
    return BufferSettings(
        groups_per_step=cfg.training.train_batch_size,
        max_staleness=cfg.transport.max_staleness,
        num_producers=cfg.launch.num_producers,
        filter_range=a.filter_range if a.dynamic_batching else None,
        dynamic_batching=a.dynamic_batching,
        drop_all_truncated_groups=a.filter_truncated_response,
        capacity=cfg.transport.buffer_capacity,
    )


def step_settings(cfg: RunConfig, pad_id: int) -> StepSettings:
    a = cfg.algorithm
    return StepSettings(
        advantage=a.advantage,
        advantage_kwargs={
            "eps": a.advantage_eps,
            "std_unbiased": a.std_unbiased,
            "group_baseline": a.reinforce_group_baseline,
        },
        policy_loss=a.policy_loss,
        loss=LossConfig(
            clip_eps_low=a.clip_eps_low,
            clip_eps_high=a.clip_eps_high,
            dual_clip_c=a.dual_clip_c,
            beta=a.beta,
            kl_estimator=a.kl_estimator,
            entropy_coef=a.entropy_coef,
            aggregation=a.loss_aggregation,
        ),
        minibatch_groups=cfg.minibatch_size,
        microbatch_size=cfg.training.train_microbatch_size,
        filter_truncated=a.filter_truncated_response,
        loss_filter_range=None if a.dynamic_batching else a.filter_range,
        max_norm=a.max_norm,
        norm_tokens=float(cfg.rollout.generation.max_new_tokens),
        logprob_chunk_size=cfg.training.logprob_chunk_size,
        pad_id=pad_id,
    )


def encode_prompts(
    path: str | Path, cfg: RunConfig, tokenizer: Any, *, limit: int | None = None
) -> tuple[list[EncodedPrompt], dict[str, Any]]:
    """Load a dataset file and apply the chat template; returns prompts and encoding stats."""
    report = load_examples(
        path, answer_field=answer_field(cfg), skip_bad_lines=cfg.data.skip_bad_lines
    )
    examples = report.examples[:limit] if limit else report.examples
    encoder = PromptEncoder(
        tokenizer,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        overlong=cfg.data.overlong_prompt,
        system_prompt=resolve_system_prompt(cfg.data.system_prompt, cfg.reward.type),
    )
    encoded, stats = encoder.encode_all(examples)
    stats["skipped_lines"] = report.num_skipped
    prompts = [EncodedPrompt(ex.uid, list(ids), ex.to_example()) for ex, ids in encoded]
    return prompts, stats
