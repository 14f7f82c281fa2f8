"""The rollout buffer between producers and consumers, and weight sync back."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from zbrl.config.base import Section


class ObjectStoreSync(Section):
    """Weights travel through the Ray object store (CPU and multi-node; the default)."""

    type: Literal["object_store"] = "object_store"
    """Weight-sync discriminator."""


WeightSyncConfig = Annotated[ObjectStoreSync, Field(discriminator="type")]
"""A union of one today; a torch.distributed broadcast implementation will join it."""


class TransportConfig(Section):
    """Buffering and staleness control."""

    max_staleness: int = Field(default=1, ge=0)
    """A sample trained at policy version v was generated at version >= v - max_staleness;
    0 is the synchronous on-policy baseline."""
    buffer_capacity: int | None = Field(default=None, ge=1)
    """Groups the buffer holds at most; None derives it from the staleness rule."""
    weight_sync: WeightSyncConfig = Field(default_factory=ObjectStoreSync)
    """How new weights reach the producers."""
