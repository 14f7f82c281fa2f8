"""``zbrl plan --memory RECIPE``: the memory plan's table, verdict and fixes (docs/memory.md).

When the plan does not fit, the changes that would make it fit are computed, not guessed: each
candidate (more FSDP2 ranks, FSDP2 CPU offload, LoRA, gradient checkpointing, a smaller
micro-batch, a larger vLLM share) is applied to the recipe as command-line overrides, validated
like any config, planned again, and named only when it fits.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from zbrl.config import ConfigError, RunConfig, load_config
from zbrl.config.loader import apply_overrides, build_config
from zbrl.config.rewards import RewardModelReward
from zbrl.errors import RunError
from zbrl.planning.memory import GIB, MemoryPlan, WorkerMemory, plan_memory
from zbrl.planning.model_shape import ModelShape, model_shape, read_shape

MAX_FSDP2_RANKS = 64
"""The largest consumer count a fix proposes."""
NO_FIX = (
    "no single change tried fits (more FSDP2 ranks, FSDP2 CPU offload, LoRA, gradient "
    "checkpointing, smaller micro-batches); use GPUs with more memory"
)


@dataclass(frozen=True)
class Fix:
    """A change (command-line overrides) whose plan fits, and the GPUs its layout needs."""

    overrides: list[str]
    why: str
    gpus: int

    def text(self) -> str:
        return f"{' '.join(self.overrides)}  ({self.why}; {self.gpus} GPU(s) in all)"


def reward_shape(cfg: RunConfig) -> ModelShape | None:
    """The reward model's shape when it runs on GPU reward workers, else None."""
    reward = cfg.reward
    if isinstance(reward, RewardModelReward) and reward.workers and reward.worker_num_gpus > 0:
        return read_shape(reward.path, cfg.logging.cache_dir, field="reward.path")
    return None


def plan_for(cfg: RunConfig, gpu_bytes: int | None, shape: ModelShape | None = None) -> MemoryPlan:
    """The memory plan of ``cfg`` (the policy's shape read unless given)."""
    return plan_memory(cfg, shape or model_shape(cfg), gpu_bytes, reward_shape(cfg))


@dataclass(frozen=True)
class Candidate:
    """A change to try: its kind (one fix per kind is named), overrides, and why it helps."""

    kind: str
    overrides: list[str]
    why: str


def candidates(cfg: RunConfig, plan: MemoryPlan) -> list[Candidate]:
    """Changes to try, the smallest first within each kind."""
    out: list[Candidate] = []
    t = cfg.training
    if plan.worker("consumer").gpus > 0:
        for n in range(2, MAX_FSDP2_RANKS + 1):
            out.append(
                Candidate(
                    "fsdp2",
                    [
                        "training.engine={type: fsdp2}",
                        f"launch.num_consumers={n}",
                        "launch.consumer_num_gpus=1",
                    ],
                    f"shard the policy, gradients and AdamW state over {n} FSDP2 ranks",
                )
            )
        for n in sorted({max(cfg.launch.num_consumers, 1), 1, 2}):
            out.append(
                Candidate(
                    "offload",
                    [
                        "training.engine={type: fsdp2, cpu_offload: true}",
                        f"launch.num_consumers={n}",
                        "launch.consumer_num_gpus=1",
                    ],
                    f"FSDP2 CPU offload on {n} rank(s): weights, gradients, AdamW state in host "
                    "memory",
                )
            )
        if cfg.model.lora is None:
            engine = "single" if cfg.launch.num_consumers == 1 else "ddp"
            out.append(
                Candidate(
                    "lora",
                    ["model.lora={rank: 16}", f"training.engine={{type: {engine}}}"],
                    "train LoRA adapters (rank 16) on a frozen base",
                )
            )
        if not cfg.model.gradient_checkpointing:
            out.append(
                Candidate(
                    "checkpointing", ["model.gradient_checkpointing=true"], "recompute activations"
                )
            )
        if t.train_microbatch_tokens is not None:
            tokens = t.train_microbatch_tokens // 2
            while tokens >= 1:
                out.append(
                    Candidate(
                        "micro-batch",
                        [f"training.train_microbatch_tokens={tokens}"],
                        f"{tokens} tokens per micro-batch",
                    )
                )
                tokens //= 2
        for m in range(t.train_microbatch_size - 1, 0, -1):
            out.append(
                Candidate(
                    "micro-batch",
                    [f"training.train_microbatch_size={m}"],
                    f"{m} sequence(s) per micro-batch",
                )
            )
    backend = cfg.rollout.backend
    vllm = backend.type == "vllm" and plan.worker("producer").gpus > 0
    if vllm and backend.gpu_memory_utilization < 0.9:
        out.append(
            Candidate(
                "vllm",
                ["rollout.backend.gpu_memory_utilization=0.9"],
                "give vLLM 90% of its GPU",
            )
        )
    return out


def find_fixes(cfg: RunConfig, plan: MemoryPlan, gpus: int | None) -> list[Fix]:
    """The candidates whose plan fits (in ``gpus`` GPUs when given): the first of each kind,
    each applied to ``cfg`` as overrides and validated like a recipe."""
    raw = cfg.model_dump(mode="json")
    fixes: list[Fix] = []
    found: set[str] = set()
    for c in candidates(cfg, plan):
        if c.kind in found:
            continue
        try:
            candidate = build_config(apply_overrides(raw, c.overrides))
        except ConfigError:
            continue  # a combination the config refuses (e.g. LoRA with FSDP2)
        new_plan = plan_for(candidate, plan.gpu_bytes, plan.shape)
        if new_plan.fits(gpus):
            found.add(c.kind)
            fixes.append(Fix(c.overrides, c.why, new_plan.gpus_needed))
    return fixes


def fix_summary(cfg: RunConfig, plan: MemoryPlan, gpus: int | None = None) -> str:
    """The fixes in one sentence, for the pre-flight's error line."""
    fixes = find_fixes(cfg, plan, gpus)
    if not fixes:
        return NO_FIX
    return "it would fit with " + "; or ".join(f"{' '.join(f.overrides)} ({f.why})" for f in fixes)


def gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def render(plan: MemoryPlan, cfg: RunConfig) -> str:
    """The per-worker table (GiB by part), the consumer's subtotal before activations, the
    host memory that offload uses."""
    shape = plan.shape
    lines = [
        f"model: {shape.params / 1e9:.3f}B parameters ({shape.summary}); shape from {shape.source}",
        f"consumer micro-batch: {plan.tokens_per_microbatch} tokens per rank; engine "
        f"{cfg.training.engine.type}, compute {cfg.model.dtype}, gradient checkpointing "
        f"{'on' if cfg.model.gradient_checkpointing else 'off'}",
        "",
    ]
    workers = plan.workers
    parts: list[str] = []
    for w in workers:
        parts += [p for p in w.device if p not in parts]
    header = ["GiB", *(worker_label(w) for w in workers)]
    rows = [header]
    for part in parts:
        rows.append([part, *(gib(w.device[part]) if part in w.device else "" for w in workers)])
    rows.append(["total", *(gib(w.total) for w in workers)])
    if plan.gpu_bytes is not None:
        rows.append(
            ["available", *(gib(w.capacity(plan.gpu_bytes)) if w.gpus else "cpu" for w in workers)]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append(
            "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))
        )
    consumer = plan.worker("consumer")
    before = before_activations(consumer)
    lines.append(
        f"\nconsumer before activations: {gib(before)} GiB per rank "
        f"({before / shape.params:.1f} B/parameter)"
    )
    if consumer.host:
        lines.append(
            f"consumer host memory (offload): {gib(sum(consumer.host.values()))} GiB per rank "
            f"({', '.join(f'{k} {gib(v)}' for k, v in consumer.host.items())})"
        )
    return "\n".join(lines)


def before_activations(consumer: WorkerMemory) -> int:
    """The consumer's state, compute copy, reference and critic: the hand count's terms."""
    skip = {"activations", "attention scores", "logits", "log-prob buffer", "runtime"}
    return sum(v for k, v in consumer.device.items() if k not in skip)


def worker_label(w: WorkerMemory) -> str:
    where = f"{w.gpus:g} GPU" if w.gpus else "CPU"
    return f"{w.name} x{w.count} ({where})"


def verdict(plan: MemoryPlan, gpus: int | None) -> str:
    """One line: fits, or what does not."""
    if plan.gpu_bytes is None:
        if not plan.gpu_workers:
            return "verdict: no worker on a GPU (a CPU run): nothing to judge"
        return "verdict: not judged: give the GPUs' memory with --gpu-gb"
    size = f"{plan.gpu_bytes / GIB:g} GiB"
    if not plan.gpu_workers:
        return "verdict: fits (no worker on a GPU: a CPU run)"
    problems = []
    if gpus is not None and plan.gpus_needed > gpus:
        problems.append(f"the layout needs {plan.gpus_needed} GPUs, {gpus} given")
    used, capacity = plan.shared_bytes()
    if used > capacity:
        problems.append(
            f"the workers sharing GPUs need {gib(used)} GiB together, their GPUs hold "
            f"{gib(capacity)} GiB"
        )
    for w in plan.gpu_workers:
        if w.total > w.capacity(plan.gpu_bytes):
            problems.append(f"a {w.name} needs {gib(w.total)} GiB of a {size} GPU")
        for part, need in w.needs.items():
            if w.device.get(part, 0) < need:
                problems.append(
                    f"a {w.name}'s {part} has {gib(w.device.get(part, 0))} GiB, it needs "
                    f"{gib(need)} GiB"
                )
    if problems:
        return "verdict: does not fit: " + "; ".join(problems)
    return f"verdict: fits {plan.gpus_needed} GPU(s) of {size}"


def as_json(plan: MemoryPlan, gpus: int | None, fixes: list[Fix]) -> dict:
    return {
        "fits": plan.fits(gpus),
        "gpu_bytes": plan.gpu_bytes,
        "gpus_needed": plan.gpus_needed,
        "params": plan.shape.params,
        "shape_source": plan.shape.source,
        "tokens_per_microbatch": plan.tokens_per_microbatch,
        "workers": {
            w.name: {
                "count": w.count,
                "gpus": w.gpus,
                "device": w.device,
                "host": w.host,
                "total": w.total,
                **({"capacity": w.capacity(plan.gpu_bytes)} if plan.gpu_bytes else {}),
            }
            for w in plan.workers
        },
        "fixes": [{"overrides": f.overrides, "why": f.why, "gpus": f.gpus} for f in fixes],
    }


def run_memory_command(args: argparse.Namespace) -> int:
    """``zbrl plan --memory RECIPE``: 0 when the plan fits (or nothing is judged), 1 when it
    does not (naming the changes that would fit)."""
    recipe, overrides = args.run_dir, list(args.overrides)
    gpu_bytes = int(args.gpu_gb * GIB) if args.gpu_gb is not None else None
    cfg = load_config(recipe, overrides)
    try:
        plan = plan_for(cfg, gpu_bytes)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    fits = plan.fits(args.gpus)
    fixes = [] if fits else find_fixes(cfg, plan, args.gpus)
    if args.json:
        print(json.dumps(as_json(plan, args.gpus, fixes)))
    else:
        print(render(plan, cfg))
        print(verdict(plan, args.gpus))
        if not fits:
            print(fix_text(fixes))
    return 0 if fits else 1


def fix_text(fixes: list[Fix]) -> str:
    if not fixes:
        return NO_FIX
    return "changes that fit:\n" + "\n".join(f"  {f.text()}" for f in fixes)
