"""One training step: advantages, rows, micro-batched forward/backward with exact gradient
accumulation, the loss and its metrics. The model, optimizer, scheduler, gradient sync and
clipping belong to the :class:`~zbrl.training.engine.base.Engine` the step drives, so the same
step runs on one process or data-parallel ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from zbrl.algorithms.advantages import compute_advantages
from zbrl.algorithms.aggregation import Normalisers
from zbrl.algorithms.logprobs import logprobs_and_entropy
from zbrl.algorithms.mismatch import mismatch_metrics
from zbrl.algorithms.policy_loss import LossConfig, LossInputs, compute_policy_loss
from zbrl.training.engine.base import Engine
from zbrl.training.rows import MicroBatch, Row, build_rows, collate, split, trained_token_count
from zbrl.types import RolloutGroup


@dataclass(frozen=True)
class StepSettings:
    """Everything one training step needs besides the engine (every field is filled by
    ``zbrl.assembly.settings.step_settings``; none has a default of its own)."""

    advantage: str
    loss: LossConfig
    policy_loss: str
    advantage_kwargs: dict[str, Any]
    minibatch_groups: int | None
    microbatch_size: int
    filter_truncated: bool
    loss_filter_range: tuple[float, float] | None
    max_norm: float
    norm_tokens: float
    logprob_chunk_size: int
    pad_id: int


class Trainer:
    """The RL train step over an :class:`~zbrl.training.engine.base.Engine` (which owns the
    policy, the frozen reference, the optimizer and the LR scheduler)."""

    def __init__(self, engine: Engine, settings: StepSettings) -> None:
        if settings.loss.beta > 0 and not engine.has_reference:
            raise ValueError("algorithm.beta > 0 needs a reference model")
        self.engine = engine
        self.settings = settings

    @property
    def optimizer_steps(self) -> int:
        return self.engine.optimizer_steps

    def train(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """Train on one batch of groups (one or more optimizer steps); returns step metrics.

        Every rank of a data-parallel engine gets the whole batch (advantages such as
        REINFORCE++'s are whitened over all of it) and trains its contiguous slice of each
        optimizer step's groups, in ticket order (:func:`rank_slice`); the metrics returned are
        the whole step's, the same on every rank."""
        s = self.settings
        rewards_BG = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
        advantages_BG = compute_advantages(s.advantage, rewards_BG, **s.advantage_kwargs)
        per_minibatch = s.minibatch_groups or len(groups)
        totals = _Totals()
        for start in range(0, len(groups), per_minibatch):
            chunk = groups[start : start + per_minibatch]
            totals.add(self._optimizer_step(chunk, advantages_BG[start : start + per_minibatch]))
        metrics = totals.means()
        metrics["advantage_mean"] = float(advantages_BG.mean())
        metrics["advantage_abs_mean"] = float(advantages_BG.abs().mean())
        return metrics

    def _optimizer_step(
        self, groups: list[RolloutGroup], advantages_BG: torch.Tensor
    ) -> dict[str, float]:
        s = self.settings
        engine = self.engine
        mine = rank_slice(len(groups), engine.rank, engine.world_size)
        rows = build_rows(
            groups[mine],
            advantages_BG[mine],
            filter_truncated=s.filter_truncated,
            loss_filter_range=s.loss_filter_range,
        )
        tokens, seqs = trained_token_count(rows)
        local = Normalisers(tokens=float(tokens), seqs=float(seqs), norm_tokens=s.norm_tokens)
        norm = engine.reduce_normalisers(local)
        micro_batches = split(rows, s.microbatch_size)
        # every rank runs as many micro-batches as the busiest one (collectives pair up)
        padding = micro_batch_count(groups, engine.world_size, s.microbatch_size)
        padding -= len(micro_batches)
        micro_batches += [[padding_row(s.pad_id)] for _ in range(padding)]
        engine.zero_grad()
        weighted = _Totals()
        loss_sum = 0.0
        for i, micro_rows in enumerate(micro_batches):
            with engine.microbatch(last=i == len(micro_batches) - 1):
                out = self._micro_step(collate(micro_rows, s.pad_id), norm)
                engine.backward(out.loss)
            loss_sum += float(out.loss.detach())
            weighted.add(out.metrics, weight=out.metrics.get("num_tokens", 0.0))
        lr = engine.current_lr()
        grad_norm = engine.clip_and_step(s.max_norm)
        metrics = weighted.reduced(engine).means()
        loss, trained = engine.all_reduce([loss_sum, float(tokens)], "sum")
        metrics.update(loss=loss, grad_norm=grad_norm, lr=lr, trained_tokens=trained)
        return metrics

    def _micro_step(self, mb: MicroBatch, norm: Normalisers):
        s = self.settings
        dev = self.engine.device
        input_ids, attention = mb.input_ids_BT.to(dev), mb.attention_BT.to(dev)
        targets = mb.targets_BT.to(dev)
        logits = self.engine.policy_logits(input_ids, attention)[:, :-1]
        logp, entropy = self._logprobs(logits, targets, mb.temperatures_B)
        ref_logp = None
        if s.loss.beta > 0:
            with torch.no_grad():
                ref_logits = self.engine.reference_logits(input_ids, attention)
                ref_logp, _ = self._logprobs(ref_logits[:, :-1], targets, mb.temperatures_B)
        if s.loss.entropy_coef == 0 and entropy is not None:
            entropy = entropy.detach()
        inputs = LossInputs(
            logprobs_BT=logp,
            old_logprobs_BT=mb.old_logprobs_BT.to(dev),
            advantages_B_or_BT=mb.advantages_B.to(dev),
            mask_BT=mb.mask_BT.to(dev),
            ref_logprobs_BT=ref_logp,
            entropy_BT=entropy,
        )
        out = compute_policy_loss(s.policy_loss, inputs, s.loss, norm)
        # the producer's log-probs (rows' behaviour log-probs) against this recomputation
        out.metrics.update(mismatch_metrics(logp, mb.old_logprobs_BT.to(dev), inputs.mask_BT))
        return out

    def _logprobs(
        self, logits_BTV: torch.Tensor, targets_BT: torch.Tensor, temperatures_B: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs at each row's own sampling temperature (the behaviour policy's)."""
        temperature = 1.0
        if bool((temperatures_B == temperatures_B[0]).all()):
            temperature = float(temperatures_B[0])
        else:
            logits_BTV = logits_BTV / temperatures_B.to(logits_BTV.device).view(-1, 1, 1)
        return logprobs_and_entropy(
            logits_BTV,
            targets_BT,
            temperature=temperature,
            chunk_size=self.settings.logprob_chunk_size,
            with_entropy=True,
        )


SUMMED = ("num_tokens", "trained_tokens")
"""Metrics that add up over micro-batches, ranks and optimizer steps (the rest are means)."""


def rank_slice(num_groups: int, rank: int, world_size: int) -> slice:
    """The contiguous groups (in ticket order) that ``rank`` trains of one optimizer step's
    ``num_groups``: balanced, the first ranks taking one fewer when it does not divide."""
    return slice(rank * num_groups // world_size, (rank + 1) * num_groups // world_size)


def micro_batch_count(groups: list[RolloutGroup], world_size: int, microbatch_size: int) -> int:
    """Micro-batches of the busiest rank for one optimizer step over ``groups``."""
    counts = []
    for rank in range(world_size):
        rows = sum(g.group_size for g in groups[rank_slice(len(groups), rank, world_size)])
        counts.append(-(-rows // microbatch_size))
    return max(counts)


def padding_row(pad_id: int) -> Row:
    """A one-token row outside the loss: a rank with fewer micro-batches than the busiest runs
    these, so its collectives pair up; its gradient and metric weight are zero."""
    return Row(
        prompt_ids=[pad_id],
        response_ids=torch.tensor([pad_id], dtype=torch.long),
        old_logprobs=torch.zeros(1),
        advantage=0.0,
        temperature=1.0,
        trained=False,
    )


class _Totals:
    """Weighted running means of metric dicts."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float = 1.0) -> None:
        for k, v in metrics.items():
            if k.endswith("_max"):
                self.sums[k] = max(self.sums.get(k, float("-inf")), float(v))
                self.weights[k] = 1.0
                continue
            w = 1.0 if k in SUMMED else weight
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * w
            self.weights[k] = self.weights.get(k, 0.0) + w

    def reduced(self, engine: Engine) -> _Totals:
        """These totals combined over the engine's ranks (sums added, maxima maxed); every
        rank must hold the same keys."""
        if engine.world_size == 1:
            return self
        keys = sorted(self.sums)
        summed = [k for k in keys if not k.endswith("_max")]
        maxed = [k for k in keys if k.endswith("_max")]
        both = engine.all_reduce(
            [self.sums[k] for k in summed] + [self.weights[k] for k in summed], "sum"
        )
        sums, weights = both[: len(summed)], both[len(summed) :]
        maxima = engine.all_reduce([self.sums[k] for k in maxed], "max")
        out = _Totals()
        out.sums = dict(zip(summed + maxed, sums + maxima, strict=True))
        out.weights = dict(zip(summed, weights, strict=True)) | {k: 1.0 for k in maxed}
        return out

    def means(self) -> dict[str, float]:
        out = {}
        for k, total in self.sums.items():
            if k in SUMMED or k.endswith("_max"):
                out[k] = total
            else:
                out[k] = total / self.weights[k] if self.weights[k] else 0.0
        return out
