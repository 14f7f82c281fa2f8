"""Mixture-of-experts models: their router's load-balancing loss and load metrics, computed by
zbrl over the real tokens of any row layout.

A transformers MoE causal LM computes its own auxiliary loss when ``output_router_logits`` is on,
from the router logits of one forward pass and its 2-D attention mask. zbrl's layouts break that
pairing (the shared-prompt layout runs a prompt pass and a response pass whose mask covers
both; packing passes a 4-D mask), so zbrl turns the model's own computation off
(:func:`forward_kwargs`), records each router's logits with forward hooks
(:class:`RouterRecorder`, on the router class the model itself records,
``_can_record_outputs["router_logits"]``) and computes the same Switch-Transformer loss
(:func:`load_balance`) over the tokens each pass really ran.

The loss enters the objective where the model defines it: ``output_router_logits`` on and
``router_aux_loss_coef`` > 0 in its config (:attr:`MoeShape.aux_coef`); the load metrics are
reported for every MoE model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
"""Config fields that name the routed expert count, by family (Qwen3-MoE and Qwen3-Next;
GPT-OSS, Mixtral; DeepSeek-V3)."""


@dataclass(frozen=True)
class MoeShape:
    """What the load-balancing loss needs to know of an MoE model."""

    num_experts: int
    top_k: int
    aux_coef: float
    """Weight of the auxiliary loss in the objective (0: the model defines none)."""
    router_class: type


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP wrapper (``.module``), else ``model``."""
    return getattr(model, "module", model)


def moe_shape(model: torch.nn.Module) -> MoeShape | None:
    """``model``'s routing shape, or None for a model without routed experts (or whose router
    transformers does not record)."""
    config = getattr(unwrapped(model), "config", None)
    experts = next(
        (getattr(config, f) for f in EXPERT_COUNT_FIELDS if getattr(config, f, None)), None
    )
    top_k = getattr(config, "num_experts_per_tok", None)
    router = _router_class(unwrapped(model))
    if not experts or not top_k or router is None:
        return None
    coef = float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0)
    on = bool(getattr(config, "output_router_logits", False))
    return MoeShape(int(experts), int(top_k), coef if on else 0.0, router)


def _router_class(model: torch.nn.Module) -> type | None:
    for module in model.modules():
        recorder = getattr(type(module), "_can_record_outputs", None) or {}
        spec = recorder.get("router_logits")
        target = getattr(spec, "target_class", None)
        if isinstance(target, type):
            return target
    return None


def forward_kwargs(model: torch.nn.Module) -> dict[str, bool]:
    """Keyword arguments for ``model``'s forward (and ``generate``): the model's own router loss
    off where its config turns it on (zbrl computes it, see the module docstring)."""
    config = getattr(unwrapped(model), "config", None)
    if getattr(config, "output_router_logits", False):
        return {"output_router_logits": False}
    return {}


class RouterRecorder:
    """Forward hooks on every router of a model that keep each call's logits ``[N, E]`` while
    :meth:`recording` is active (in call order: layer by layer, pass by pass)."""

    def __init__(self, model: torch.nn.Module, shape: MoeShape) -> None:
        self.shape = shape
        self.records: list[torch.Tensor] = []
        self._active = False
        routers = [m for m in unwrapped(model).modules() if isinstance(m, shape.router_class)]
        self.routers_per_pass = len(routers)
        for router in routers:
            router.register_forward_hook(self._keep)

    def _keep(self, module: torch.nn.Module, args: object, output: object) -> None:
        if self._active:
            logits = output[0] if isinstance(output, tuple | list) else output
            self.records.append(logits.reshape(-1, logits.shape[-1]))

    @contextmanager
    def recording(self) -> Iterator[list[torch.Tensor]]:
        """Record the router logits of the forward passes run inside; yields the list."""
        self.records = []
        self._active = True
        try:
            yield self.records
        finally:
            self._active = False

    def per_layer(self, token_masks: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The records paired with the real-token mask of their pass (one flat mask per
        forward pass, in call order)."""
        expected = self.routers_per_pass * len(token_masks)
        if len(self.records) != expected:
            raise RuntimeError(
                f"recorded {len(self.records)} router calls, expected {expected} "
                f"({self.routers_per_pass} routers x {len(token_masks)} forward passes)"
            )
        pairs = []
        for i, logits in enumerate(self.records):
            mask = token_masks[i // self.routers_per_pass].reshape(-1)
            if mask.numel() != logits.shape[0]:
                raise RuntimeError(f"router call {i}: {logits.shape[0]} rows, mask {mask.numel()}")
            pairs.append((logits, mask))
        return pairs


@dataclass(frozen=True)
class LoadBalance:
    aux_loss: torch.Tensor
    """Switch-Transformer load-balancing loss (differentiable scalar): ``E · Σ_e f_e · P_e``,
    ``f_e`` the share of top-k assignments and ``P_e`` the mean router probability of expert
    ``e``, over every real token of every MoE layer (1.0 when perfectly balanced, times
    ``top_k``)."""
    imbalance: float
    """Mean over MoE layers of the busiest expert's assignments over the mean expert's (1.0:
    perfectly balanced; ``E / top_k`` at most)."""


def load_balance(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], num_experts: int, top_k: int, layers: int
) -> LoadBalance:
    """The load balance of router logits ``pairs`` (logits ``[N, E]``, real-token mask ``[N]``)
    recorded ``layers`` routers per pass; passes of the same layer are pooled."""
    device = pairs[0][0].device
    assigned_E = torch.zeros(num_experts, device=device)
    probs_E = torch.zeros(num_experts, device=device)
    tokens = torch.zeros((), device=device)
    per_layer: dict[int, torch.Tensor] = {}
    for i, (logits_NE, mask_N) in enumerate(pairs):
        weight_N = mask_N.to(device=device, dtype=torch.float32)
        probs_NE = torch.softmax(logits_NE.float(), dim=-1)
        chosen_NK = probs_NE.topk(top_k, dim=-1).indices
        counts_E = torch.zeros(num_experts, device=device).index_add_(
            0, chosen_NK.reshape(-1), weight_N.repeat_interleave(top_k)
        )
        assigned_E = assigned_E + counts_E
        probs_E = probs_E + (probs_NE * weight_N[:, None]).sum(0)
        tokens = tokens + weight_N.sum()
        layer = i % layers
        per_layer[layer] = per_layer.get(layer, 0) + counts_E
    tokens = tokens.clamp_min(1.0)
    aux = num_experts * ((assigned_E / tokens) * (probs_E / tokens)).sum()
    ratios = [float(c.max() / c.mean()) for c in per_layer.values() if float(c.sum()) > 0]
    return LoadBalance(aux_loss=aux, imbalance=sum(ratios) / len(ratios) if ratios else 1.0)
