"""A zbrl run config as TRL ``GRPOConfig`` arguments, with every setting that does not carry over.

:func:`grpo_config_kwargs` returns plain keyword arguments (TRL itself is not imported here, so
the translation is testable without TRL installed). A zbrl setting TRL has no equivalent for, in
a way that changes what is trained, is refused with ``ValueError`` naming it; a difference that
remains between two otherwise matched runs is listed in ``Translation.unmatched``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zbrl.config import RunConfig

LOSS_TYPES = {
    # zbrl loss aggregation -> TRL loss_type (one optimizer step per batch, no accumulation)
    "token-mean": "dapo",  # sum over the batch's tokens / number of tokens
    "seq-mean-token-mean": "grpo",  # per-sequence token mean, then the mean over sequences
    "seq-mean-token-sum-norm": "dr_grpo",  # sum / (sequences * max_completion_length)
}
SCALE_REWARDS = {"grpo": "group", "dr_grpo": "none"}
"""zbrl advantage -> TRL scale_rewards (group mean baseline, with or without the group std)."""
TRL_ADVANTAGE_EPS = 1e-4
"""TRL divides by ``std + 1e-4`` (grpo_trainer.py); zbrl's eps is a setting."""


@dataclass(frozen=True)
class Translation:
    kwargs: dict[str, Any]
    """Keyword arguments for ``trl.GRPOConfig``."""
    unmatched: list[str]
    """Differences that remain, one sentence each."""


def grpo_config_kwargs(
    cfg: RunConfig, *, output_dir: str, max_steps: int, threads: int
) -> Translation:
    """TRL ``GRPOConfig`` keyword arguments for the algorithm, batch and generation of ``cfg``.

    One TRL step = one zbrl step: ``train_batch_size`` prompts × ``num_generations`` completions
    generated in one batch and trained with one optimizer step. ``threads``: the torch threads
    the TRL process runs with (both phases), to compare with zbrl's per-worker threads.
    """
    a, g, t = cfg.algorithm, cfg.rollout.generation, cfg.training
    _refuse(cfg)
    completions = t.train_batch_size * g.num_generations
    schedule = a.lr_schedule
    kwargs: dict[str, Any] = {
        "output_dir": output_dir,
        "max_steps": max_steps,
        "seed": cfg.seed,
        "learning_rate": a.lr,
        "lr_scheduler_type": (
            "constant_with_warmup" if schedule.decay == "constant" else "cosine_with_min_lr"
        ),
        "warmup_steps": schedule.warmup_steps,
        "weight_decay": a.weight_decay,
        "adam_beta1": a.adam_betas[0],
        "adam_beta2": a.adam_betas[1],
        "max_grad_norm": a.max_norm,
        "optim": "adamw_torch",
        "per_device_train_batch_size": completions,
        "gradient_accumulation_steps": 1,
        "generation_batch_size": completions,
        "num_generations": g.num_generations,
        "max_completion_length": g.max_new_tokens,
        "temperature": g.temperature,
        "top_p": g.top_p,
        "top_k": g.top_k if g.top_k > 0 else 0,
        "beta": a.beta,
        "num_iterations": a.ppo_epochs,
        "epsilon": a.policy_loss.clip_eps_low,
        "epsilon_high": a.policy_loss.clip_eps_high,
        "loss_type": LOSS_TYPES[a.loss_aggregation],
        "scale_rewards": SCALE_REWARDS[a.advantage.type],
        "mask_truncated_completions": a.filter_truncated_response,
        "shuffle_dataset": cfg.data.shuffle,
        "activation_checkpointing": cfg.model.gradient_checkpointing,
        "bf16": cfg.model.dtype == "bfloat16",
        "fp16": cfg.model.dtype == "float16",
        "use_cpu": t.device == "cpu" or t.device == "auto",
        "remove_unused_columns": False,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": max_steps + 1,  # metrics are kept in memory; no log lines per step
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    if schedule.decay != "constant":
        kwargs["lr_scheduler_kwargs"] = {"min_lr_rate": schedule.min_lr_ratio}
    return Translation(kwargs, _unmatched(cfg, threads))


def _refuse(cfg: RunConfig) -> None:
    a, t = cfg.algorithm, cfg.training
    problems = []
    if a.critic is not None:
        problems.append("algorithm.critic (TRL's GRPOTrainer has no value model)")
    if a.policy_loss.type != "ppo_clip":
        problems.append(f"algorithm.policy_loss.type={a.policy_loss.type} (only ppo_clip)")
    if a.policy_loss.type == "ppo_clip" and a.policy_loss.dual_clip_c is not None:
        problems.append("algorithm.policy_loss.dual_clip_c (TRL has no dual clip)")
    if a.advantage.type not in SCALE_REWARDS:
        problems.append(f"algorithm.advantage.type={a.advantage.type} (only grpo, dr_grpo)")
    if a.loss_aggregation not in LOSS_TYPES:
        problems.append(f"algorithm.loss_aggregation={a.loss_aggregation}")
    if a.correction != "none":
        problems.append(f"algorithm.correction={a.correction} (TRL trains on-policy here)")
    if a.entropy_coef != 0.0:
        problems.append("algorithm.entropy_coef (not translated)")
    if a.filter_range is not None:
        problems.append("algorithm.filter_range (TRL keeps every group)")
    if cfg.minibatch_size != t.train_batch_size:
        problems.append("training.train_minibatch_size (only one optimizer step per batch)")
    if problems:
        raise ValueError("cannot translate to TRL GRPOConfig: " + "; ".join(problems))


def _unmatched(cfg: RunConfig, threads: int) -> list[str]:
    a, r = cfg.algorithm, cfg.rollout
    notes = [
        f"threads: zbrl runs each worker (producer, consumer) with launch.torch_threads="
        f"{cfg.launch.torch_threads} torch thread(s) in its own process; TRL runs generation and "
        f"training one after the other in one process with {threads} threads",
        "generation backend: zbrl's TransformersBackend calls generate with output_logits and "
        "computes the behaviour log-probs per step; TRL calls generate without logits",
        f"generation batching: zbrl generates {r.inference_batch_size} prompts per producer batch "
        f"in micro-batches of {r.inference_microbatch_size} prompts; TRL generates the whole step "
        "(train_batch_size prompts x num_generations) in one generate call",
        "old log-probs: zbrl's ratio is against the behaviour log-probs its producer recorded "
        "while sampling (no extra pass: algorithm.correction is none); TRL with num_iterations=1 "
        "uses the detached current log-probs",
        "staleness: zbrl async trains on rollouts up to transport.max_staleness versions old; "
        "TRL (and zbrl sync) train only on rollouts of the current weights",
        f"advantage eps: zbrl (r - mean) / (std + {a.advantage.eps:g}) "
        f"(std_unbiased={getattr(a.advantage, 'std_unbiased', None)}); TRL (r - mean) / "
        f"(std + {TRL_ADVANTAGE_EPS:g}) with torch's unbiased std",
        "micro-batching: zbrl pads per micro-batch of training.train_microbatch_size "
        "samples; TRL pads the step's completions to the longest one",
        "shared prompts: zbrl's generation prefills each prompt once for its G samples"
        + (
            " and its training runs each prompt once per group (training.share_prompts: the G "
            "responses on the prompt's cached keys and values)"
            if cfg.training.share_prompts
            else ""
        )
        + ", with the same samples, log-probs and gradients; TRL runs every one of the G prompt "
        "copies",
        "optimizer: both torch AdamW (eps 1e-8) with the same lr, betas, weight decay and "
        "grad-norm clip; TRL through transformers' Trainer (its LR scheduler object, its "
        "grad clipping)",
        "prompt order: zbrl's sampler (data.seed) and TRL's RepeatSampler (seed) draw different "
        "prompt orders from the same training prompts; sampling RNG streams differ",
        "reward: the same zbrl reward function, called by TRL through a reward_funcs wrapper "
        "(truncation = no EOS in the completion ids)",
        "per-step bookkeeping: zbrl records telemetry spans and writes checkpoints at the "
        "evaluation steps (inside its clock); TRL computes its per-step logging metrics (entropy, "
        "clip ratios), and the weight snapshots at evaluation steps are outside its clock",
    ]
    if a.beta > 0:
        notes.append(
            f"KL: zbrl {a.kl_estimator} estimator on the frozen reference; TRL its k3 estimator"
        )
    return notes
