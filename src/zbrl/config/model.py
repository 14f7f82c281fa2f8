"""Which policy model to train."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from zbrl.config.base import Section

FLOAT16_REFUSED = (
    "model.dtype=float16 is not supported: float16 training needs a dynamic loss scaler, which "
    "zbrl does not have; use model.dtype=bfloat16 (same memory and speed on GPUs from Ampere on, "
    "no loss scaling needed) or float32"
)
"""Why ``model.dtype=float16`` is refused, and what to use instead (docs/precision.md)."""

EMBEDDED = "embedded"
"""``model.path`` / ``data.train_path`` value that selects the embedded default
(docs/embedded-default.md)."""


class WarmStartConfig(Section):
    """The short supervised warm start of the embedded model (ignored for user models)."""

    steps: int = Field(default=500, ge=0)
    """Most supervised steps on the synthetic train split before RL (0: RL from random weights)."""
    stop_at_accuracy: float | None = Field(default=0.4, gt=0, le=1)
    """Stop the warm start early once greedy accuracy on unseen training-split problems reaches
    this value, so that RL, not the warm start, makes the improvement (None: train all
    ``steps``)."""
    lr: float = Field(default=2e-3, gt=0)
    """Learning rate of the warm start."""
    batch_size: int = Field(default=32, ge=1)
    """Examples per warm-start step."""


LLAMA_LINEAR_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama/Qwen/Mistral-type decoder block: LoRA's default targets."""


class LoraConfig(Section):
    """LoRA adapters (peft) trained on a frozen base: only the adapter weights are trained,
    published and checkpointed (docs/scaling.md, LoRA)."""

    rank: int = Field(default=16, ge=1)
    """Rank ``r`` of each adapter (``A`` is ``r x in``, ``B`` is ``out x r``)."""
    alpha: float = Field(default=32.0, gt=0)
    """Scale numerator: the adapter's update is ``(alpha / rank) * B @ A``."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter's input during training (0: none, so training and the merged
    inference weights compute the same function)."""
    target_modules: list[str] = Field(
        default_factory=lambda: list(LLAMA_LINEAR_LAYERS), min_length=1
    )
    """Names (last component) of the ``nn.Linear`` modules that get adapters; the default is
    every linear layer of a Llama/Qwen-type block (attention and MLP). Embeddings and the head
    are not supported (they stay frozen)."""


class ModelConfig(Section):
    """The policy: a Hugging Face model directory, or the embedded tiny model."""

    path: str = EMBEDDED
    """``embedded`` (the tiny model), a local Hugging Face model directory, a ``.gguf`` file
    (dequantized once into ``logging.cache_dir``), a Hugging Face Hub id ``ORG/NAME`` (downloaded
    into the hub's cache; offline, it must be there already) or the name of a model fetched with
    ``zbrl models pull NAME`` (``smollm2-135m``). See docs/models.md."""
    tokenizer_path: str | None = None
    """The tokenizer's source when it differs from ``path``, in any of ``path``'s forms but
    ``embedded``; None uses ``path``."""
    chat_template: str | None = None
    """A Jinja chat template replacing the tokenizer's own: the template text (it holds ``{{`` or
    ``{%``), or else the path of a template file (any suffix; one that does not exist is
    refused). None keeps the tokenizer's template; a tokenizer without one is refused."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype: the training forward/backward passes (autocast, or FSDP2's mixed-precision
    policy), the frozen reference, and, unless ``rollout.inference_dtype`` says otherwise, the
    weights producers and the evaluator generate with (published weights are cast to it). The
    trained weights (policy and critic) and the optimizer state are float32 whatever this is;
    checkpoints hold those float32 weights. ``float16`` is refused (it needs loss scaling; use
    ``bfloat16``). See docs/precision.md."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = False
    """Allow custom modelling code shipped in the model directory."""
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    """Warm start of the embedded model (cached in ``logging.cache_dir``)."""
    lora: LoraConfig | None = None
    """LoRA adapters on a frozen base (needs the ``lora`` extra: peft); None trains every
    weight. Only the adapters travel to producers and the evaluator (merged into their base on
    the transformers backend, served through vLLM's LoRA support on the vLLM backend) and only
    they are checkpointed. Not with ``training.engine=fsdp2`` or ``algorithm.critic``."""

    @field_validator("dtype")
    @classmethod
    def _no_float16(cls, value: str) -> str:
        if value == "float16":
            raise ValueError(FLOAT16_REFUSED)
        return value
