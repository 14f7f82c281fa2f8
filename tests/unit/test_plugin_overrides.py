"""Plug-in sections tuned field by field on the command line: the recipe's type is kept, the
default variant applies where the recipe sets none, and another variant's option is refused with
the ``type=`` that would accept it."""

from __future__ import annotations

from pathlib import Path

import pytest

from zbrl.config import load_config
from zbrl.config.loader import ConfigError, apply_overrides, build_config

DEMO = str(Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml")


def test_a_shorthand_type_is_kept_when_one_of_its_fields_is_overridden() -> None:
    raw = apply_overrides({"rollout": {"backend": "vllm"}}, ["rollout.backend.max_model_len=2048"])
    assert raw["rollout"]["backend"] == {"type": "vllm", "max_model_len": 2048}
    cfg = build_config(raw)
    assert cfg.rollout.backend.type == "vllm"
    assert cfg.rollout.backend.max_model_len == 2048


def test_an_import_path_shorthand_is_not_mistaken_for_a_type_to_keep() -> None:
    raw = apply_overrides({"reward": "pkg.mod:fn"}, ["reward.options={a: 1}"])
    assert raw["reward"] == {"options": {"a": 1}}


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("transport.weight_sync.bucket_mb=8", "bucket_mb"),
        ("transport.weight_sync.join_timeout_s=5", "join_timeout_s"),
    ],
)
def test_an_unset_plugin_section_takes_its_default_variant(override: str, field: str) -> None:
    cfg = load_config(DEMO, ["transport.weight_sync.type=broadcast", override])
    assert cfg.transport.weight_sync.type == "broadcast"
    assert getattr(cfg.transport.weight_sync, field) == pytest.approx(float(override[-1]))


@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ("rollout.backend.max_model_len=512", "add rollout.backend.type=vllm"),
        ("transport.weight_sync.bucket_mb=8", "add transport.weight_sync.type=broadcast"),
        ("training.engine.reshard_after_forward=false", "add training.engine.type=fsdp2"),
    ],
)
def test_another_variants_option_is_refused_naming_the_type(override: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(DEMO, [override])
    message = str(info.value)
    assert f"field '{override.partition('=')[0]}': unknown field" in message
    assert fix in message


def test_the_default_variant_accepts_its_own_fields_without_type() -> None:
    cfg = load_config(DEMO, ["rollout.backend.type=vllm", "rollout.backend.max_model_len=512"])
    assert cfg.rollout.backend.max_model_len == 512


def test_a_section_whose_type_is_missing_says_to_add_it() -> None:
    with pytest.raises(
        ConfigError, match=r"add rollout\.backend\.type=\.\.\. \(one of: transformers, vllm\)"
    ):
        build_config({"rollout": {"backend": {"type": None, "max_model_len": 512}}})
