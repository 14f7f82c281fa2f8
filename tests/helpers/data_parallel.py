"""Check that data-parallel engines train exactly like one process: run the same train steps on
``world_size`` ranks (spawned processes in one gloo group on 127.0.0.1) and on one process, and
return what to compare. Used by ``tests/unit/test_data_parallel.py`` (many cases per process
group: setting a group up costs seconds)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zbrl.types import RolloutGroup


@dataclass(frozen=True)
class Case:
    """One comparison: config overrides and a batch shape."""

    name: str
    overrides: tuple[str, ...]
    num_groups: int
    group_size: int = 3
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def make_groups(case: Case, vocab: int) -> list[RolloutGroup]:
    """Random groups with uneven prompt and response lengths (some responses empty-ish short,
    one truncated) and varied rewards."""
    rng = random.Random(case.seed)
    gen = torch.Generator().manual_seed(case.seed)
    groups = []
    for b in range(case.num_groups):
        lengths = [rng.randint(1, 7) for _ in range(case.group_size)]
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 6))]
        groups.append(
            RolloutGroup(
                uid=f"case-{b}",
                prompt_ids=prompt,
                response_ids=[torch.randint(3, vocab, (n,), generator=gen) for n in lengths],
                behaviour_logprobs=[-4.0 - torch.rand(n, generator=gen) for n in lengths],
                rewards=[float(rng.random() < 0.5) + 0.1 * i for i in range(case.group_size)],
                format_acc=[1.0] * case.group_size,
                ans_acc=[rng.random() for _ in range(case.group_size)],
                truncated=[i == 0 and b == 1 for i in range(case.group_size)],
                policy_version=0,
                temperature=1.0,
                producer=0,
                ticket=b,
            )
        )
    return groups


def first_step(trainer: Any, groups: list[RolloutGroup]) -> tuple[dict[str, torch.Tensor], dict]:
    """``trainer.train(groups)``: the whole gradients of its first optimizer step (captured just
    before the step clips them) and the step's metrics."""
    engine, step, grads = trainer.engine, trainer.engine.clip_and_step, []
    engine.clip_and_step = lambda max_norm: grads.append(full_grads(engine)) or step(max_norm)
    metrics = trainer.train(groups)
    return grads[0], metrics


def full_grads(engine: Any) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient by name (a collective for sharded engines)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in engine.policy.named_parameters():
        grad = p.grad
        if isinstance(grad, DTensor):
            grad = grad.full_tensor()
        out[name] = grad.detach().cpu().clone() if grad is not None else None
    return out


def fsdp2_placement(engine: Any) -> dict[str, Any]:
    """Where an FSDP2 engine keeps its state: the offload policy of every sharded module (read
    from FSDP2's own per-module state, which has no public getter) and the devices of the
    parameter shards, their gradients and the optimizer state."""
    from torch.distributed.fsdp import FSDPModule

    policies = {
        type(m._get_fsdp_state()._fsdp_param_group.offload_policy).__name__
        for m in engine.policy.modules()
        if isinstance(m, FSDPModule)
    }
    params = list(engine.policy.parameters())
    optimizer_state = [
        t for state in engine.optimizer.state.values() for t in state.values() if t.dim() > 0
    ]
    return {
        "offload_policies": sorted(policies),
        "param_devices": sorted({str(p.to_local().device) for p in params}),
        "optimizer_state_devices": sorted({str(t.to_local().device) for t in optimizer_state}),
        "optimizer_state_tensors": len(optimizer_state),
    }


def run_case(case: Case, engine_type: str, world_size: int, model_dir: Path) -> dict[str, Any]:
    """Build the engine of ``engine_type`` from the config of ``case`` and train one batch;
    returns (on rank 0) the gradients of each optimizer step, the metrics and the weights
    after."""
    from zbrl.assembly.models import build_engine
    from zbrl.assembly.settings import step_settings
    from zbrl.config import load_config
    from zbrl.training.train_step import Trainer

    overrides = [
        f"launch.num_consumers={world_size}",
        f"training.engine={engine_type}",
        "training.device=cpu",
        "training.train_batch_size=" + str(2 * case.num_groups),  # divisible by world_size
        *case.overrides,
    ]
    cfg = load_config(None, overrides)
    torch.manual_seed(0)
    engine = build_engine(cfg, model_dir, total_steps=4)
    vocab = engine.policy.config.vocab_size
    trainer = Trainer(engine, step_settings(cfg, pad_id=0))
    grads: list[dict[str, torch.Tensor]] = []
    step = engine.clip_and_step

    def recording_step(max_norm: float) -> float:
        grads.append(full_grads(engine))
        return step(max_norm)

    engine.clip_and_step = recording_step  # type: ignore[method-assign]
    metrics = trainer.train(make_groups(case, vocab))
    weights = engine.full_state_dict()
    out = {"grads": grads, "metrics": metrics, "weights": weights, "rank": engine.rank}
    if engine_type == "fsdp2":
        out["placement"] = fsdp2_placement(engine)
    if "checkpoint_dir" in case.extra:
        out.update(_checkpoint_and_resume(case, cfg, model_dir, trainer, vocab))
    return out


def _checkpoint_and_resume(case: Case, cfg: Any, model_dir: Path, trainer: Any, vocab: int):
    """Save the engine (``from_pretrained`` layout) and its state, train one more batch; a fresh
    engine loaded from that state trains the same batch: both results are returned."""
    from zbrl.assembly.models import build_engine
    from zbrl.assembly.settings import step_settings
    from zbrl.training.checkpoint import save_checkpoint
    from zbrl.training.train_step import Trainer

    engine = trainer.engine
    path = Path(case.extra["checkpoint_dir"])
    save_checkpoint(engine, None, path)
    state = engine.state_dict()
    saved_weights = {k: v.clone() for k, v in engine.full_state_dict().items()}
    follow_up = make_groups(Case(case.name, case.overrides, case.num_groups, seed=99), vocab)
    trainer.train(follow_up)
    continued = {k: v.clone() for k, v in engine.full_state_dict().items()}
    resumed_engine = build_engine(cfg, model_dir, total_steps=4)
    resumed_engine.load_state_dict(state)
    Trainer(resumed_engine, step_settings(cfg, pad_id=0)).train(follow_up)
    return {
        "saved_weights": saved_weights,
        "continued": continued,
        "resumed": resumed_engine.full_state_dict(),
        "steps": (engine.optimizer_steps, resumed_engine.optimizer_steps),
        "checkpoint_entries": sorted(p.name for p in path.parent.iterdir()),
    }


def _rank_main(rank: int, world_size: int, port: int, engine_type: str, cases, model_dir, out):
    from zbrl.models.quiet import quiet_transformers
    from zbrl.training.distributed import GroupSpec, join_group, leave_group

    quiet_transformers()
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    join_group(GroupSpec("127.0.0.1", port, world_size, "gloo", 120.0), rank)
    try:
        results = {c.name: run_case(c, engine_type, world_size, Path(model_dir)) for c in cases}
    finally:
        leave_group()
    if rank == 0:
        torch.save(results, out)


def run_distributed(
    engine_type: str, cases: list[Case], model_dir: Path, out: Path, world_size: int = 2
) -> dict[str, Any]:
    """Every case on ``world_size`` spawned ranks of one gloo group; rank 0's results."""
    import torch.multiprocessing as mp

    from zbrl.training.distributed import GroupHost

    host = GroupHost("127.0.0.1", timeout_s=120.0)
    mp.spawn(
        _rank_main,
        args=(world_size, host.port, engine_type, cases, str(model_dir), str(out)),
        nprocs=world_size,
        join=True,
    )
    return torch.load(out, weights_only=False)
