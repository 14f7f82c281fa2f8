"""The worker actor classes the driver creates: light shells whose constructor imports the role
(:mod:`zbrl.launch.worker_roles`: torch, transformers, the models) inside the worker's own
process and hands it every call.

Ray needs the class object to create an actor, so the driver imports the module that defines
it; with the roles' imports here, the driver would import torch and transformers only to name
the classes (about 2 s of CPU on the two cores the workers start on; docs/performance.md,
Start-up). Each shell's methods are its role's, by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zbrl.launch.worker_specs import ConsumerSpec, EvaluatorSpec, ProducerSpec
    from zbrl.types import EncodedPrompt


class _RoleShell:
    """What every shell answers itself from its role."""

    role: Any

    def placement(self) -> dict[str, Any]:
        """Where this worker runs (node id, address, host, pid)."""
        return self.role.placement()


class _RunShell(_RoleShell):
    """A shell whose role runs until the run ends (a producer, a consumer)."""

    def run(self) -> Any:
        return self.role.run()


class ProducerWorker(_RunShell):
    """A Producer in its own process (:class:`zbrl.launch.worker_roles.ProducerRole`, which
    documents the arguments)."""

    def __init__(self, spec: ProducerSpec, prompts: list[EncodedPrompt]) -> None:
        from zbrl.launch.worker_roles import ProducerRole

        self.role = ProducerRole(spec, prompts)


class ConsumerWorker(_RunShell):
    """A Consumer in its own process (:class:`zbrl.launch.worker_roles.ConsumerRole`, which
    documents the arguments)."""

    def __init__(self, spec: ConsumerSpec, prompts: list[EncodedPrompt] | None = None) -> None:
        from zbrl.launch.worker_roles import ConsumerRole

        self.role = ConsumerRole(spec, prompts)


class EvaluatorWorker(_RoleShell):
    """The evaluator in its own process (:class:`zbrl.launch.worker_roles.EvaluatorRole`,
    built from a :class:`zbrl.launch.worker_specs.ProducerSpec`)."""

    def __init__(self, spec: EvaluatorSpec) -> None:
        from zbrl.launch.worker_roles import EvaluatorRole

        self.role = EvaluatorRole(spec)

    def evaluate(self, step: int, version: int) -> dict[str, dict[str, float]]:
        return self.role.evaluate(step, version)

    def close(self) -> None:
        self.role.close()
