"""Which policy model to train."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from zbrl.config.base import Section

EMBEDDED = "embedded"
"""``model.path`` / ``data.train_path`` value that selects the embedded default (DESIGN §4)."""


class WarmStartConfig(Section):
    """The short supervised warm start of the embedded model (ignored for user models)."""

    steps: int = Field(default=500, ge=0)
    """Most supervised steps on the synthetic train split before RL (0: RL from random weights)."""
    stop_at_accuracy: float = Field(default=0.4, gt=0, le=1)
    """Stop the warm start early once greedy accuracy on unseen training-split problems reaches
    this value, so that RL, not the warm start, makes the improvement."""
    lr: float = Field(default=2e-3, gt=0)
    """Learning rate of the warm start."""
    batch_size: int = Field(default=32, ge=1)
    """Examples per warm-start step."""


class ModelConfig(Section):
    """The policy: a Hugging Face model directory, or the embedded tiny model."""

    path: str = EMBEDDED
    """A local directory loadable with ``from_pretrained``, or ``embedded`` for the tiny model."""
    tokenizer_path: str | None = None
    """Tokenizer directory when it differs from ``path``; None uses ``path``."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the trained and the inference model."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = False
    """Allow custom modelling code shipped in the model directory."""
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    """Warm start of the embedded model (cached in ``logging.cache_dir``)."""
