"""The memory plan's consumer prediction against the measured peak of real training steps, on CPU.

For each model (the embedded tiny model; SmolLM2-135M when pulled: ``zbrl models pull
smollm2-135m``) and each setting (float32, bfloat16 autocast, gradient checkpointing), the
project's own engine and train step (:func:`zbrl.assembly.models.build_engine`,
:class:`zbrl.training.train_step.Trainer`) train two steps on groups whose every row has the
longest length the plan assumes (``data.max_prompt_tokens`` + ``max_new_tokens``; shared prompts
off, as the plan counts full rows), two micro-batches per step.

How the peak is measured: the CPU allocator's own record. The second step runs under
``torch.profiler.profile(profile_memory=True)``, which records every allocation and free of the
CPU allocator (``[memory]`` events, signed byte counts, time-stamped); their running sum's maximum
is the step's peak above what was live when it started. What was live then is counted exactly:
the storages of the parameters, their gradients and AdamW's state (by storage pointer, each
once). Peak = that + the running sum's maximum. Resident-set sizes are not used: glibc keeps
freed pages, and the interpreter, torch and the tokenizer add hundreds of MB that are not the
plan's. The plan's ``runtime`` part is GPU-only and absent here.

Usage::

    python bench/memory_plan.py                 # embedded model, and SmolLM2 when pulled
    python bench/memory_plan.py --models embedded
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from zbrl.assembly.models import build_engine
from zbrl.assembly.settings import step_settings
from zbrl.config import load_config
from zbrl.planning.memory import plan_memory
from zbrl.planning.model_shape import read_shape
from zbrl.training.train_step import Trainer
from zbrl.types import RolloutGroup

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "zbrl"
MIB = 1024 * 1024
SETTINGS = {
    "fp32": [],
    "bf16": ["model.dtype=bfloat16"],
    "fp32+ckpt": ["model.gradient_checkpointing=true"],
}


@dataclass(frozen=True)
class Row:
    model: str
    setting: str
    tokens: int
    planned: int
    measured: int
    state: int
    """Bytes live at the step's start (parameters, gradients, AdamW state)."""

    @property
    def error(self) -> float:
        return (self.planned - self.measured) / self.measured


def groups(num: int, size: int, prompt: int, response: int, vocab: int, seed: int):
    """``num`` random groups of ``size`` rows, every prompt and response at its full length."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for b in range(num):
        out.append(
            RolloutGroup(
                uid=f"g{seed}-{b}",
                prompt_ids=torch.randint(3, vocab, (prompt,), generator=gen).tolist(),
                response_ids=[
                    torch.randint(3, vocab, (response,), generator=gen) for _ in range(size)
                ],
                behaviour_logprobs=[
                    -4.0 - torch.rand(response, generator=gen) for _ in range(size)
                ],
                rewards=[float(i % 2) for i in range(size)],
                format_acc=[1.0] * size,
                ans_acc=[0.5] * size,
                truncated=[False] * size,
                policy_version=0,
                temperature=1.0,
                producer=0,
                ticket=b,
            )
        )
    return out


def live_state_bytes(engine) -> int:
    """Storages of the parameters, gradients and optimizer state, each counted once."""
    seen: dict[int, int] = {}

    def add(t) -> None:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()

    for p in engine.policy.parameters():
        add(p)
        add(p.grad)
    for state in engine.optimizer.state.values():
        for v in state.values():
            add(v)
    return sum(seen.values())


def profiled_peak(step) -> int:
    """The running sum's maximum of the CPU allocator's allocations and frees during ``step()``
    (the profiler's allocation events, each with its signed size, in time order)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    sizes: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(sizes):
        live += size
        peak = max(peak, live)
    return peak


def measure(name: str, model_dir: Path, base: list[str], setting: str) -> Row:
    overrides = [
        "training.device=cpu",
        "training.share_prompts=false",
        "algorithm.beta=0.0",
        *base,
        *SETTINGS[setting],
    ]
    cfg = load_config(None, overrides)
    shape = read_shape(str(model_dir), str(CACHE), field="model.path")
    planned = plan_memory(cfg, shape).worker("consumer").total
    g = cfg.rollout.generation.num_generations
    prompt, response = cfg.data.max_prompt_tokens, cfg.rollout.generation.max_new_tokens
    torch.manual_seed(0)
    engine = build_engine(cfg, model_dir, total_steps=4)
    trainer = Trainer(engine, step_settings(cfg, pad_id=0))
    b = cfg.training.train_batch_size
    trainer.train(groups(b, g, prompt, response, shape.vocab, seed=1))
    state = live_state_bytes(engine)
    peak = profiled_peak(lambda: trainer.train(groups(b, g, prompt, response, shape.vocab, 2)))
    tokens = cfg.training.train_microbatch_size * (prompt + response)
    return Row(name, setting, tokens, planned, state + peak, state)


MODELS = {
    # (config overrides; each step: train_batch_size groups x G rows, two micro-batches)
    "embedded": [
        "data.max_prompt_tokens=64",
        "rollout.generation.max_new_tokens=64",
        "rollout.generation.num_generations=4",
        "training.train_batch_size=2",
        "training.train_microbatch_size=4",
    ],
    "smollm2-135m": [
        "model.path=smollm2-135m",
        "data.allow_embedded_task_with_user_model=true",
        "data.max_prompt_tokens=128",
        "rollout.generation.max_new_tokens=128",
        "rollout.generation.num_generations=4",
        "training.train_batch_size=2",
        "training.train_microbatch_size=4",
    ],
}


def model_dir_of(name: str) -> Path | None:
    if name == "embedded":  # the embedded model's shape, random weights (the peak is the same)
        from zbrl.embedded.tiny_model import create_embedded_model

        return create_embedded_model(Path(tempfile.mkdtemp(prefix="zbrl-memory-")) / "model")
    from zbrl.models.catalogue import model_dir
    from zbrl.models.gguf_convert import is_converted

    target = model_dir(name, CACHE)
    return target if is_converted(target) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated subset")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in args.models.split(","):
        directory = model_dir_of(name)
        if directory is None:
            print(f"{name}: not pulled (zbrl models pull {name}); skipped", file=sys.stderr)
            continue
        for setting in args.settings.split(","):
            rows.append(measure(name, directory, MODELS[name], setting))
            print_row(rows[-1], header=len(rows) == 1)
    return 0


def print_row(r: Row, header: bool) -> None:
    if header:
        print(
            f"{'model':14} {'setting':10} {'tokens/mb':>9} {'state MiB':>10} "
            f"{'planned MiB':>11} {'measured MiB':>12} {'error':>7}"
        )
    print(
        f"{r.model:14} {r.setting:10} {r.tokens:9d} {r.state / MIB:10.1f} "
        f"{r.planned / MIB:11.1f} {r.measured / MIB:12.1f} {r.error:+7.1%}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
