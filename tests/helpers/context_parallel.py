"""Check Ulysses attention numerics on spawned gloo ranks: every rank runs the embedded model on
the same right-padded rows twice, once whole (plain sdpa) and once split over its
context-parallel group (:mod:`zbrl.training.engine.context_parallel`), and rank 0 returns what to
compare. Used by ``tests/unit/test_context_parallel.py``."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

LENGTHS = (11, 4, 8)
"""Real tokens of each row: uneven, none a multiple of 4 once shifted (so padding is split)."""


def rows(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids_BT`` (pad 0), the targets ``[B, T-1]`` and their mask."""
    gen = torch.Generator().manual_seed(3)
    width = max(LENGTHS)
    ids = torch.zeros((len(LENGTHS), width), dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        ids[i, :n] = torch.randint(3, vocab, (n,), generator=gen)
    mask = torch.arange(width - 1)[None, :] < torch.tensor(LENGTHS)[:, None] - 1
    return ids, ids[:, 1:], mask


def token_logprobs(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits_BTV.float(), -1).gather(-1, targets_BT[..., None])[..., 0]


def weighted_loss(logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient differs per token (so a misplaced token shows)."""
    weights_BT = torch.linspace(-1.0, 2.0, logp_BT.numel()).view_as(logp_BT)
    return torch.where(mask_BT, logp_BT * weights_BT, 0.0).sum()


def run_rank(model_dir: Path, size: int, kv_heads: int | None) -> dict[str, Any]:
    """One comparison on this rank for context-parallel groups of ``size``; ``kv_heads`` rebuilds
    the model with that many key/value heads (grouped-query attention), random weights."""
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM

    from zbrl.training.engine.context_parallel import (
        ULYSSES,
        context_parallel_groups,
        register_ulysses,
    )

    if kv_heads is None:
        plain = AutoModelForCausalLM.from_pretrained(model_dir)
    else:
        config = AutoConfig.from_pretrained(model_dir)
        config.num_key_value_heads = kv_heads
        torch.manual_seed(1)
        plain = AutoModelForCausalLM.from_config(config)
    split = AutoModelForCausalLM.from_config(copy.deepcopy(plain.config))
    split.load_state_dict(plain.state_dict())
    register_ulysses()
    split.set_attn_implementation(ULYSSES)
    ids, targets, mask = rows(plain.config.vocab_size)

    want_logp = token_logprobs(plain(input_ids=ids).logits[:, :-1], targets)
    weighted_loss(want_logp, mask).backward()

    shard = context_parallel_groups(size)
    local_logits = shard.logits(split, ids)
    logp = shard.gather(token_logprobs(local_logits, shard.local(targets)), targets.shape[1])
    weighted_loss(logp, mask).backward()
    grads = {}
    for name, p in split.named_parameters():
        dist.all_reduce(p.grad, group=shard.group)  # the group's gradient: the sum of its ranks'
        grads[name] = p.grad
    return {
        "logp": torch.where(mask, logp, 0.0).detach(),
        "want_logp": torch.where(mask, want_logp, 0.0).detach(),
        "local_width": local_logits.shape[1],
        "grads": grads,
        "want_grads": {n: p.grad for n, p in plain.named_parameters()},
    }


def _rank_main(rank: int, world: int, port: int, model_dir: str, cases, out: str) -> None:
    from zbrl.models.quiet import quiet_transformers
    from zbrl.training.distributed import GroupSpec, join_group, leave_group

    quiet_transformers()
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    join_group(GroupSpec("127.0.0.1", port, world, "gloo", 60.0), rank)
    try:
        results = {name: run_rank(Path(model_dir), *args) for name, args in cases.items()}
    finally:
        leave_group()
    if rank == 0:
        torch.save(results, out)


def run_spawned(model_dir: Path, world: int, cases: dict[str, tuple], out: Path) -> dict:
    """Each case ``name: (size, kv_heads)`` on ``world`` spawned ranks; rank 0's results."""
    import torch.multiprocessing as mp

    from zbrl.training.distributed import GroupHost

    host = GroupHost("127.0.0.1", timeout_s=60.0)
    mp.spawn(_rank_main, args=(world, host.port, str(model_dir), cases, str(out)), nprocs=world)
    return torch.load(out, weights_only=False)
