"""Each role's settings from a RunConfig (the only place config fields become role settings;
those the driver needs, without torch, are in :mod:`zbrl.assembly.shared_settings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from zbrl.algorithms.distill import DistillWeights
from zbrl.algorithms.policy_loss import LossConfig
from zbrl.assembly.shared_settings import weight_sync_backend
from zbrl.assembly.teacher import teacher_dir
from zbrl.config import GaeAdvantage, GspoLoss, ImportAdvantage, PpoClipLoss, RunConfig
from zbrl.config.transport import BroadcastSync
from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.producer import ExactLogprobs, ProducerSettings
from zbrl.rollout.teacher import TeacherSettings
from zbrl.training.consumer import ConsumerSettings
from zbrl.training.rows import MicroBatching
from zbrl.training.step_start import CriticSettings
from zbrl.training.train_step import StepSettings
from zbrl.transport.weight_sync.broadcast import BroadcastSettings


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


def device_of(cfg: RunConfig) -> torch.device:
    if cfg.training.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.training.device)


def inference_dtype_name(cfg: RunConfig) -> str:
    """The inference precision: the dtype producers and the evaluator generate with and
    published weights are cast to (``rollout.inference_dtype``; unset: ``model.dtype``). The
    one place it is read."""
    name = cfg.rollout.inference_dtype
    return cfg.model.dtype if name is None else name


def teacher_settings(cfg: RunConfig) -> TeacherSettings | None:
    """What a producer needs to load the distillation teacher (None without
    ``algorithm.distill``); the directory is the driver's (built or fetched before the workers
    start)."""
    distill = cfg.algorithm.distill
    if distill is None:
        return None
    return TeacherSettings(
        model_dir=str(teacher_dir(cfg, verbose=False)),
        dtype=inference_dtype_name(cfg),
        device=str(device_of(cfg)),
        batch_size=distill.batch_size,
        trust_remote_code=cfg.model.trust_remote_code,
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
        inflight_chunk_tokens=(
            cfg.rollout.inflight_updates.chunk_tokens
            if cfg.rollout.inflight_updates.enabled
            else None
        ),
        inflight_keep_cache=cfg.rollout.inflight_updates.after_swap == "keep",
        teacher=teacher_settings(cfg),
        exact_logprobs=ExactLogprobs(
            dtype=cfg.model.dtype, chunk_size=cfg.training.logprob_chunk_size
        )
        if cfg.rollout.exact_logprobs
        else None,
    )


UID_LOG_FILE = "trained_uids.jsonl"
"""One line per training step in the run dir: the uids trained and their policy versions."""


def consumer_settings(cfg: RunConfig, run_dir: str | Path) -> ConsumerSettings:
    lg = cfg.logging
    return ConsumerSettings(
        groups_per_step=cfg.training.train_batch_size,  # data-parallel ranks split it
        max_steps=cfg.training.max_steps,
        checkpoint_dir=str(Path(run_dir) / "checkpoints"),
        save_interval=lg.save_interval,
        save_keep=lg.save_keep,
        save_final=lg.save_final,
        log_rollout_interval=lg.log_rollout_interval,
        rollouts_per_log=lg.rollouts_per_log,
        uid_log=str(Path(run_dir) / UID_LOG_FILE),
    )


def loss_config(cfg: RunConfig) -> LossConfig:
    a = cfg.algorithm
    loss = a.policy_loss
    kl_in_reward = isinstance(a.advantage, GaeAdvantage) and a.advantage.kl_in_reward
    shared = {
        "beta": 0.0 if kl_in_reward else a.beta,  # else beta weighs the KL in the reward
        "correction": a.correction,
        "correction_level": a.correction_level,
        "correction_cap": a.correction_cap,
        "kl_estimator": a.kl_estimator,
        "entropy_coef": a.entropy_coef,
        "aggregation": a.loss_aggregation,
    }
    if isinstance(loss, PpoClipLoss):
        return LossConfig(
            clip_eps_low=loss.clip_eps_low,
            clip_eps_high=loss.clip_eps_high,
            dual_clip_c=loss.dual_clip_c,
            **shared,
        )
    if isinstance(loss, GspoLoss):
        return LossConfig(
            clip_eps_low=loss.clip_eps_low,
            clip_eps_high=loss.clip_eps_high,
            dual_clip_c=None,
            **shared,
        )
    return LossConfig(options=dict(loss.options), **shared)


def advantage_options(cfg: RunConfig) -> dict[str, Any]:
    """Keyword options of the chosen estimator: its own fields, or a user estimator's options."""
    advantage = cfg.algorithm.advantage
    if isinstance(advantage, ImportAdvantage):
        return dict(advantage.options)
    return advantage.model_dump(exclude={"type"})


def critic_settings(cfg: RunConfig) -> CriticSettings | None:
    a = cfg.algorithm
    if a.critic is None or not isinstance(a.advantage, GaeAdvantage):
        return None
    return CriticSettings(
        gamma=a.advantage.gamma,
        lam=a.advantage.lam,
        whiten=a.advantage.whiten,
        kl_coef=a.beta if a.advantage.kl_in_reward else 0.0,
        value_clip=a.critic.value_clip,
        max_norm=a.critic.max_norm,
    )


def context_parallel(cfg: RunConfig) -> bool:
    """Whether consumers split each row's tokens (``training.engine.context_parallel_size``)."""
    engine = cfg.training.engine
    return engine.type == "fsdp2" and engine.context_parallel_size > 1


def micro_batching(cfg: RunConfig, critic: CriticSettings | None) -> MicroBatching:
    """How the trainer cuts a step into forward passes: one group's full rows per pass under
    ``rollout.exact_logprobs`` (the producer scored each group so), else the training section's
    settings."""
    if cfg.rollout.exact_logprobs:
        g = cfg.rollout.generation.num_generations
        return MicroBatching(size=g, tokens=None, share_prompts=False, packing=False)
    return MicroBatching(
        size=cfg.training.train_microbatch_size,
        tokens=cfg.training.train_microbatch_tokens,
        # the critic's value model and context parallelism take full rows (documented on
        # the field)
        share_prompts=cfg.training.share_prompts and critic is None and not context_parallel(cfg),
        packing=cfg.training.packing,  # its combinations are checked (check_packing)
    )


def step_settings(cfg: RunConfig, pad_id: int) -> StepSettings:
    a = cfg.algorithm
    critic = critic_settings(cfg)
    return StepSettings(
        advantage=a.advantage.type,
        advantage_kwargs=advantage_options(cfg),
        policy_loss=a.policy_loss.type,
        loss=loss_config(cfg),
        minibatch_groups=cfg.minibatch_size,
        micro=micro_batching(cfg, critic),
        filter_truncated=a.filter_truncated_response,
        loss_filter_range=None if a.dynamic_batching else a.filter_range,
        max_norm=a.max_norm,
        norm_tokens=float(cfg.rollout.generation.max_new_tokens),
        logprob_chunk_size=cfg.training.logprob_chunk_size,
        pad_id=pad_id,
        ppo_epochs=a.ppo_epochs,
        proximal=a.proximal,
        critic=critic,
        distill=None
        if a.distill is None
        else DistillWeights(coef=a.distill.coef, reward_coef=a.distill.reward_coef),
    )


GLOO_BUCKET_MB = 4.0
"""Broadcast bucket with gloo when ``bucket_mb`` is unset (fastest of 1-512 MiB on loopback)."""
NCCL_BUCKET_MB = 64.0
"""Broadcast bucket with NCCL when ``bucket_mb`` is unset."""


def broadcast_settings(cfg: RunConfig, node_address: str) -> BroadcastSettings | None:
    """Settings of broadcast weight sync (None for the object store); ``node_address`` is the
    address of the node this worker runs on, the sender's default rendezvous address."""
    sync = cfg.transport.weight_sync
    if not isinstance(sync, BroadcastSync):
        return None
    backend = weight_sync_backend(cfg)
    assert backend in ("gloo", "nccl")
    default_mb = {"gloo": GLOO_BUCKET_MB, "nccl": NCCL_BUCKET_MB}[backend]
    bucket_mb = sync.bucket_mb if sync.bucket_mb is not None else default_mb
    return BroadcastSettings(
        bucket_bytes=max(1, int(bucket_mb * 2**20)),
        backend=backend,
        address=sync.address or node_address,
        join_timeout_s=sync.join_timeout_s,
        op_timeout_s=sync.op_timeout_s,
        keepalive_s=min(5.0, sync.op_timeout_s / 4),
    )
