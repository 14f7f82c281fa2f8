"""Role settings for unit tests, built the way a run builds them: from a RunConfig
(``load_config(None, overrides)``) through :mod:`zbrl.assembly.settings`, then with the fields a
test is about replaced. Settings dataclasses have no defaults of their own, so this is the one
way tests get a complete, config-consistent settings object."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from zbrl.assembly import settings, shared_settings
from zbrl.config import RunConfig, load_config
from zbrl.training.rows import MicroBatching


@lru_cache(maxsize=32)
def _cached_config(overrides: tuple[str, ...]) -> RunConfig:
    return load_config(None, list(overrides))


def run_config(*overrides: str) -> RunConfig:
    """The default RunConfig with dotted ``overrides`` (``"training.train_batch_size=2"``)."""
    return _cached_config(tuple(overrides))


@lru_cache(maxsize=1)
def _tokenizer():
    from zbrl.embedded.tokenizer import build_tokenizer

    return build_tokenizer()


def single_turn(params):
    """The episode runner of plain prompts sampled with ``params`` (as the run's assembly builds
    it), with the embedded tokenizer."""
    from zbrl.rollout.single_turn import single_turn_episodes

    return single_turn_episodes(_tokenizer(), params.max_new_tokens)


def sampling_params(*overrides: str, **fields: Any):
    return replace(settings.sampling_params(run_config(*overrides)), **fields)


def buffer_settings(*overrides: str, **fields: Any):
    return replace(shared_settings.buffer_settings(run_config(*overrides)), **fields)


def producer_settings(*overrides: str, index: int = 0, **fields: Any):
    return replace(settings.producer_settings(run_config(*overrides), index), **fields)


def consumer_settings(run_dir: str, *overrides: str, **fields: Any):
    return replace(settings.consumer_settings(run_config(*overrides), run_dir), **fields)


def step_settings(*overrides: str, pad_id: int = 0, **fields: Any):
    """``microbatch_size`` / ``microbatch_tokens`` / ``share_prompts`` stand for the fields of
    ``micro``."""
    if {"microbatch_size", "microbatch_tokens", "share_prompts"} & fields.keys():
        fields["micro"] = MicroBatching(
            fields.pop("microbatch_size", 8),
            fields.pop("microbatch_tokens", None),
            fields.pop("share_prompts", False),
        )
    return replace(settings.step_settings(run_config(*overrides), pad_id), **fields)
