"""An idle consumer's own generation from a RunConfig (``rollout.consumers_generate``): a
producer of its own over the consumer's policy module (:mod:`zbrl.rollout.consumer_generation`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from zbrl.assembly.environments import build_episode_runner
from zbrl.assembly.models import device_of, inference_dtype
from zbrl.assembly.settings import producer_settings
from zbrl.config import RunConfig
from zbrl.config.checks import consumer_generation_refused
from zbrl.data.sampler import ShardedSampler
from zbrl.rewards.base import RewardFunction
from zbrl.rollout.consumer_generation import STREAM_SEED, ConsumerGeneration, CurrentWeights
from zbrl.rollout.idle_planner import OnlinePlanner
from zbrl.rollout.producer import Producer
from zbrl.telemetry.spans import SpanRecorder
from zbrl.transport.clients import BufferClient
from zbrl.types import EncodedPrompt


def consumer_generation_mode(cfg: RunConfig) -> str:
    """``rollout.consumers_generate`` as the run applies it: ``off`` where a consumer cannot
    generate (:func:`zbrl.config.checks.consumer_generation_refused`; ``on`` is refused there
    by the config)."""
    if consumer_generation_refused(cfg) is not None:
        return "off"
    return cfg.rollout.consumers_generate


def build_consumer_generation(
    cfg: RunConfig,
    rank: int,
    policy: torch.nn.Module,
    tokenizer: Any,
    prompts: list[EncodedPrompt],
    reward: RewardFunction,
    buffer: BufferClient,
    recorder: SpanRecorder,
) -> ConsumerGeneration | None:
    """Consumer ``rank``'s generation on ``policy`` (its engine's own module, float32 master
    weights: generation casts on the fly to the inference dtype under autocast, no copy), or
    None when the run's mode is ``off``. ``buffer``: a client whose node is unset (its
    reservations are the consumer's, never a parked producer's)."""
    mode = consumer_generation_mode(cfg)
    if mode == "off":
        return None
    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    fast = getattr(cfg.rollout.backend, "fast_decode", True)  # a vLLM run's consumer: default
    backend = TransformersBackend(policy, tokenizer, device=device_of(cfg), fast_decode=fast)
    prompts_per_batch = cfg.rollout.consumer_generate_prompts
    settings = replace(
        producer_settings(cfg, 0),
        index=cfg.launch.num_producers + rank,  # after the producers' ids
        inference_batch_size=prompts_per_batch,
        inference_microbatch_size=prompts_per_batch,
        num_epochs=None,  # its own stream never ends; the producers' data ends the run
        inflight_chunk_tokens=None,  # its weights do not change while it generates
    )
    sampler = ShardedSampler(
        len(prompts),
        num_shards=1,
        shard_index=0,
        seed=cfg.data.seed + STREAM_SEED * (rank + 1),
        shuffle=True,
    )
    weights = CurrentWeights()
    producer = Producer(
        settings,
        prompts,
        backend,
        reward,
        buffer,
        weights,
        recorder,
        build_episode_runner(cfg, backend, settings.sampling.max_new_tokens),
        sampler=sampler,
        stream=f"c{rank}",
        resume_in_buffer=False,
    )
    planner = OnlinePlanner(mode, batch_groups=cfg.training.train_batch_size)  # type: ignore[arg-type]
    dtype = inference_dtype(cfg)
    return ConsumerGeneration(
        producer,
        weights,
        planner,
        policy,
        prompts_per_batch=prompts_per_batch,
        autocast_dtype=None if dtype == torch.float32 else dtype,
    )
