"""What one forward pass of the policy (or the frozen reference) takes, in one of three layouts,
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

**Packed** (``packed`` set): the micro-batch goes in a few rows with no padding inside them:
each unique prompt once, followed by its responses (each but its last token, which predicts
nothing), one block per prompt; blocks go largest first into the first row with room, each row as
wide as the largest block, and the rows are right-padded to that width. A block-causal mask lets a
prompt token see the earlier tokens of its prompt and a response token see its prompt and the
earlier tokens of its own response only, and the positions of each response restart at its
prompt's length, so every response token sees exactly the keys, values and positions it has in its
full prompt + response row. The mask is dense, so attention costs rows × width² (blocked entries
included): rows as wide as one block keep that near the shared-prompt layout's on many short
groups, where one row of every token would make attention most of the step. The logits of the
columns that predict a response token in some row (each prompt's last, every response token's)
are gathered back to the response-aligned ``[B, R, V]`` of the shared-prompt layout, so the loss
code is the same. The work is the sum of the tokens (plus the rows' tail padding), not rows × the
longest row (``bench/packing.py`` measures it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from zbrl.models.cpu_attention import SDPA_FLOAT32
from zbrl.models.forward import full_row_logits
from zbrl.models.kv_cache import (
    cache_argument,
    left_padded_positions,
    output_cache,
    select_cache_rows,
)
from zbrl.models.moe import forward_kwargs


@dataclass(frozen=True)
class SharedPrompts:
    """The unique prompts of a micro-batch and which one each row continues."""

    prompt_ids_UP: torch.Tensor  # int64, left-padded
    prompt_attention_UP: torch.Tensor  # int64 0/1
    prompt_index_B: torch.Tensor  # int64 [B]: row -> unique prompt


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch packed into ``P`` rows of ``N`` tokens (see the module's docstring)."""

    input_ids_PN: torch.Tensor  # int64
    position_ids_PN: torch.Tensor  # int64: a response's restart at its prompt's length
    group_PN: torch.Tensor  # int64: which prompt block each token belongs to (-1 at padding)
    block_PN: torch.Tensor  # int64: -1 on prompt tokens, the row's index on response tokens
    keep_K: torch.Tensor  # int64: the columns whose logits predict a response token in some row
    gather_BR: torch.Tensor  # int64 [B, R]: index into the flat [P * K] kept logits of each
    # target (0 at padding)

    def to(self, device: torch.device) -> PackedRows:
        return PackedRows(
            input_ids_PN=self.input_ids_PN.to(device),
            position_ids_PN=self.position_ids_PN.to(device),
            group_PN=self.group_PN.to(device),
            block_PN=self.block_PN.to(device),
            keep_K=self.keep_K.to(device),
            gather_BR=self.gather_BR.to(device),
        )


def block_causal_allowed(group_PN: torch.Tensor, block_PN: torch.Tensor) -> torch.Tensor:
    """bool ``[P, 1, N, N]``: in each row, query ``q`` may attend key ``k`` when ``k`` is not
    after ``q``, in the same prompt block, and either a prompt token or a token of ``q``'s own
    response."""
    n = group_PN.shape[1]
    positions = torch.arange(n, device=group_PN.device)
    causal_NN = positions[None, :] <= positions[:, None]
    keys_P1N, queries_PN1 = group_PN[:, None, :], group_PN[:, :, None]
    blocks_P1N = block_PN[:, None, :]
    own_PNN = (blocks_P1N == -1) | (blocks_P1N == block_PN[:, :, None])
    return (causal_NN & (keys_P1N == queries_PN1) & own_PNN)[:, None]


MASKED_IMPLEMENTATIONS = ("sdpa", SDPA_FLOAT32, "eager")
"""Attention implementations that take the packed layout's 4-D mask."""


def packed_attention_mask(model: torch.nn.Module, allowed_P1NN: torch.Tensor) -> torch.Tensor:
    """The block-causal mask in the form ``model``'s attention takes a 4-D mask: boolean for
    SDPA, additive (0 or the float32 minimum) for eager attention."""
    inner = getattr(model, "module", model)  # DDP keeps the model as .module
    implementation = inner.config._attn_implementation
    if implementation in ("sdpa", SDPA_FLOAT32):
        return allowed_P1NN
    if implementation == "eager":
        blocked = torch.finfo(torch.float32).min
        return torch.where(allowed_P1NN, 0.0, blocked).to(torch.float32)
    raise ValueError(
        "training.packing needs attention that takes a 4-D mask "
        f"({', '.join(MASKED_IMPLEMENTATIONS)}); the model runs {implementation!r}: set "
        "training.packing=false"
    )


@dataclass(frozen=True)
class ModelInputs:
    """Inputs of one forward pass: full rows, responses on top of ``prompts``, or ``packed``
    (then ``input_ids_BT`` are the right-padded responses, the targets, and not run)."""

    input_ids_BT: torch.Tensor
    attention_BT: torch.Tensor
    prompts: SharedPrompts | None = None
    packed: PackedRows | None = None

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
            packed=None if self.packed is None else self.packed.to(device),
        )

    def logits(self, model: torch.nn.Module) -> torch.Tensor:
        """``model``'s logits aligned with the targets (position ``t`` predicts target ``t``);
        ``model`` is a causal LM with the Hugging Face call signature (or a wrapper of one: DDP,
        FSDP2)."""
        if self.packed is not None:
            return _packed_logits(model, self.packed)
        if self.prompts is None:
            return full_row_logits(model, self.input_ids_BT, self.attention_BT)
        return _shared_prompt_logits(model, self.prompts, self.input_ids_BT, self.attention_BT)

    def token_masks(self) -> list[torch.Tensor]:
        """Which tokens of each forward pass :meth:`logits` runs are real (bool, one tensor per
        pass in call order, shaped like that pass's input ids): what an MoE router's load
        balance is computed over (:mod:`zbrl.models.moe`)."""
        if self.packed is not None:
            return [self.packed.group_PN >= 0]
        if self.prompts is None:
            return [self.attention_BT.bool()]
        return [self.prompts.prompt_attention_UP.bool(), self.attention_BT.bool()]


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
        **forward_kwargs(model),
    )
    index_B = prompts.prompt_index_B
    cache = output_cache(first)
    select_cache_rows(cache, index_B)  # indexing: the gradient reaches the prompt pass
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
        **forward_kwargs(model),
    )
    return torch.cat([first.logits[index_B, -1:], rest.logits[:, :-1]], dim=1)


def _packed_logits(model: torch.nn.Module, packed: PackedRows) -> torch.Tensor:
    allowed = block_causal_allowed(packed.group_PN, packed.block_PN)
    out = model(
        input_ids=packed.input_ids_PN,
        attention_mask=packed_attention_mask(model, allowed),
        position_ids=packed.position_ids_PN,
        logits_to_keep=packed.keep_K,  # the prompts' other positions predict nothing trained
        **forward_kwargs(model),
    )
    return out.logits.flatten(0, 1)[packed.gather_BR]
