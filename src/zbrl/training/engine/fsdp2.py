"""The fully sharded engine (torch FSDP2): ``fully_shard`` on every decoder layer, then on the
root, so parameters, gradients and optimizer state are split over the ranks.

- The optimizer is built *after* sharding (over the sharded ``DTensor`` parameters), so its state
  is sharded too; the engine takes an optimizer factory for that reason.
- Each micro-batch's backward reduce-scatters its gradients (averaging over ranks, hence the loss
  is scaled by ``world_size``), so gradients stay sharded between micro-batches: the memory of a
  sharded engine, paid for with one reduce-scatter per micro-batch instead of one per step.
- Full weights (to publish, to checkpoint) are gathered with ``get_model_state_dict(...,
  full_state_dict=True, cpu_offload=True)``: the whole model is materialised on rank 0's CPU
  only; other ranks get an empty dict.
- Tied embeddings (``lm_head.weight`` is ``embed_tokens.weight``) stay one parameter: neither the
  embedding nor the head is sharded on its own; both belong to the root's group.
- Mixed precision (:mod:`.precision`): the sharded parameters and the optimizer state are
  float32 (the master weights); with a lower compute dtype, FSDP2's ``MixedPrecisionPolicy``
  all-gathers the parameters in it (``param_dtype``) and reduce-scatters gradients in float32
  (``reduce_dtype``), so the optimizer sees float32 gradients. Full weights are gathered in
  float32.
- CPU offload (``cpu_offload``): FSDP2's ``CPUOffloadPolicy`` keeps the sharded parameters, their
  gradients and (since the optimizer is built over those parameters) the optimizer state in CPU
  memory; each layer's shard is copied to the device for its all-gather in the forward and the
  backward, its gradient shard comes back after the reduce-scatter, and the optimizer steps on
  the CPU. The device then holds only the gathered layers in flight and the activations. The
  math is unchanged (``tests/unit/test_fsdp2_offload.py``). Host memory is pinned on GPUs (faster
  copies); on CPU the policy changes placement of nothing.
- Context parallelism (``context_parallel_size`` = C > 1, :mod:`.context_parallel`): groups of C
  consecutive ranks share one data-parallel slice of each step's groups, each rank running 1/C of
  every row's tokens, attention exchanging heads all-to-all (the model's ``attn_implementation``
  becomes :data:`~.context_parallel.ULYSSES`). FSDP2 still shards over, and averages over, all
  ranks: one 1-D mesh; the loss scaling by ``world_size`` stays exact (see that module). Full rows
  only (the shared-prompt layout is turned off by ``zbrl.assembly.settings``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from zbrl.training.engine.context_parallel import (
    ULYSSES,
    check_heads,
    context_parallel_groups,
    register_ulysses,
)
from zbrl.training.engine.ddp import OptimizerFactory
from zbrl.training.engine.precision import MASTER_DTYPE, check_compute_dtype, check_master
from zbrl.training.engine.ranked import RankedEngine
from zbrl.training.engine.single import cpu_snapshot
from zbrl.training.model_inputs import ModelInputs

FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Gather to full tensors on rank 0's CPU; other ranks get nothing."""
LOAD_FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
"""Load a full state given on rank 0; the engine shards it to every rank."""


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class transformers lists in
    ``_no_split_modules`` (``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ...)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"training.engine=fsdp2 found no decoder layers in {type(model).__name__} (it shards "
            "the classes named in the model's _no_split_modules); use training.engine=ddp"
        )
    return layers


def mixed_precision(compute_dtype: torch.dtype) -> MixedPrecisionPolicy:
    """Compute (and all-gather parameters) in ``compute_dtype``, reduce gradients in float32;
    float32 compute is FSDP2's default policy."""
    if compute_dtype == MASTER_DTYPE:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=MASTER_DTYPE)


def offload_policy(cpu_offload: bool, device: torch.device) -> OffloadPolicy:
    """FSDP2's CPU offload (pinned host memory when the device is a GPU), or its no-offload
    default."""
    if not cpu_offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device.type == "cuda")


def shard_model(
    model: torch.nn.Module,
    device: torch.device,
    reshard_after_forward: bool,
    mp_policy: MixedPrecisionPolicy | None = None,
    cpu_offload: bool = False,
) -> None:
    """``fully_shard`` each decoder layer, then the root (in place), under ``mp_policy``, with
    the shards in CPU memory when ``cpu_offload``."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    kwargs["mp_policy"] = mp_policy or MixedPrecisionPolicy()
    kwargs["offload_policy"] = offload_policy(cpu_offload, device)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


class Fsdp2Engine(RankedEngine):
    """:class:`~zbrl.training.engine.base.Engine` over FSDP2 in an initialised process group.

    ``policy`` (float32, the master weights) and ``reference`` (sharded the same way, forward
    only) must be on ``device``; both compute in ``compute_dtype``. With ``cpu_offload`` both
    keep their shards in CPU memory (the optimizer state of the policy too). With
    ``context_parallel_size`` > 1 (a divisor of the world size and of the model's attention
    heads) both attend with Ulysses over groups of that many consecutive ranks.
    :meth:`state_dict` / :meth:`load_state_dict` are collectives and use *full* states on rank 0
    (independent of the number of ranks; see their docstrings).
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        optimizer_factory: OptimizerFactory,
        *,
        reference: torch.nn.Module | None = None,
        device: torch.device | str = "cpu",
        reshard_after_forward: bool = True,
        compute_dtype: torch.dtype = torch.float32,
        cpu_offload: bool = False,
        context_parallel_size: int = 1,
    ) -> None:
        self.compute_dtype = check_compute_dtype(compute_dtype)
        check_master(policy, "policy")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = torch.device(device)
        self.cpu_offload = cpu_offload
        if context_parallel_size > 1:
            check_heads(policy.config, context_parallel_size)
            self.sequence = context_parallel_groups(context_parallel_size)
            register_ulysses()
            for model in (policy, reference):
                if model is not None:
                    model.set_attn_implementation(ULYSSES)
        mp_policy = mixed_precision(self.compute_dtype)
        shard_model(policy, self.device, reshard_after_forward, mp_policy, cpu_offload)
        if reference is not None:
            shard_model(reference, self.device, reshard_after_forward, mp_policy, cpu_offload)
        self.policy = policy
        self.reference = reference
        self.optimizer, self.scheduler = optimizer_factory(policy.parameters())
        self.optimizer_steps = 0

    def zero_grad(self) -> None:
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)

    def microbatch(self, last: bool) -> AbstractContextManager[Any]:
        return nullcontext()  # every micro-batch reduce-scatters (see the module docstring)

    def policy_logits(self, inputs: ModelInputs) -> torch.Tensor:
        return self._logits(self.policy, inputs)

    def reference_logits(self, inputs: ModelInputs) -> torch.Tensor:
        if self.sequence is None or self.reference is None:
            return super().reference_logits(inputs)
        with torch.no_grad():
            return self._logits(self.reference, inputs)

    def _logits(self, model: torch.nn.Module, inputs: ModelInputs) -> torch.Tensor:
        """Whole rows' logits, or this rank's part under context parallelism."""
        if self.sequence is None:
            return inputs.logits(model)
        if inputs.prompts is not None or inputs.packed is not None:
            raise ValueError(
                "context parallelism takes full rows, not the shared-prompt or packed layout "
                "(training.share_prompts is turned off under context_parallel_size > 1, and "
                "training.packing is refused)"
            )
        return self.sequence.logits(model, inputs.input_ids_BT)

    def _forward_context(self) -> AbstractContextManager[Any]:
        return nullcontext()  # the mixed-precision policy casts at module boundaries

    def clip_and_step(self, max_norm: float) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        if isinstance(total, DTensor):
            total = total.full_tensor()  # the norm over every shard
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        return float(total)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: full CPU weights on rank 0, ``{}`` elsewhere."""
        state = get_model_state_dict(self.policy, options=FULL_ON_RANK0)
        return state if self.rank == 0 else {}

    def save_pretrained(self, directory: Path) -> None:
        """Collective: gathers to rank 0, which writes ``directory``."""
        state = self.full_state_dict()
        if self.rank == 0:
            save_full_state(self.policy, state, directory)

    def state_dict(self) -> dict[str, Any]:
        """Collective. On rank 0: the full policy weights and the full optimizer state (both on
        CPU, keyed by parameter name, so they load into any number of ranks), the scheduler
        state and the step count; on other ranks the same keys with empty ``policy`` and
        ``optimizer``. Save rank 0's."""
        policy = get_model_state_dict(self.policy, options=FULL_ON_RANK0)
        optim = get_optimizer_state_dict(self.policy, self.optimizer, options=FULL_ON_RANK0)
        # a snapshot: the gathered optimizer state still shares small tensors (Adam's ``step``)
        # with the live optimizer, which later steps increment in place
        return cpu_snapshot(
            {
                "policy": policy if self.rank == 0 else {},
                "optimizer": optim if self.rank == 0 else {},
                "scheduler": self.scheduler.state_dict(),
                "optimizer_steps": self.optimizer_steps,
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Collective: every rank calls it; only rank 0's ``policy`` and ``optimizer`` are read
        (broadcast and sharded), so other ranks may pass :meth:`state_dict`'s empty ones.
        ``policy`` may be left out (on every rank) when the engine was built from the same
        checkpoint's weights."""
        if "policy" in state:
            set_model_state_dict(self.policy, state["policy"], options=LOAD_FROM_RANK0)
        set_optimizer_state_dict(
            self.policy, self.optimizer, state["optimizer"], options=LOAD_FROM_RANK0
        )
        self.scheduler.load_state_dict(state["scheduler"])
        self.optimizer_steps = state["optimizer_steps"]


def save_full_state(
    model: torch.nn.Module, state: dict[str, torch.Tensor], directory: Path
) -> None:
    """Write gathered weights in the ``from_pretrained`` layout with the model's config (the
    original architecture name, not FSDP's wrapper class)."""
    config = model.config
    architectures = config.architectures
    model.save_pretrained(directory, state_dict=state, safe_serialization=True)
    if architectures:
        config.architectures = architectures
        config.save_pretrained(directory)
