"""docs/config.md's generator on lists of sections, optional sections and plug-in variants."""

from __future__ import annotations

from zbrl.config.reference import markdown_reference


def _row(path: str) -> list[str]:
    rows = [line for line in markdown_reference().splitlines() if line.startswith(f"| `{path}` |")]
    assert rows, f"no row for {path}"
    return [cell.strip() for cell in rows[0].strip("|").split(" | ")]


def test_an_optional_section_defaults_to_null_not_to_a_section() -> None:
    _, kind, default, _ = _row("rollout.generation.temperature_schedule")
    assert kind == "TemperatureSchedule or None (optional section)"
    assert default == "`null`"
    assert _row("rollout.generation.temperature_schedule.final")[2] == "`required`"


def test_a_list_of_sections_has_its_element_fields_under_brackets() -> None:
    assert _row("reward.extra")[1] == "list of ExtraReward"
    assert _row("reward.extra")[2] == "`[]`"
    assert _row("reward.extra[].weight")[2] == "`1.0`"


def test_a_plugin_variants_fields_are_written_as_overridden_and_marked_with_their_type() -> None:
    kind = _row("rollout.backend")[1]
    assert kind == "one of `transformers`, `vllm` (by `type`)"
    assert _row("rollout.backend.max_model_len")[3].startswith("(type `vllm`) ")
    assert "[VllmBackend]" not in markdown_reference()
