"""How the consumers batch and run the optimisation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from zbrl.config.base import Section


class TrainingConfig(Section):
    """Train batching and the training loop's extent."""

    train_batch_size: int = Field(default=8, ge=1)
    """Effective groups (prompts) consumed per training step, over all consumers."""
    train_minibatch_size: int | None = Field(default=None, ge=1)
    """Groups per optimizer step; a train batch makes train_batch_size / train_minibatch_size
    optimizer steps. None means one optimizer step per train batch."""
    train_microbatch_size: int = Field(default=8, ge=1)
    """Sequences per forward/backward pass (gradient accumulation; padded per micro-batch)."""
    max_steps: int | None = Field(default=None, ge=1)
    """Stop after this many training steps; None runs until the data ends."""
    logprob_chunk_size: int = Field(default=1024, ge=1)
    """Rows of logits turned into log-probs at once (bounds the float32 working set)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device of the consumer's model; ``auto`` picks CUDA when available."""
