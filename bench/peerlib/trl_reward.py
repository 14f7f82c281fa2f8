"""zbrl's reward function in the shape TRL's ``reward_funcs`` expect (no TRL import)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zbrl.rewards.base import RewardContext, RewardFunction


def make_trl_reward(
    reward_fn: RewardFunction,
    examples: Mapping[str, Mapping[str, Any]],
    *,
    max_new_tokens: int,
    eos_ids: set[int],
) -> Callable[..., list[float]]:
    """A TRL reward function scoring with ``reward_fn``.

    TRL calls it with the prompts, the completions (conversational: ``[{"role": "assistant",
    "content": text}]``, or plain strings), the completion token ids (EOS included when generated)
    and each dataset column as a keyword; the dataset's ``uid`` column names the example in
    ``examples`` (the reward's view of it, as zbrl's producer passes it). A completion is
    truncated, as in zbrl, when it does not end with an EOS token."""

    def zbrl_reward(
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]],
        uid: Sequence[str],
        **_: Any,
    ) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        contexts = [
            RewardContext(
                response_tokens=len(ids),
                max_new_tokens=max_new_tokens,
                truncated=not (len(ids) and ids[-1] in eos_ids),
            )
            for ids in completion_ids
        ]
        results = reward_fn.score_batch(texts, [examples[u] for u in uid], contexts)
        return [r.reward for r in results]

    return zbrl_reward
