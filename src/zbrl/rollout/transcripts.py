"""How a run's episodes become tokens and records: :class:`ChatTranscript` for a run with an
environment (its messages through the chat template, every episode reported turn by turn),
:class:`ResponseTranscript` for plain prompts (no environment message; each episode reported as
its response, as a single-turn completion always was)."""

from __future__ import annotations

from typing import Any

from zbrl.errors import RunError
from zbrl.rollout.episodes import EpisodeCompletion, GroupRecord
from zbrl.rollout.turns import TurnFormatter


class ChatTranscript:
    """Environment messages as tokens through the model's chat template; each episode is
    reported whole: the response decoded with special tokens, its turns, its loss mask (the
    environment's tokens untrained) and its events (``env/<name>`` metrics)."""

    def __init__(self, formatter: TurnFormatter) -> None:
        self.formatter = formatter

    def environment_ids(self, model_ids: list[int], content: str) -> tuple[list[int], str]:
        return self.formatter.environment_ids(model_ids, content)

    def decode(self, ids: list[int], *, skip_special: bool) -> str:
        return self.formatter.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def group_record(self, episodes: list[EpisodeCompletion]) -> GroupRecord:
        return GroupRecord(
            response_texts=[
                self.decode(c.token_ids.tolist(), skip_special=False) for c in episodes
            ],
            loss_masks=[c.loss_mask for c in episodes],
            turns=[c.turns for c in episodes],
            env_counts=sum_counts(episodes),
        )

    def sample_record(self, episode: EpisodeCompletion) -> dict[str, Any]:
        transcript = self.decode(episode.token_ids.tolist(), skip_special=False)
        return {"transcript": transcript, "turns": episode.turns}


class ResponseTranscript:
    """Plain prompts: their environment sends no message, and each episode is reported as its
    response alone (the text the model wrote; every token trained, no turns, no events)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def environment_ids(self, model_ids: list[int], content: str) -> tuple[list[int], str]:
        raise RunError(
            "an environment message in a single-turn rollout: plain prompts have no environment "
            "turns (set `environment` for multi-turn episodes)"
        )

    def decode(self, ids: list[int], *, skip_special: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def group_record(self, episodes: list[EpisodeCompletion]) -> GroupRecord:
        return GroupRecord(
            response_texts=[c.text for c in episodes], loss_masks=None, turns=None, env_counts={}
        )

    def sample_record(self, episode: EpisodeCompletion) -> dict[str, Any]:
        return {}


def sum_counts(episodes: list[EpisodeCompletion]) -> dict[str, float]:
    """Events of a group's episodes added up (``env/<name>`` metrics per group)."""
    out: dict[str, float] = {}
    for c in episodes:
        for name, n in c.counts.items():
            out[name] = out.get(name, 0.0) + n
    return out
