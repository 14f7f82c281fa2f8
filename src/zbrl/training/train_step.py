"""One training step: advantages, rows, the step-start pass (proximal log-probs, critic values,
GAE), ``ppo_epochs`` passes of micro-batched forward/backward with exact gradient accumulation per
mini-batch, the policy loss (and the critic's value loss) and their metrics. The model, optimizer,
scheduler, gradient sync and clipping belong to the :class:`~zbrl.training.engine.base.Engine` the
step drives, so the same step runs on one process or data-parallel ranks."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch

from zbrl.algorithms.advantages import compute_advantages
from zbrl.algorithms.aggregation import Normalisers
from zbrl.algorithms.correction import loglinear_alpha, loglinear_proximal
from zbrl.algorithms.distill import DistillWeights, distill_advantages, reverse_kl_per_token
from zbrl.algorithms.gae import value_loss
from zbrl.algorithms.logprobs import logprobs_and_entropy
from zbrl.algorithms.mismatch import split_mismatch_metrics
from zbrl.algorithms.policy_loss import LossConfig, LossInputs, LossOutputs, compute_policy_loss
from zbrl.models.moe import RouterRecorder, load_balance, moe_shape
from zbrl.training.engine.base import Engine
from zbrl.training.model_inputs import ModelInputs
from zbrl.training.rows import (
    MicroBatch,
    MicroBatching,
    Row,
    RowShape,
    build_rows,
    collate,
    packed_tokens,
    plan,
    split,
    trained_token_count,
)
from zbrl.training.step_start import CriticSettings, annotate_gae, annotate_step_start
from zbrl.types import RolloutGroup

GAE = "gae"
"""The advantage estimator that needs the critic (token-level, computed by the step)."""


@dataclass(frozen=True)
class StepSettings:
    """Everything one training step needs besides the engine (every field is filled by
    ``zbrl.assembly.settings.step_settings``; none has a default of its own)."""

    advantage: str
    loss: LossConfig
    policy_loss: str
    advantage_kwargs: dict[str, Any]
    minibatch_groups: int | None
    micro: MicroBatching
    """How each optimizer step's rows are cut into forward/backward passes."""
    filter_truncated: bool
    loss_filter_range: tuple[float, float] | None
    max_norm: float
    norm_tokens: float
    logprob_chunk_size: int
    pad_id: int
    ppo_epochs: int
    proximal: str
    """How ``decoupled`` gets the proximal log-probs: ``recompute`` or ``loglinear``."""
    critic: CriticSettings | None
    """PPO's critic side (GAE and value loss); None without a critic."""
    distill: DistillWeights | None
    """On-policy distillation: per-token advantages from the teacher's log-probs (None: off)."""


class Trainer:
    """The RL train step over an :class:`~zbrl.training.engine.base.Engine` (which owns the
    policy, the frozen reference, the optimizer and the LR scheduler)."""

    def __init__(self, engine: Engine, settings: StepSettings) -> None:
        if settings.loss.beta > 0 and not engine.has_reference:
            raise ValueError("algorithm.beta > 0 needs a reference model")
        if settings.critic is not None and settings.critic.kl_coef > 0 and not engine.has_reference:
            raise ValueError("a KL folded into the reward needs a reference model")
        if settings.critic is not None and not engine.has_critic:
            raise ValueError("algorithm.critic needs an engine with a value model")
        if settings.critic is not None and settings.micro.share_prompts:
            raise ValueError("the critic's value model takes full rows: share_prompts must be off")
        if settings.critic is not None and settings.micro.packing:
            raise ValueError("the critic's value model takes full rows: packing must be off")
        if (settings.advantage == GAE) != (settings.critic is not None):
            raise ValueError("advantage 'gae' needs the critic settings, and only it uses them")
        if settings.distill is not None and settings.critic is not None:
            raise ValueError("distillation and GAE both set per-token advantages: use one")
        self.engine = engine
        self.settings = settings
        self._updates_in_batch = 0
        policy = getattr(engine, "policy", None)  # stub engines in tests hold no model
        shape = None if policy is None else moe_shape(policy)
        if shape is not None and engine.world_size != engine.data_parallel_size:
            # context parallelism: each rank routes a slice of every row's tokens
            if shape.aux_coef:
                raise ValueError(
                    "the MoE model's router loss (router_aux_loss_coef in its config.json) is "
                    "not computed under context parallelism: set "
                    "training.engine.context_parallel_size=1, or output_router_logits=false in "
                    "the model's config.json"
                )
            shape = None
        self.routers = None if shape is None else RouterRecorder(policy, shape)
        """The policy's routers (an MoE model): load balance and its auxiliary loss."""

    @property
    def optimizer_steps(self) -> int:
        return self.engine.optimizer_steps

    def train(
        self, groups: list[RolloutGroup], policy_version: int | None = None
    ) -> dict[str, float]:
        """Train on one batch of groups (``ppo_epochs`` passes, one optimizer step per
        mini-batch each); ``policy_version`` is the version being trained (how stale each group
        is; needed by the log-linear proximal approximation). Returns the step's metrics.

        Every rank of a data-parallel engine gets the whole batch (advantages such as
        REINFORCE++'s are whitened over all of it) and trains its contiguous slice of each
        optimizer step's groups, in ticket order (:func:`rank_groups`); the metrics returned are
        the whole step's, the same on every rank."""
        s = self.settings
        rewards_BG = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
        if s.advantage == GAE:
            advantages_BG = torch.zeros_like(rewards_BG)  # token-level, from the critic below
        else:
            advantages_BG = compute_advantages(s.advantage, rewards_BG, **s.advantage_kwargs)
        per_minibatch = s.minibatch_groups or len(groups)
        engine = self.engine
        minibatches: list[tuple[list[Row], int]] = []  # this rank's rows, micro-batches to run
        for start in range(0, len(groups), per_minibatch):
            chunk = groups[start : start + per_minibatch]
            mine = rank_groups(chunk, engine.data_rank, engine.data_parallel_size, s.micro)
            rows = build_rows(
                [chunk[i] for i in mine],
                advantages_BG[start : start + per_minibatch][mine],
                filter_truncated=s.filter_truncated,
                loss_filter_range=s.loss_filter_range,
                trained_version=policy_version,
            )
            count = micro_batch_count(chunk, engine.data_parallel_size, s.micro)
            minibatches.append((rows, count))
        self._check_versions(policy_version)
        all_rows = [row for rows, _ in minibatches for row in rows]
        distill_metrics = {} if s.distill is None else self._distill(all_rows, s.distill)
        metrics = self._step_start(all_rows)
        metrics.update(distill_metrics)
        totals = _Totals()
        self._updates_in_batch = 0
        steps_per_batch = self._steps_per_batch(len(minibatches))
        for _ in range(s.ppo_epochs):
            for rows, count in minibatches:
                totals.add(self._optimizer_step(rows, count, steps_per_batch))
                self._updates_in_batch += 1
        metrics.update(totals.means())
        metrics["advantage_mean"] = float(advantages_BG.mean())
        metrics["advantage_abs_mean"] = float(advantages_BG.abs().mean())
        return metrics

    def _distill(self, rows: list[Row], weights: DistillWeights) -> dict[str, float]:
        """Per-token distillation advantages on this rank's rows; the step's mean reverse KL
        over every rank's trained tokens."""
        total, count = self.engine.all_reduce(list(distill_rows(rows, weights)), "sum")
        return {"distill/reverse_kl": total / count if count else 0.0}

    def _steps_per_batch(self, minibatches: int) -> int:
        return minibatches * self.settings.ppo_epochs

    def _check_versions(self, policy_version: int | None) -> None:
        if self._loglinear and policy_version is None:
            raise ValueError(
                "the log-linear proximal approximation needs Trainer.train(..., policy_version=)"
            )

    @property
    def _loglinear(self) -> bool:
        s = self.settings
        return s.loss.correction == "decoupled" and s.proximal == "loglinear"

    def _step_start(self, rows: list[Row]) -> dict[str, float]:
        """No-grad pass of the step-start models, then GAE (see :mod:`.step_start`)."""
        s = self.settings
        critic = s.critic
        annotate_step_start(
            self.engine,
            rows,
            lambda logits, targets, temps: self._token_logprobs(logits, targets, temps)[0],
            batching=s.micro,
            pad_id=s.pad_id,
            proximal=s.loss.correction == "decoupled" and s.proximal == "recompute",
            reference=critic is not None and critic.kl_coef > 0,
            values=critic is not None,
        )
        return annotate_gae(rows, critic) if critic is not None else {}

    def _optimizer_step(
        self, rows: list[Row], micro_batches_to_run: int, steps_per_batch: int
    ) -> dict[str, float]:
        """One optimizer step over this rank's ``rows``, in ``micro_batches_to_run`` micro-batches
        (the busiest rank's count: a rank with fewer rows runs zero-weight padding ones)."""
        s = self.settings
        engine = self.engine
        tokens, seqs = trained_token_count(rows)
        local = Normalisers(tokens=float(tokens), seqs=float(seqs), norm_tokens=s.norm_tokens)
        norm = engine.reduce_normalisers(local)
        micro_batches = split(rows, s.micro)
        # every rank runs as many micro-batches as the busiest one (collectives pair up)
        padding = micro_batches_to_run - len(micro_batches)
        micro_batches += [[padding_row(s.pad_id)] for _ in range(padding)]
        engine.zero_grad()
        weighted = _Totals()
        loss_sum = 0.0
        for i, micro_rows in enumerate(micro_batches):
            with engine.microbatch(last=i == len(micro_batches) - 1):
                mb = collate(
                    micro_rows,
                    s.pad_id,
                    share_prompts=s.micro.share_prompts,
                    packed=s.micro.packing,
                )
                out, parts = self._micro_step(mb, norm, steps_per_batch)
                engine.backward(out.loss)
                if s.critic is not None:
                    out.metrics.update(self._critic_micro_step(mb, norm))
            loss_sum += float(out.loss.detach())
            weighted.add(out.metrics, weight=out.metrics.get("num_tokens", 0.0))
            for part, tokens_in_part in parts:  # mismatch / drift, each over its own tokens
                weighted.add(part, weight=tokens_in_part)
        lr = engine.current_lr()
        grad_norm = engine.clip_and_step(s.max_norm)
        metrics = weighted.reduced(engine).means()
        if s.critic is not None:
            metrics["critic_grad_norm"] = engine.critic_clip_and_step(s.critic.max_norm)
        loss, trained = engine.all_reduce([loss_sum, float(tokens)], "sum")
        metrics.update(loss=loss, grad_norm=grad_norm, lr=lr, trained_tokens=trained)
        return metrics

    def _micro_step(
        self, mb: MicroBatch, norm: Normalisers, steps_per_batch: int
    ) -> tuple[LossOutputs, list[tuple[dict[str, float], float]]]:
        """The loss of one micro-batch and the mismatch / drift metrics with their token
        counts (see :func:`split_mismatch_metrics`)."""
        s = self.settings
        dev = self.engine.device
        model_inputs = mb.model_inputs().to(dev)
        targets = mb.targets_BT.to(dev)
        routed = nullcontext([]) if self.routers is None else self.routers.recording()
        with routed as router_logits:
            logits = self.engine.policy_logits(model_inputs)
        logp, entropy = self._token_logprobs(logits, targets, mb.temperatures_B)
        ref_logp = None
        if s.loss.beta > 0:
            with torch.no_grad():
                ref_logits = self.engine.reference_logits(model_inputs)
                ref_logp, _ = self._token_logprobs(ref_logits, targets, mb.temperatures_B)
        if s.loss.entropy_coef == 0 and entropy is not None:
            entropy = entropy.detach()
        old_logp = mb.old_logprobs_BT.to(dev)
        inputs = LossInputs(
            logprobs_BT=logp,
            old_logprobs_BT=old_logp,
            advantages_B_or_BT=(
                mb.advantages_B if mb.advantages_BT is None else mb.advantages_BT
            ).to(dev),
            mask_BT=mb.mask_BT.to(dev),
            ref_logprobs_BT=ref_logp,
            entropy_BT=entropy,
            proximal_logprobs_BT=self._proximal(mb, old_logp, logp, steps_per_batch),
        )
        out = compute_policy_loss(s.policy_loss, inputs, s.loss, norm)
        if self.routers is not None:
            out = self._with_router_loss(out, model_inputs, router_logits, mb, norm)
        # the producer's log-probs (rows' behaviour log-probs) against this recomputation: the
        # weights computing it are the trained version only before the batch's first update
        behind_BT = mb.behind_BT.to(dev)
        same_weights_BT = (behind_BT == 0) & (self._updates_in_batch == 0)
        return out, split_mismatch_metrics(logp, old_logp, inputs.mask_BT, same_weights_BT)

    def _with_router_loss(
        self,
        out: LossOutputs,
        model_inputs: ModelInputs,
        router_logits: list[torch.Tensor],
        mb: MicroBatch,
        norm: Normalisers,
    ) -> LossOutputs:
        """``out`` with the MoE router's load-balancing loss added (weighted by the
        micro-batch's share of the step's trained tokens, as the policy loss is normalised) and
        its metrics: ``router_aux_loss`` and ``expert_load_imbalance``."""
        routers = self.routers
        shape = routers.shape
        pairs = routers.per_layer(model_inputs.token_masks())
        balance = load_balance(pairs, shape.num_experts, shape.top_k, routers.routers_per_pass)
        share = float(mb.mask_BT.sum()) / max(norm.tokens, 1.0)
        loss = out.loss + shape.aux_coef * share * balance.aux_loss if shape.aux_coef else out.loss
        metrics = dict(out.metrics)
        metrics.update(
            router_aux_loss=float(balance.aux_loss.detach()),
            expert_load_imbalance=balance.imbalance,
        )
        return replace(out, loss=loss, metrics=metrics)

    def _proximal(
        self, mb: MicroBatch, old_logp: torch.Tensor, logp: torch.Tensor, steps_per_batch: int
    ) -> torch.Tensor | None:
        """The proximal log-probs: recomputed at the step start, or AReaL's log-linear
        interpolation by policy version (in optimizer steps)."""
        if self._loglinear:  # per token: in-flight responses mix versions
            alpha_BT = loglinear_alpha(mb.behind_BT * steps_per_batch, self._updates_in_batch)
            return loglinear_proximal(old_logp, logp, alpha_BT)
        if mb.proximal_logprobs_BT is None:
            return None
        return mb.proximal_logprobs_BT.to(self.engine.device)

    def _critic_micro_step(self, mb: MicroBatch, norm: Normalisers) -> dict[str, float]:
        """The clipped value loss of one micro-batch, back-propagated into the critic."""
        s = self.settings
        dev = self.engine.device
        values = self.engine.critic_values(mb.input_ids_BT.to(dev), mb.attention_BT.to(dev))
        loss, metrics = value_loss(
            values[:, :-1],
            mb.old_values_BT.to(dev),
            mb.returns_BT.to(dev),
            mb.mask_BT.to(dev),
            clip=s.critic.value_clip,
            aggregation=s.loss.aggregation,
            norm=norm,
        )
        self.engine.critic_backward(loss)
        return {name: float(v) for name, v in metrics.items()}

    def _token_logprobs(
        self, logits_BSV: torch.Tensor, targets_BT: torch.Tensor, temperatures_B: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropy) of whole rows ``[B, T]`` from the engine's logits, which
        under context parallelism cover only this rank's tokens (:meth:`Engine.local_tokens`)."""
        engine = self.engine
        width = targets_BT.shape[1]
        logp, entropy = self._logprobs(logits_BSV, engine.local_tokens(targets_BT), temperatures_B)
        entropy = None if entropy is None else engine.gather_tokens(entropy, width)
        return engine.gather_tokens(logp, width), entropy

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


def distill_rows(rows: list[Row], weights: DistillWeights) -> tuple[float, float]:
    """Set every row's per-token advantages from its teacher log-probs (see
    :mod:`zbrl.algorithms.distill`); the sampled-token reverse KL summed over the model's tokens
    of the trained rows, and their count."""
    total, count = 0.0, 0
    for row in rows:
        if row.teacher_logprobs is None:
            raise ValueError(
                "algorithm.distill: a rollout group came without teacher log-probs; the "
                "producers must run with the same algorithm.distill"
            )
        row.token_advantages = distill_advantages(
            row.advantage,
            row.old_logprobs,
            row.teacher_logprobs,
            row.loss_mask,
            coef=weights.coef,
            reward_coef=weights.reward_coef,
        )
        if row.trained:
            kl, n = reverse_kl_per_token(row.old_logprobs, row.teacher_logprobs, row.loss_mask)
            total, count = total + kl, count + n
    return total, float(count)


SUMMED = ("num_tokens", "trained_tokens")
"""Metrics that add up over micro-batches, ranks and optimizer steps (the rest are means)."""


def rank_slice(num_groups: int, rank: int, world_size: int) -> slice:
    """The contiguous groups (in ticket order) that ``rank`` trains of one optimizer step's
    ``num_groups``: balanced, the first ranks taking one fewer when it does not divide."""
    return slice(rank * num_groups // world_size, (rank + 1) * num_groups // world_size)


def group_shapes(group: RolloutGroup) -> list[RowShape]:
    """The shapes of a group's rows (its completions', then its episodes' later segments')."""
    shapes = [RowShape(tuple(group.prompt_ids), int(r.numel())) for r in group.response_ids]
    for segments in group.segments or ():
        shapes += [RowShape(tuple(s.prompt_ids), int(s.response_ids.numel())) for s in segments]
    return shapes


def rank_groups(
    groups: list[RolloutGroup], rank: int, world_size: int, batching: MicroBatching
) -> list[int]:
    """Indices of the groups ``rank`` trains of one optimizer step's ``groups``: the contiguous
    :func:`rank_slice`, or, packed under a token budget, balanced by packed tokens (each group,
    largest first, to the rank with the fewest so far, the lower rank on a tie), in ticket
    order either way. Every rank sees the whole batch and works out the same assignment."""
    if world_size == 1 or not batching.packing or batching.tokens is None:
        return list(range(len(groups)))[rank_slice(len(groups), rank, world_size)]
    sizes = [packed_tokens(group_shapes(g)) for g in groups]
    loads = [0] * world_size
    owner = [0] * len(groups)
    for i in sorted(range(len(groups)), key=lambda i: (-sizes[i], i)):
        owner[i] = min(range(world_size), key=lambda r: (loads[r], r))
        loads[owner[i]] += sizes[i]
    return [i for i in range(len(groups)) if owner[i] == rank]


def micro_batch_count(groups: list[RolloutGroup], world_size: int, batching: MicroBatching) -> int:
    """Micro-batches of the busiest rank for one optimizer step over ``groups`` (every rank
    sees the whole batch, so each works out every rank's plan)."""
    counts = []
    for rank in range(world_size):
        mine = rank_groups(groups, rank, world_size, batching)
        shapes = [shape for i in mine for shape in group_shapes(groups[i])]
        counts.append(len(plan(shapes, batching)))
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
        reward=0.0,
        behind=0,
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
