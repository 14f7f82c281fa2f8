"""What the data-parallel engines (DDP, FSDP2) share: the frozen reference, the loss scaling for
gradient averaging, the collectives over the consumers' process group, and the compute dtype."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Literal

import torch

from zbrl.algorithms.aggregation import Normalisers
from zbrl.training import distributed
from zbrl.training.model_inputs import ModelInputs


def reference_logits(reference: torch.nn.Module | None, inputs: ModelInputs) -> torch.Tensor:
    """Logits of the frozen reference aligned with the targets, without grad; ValueError when
    there is none."""
    if reference is None:
        raise ValueError("this engine has no reference model (algorithm.beta is 0)")
    with torch.no_grad():
        return inputs.logits(reference)


class RankedEngine:
    """Base of the engines whose ranks average gradients over the process group; subclasses set
    ``world_size``, ``device``, ``reference``, ``optimizer`` and ``compute_dtype``, and say how a
    forward pass computes in it (:meth:`_forward_context`)."""

    world_size: int
    device: torch.device
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    compute_dtype: torch.dtype

    def _forward_context(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    @property
    def has_reference(self) -> bool:
        return self.reference is not None

    def reference_logits(self, inputs: ModelInputs) -> torch.Tensor:
        with self._forward_context():
            return reference_logits(self.reference, inputs)

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.world_size).backward()  # the reduction averages: scale back to the sum

    def reduce_normalisers(self, norm: Normalisers) -> Normalisers:
        return distributed.reduce_normalisers(norm, self.device)

    def all_reduce(self, values: list[float], op: Literal["sum", "max"]) -> list[float]:
        return distributed.all_reduce_floats(values, op, self.device)

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])
