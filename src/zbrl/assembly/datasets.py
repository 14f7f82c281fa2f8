"""Encoded prompts from a dataset file and the run's reward and data settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zbrl.assembly.rewards import answer_spec, default_system_prompt
from zbrl.config import RunConfig
from zbrl.data.dataset import load_examples
from zbrl.data.prompts import PromptEncoder, resolve_system_prompt
from zbrl.types import EncodedPrompt


def encode_prompts(
    path: str | Path, cfg: RunConfig, tokenizer: Any, *, limit: int | None = None
) -> tuple[list[EncodedPrompt], dict[str, Any]]:
    """Load a dataset file and apply the chat template; returns prompts and encoding stats."""
    report = load_examples(
        path, answer_field=answer_spec(cfg).field, skip_bad_lines=cfg.data.skip_bad_lines
    )
    examples = report.examples[:limit] if limit else report.examples
    encoder = PromptEncoder(
        tokenizer,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        overlong=cfg.data.overlong_prompt,
        system_prompt=resolve_system_prompt(cfg.data.system_prompt, default_system_prompt(cfg)),
    )
    encoded, stats = encoder.encode_all(examples)
    stats["skipped_lines"] = report.num_skipped
    prompts = [EncodedPrompt(ex.uid, list(ids), ex.to_example()) for ex, ids in encoded]
    return prompts, stats
