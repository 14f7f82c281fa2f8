"""What one forward pass of the policy (or the frozen reference) takes, in one of two layouts,
and the logits it gives back aligned with the micro-batch's targets.

**Full rows** (``prompts`` is None): each row is its prompt followed by its response, right-padded;
the logits at position ``t`` predict token ``t + 1``, so the returned logits are the model's
``[:, :-1]``.

**Shared prompts**: a group's G responses share one prompt. The prompts of the micro-batch are
run once each (``U`` unique prompts, left-padded, positions counted from each prompt's first real
token) and their key/value cache is gathered to the rows (``prompt_index_B``); the responses
(right-padded) are then run on top of it. The first response token is predicted by the prompt's
last position, the others by the response positions before them, so the returned logits
``[B, R, V]`` are aligned with the response tokens. The math is the same as full rows: the same
positions, the same causal attention to the same keys, and the gradient flows back through the
gathered cache into the prompt pass (``tests/unit/test_model_inputs.py`` checks log-probs and
gradients against full rows). The work is not: with G responses per prompt the prompt tokens go
through the model once instead of G times (``bench/per_core_rates.py`` measures it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from zbrl.models.kv_cache import cache_argument, left_padded_positions, output_cache


@dataclass(frozen=True)
class SharedPrompts:
    """The unique prompts of a micro-batch and which one each row continues."""

    prompt_ids_UP: torch.Tensor  # int64, left-padded
    prompt_attention_UP: torch.Tensor  # int64 0/1
    prompt_index_B: torch.Tensor  # int64 [B]: row -> unique prompt


@dataclass(frozen=True)
class ModelInputs:
    """Inputs of one forward pass: full rows, or responses on top of ``prompts``."""

    input_ids_BT: torch.Tensor
    attention_BT: torch.Tensor
    prompts: SharedPrompts | None = None

    def to(self, device: torch.device) -> ModelInputs:
        prompts = self.prompts
        if prompts is not None:
            prompts = SharedPrompts(
                prompt_ids_UP=prompts.prompt_ids_UP.to(device),
                prompt_attention_UP=prompts.prompt_attention_UP.to(device),
                prompt_index_B=prompts.prompt_index_B.to(device),
            )
        return replace(
            self,
            input_ids_BT=self.input_ids_BT.to(device),
            attention_BT=self.attention_BT.to(device),
            prompts=prompts,
        )

    def logits(self, model: torch.nn.Module) -> torch.Tensor:
        """``model``'s logits aligned with the targets (position ``t`` predicts target ``t``);
        ``model`` is a causal LM with the Hugging Face call signature (or a wrapper of one: DDP,
        FSDP2)."""
        if self.prompts is None:
            return model(input_ids=self.input_ids_BT, attention_mask=self.attention_BT).logits[
                :, :-1
            ]
        return _shared_prompt_logits(model, self.prompts, self.input_ids_BT, self.attention_BT)


def _shared_prompt_logits(
    model: torch.nn.Module,
    prompts: SharedPrompts,
    response_ids_BR: torch.Tensor,
    response_attention_BR: torch.Tensor,
) -> torch.Tensor:
    attention_UP = prompts.prompt_attention_UP
    first = model(
        input_ids=prompts.prompt_ids_UP,
        attention_mask=attention_UP,
        position_ids=left_padded_positions(attention_UP),
        use_cache=True,
        logits_to_keep=1,  # only the last prompt position predicts a response token
    )
    index_B = prompts.prompt_index_B
    cache = output_cache(first)
    cache.batch_select_indices(index_B)  # indexing: the gradient reaches the prompt pass
    starts_B = attention_UP.sum(1)[index_B]
    width = response_ids_BR.shape[1]
    # The whole response goes in, though its last token predicts nothing trained: the pass is
    # never empty, so data-parallel ranks make the same forwards (and collectives) whatever
    # their lengths.
    rest = model(
        input_ids=response_ids_BR,
        attention_mask=torch.cat([attention_UP[index_B], response_attention_BR], dim=1),
        position_ids=starts_B[:, None] + torch.arange(width, device=starts_B.device)[None, :],
        **{cache_argument(model): cache},
    )
    return torch.cat([first.logits[index_B, -1:], rest.logits[:, :-1]], dim=1)
