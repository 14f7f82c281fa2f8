"""What the driver gives each worker it creates: one frozen spec per role
(:mod:`zbrl.launch.workers` takes them, :mod:`zbrl.launch.worker_roles` reads them).

A spec travels to the worker's process pickled with the actor's constructor; the actor handles
in it (buffer, store, hub, reward workers, head files) travel as handles. A producer's prompts
are not in its spec: the driver puts them in Ray's object store once, and Ray hands an object
reference's value to a constructor only for a top-level argument, so they come beside it.

Nothing here imports torch or Ray (the driver imports this module to create the workers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zbrl.launch.shipping import ShippedDir
    from zbrl.training.distributed import GroupSpec
    from zbrl.types import EncodedPrompt


@dataclass(frozen=True)
class ProducerSpec:
    """A producer's construction (its prompts come beside it, see the module docstring)."""

    cfg_data: dict[str, Any]
    """The run's config, as ``RunConfig.model_dump(mode="json")``."""
    index: int
    """Which producer (its prompt shard and seed)."""
    model: ShippedDir
    """The weights to load, read where this node has them."""
    tokenizer: ShippedDir
    buffer: Any
    """The rollout buffer's actor."""
    store: Any
    """The weight store's actor."""
    hub: Any
    """The telemetry hub's actor."""
    initial_version: int
    """The version of the weights in ``model``."""
    resume_state: dict[str, Any] | None = None
    """The producer's resume point (from the rollout buffer) when it continues a shard."""
    reward_workers: list[Any] | None = None
    """The reward-model actors to score with (None: in the producer's process)."""


@dataclass(frozen=True)
class ConsumerSpec:
    """A consumer's construction: rank ``index`` of the data-parallel group when ``group`` is
    given."""

    cfg_data: dict[str, Any]
    index: int
    model: ShippedDir
    """The policy's weights (a checkpoint when resuming)."""
    reference: ShippedDir
    """The frozen reference's weights (the base model)."""
    tokenizer: ShippedDir
    run_dir: str
    total_steps: int
    buffer: Any
    store: Any
    hub: Any
    trainer_state: str | None = None
    """A checkpoint's consumer state file to continue from (inside ``model``, as the driver's
    node has it)."""
    group: GroupSpec | None = None
    """The data-parallel group this consumer joins as rank ``index`` (None for one consumer)."""
    head_files: Any = None
    """The actor that takes this consumer's checkpoints and uid log when it runs on another node
    than the driver's (None on a single node)."""


@dataclass(frozen=True)
class EvaluatorSpec:
    """The evaluator's construction."""

    cfg_data: dict[str, Any]
    model: ShippedDir
    tokenizer: ShippedDir
    eval_sets: dict[str, list[EncodedPrompt]]
    run_dir: str
    store: Any
    hub: Any
    initial_version: int
    head_files: Any = None
    """The actor that takes the eval files when the evaluator runs on another node than the
    driver's."""
