"""The data-parallel engine (torch DDP): every rank holds the full policy and optimizer state;
gradients are all-reduced (averaged) once per optimizer step, after the last micro-batch. The
policy is float32 (master weights); forward passes run under autocast to the compute dtype
(:mod:`.precision`), so the gradients DDP reduces are float32."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from zbrl.models.cpu_attention import attention_in_float32
from zbrl.models.forward import autocast
from zbrl.training.engine.precision import check_compute_dtype, check_master
from zbrl.training.engine.ranked import RankedEngine
from zbrl.training.engine.single import (
    clipped_step,
    cpu_snapshot,
    load_trained_weights,
    trainable_parameters,
    trained_weights,
)
from zbrl.training.model_inputs import ModelInputs

OptimizerFactory = Callable[
    [Iterable[torch.nn.Parameter]],
    tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler],
]
"""Builds the optimizer and its LR schedule over the parameters an engine trains (sharded
engines must build it after sharding, so engines take the factory, not the optimizer)."""


class DdpEngine(RankedEngine):
    """:class:`~zbrl.training.engine.base.Engine` over torch DDP in an initialised process group.

    Every rank loads the same weights; DDP also broadcasts rank 0's at construction. The loss of
    each micro-batch is this rank's share of the step objective over the *global* normalisers,
    scaled by ``world_size`` because DDP averages the ranks' gradients: the result is the
    gradient one process computes on the whole batch.
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        optimizer_factory: OptimizerFactory,
        *,
        reference: torch.nn.Module | None = None,
        device: torch.device | str = "cpu",
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.compute_dtype = check_compute_dtype(compute_dtype)
        check_master(policy, "policy")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = torch.device(device)
        for model in (policy, reference):
            if model is not None:
                attention_in_float32(model, self.device, self.compute_dtype)
        self.policy = policy  # the plain module (weights, save_pretrained)
        ids = [self.device.index or 0] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(policy, device_ids=ids)
        self.reference = reference
        self.optimizer, self.scheduler = optimizer_factory(trainable_parameters(policy))
        self.optimizer_steps = 0

    def zero_grad(self) -> None:
        self.ddp.train()
        self.optimizer.zero_grad(set_to_none=True)

    def microbatch(self, last: bool) -> AbstractContextManager[Any]:
        return nullcontext() if last else self.ddp.no_sync()

    def policy_logits(self, inputs: ModelInputs) -> torch.Tensor:
        with self._forward_context():
            return inputs.logits(self.ddp)

    def _forward_context(self) -> AbstractContextManager[Any]:
        return autocast(self.device, self.compute_dtype)

    def clip_and_step(self, max_norm: float) -> float:
        # the gradients are identical on every rank after the all-reduce: so is the norm
        grad_norm = clipped_step(self.policy, self.optimizer, self.scheduler, max_norm)
        self.optimizer_steps += 1
        return grad_norm

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return trained_weights(self.policy) if self.rank == 0 else {}

    def save_pretrained(self, directory: Path) -> None:
        if self.rank == 0:
            self.policy.save_pretrained(directory, safe_serialization=True)

    def state_dict(self) -> dict[str, Any]:
        """The same on every rank (replicas): policy, optimizer, scheduler, step count."""
        return cpu_snapshot(
            {
                "policy": trained_weights(self.policy),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "optimizer_steps": self.optimizer_steps,
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load on every rank (each rank passes the same state, e.g. rank 0's); ``policy`` may be
        left out when every rank was built from the same checkpoint's weights."""
        if "policy" in state:
            load_trained_weights(self.policy, state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.optimizer_steps = state["optimizer_steps"]
