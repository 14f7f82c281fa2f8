"""Prompt datasets: loading and validation, prompt templates and encoding, sharded sampling."""

from zbrl.data.dataset import (
    ANSWER_FIELDS,
    ROLES,
    DatasetError,
    LoadReport,
    PromptExample,
    load_examples,
)
from zbrl.data.prompts import (
    PromptEncoder,
    as_token_ids,
    build_messages,
    resolve_system_prompt,
)
from zbrl.data.sampler import ShardedSampler

__all__ = [
    "ANSWER_FIELDS",
    "ROLES",
    "DatasetError",
    "LoadReport",
    "PromptEncoder",
    "PromptExample",
    "ShardedSampler",
    "as_token_ids",
    "build_messages",
    "load_examples",
    "resolve_system_prompt",
]

# Imported on demand: Hugging Face datasets (zbrl.data.hf_source) and reasoning-gym
# (zbrl.data.reasoning_gym_source), the sources of data.source. The embedded tasks live in
# zbrl.embedded.
