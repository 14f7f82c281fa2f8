"""The critic of PPO: a separate value model — the policy's backbone (loaded from the same
checkpoint, without its LM head) and a scalar head, zero-initialised so every value starts at 0.

Why a separate model rather than a value head on the policy: the policy's weights stay exactly the
published ones (weight sync sends the policy alone), the value loss never reaches the policy's
gradient, and the critic has its own optimizer and learning rate.

Precision: like the policy, the critic is trained in float32 (its master weights and AdamW state)
and the engine runs its forward pass under autocast to the compute dtype
(:mod:`zbrl.training.engine.precision`); the values come out float32 either way.
"""

from __future__ import annotations

from pathlib import Path

import torch


class ValueModel(torch.nn.Module):
    """``forward(input_ids_BT, attention_mask_BT) -> values_BT`` (float32): the value of the
    state after each position's token (aligned like logits: position ``t`` predicts ``t + 1``)."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, *, dtype: torch.dtype, trust_remote_code: bool
    ) -> ValueModel:
        """The backbone of ``model_dir`` and a new head, all parameters in ``dtype`` (float32
        for training)."""
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(
            model_dir, dtype=dtype, trust_remote_code=trust_remote_code
        )
        return cls(backbone, backbone.config.hidden_size).to(dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden_BTH = self.backbone(input_ids=input_ids, attention_mask=attention_mask)[0]
        return self.head(hidden_BTH).squeeze(-1).float()
