"""Turn RolloutGroups into training rows and micro-batches: right-padded per micro-batch (never
to the batch's global maximum), or packed into a few rows with no padding inside them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from zbrl.algorithms.filters import group_in_accuracy_range
from zbrl.models.forward import right_padded
from zbrl.models.kv_cache import left_pad
from zbrl.training.model_inputs import ModelInputs, PackedRows, SharedPrompts
from zbrl.types import RolloutGroup, Segment


@dataclass
class Row:
    """One sequence to train on: prompt + response, with its per-sequence inputs."""

    prompt_ids: list[int]
    response_ids: torch.Tensor  # int64 [L]
    old_logprobs: torch.Tensor  # float32 [L]
    advantage: float
    temperature: float
    trained: bool  # False: excluded from the loss (truncated or filtered in the loss)
    reward: float
    behind: int  # policy versions between its oldest token's and the trained one
    # Filled at the start of a step when the algorithm needs them (all float32 [L]):
    proximal_logprobs: torch.Tensor | None = None  # step-start policy (decoupled correction)
    ref_logprobs: torch.Tensor | None = None  # reference policy (KL folded into the reward)
    old_values: torch.Tensor | None = None  # step-start critic values (PPO with GAE)
    returns: torch.Tensor | None = None  # value targets (GAE)
    token_advantages: torch.Tensor | None = None  # per-token advantages (GAE, distillation)
    teacher_logprobs: torch.Tensor | None = None  # the distillation teacher's, float32 [L]
    # Multi-turn episodes: bool [L], True on the model's tokens (environment tokens are part of
    # the sequence but outside the loss); None: every response token is the model's.
    loss_mask: torch.Tensor | None = None
    # int64 [L]: policy versions between each token's and the trained one (in-flight updates
    # make them differ inside a response); None: ``behind`` for every token.
    token_behind: torch.Tensor | None = None

    def trained_tokens(self) -> int:
        """Response tokens in the loss (0 for a row outside it)."""
        if not self.trained:
            return 0
        if self.loss_mask is None:
            return int(self.response_ids.numel())
        return int(self.loss_mask.sum())


@dataclass
class MicroBatch:
    """Right-padded tensors of a few rows, in one of the three layouts of
    :mod:`zbrl.training.model_inputs`; every ``_BT`` tensor but the inputs is aligned with
    ``targets_BT``."""

    input_ids_BT: torch.Tensor
    attention_BT: torch.Tensor
    targets_BT: torch.Tensor  # input_ids shifted left by one
    mask_BT: torch.Tensor  # bool: response tokens of trained rows (the model's, in episodes)
    old_logprobs_BT: torch.Tensor
    advantages_B: torch.Tensor
    temperatures_B: torch.Tensor
    behind_B: torch.Tensor  # int64: each row's oldest token's
    behind_BT: torch.Tensor  # int64: each token's (0 at padding)
    # Present when every row of the micro-batch has the field (see Row); 0 at padding.
    proximal_logprobs_BT: torch.Tensor | None = None
    old_values_BT: torch.Tensor | None = None
    returns_BT: torch.Tensor | None = None
    advantages_BT: torch.Tensor | None = None
    prompts: SharedPrompts | None = None
    """Set in the shared-prompt layout: ``input_ids_BT`` are then the responses alone."""
    packed: PackedRows | None = None
    """Set in the packed layout: ``input_ids_BT`` are then the responses alone (not run)."""

    def model_inputs(self) -> ModelInputs:
        return ModelInputs(self.input_ids_BT, self.attention_BT, self.prompts, self.packed)


def build_rows(
    groups: list[RolloutGroup],
    advantages_BG: torch.Tensor,
    *,
    filter_truncated: bool,
    loss_filter_range: tuple[float, float] | None,
    trained_version: int | None = None,
) -> list[Row]:
    """One row per completion (and one per later segment of an agent episode whose history
    changed, with the episode's advantage); ``loss_filter_range`` masks whole groups in the
    loss (used when the buffer does not filter them, i.e. ``dynamic_batching`` is off).
    ``trained_version`` is the version of the policy being trained (each row's ``behind`` is
    measured from it; 0 when not given), and each token's ``token_behind`` from the version
    that sampled it."""
    rows: list[Row] = []
    for b, group in enumerate(groups):
        group_kept = group_in_accuracy_range(group.ans_acc, loss_filter_range)
        behind = 0 if trained_version is None else max(0, trained_version - group.policy_version)
        for g in range(group.group_size):
            row = Row(
                prompt_ids=group.prompt_ids,
                response_ids=group.response_ids[g],
                old_logprobs=group.behaviour_logprobs[g],
                advantage=float(advantages_BG[b, g]),
                temperature=group.temperature,
                trained=group_kept and not (filter_truncated and group.truncated[g]),
                reward=float(group.rewards[g]),
                behind=behind,
                loss_mask=None if group.loss_masks is None else group.loss_masks[g],
                teacher_logprobs=None
                if group.teacher_logprobs is None
                else group.teacher_logprobs[g],
                token_behind=None
                if trained_version is None
                else (trained_version - group.versions(g)).clamp_min(0),
            )
            rows.append(row)
            for seg in group.segments[g] if group.segments is not None else ():
                rows.append(_segment_row(row, seg, trained_version))
    return rows


def _segment_row(episode: Row, seg: Segment, trained_version: int | None) -> Row:
    """A later segment of an agent episode (a changed history) as a row of its own: its own
    prompt, tokens, mask and versions; its episode's advantage, reward and whether it is
    trained (the advantage is the episode's, computed over the group's episodes)."""
    return replace(
        episode,
        prompt_ids=seg.prompt_ids,
        response_ids=seg.response_ids,
        old_logprobs=seg.behaviour_logprobs,
        loss_mask=seg.loss_mask,
        teacher_logprobs=None,  # the teacher scores an episode's first segment only
        token_behind=None
        if trained_version is None
        else (trained_version - seg.token_versions).clamp_min(0),
    )


def collate(
    rows: list[Row], pad_id: int, *, share_prompts: bool = False, packed: bool = False
) -> MicroBatch:
    """Right-pad ``rows`` to their own longest sequence: full rows (prompt + response), or with
    ``share_prompts`` the responses alone on top of the micro-batch's unique prompts; or with
    ``packed`` all of them in a few packed rows (:func:`pack_rows`), the targets still the
    right-padded responses (see :mod:`zbrl.training.model_inputs`). The per-token tensors are
    aligned with the targets."""
    packed_row = None
    if packed:
        input_ids, attention, _ = _response_layout(rows, pad_id)
        targets, prompts = input_ids, None
        packed_row = pack_rows(rows, input_ids.shape[1], pad_id)
    elif share_prompts:
        input_ids, attention, prompts = _response_layout(rows, pad_id)
        targets = input_ids
    else:
        (input_ids, attention), prompts = _full_layout(rows, pad_id), None
        targets = input_ids[:, 1:]
    responses_aligned = packed or share_prompts  # targets are the responses themselves
    mask = torch.zeros(targets.shape, dtype=torch.bool)
    old = torch.zeros(targets.shape, dtype=torch.float32)
    behind = torch.zeros(targets.shape, dtype=torch.long)
    for i, r in enumerate(rows):
        span = response_span(r, shared=responses_aligned)
        mask[i, span] = r.trained if r.loss_mask is None else r.loss_mask & r.trained
        old[i, span] = r.old_logprobs
        behind[i, span] = r.behind if r.token_behind is None else r.token_behind
    return MicroBatch(
        input_ids_BT=input_ids,
        attention_BT=attention,
        targets_BT=targets,
        mask_BT=mask,
        old_logprobs_BT=old,
        advantages_B=torch.tensor([r.advantage for r in rows], dtype=torch.float32),
        temperatures_B=torch.tensor([r.temperature for r in rows], dtype=torch.float32),
        behind_B=torch.tensor([r.behind for r in rows], dtype=torch.long),
        behind_BT=behind,
        proximal_logprobs_BT=_padded(rows, "proximal_logprobs", old.shape, responses_aligned),
        old_values_BT=_padded(rows, "old_values", old.shape, responses_aligned),
        returns_BT=_padded(rows, "returns", old.shape, responses_aligned),
        advantages_BT=_padded(rows, "token_advantages", old.shape, responses_aligned),
        prompts=prompts,
        packed=packed_row,
    )


def _full_layout(rows: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    full = [torch.cat([torch.tensor(r.prompt_ids, dtype=torch.long), r.response_ids]) for r in rows]
    return right_padded(full, pad_id)  # as the producer's exact log-probs lay them out


def _response_layout(
    rows: list[Row], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, SharedPrompts]:
    """Right-padded responses ``[B, R]`` (R ≥ 1), their attention, and the unique prompts
    (left-padded) with each row's index into them."""
    unique: dict[tuple[int, ...], int] = {}
    index = [unique.setdefault(tuple(r.prompt_ids), len(unique)) for r in rows]
    prompt_ids, prompt_attention = left_pad([list(p) for p in unique], pad_id)
    lengths = [int(r.response_ids.numel()) for r in rows]
    responses = torch.full((len(rows), max(1, *lengths)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        responses[i, : lengths[i]] = r.response_ids
    prompts = SharedPrompts(
        prompt_ids_UP=prompt_ids,
        prompt_attention_UP=prompt_attention,
        prompt_index_B=torch.tensor(index, dtype=torch.long),
    )
    return responses, _right_mask(lengths, responses.shape[1]), prompts


def pack_rows(rows: list[Row], width: int, pad_id: int) -> PackedRows:
    """``rows`` packed into a few rows: each unique prompt (first seen first) followed by its
    rows' responses but their last tokens is one block; blocks go largest first into the first
    row with room (first-fit decreasing), every row as wide as the largest block (see
    :func:`packed_row_plan`), right-padded. ``width`` is the targets' (the longest response,
    ≥ 1)."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rows):
        by_prompt.setdefault(tuple(r.prompt_ids), []).append(i)
    blocks = list(by_prompt.items())
    sizes = [
        len(prompt) + sum(max(int(rows[i].response_ids.numel()) - 1, 0) for i in members)
        for prompt, members in blocks
    ]
    row_of_block = packed_row_plan(sizes)
    n_rows, n = max(row_of_block) + 1, max(sizes)
    ids_PN = torch.full((n_rows, n), pad_id, dtype=torch.long)
    positions_PN = torch.zeros((n_rows, n), dtype=torch.long)
    group_PN = torch.full((n_rows, n), -1, dtype=torch.long)  # padding: a group of its own
    block_PN = torch.full((n_rows, n), PADDING_BLOCK, dtype=torch.long)
    predictor_row_B = torch.zeros(len(rows), dtype=torch.long)
    predictor_col_BR = torch.zeros((len(rows), width), dtype=torch.long)  # column predicting each
    fill = [0] * n_rows  # tokens placed in each row
    prompt_lasts: list[tuple[int, int]] = []  # (row, column) of prompt ends predicting a token
    for g, ((prompt, members), p_row) in enumerate(zip(blocks, row_of_block, strict=True)):
        p, offset = len(prompt), fill[p_row]
        ids_PN[p_row, offset : offset + p] = torch.tensor(prompt, dtype=torch.long)
        positions_PN[p_row, offset : offset + p] = torch.arange(p)
        group_PN[p_row, offset : offset + sizes[g]] = g
        block_PN[p_row, offset : offset + p] = -1
        prompt_last, offset = offset + p - 1, offset + p
        for i in members:
            fed = rows[i].response_ids[:-1]  # the last token predicts nothing trained
            k = int(fed.numel())
            ids_PN[p_row, offset : offset + k] = fed
            positions_PN[p_row, offset : offset + k] = torch.arange(p, p + k)
            block_PN[p_row, offset : offset + k] = i
            if rows[i].response_ids.numel():
                prompt_lasts.append((p_row, prompt_last))
                predictor_row_B[i] = p_row
                predictor_col_BR[i, 0] = prompt_last
                predictor_col_BR[i, 1 : k + 1] = torch.arange(offset, offset + k)
            offset += k
        fill[p_row] = offset
    # a column's logits are kept when it predicts a response token in some row
    predicts_PN = block_PN >= 0
    predicts_PN[tuple(torch.tensor(prompt_lasts, dtype=torch.long).reshape(-1, 2).T)] = True
    kept_N = predicts_PN.any(0)
    keep_K = kept_N.nonzero()[:, 0]
    index_of_N = kept_N.long().cumsum(0) - 1  # kept column -> its index in keep_K
    lengths_B = torch.tensor([int(r.response_ids.numel()) for r in rows], dtype=torch.long)
    targeted_BR = torch.arange(width)[None, :] < lengths_B[:, None]
    gather_BR = predictor_row_B[:, None] * keep_K.numel() + index_of_N[predictor_col_BR]
    return PackedRows(
        input_ids_PN=ids_PN,
        position_ids_PN=positions_PN,
        group_PN=group_PN,
        block_PN=block_PN,
        keep_K=keep_K,
        gather_BR=torch.where(targeted_BR, gather_BR, 0),
    )


PADDING_BLOCK = -2
"""``block_PN`` of a packed row's padding: it sees only the padding before it (never empty, so
attention stays finite), and no real token sees it."""


def packed_row_plan(sizes: list[int]) -> list[int]:
    """The packed row of each block of ``sizes`` tokens: largest first (ties in order), each
    into the first row whose tokens stay within the largest block's. Rows then hold whole
    blocks and are about as wide as the largest: attention, whose mask is dense, costs rows ×
    width² instead of one row's (all tokens)², and padding stays under one block per row."""
    width = max(sizes)
    used: list[int] = []
    row_of = [0] * len(sizes)
    for b in sorted(range(len(sizes)), key=lambda b: (-sizes[b], b)):
        for r, tokens in enumerate(used):
            if tokens + sizes[b] <= width:
                used[r] += sizes[b]
                row_of[b] = r
                break
        else:
            used.append(sizes[b])
            row_of[b] = len(used) - 1
    return row_of


def _right_mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


def response_span(row: Row, *, shared: bool = False) -> slice:
    """Where a row's response tokens sit in the targets: full rows predict token t + 1 at
    position t, so the response occupies targets [p-1, p-1+L); with shared prompts the targets
    are the response itself, [0, L)."""
    start = 0 if shared else len(row.prompt_ids) - 1
    return slice(start, start + int(row.response_ids.numel()))


def _padded(rows: list[Row], name: str, shape: torch.Size, shared: bool) -> torch.Tensor | None:
    """``[B, T]`` float32 of the per-token field ``name`` at each row's response span, or None
    when a row lacks it."""
    values = [getattr(r, name) for r in rows]
    if any(v is None for v in values):
        return None
    out = torch.zeros(shape, dtype=torch.float32)
    for i, (r, v) in enumerate(zip(rows, values, strict=True)):
        out[i, response_span(r, shared=shared)] = v
    return out


@dataclass(frozen=True)
class MicroBatching:
    """How an optimizer step's rows are cut into forward/backward passes."""

    size: int
    """Rows per micro-batch at most."""
    tokens: int | None
    """Token budget (rows × padded length) per micro-batch; None: ``size`` rows in order."""
    share_prompts: bool
    """Run each micro-batch's unique prompts once, the responses on top of them (the
    shared-prompt layout of :mod:`zbrl.training.model_inputs`); False: full rows."""
    packing: bool = False
    """Pack each micro-batch into a few rows without padding inside them (the packed layout of
    :mod:`zbrl.training.model_inputs`); ``tokens`` then budgets packed tokens (see
    :func:`plan_packed`)."""


class RowShape(NamedTuple):
    """What planning micro-batches needs of a row."""

    prompt: tuple[int, ...]
    response: int  # tokens


def row_shape(row: Row) -> RowShape:
    return RowShape(tuple(row.prompt_ids), int(row.response_ids.numel()))


def packed_tokens(shapes: list[RowShape]) -> int:
    """Tokens of ``shapes`` packed: each unique prompt once, each response but its last token
    (:func:`pack_rows`; its rows' padding not counted)."""
    prompts = {s.prompt for s in shapes}
    return sum(len(p) for p in prompts) + sum(max(s.response - 1, 0) for s in shapes)


def row_length(row: Row) -> int:
    return len(row.prompt_ids) + int(row.response_ids.numel())


def plan_micro_batches(lengths: list[int], batching: MicroBatching) -> list[list[int]]:
    """Row indices of each micro-batch. Without a token budget: consecutive runs of
    ``batching.size``. With one: longest first, a micro-batch closes when one more row would
    take it over the budget (its padded width is its first, longest row) or over ``size`` rows;
    a row longer than the budget goes alone."""
    if batching.tokens is None:
        return [
            list(range(i, min(i + batching.size, len(lengths))))
            for i in range(0, len(lengths), batching.size)
        ]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan: list[list[int]] = []
    for i in order:
        current = plan[-1] if plan else None
        if (
            current is None
            or len(current) == batching.size
            or (len(current) + 1) * lengths[current[0]] > batching.tokens
        ):
            plan.append([i])
        else:
            current.append(i)
    return plan


def plan_packed(shapes: list[RowShape], batching: MicroBatching) -> list[list[int]]:
    """Row indices of each packed micro-batch. Without a token budget: ``batching.size`` rows
    at a time in ticket order (as :func:`plan_micro_batches`). With one: the rows of each prompt
    stay together, cut into pieces of at most ``tokens`` packed tokens (a piece always takes one
    row, so a row longer than the budget goes alone, with its prompt); the pieces go largest
    first into the first micro-batch they fit (first-fit decreasing), so micro-batches come out
    full and few. The row cap ``size`` does not apply: the cost of a packed row is its tokens."""
    budget = batching.tokens
    if budget is None:
        return plan_micro_batches([0] * len(shapes), batching)
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(shapes):
        by_prompt.setdefault(s.prompt, []).append(i)
    pieces: list[tuple[int, list[int]]] = []  # (packed tokens, row indices)
    for prompt, members in by_prompt.items():
        piece: list[int] = []
        cost = len(prompt)
        for i in members:
            extra = max(shapes[i].response - 1, 0)
            if piece and cost + extra > budget:
                pieces.append((cost, piece))
                piece, cost = [], len(prompt)
            piece.append(i)
            cost += extra
        pieces.append((cost, piece))
    pieces.sort(key=lambda piece: (-piece[0], piece[1][0]))
    bins: list[tuple[int, list[int]]] = []
    for cost, piece in pieces:
        for b, (used, members) in enumerate(bins):
            if used + cost <= budget:
                bins[b] = (used + cost, members + piece)
                break
        else:
            bins.append((cost, list(piece)))
    return [members for _, members in bins]


def plan(shapes: list[RowShape], batching: MicroBatching) -> list[list[int]]:
    """Row indices of each micro-batch in ``batching``'s layout."""
    if batching.packing:
        return plan_packed(shapes, batching)
    return plan_micro_batches([len(s.prompt) + s.response for s in shapes], batching)


def split(rows: list[Row], batching: MicroBatching) -> list[list[Row]]:
    """``rows`` cut into micro-batches (see :func:`plan`)."""
    indices_per_micro = plan([row_shape(r) for r in rows], batching)
    return [[rows[i] for i in indices] for indices in indices_per_micro]


def trained_token_count(rows: list[Row]) -> tuple[int, int]:
    """(trained tokens, trained non-empty sequences) of a whole optimizer step."""
    counts = [r.trained_tokens() for r in rows]
    tokens = sum(counts)
    seqs = sum(1 for n in counts if n > 0)
    return tokens, seqs
