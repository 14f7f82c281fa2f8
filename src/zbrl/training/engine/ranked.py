"""What the data-parallel engines (DDP, FSDP2) share: the frozen reference, the loss scaling for
gradient averaging, the collectives over the consumers' process group, the compute dtype, and
the context-parallel view of the ranks (none unless the FSDP2 engine sets ``sequence``)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

import torch

from zbrl.algorithms.aggregation import Normalisers
from zbrl.training import distributed
from zbrl.training.model_inputs import ModelInputs

if TYPE_CHECKING:
    from zbrl.training.engine.context_parallel import SequenceShard


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
    forward pass computes in it (:meth:`_forward_context`). ``sequence`` is this rank's
    context-parallel group (None: every rank trains its own slice of the data)."""

    rank: int
    world_size: int
    sequence: SequenceShard | None = None
    device: torch.device
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    compute_dtype: torch.dtype

    def _forward_context(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    @property
    def has_reference(self) -> bool:
        return self.reference is not None

    @property
    def data_rank(self) -> int:
        return self.rank if self.sequence is None else self.rank // self.sequence.size

    @property
    def data_parallel_size(self) -> int:
        return self.world_size if self.sequence is None else self.world_size // self.sequence.size

    def local_tokens(self, targets_BT: torch.Tensor) -> torch.Tensor:
        return targets_BT if self.sequence is None else self.sequence.local(targets_BT)

    def gather_tokens(self, part_BS: torch.Tensor, width: int) -> torch.Tensor:
        return part_BS if self.sequence is None else self.sequence.gather(part_BS, width)

    def reference_logits(self, inputs: ModelInputs) -> torch.Tensor:
        with self._forward_context():
            return reference_logits(self.reference, inputs)

    def backward(self, loss: torch.Tensor) -> None:
        # The reduction averages over every rank: scale back to the sum. Under context
        # parallelism too: each rank of a group back-propagates its own tokens' share of the
        # group's loss (see zbrl.training.engine.context_parallel).
        (loss * self.world_size).backward()

    def reduce_normalisers(self, norm: Normalisers) -> Normalisers:
        tokens, seqs = self.all_reduce([norm.tokens, norm.seqs], "sum")
        return Normalisers(tokens=tokens, seqs=seqs, norm_tokens=norm.norm_tokens)

    def all_reduce(self, values: list[float], op: Literal["sum", "max"]) -> list[float]:
        if self.sequence is not None and self.sequence.rank > 0:
            # the group's first rank holds the same values: the others count nothing
            values = [0.0 if op == "sum" else float("-inf")] * len(values)
        return distributed.all_reduce_floats(values, op, self.device)

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])
