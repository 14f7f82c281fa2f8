"""The training engine: what the train step asks of the model, optimizer and devices.

The train step (:class:`zbrl.training.train_step.Trainer`) owns the RL logic: advantages, rows,
micro-batching, the loss and its aggregation, metrics. An engine owns everything that changes when
training is spread over processes: the policy (and frozen reference), the optimizer, the LR
scheduler, the device, gradient synchronisation and how full weights are gathered. The
single-process engine (:mod:`.single`), the data-parallel engine (:mod:`.ddp`) and the sharded
engine (:mod:`.fsdp2`) implement the same interface, so the step runs unchanged on all of them.

One optimizer step, as the trainer drives it::

    norm = engine.reduce_normalisers(local_norm)      # global token / sequence counts
    engine.zero_grad()
    for i, micro in enumerate(micro_batches):
        with engine.microbatch(last=i == len(micro_batches) - 1):
            logits_BTV = engine.policy_logits(micro.model_inputs())  # aligned with targets
            loss = ...                                 # normalised by the global ``norm``
            engine.backward(loss)
    lr = engine.current_lr()
    grad_norm = engine.clip_and_step(max_norm)

An engine may also own a critic (PPO's value model) and its optimizer (:attr:`has_critic`):
``zero_grad`` clears both, the step calls :meth:`critic_values` and :meth:`critic_backward` in the
same micro-batches and :meth:`critic_clip_and_step` after the policy's step. Only the
single-process engine has one so far (a config check refuses a critic on other engines).

Under context parallelism (the FSDP2 engine's ``context_parallel_size`` > 1) a group of ranks
shares one data-parallel slice of the batch and each rank's logits cover only its part of every
row's tokens: the step takes the matching part of the targets (:meth:`Engine.local_tokens`),
computes log-probs there and gathers them back to whole rows (:meth:`Engine.gather_tokens`), so
the loss and the metrics see whole rows on every rank. Without it both are the identity.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from zbrl.algorithms.aggregation import Normalisers
from zbrl.training.model_inputs import ModelInputs


class Engine(Protocol):
    """Model, optimizer and scheduler of one training process (see the module docstring)."""

    rank: int
    """This process's rank in the training group (0 for a single process)."""
    world_size: int
    """Processes training the same policy together (1 for a single process)."""
    data_rank: int
    """Which slice of each optimizer step's groups this process trains (``rank``, except under
    context parallelism, where a group of ranks shares one slice)."""
    data_parallel_size: int
    """Slices each optimizer step's groups are cut into (``world_size`` / context-parallel
    size)."""
    device: torch.device
    """Where micro-batch tensors go before the forward pass."""
    compute_dtype: torch.dtype
    """dtype of the forward and backward passes (``model.dtype``); the policy's (and critic's)
    parameters, gradients and optimizer state are float32 whatever it is
    (:mod:`zbrl.training.engine.precision`)."""
    optimizer_steps: int
    """Optimizer steps taken so far (part of :meth:`state_dict`)."""

    @property
    def has_reference(self) -> bool:
        """Whether a frozen reference model exists (needed when the KL penalty is on)."""
        ...

    @property
    def has_critic(self) -> bool:
        """Whether a value model (and its optimizer) exists (PPO with GAE)."""
        ...

    def zero_grad(self) -> None:
        """Start an optimizer step: the policy (and critic) in training mode, gradients
        cleared."""
        ...

    def microbatch(self, last: bool) -> AbstractContextManager[Any]:
        """Context for one micro-batch's forward and backward. Data-parallel engines synchronise
        gradients only when ``last`` is True (the last micro-batch of the optimizer step);
        every rank must run the same number of micro-batches per step."""
        ...

    def policy_logits(self, inputs: ModelInputs) -> torch.Tensor:
        """Policy logits ``[B, T, V]`` aligned with the micro-batch's targets (``inputs`` on
        :attr:`device`; see :meth:`ModelInputs.logits`), with grad."""
        ...

    def reference_logits(self, inputs: ModelInputs) -> torch.Tensor:
        """Frozen reference logits aligned like :meth:`policy_logits`, without grad; ValueError
        when there is none."""
        ...

    def local_tokens(self, targets_BT: torch.Tensor) -> torch.Tensor:
        """The part of per-token ``targets_BT`` that this rank's logits are aligned with (all of
        it, except under context parallelism: ``[B, S]``, this rank's positions, zero-padded)."""
        ...

    def gather_tokens(self, part_BS: torch.Tensor, width: int) -> torch.Tensor:
        """Whole rows ``[B, width]`` of a per-token result computed on :meth:`local_tokens`
        (identity without context parallelism; else a collective of the group, whose gradient
        flows back to this rank's part)."""
        ...

    def critic_values(self, input_ids_BT: torch.Tensor, attention_BT: torch.Tensor) -> torch.Tensor:
        """Critic values ``[B, T]`` float32 (aligned like logits), with grad; ValueError when
        there is no critic."""
        ...

    def critic_backward(self, loss: torch.Tensor) -> None:
        """Accumulate the critic's gradients of ``loss`` (normalised like the policy loss)."""
        ...

    def critic_clip_and_step(self, max_norm: float) -> float:
        """Clip the critic's gradient norm, step its optimizer; returns the norm before
        clipping."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate gradients of ``loss``: this rank's share of the step objective, already
        divided by the *global* normalisers. An engine whose gradient reduction averages over
        ranks (DDP, FSDP2) scales by ``world_size`` so the reduced gradient is the sum."""
        ...

    def reduce_normalisers(self, norm: Normalisers) -> Normalisers:
        """Global normalisers from this rank's counts of one optimizer step (identity for one
        process; data-parallel engines all-reduce ``tokens`` and ``seqs`` with SUM, counting each
        data-parallel slice once). A collective: every rank calls it once per optimizer step."""
        ...

    def all_reduce(self, values: list[float], op: Literal["sum", "max"]) -> list[float]:
        """``values`` reduced element-wise over the data-parallel slices (identity for one
        process; the ranks of a context-parallel group hold the same values and count once):
        how the step's metrics are combined. A collective of every rank (so also a barrier):
        every rank passes the same number of values."""
        ...

    def current_lr(self) -> float:
        """Learning rate the next :meth:`clip_and_step` applies."""
        ...

    def clip_and_step(self, max_norm: float) -> float:
        """Clip the gradient's global norm to ``max_norm``, step the optimizer and the LR
        schedule, count the step; returns the norm before clipping (over all ranks/shards)."""
        ...

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's full, unsharded weights by ``state_dict`` name: what weight sync
        publishes. Sharded engines gather (a collective: every rank calls it) and return the
        weights on rank 0 and an empty dict elsewhere. May share storage with the live model:
        copy before the next step changes it."""
        ...

    def save_pretrained(self, directory: Path) -> None:
        """Write the policy to ``directory`` loadable with ``from_pretrained`` (collective for
        sharded engines; only rank 0 writes)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume training exactly: policy weights, optimizer state, LR
        schedule position, :attr:`optimizer_steps`, and the critic and its optimizer when there
        is one (keys ``critic``, ``critic_optimizer``). A snapshot (later steps do not change it),
        picklable, tensors on CPU. The frozen reference is not included (it is rebuilt from the
        model directory)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` of an engine built with the same model and config.
        ``policy`` may be left out when the engine was built from the weights of the same
        checkpoint (resumable checkpoints store the policy in Hugging Face format only)."""
        ...
