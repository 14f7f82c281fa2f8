"""The single-process engine: one policy on one device, plain autograd, no gradient sync."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Literal

import torch

from zbrl.algorithms.aggregation import Normalisers
from zbrl.models.cpu_attention import attention_in_float32
from zbrl.models.forward import autocast
from zbrl.training.engine.precision import check_compute_dtype, check_master
from zbrl.training.engine.ranked import reference_logits
from zbrl.training.model_inputs import ModelInputs


class SingleProcessEngine:
    """:class:`~zbrl.training.engine.base.Engine` for one process (rank 0 of 1).

    Takes a built policy (already on ``device``, float32: the master weights), its optimizer
    and LR scheduler, an optional frozen reference model, and an optional critic (a value model
    on ``device``, float32) with its own optimizer. Forward passes of all three run under
    autocast to ``compute_dtype`` (see :mod:`.precision`).
    """

    rank = 0
    world_size = 1
    data_rank = 0
    data_parallel_size = 1

    def __init__(
        self,
        policy: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        *,
        reference: torch.nn.Module | None = None,
        critic: torch.nn.Module | None = None,
        critic_optimizer: torch.optim.Optimizer | None = None,
        device: torch.device | str = "cpu",
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        if (critic is None) != (critic_optimizer is None):
            raise ValueError("a critic needs its optimizer (pass both critic and critic_optimizer)")
        self.compute_dtype = check_compute_dtype(compute_dtype)
        check_master(policy, "policy")
        if critic is not None:
            check_master(critic, "critic")
        self.policy = policy
        self.reference = reference
        self.critic = critic
        self.critic_optimizer = critic_optimizer
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = torch.device(device)
        for model in (policy, reference, critic):
            if model is not None:
                attention_in_float32(model, self.device, self.compute_dtype)
        self.optimizer_steps = 0

    @property
    def has_reference(self) -> bool:
        return self.reference is not None

    @property
    def has_critic(self) -> bool:
        return self.critic is not None

    def zero_grad(self) -> None:
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.train()
            self.critic_optimizer.zero_grad(set_to_none=True)

    def critic_values(self, input_ids_BT: torch.Tensor, attention_BT: torch.Tensor) -> torch.Tensor:
        if self.critic is None:
            raise ValueError("this engine has no critic (algorithm.critic is not set)")
        with self._autocast():
            return self.critic(input_ids_BT, attention_BT)

    def critic_backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def critic_clip_and_step(self, max_norm: float) -> float:
        if self.critic is None:
            raise ValueError("this engine has no critic (algorithm.critic is not set)")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), max_norm)
        self.critic_optimizer.step()
        return float(grad_norm)

    def microbatch(self, last: bool) -> AbstractContextManager[Any]:
        return nullcontext()

    def policy_logits(self, inputs: ModelInputs) -> torch.Tensor:
        with self._autocast():
            return inputs.logits(self.policy)

    def reference_logits(self, inputs: ModelInputs) -> torch.Tensor:
        with self._autocast():
            return reference_logits(self.reference, inputs)

    def _autocast(self):
        return autocast(self.device, self.compute_dtype)

    def local_tokens(self, targets_BT: torch.Tensor) -> torch.Tensor:
        return targets_BT

    def gather_tokens(self, part_BS: torch.Tensor, width: int) -> torch.Tensor:
        return part_BS

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def reduce_normalisers(self, norm: Normalisers) -> Normalisers:
        return norm

    def all_reduce(self, values: list[float], op: Literal["sum", "max"]) -> list[float]:
        return list(values)

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def clip_and_step(self, max_norm: float) -> float:
        grad_norm = clipped_step(self.policy, self.optimizer, self.scheduler, max_norm)
        self.optimizer_steps += 1
        return grad_norm

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return trained_weights(self.policy)

    def save_pretrained(self, directory: Path) -> None:
        self.policy.save_pretrained(directory, safe_serialization=True)

    def state_dict(self) -> dict[str, Any]:
        state = {
            "policy": trained_weights(self.policy),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "optimizer_steps": self.optimizer_steps,
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
        return cpu_snapshot(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (self.critic is not None) != ("critic" in state):
            raise ValueError(
                "the saved engine state and this engine disagree on the critic (one has a "
                "value model, the other not); resume with the same algorithm.critic setting"
            )
        if "policy" in state:  # absent when the policy was loaded from the same checkpoint
            load_trained_weights(self.policy, state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.optimizer_steps = state["optimizer_steps"]
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])


def clipped_step(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, max_norm: float
) -> float:
    """Clip the gradients' global norm to ``max_norm``, step the optimizer and the LR schedule;
    the norm before clipping."""
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    return float(grad_norm)


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a peft model (``model.lora``): only its adapters are trained."""
    peft = sys.modules.get("peft")  # a model can only be a PeftModel once peft is imported
    return peft is not None and isinstance(model, peft.PeftModel)


def trained_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What weight sync publishes and the engine state holds: every weight by ``state_dict``
    name, or, for a LoRA model, its adapter tensors only (peft's names; see
    :mod:`zbrl.models.lora`). Shares storage with the model."""
    if is_lora(model):
        from zbrl.models.lora import adapter_state

        return adapter_state(model)
    return model.state_dict()


def load_trained_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`trained_weights` of the same kind of model back (strict)."""
    if is_lora(model):
        from zbrl.models.lora import load_adapter_state

        load_adapter_state(model, state)
    else:
        model.load_state_dict(state)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates (all of them, or a LoRA model's adapters)."""
    return [p for p in model.parameters() if p.requires_grad]


def cpu_snapshot(obj: Any) -> Any:
    """A copy of nested dicts/lists/tuples whose tensors are detached CPU copies."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_snapshot(v) for v in obj)
    return obj
