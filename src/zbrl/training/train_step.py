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
        """Train on one batch of groups (one or more optimizer steps); returns step metrics."""
        s = self.settings
        rewards_BG = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
        advantages_BG = compute_advantages(s.advantage, rewards_BG, **s.advantage_kwargs)
        per_minibatch = s.minibatch_groups or len(groups)
        totals = _Totals()
        for start in range(0, len(groups), per_minibatch):
            chunk = slice(start, start + per_minibatch)
            rows = build_rows(
                groups[chunk],
                advantages_BG[chunk],
                filter_truncated=s.filter_truncated,
                loss_filter_range=s.loss_filter_range,
            )
            totals.add(self._optimizer_step(rows))
        metrics = totals.means()
        metrics["advantage_mean"] = float(advantages_BG.mean())
        metrics["advantage_abs_mean"] = float(advantages_BG.abs().mean())
        return metrics

    def _optimizer_step(self, rows: list[Row]) -> dict[str, float]:
        s = self.settings
        engine = self.engine
        tokens, seqs = trained_token_count(rows)
        local = Normalisers(tokens=float(tokens), seqs=float(seqs), norm_tokens=s.norm_tokens)
        norm = engine.reduce_normalisers(local)
        engine.zero_grad()
        weighted = _Totals()
        loss_sum = 0.0
        micro_batches = split(rows, s.microbatch_size)
        for i, micro_rows in enumerate(micro_batches):
            with engine.microbatch(last=i == len(micro_batches) - 1):
                out = self._micro_step(collate(micro_rows, s.pad_id), norm)
                engine.backward(out.loss)
            loss_sum += float(out.loss.detach())
            weighted.add(out.metrics, weight=out.metrics.get("num_tokens", 0.0))
        lr = engine.current_lr()
        grad_norm = engine.clip_and_step(s.max_norm)
        metrics = weighted.means()
        metrics.update(loss=loss_sum, grad_norm=grad_norm, lr=lr, trained_tokens=float(tokens))
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
            w = 1.0 if k in ("num_tokens", "trained_tokens") else weight
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * w
            self.weights[k] = self.weights.get(k, 0.0) + w

    def means(self) -> dict[str, float]:
        out = {}
        for k, total in self.sums.items():
            if k in ("num_tokens", "trained_tokens") or k.endswith("_max"):
                out[k] = total
            else:
                out[k] = total / self.weights[k] if self.weights[k] else 0.0
        return out
