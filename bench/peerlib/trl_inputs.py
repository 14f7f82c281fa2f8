"""TRL's training dataset and reward function for zbrl's encoded prompts (the same tokens, the
same reward), shared by ``bench/peers_trl.py`` and ``bench/peers_startup.py``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from peerlib.trl_reward import make_trl_reward
from zbrl.data.prompts import as_token_ids, build_messages


def trl_dataset_and_reward(cfg, tokenizer, train_prompts: Sequence[Any], reward_fn) -> tuple:
    """A ``datasets.Dataset`` of conversational prompts (with each prompt's ``uid``) whose chat
    template gives exactly zbrl's prompt tokens, and the reward function TRL calls."""
    from datasets import Dataset

    rows = []
    for p in train_prompts:
        messages = build_messages(p.example, None)
        ids = as_token_ids(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        )
        if ids != list(p.prompt_ids):
            raise SystemExit(f"prompt {p.uid}: TRL's chat template tokens differ from zbrl's")
        rows.append({"prompt": messages, "uid": p.uid})
    reward: Callable[..., list[float]] = make_trl_reward(
        reward_fn,
        {p.uid: p.example for p in train_prompts},
        max_new_tokens=cfg.rollout.generation.max_new_tokens,
        eos_ids={tokenizer.eos_token_id},
    )
    return Dataset.from_list(rows), reward
