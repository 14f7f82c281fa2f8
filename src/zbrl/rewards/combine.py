"""A weighted sum of rewards.

``CombinedReward([(primary, 1.0), (bonus, 0.5)])`` scores every response with each component:
``reward = Σ weight_i · reward_i``; ``format_acc``, ``ans_acc`` and ``parsed`` come from the first
(primary) component; ``metadata["component_rewards"]`` maps each component's name (suffixed
``#2``, ``#3``… when repeated) to its unweighted reward, and ``metadata["primary"]`` holds the
primary component's metadata. Components are scored with their own ``score_batch``, so a reward
that batches (``code``) keeps doing so. A response whose score failed in any component is a
failed result (``failed``; its NaN reward makes the sum NaN): part of a score is no score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from zbrl.rewards.base import BaseReward, RewardBatch, RewardFunction, RewardResult, prepare_reward


class CombinedReward(BaseReward):
    """Weighted sum of ``(reward_fn, weight)`` pairs; the first one is the primary reward."""

    def __init__(self, components: Sequence[tuple[RewardFunction, float]]) -> None:
        components = list(components)
        if not components:
            raise ValueError("CombinedReward needs at least one (reward_fn, weight) pair")
        for i, pair in enumerate(components):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(f"CombinedReward component {i} must be a (reward_fn, weight) pair")
            fn, weight = pair
            if isinstance(fn, type) or not isinstance(fn, RewardFunction):
                raise TypeError(
                    f"CombinedReward component {i} is a {type(fn).__name__}, not a reward (build "
                    f"it with build_reward)"
                )
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise TypeError(
                    f"CombinedReward component {i} weight must be a number, got {weight!r}"
                )
            if not math.isfinite(weight):
                raise ValueError(
                    f"CombinedReward component {i} weight must be finite, got {weight}"
                )
        self.components = [(fn, float(w)) for fn, w in components]
        self.keys = _unique_keys([fn.name for fn, _ in self.components])
        self.name = "+".join(f"{w:g}*{fn.name}" for fn, w in self.components)

    def prepare(self) -> None:
        for fn, _ in self.components:
            prepare_reward(fn)

    def score_responses(self, batch: RewardBatch) -> list[RewardResult]:
        responses, examples, contexts = batch
        per_component = []
        for fn, _ in self.components:
            results = fn.score_batch(responses, examples, contexts)
            if len(results) != len(responses):
                raise ValueError(
                    f"reward {fn.name!r} returned {len(results)} results for {len(responses)} "
                    f"responses"
                )
            per_component.append(results)
        combined = []
        for i in range(len(responses)):
            parts = [results[i] for results in per_component]
            primary = parts[0]
            combined.append(
                RewardResult(
                    reward=sum(w * part.reward for (_, w), part in zip(self.components, parts)),
                    format_acc=primary.format_acc,
                    ans_acc=primary.ans_acc,
                    parsed=primary.parsed,
                    timed_out=any(part.timed_out for part in parts),
                    failed=any(part.failed for part in parts),
                    metadata={
                        "component_rewards": {
                            key: part.reward for key, part in zip(self.keys, parts)
                        },
                        "primary": primary.metadata,
                    },
                )
            )
        return combined


def _unique_keys(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    keys = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys
