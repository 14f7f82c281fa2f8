"""YAML recipes, dotted command-line overrides, and readable validation errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from zbrl.config.run import RunConfig


class ConfigError(ValueError):
    """A recipe or override that does not make a valid RunConfig; the message names the field."""


def read_recipe(path: str | Path) -> dict[str, Any]:
    """Parse a YAML recipe into a dict, with errors that name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: recipe file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}"
        )
    return data


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (values parsed as YAML) to a copy of ``raw``."""
    result = _deep_copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    return result


def build_config(raw: dict[str, Any], source: str = "config") -> RunConfig:
    """Validate ``raw`` into a RunConfig, turning pydantic errors into one readable ConfigError."""
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{source}: invalid configuration ({exc.error_count()} problem(s))"]
        lines += [f"  - {_describe(err)}" for err in exc.errors()]
        raise ConfigError("\n".join(lines)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a recipe (or start from the defaults when ``path`` is None) and apply overrides."""
    raw = read_recipe(path) if path is not None else {}
    raw = apply_overrides(raw, overrides or [])
    return build_config(raw, source=str(path) if path is not None else "defaults")


def resolved_yaml(cfg: RunConfig) -> str:
    """The fully resolved configuration, as YAML."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def _describe(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        known = _known_fields(err["loc"][:-1])
        hint = f"; known fields here: {', '.join(known)}" if known else ""
        return f"field '{loc}': unknown field{hint}"
    if not loc:
        return msg
    value = err.get("input")
    shown = "" if isinstance(value, dict) else f" = {value!r}"
    fix = _BOUND_FIXES.get(err["type"], "")
    if fix:
        fix = "; fix: " + fix.format(**err.get("ctx", {}))
    return f"field '{loc}'{shown}: {msg}{fix}"


_BOUND_FIXES = {
    "less_than": "use a value below {lt}",
    "less_than_equal": "use a value of at most {le}",
    "greater_than": "use a value above {gt}",
    "greater_than_equal": "use a value of at least {ge}",
    "literal_error": "use one of {expected}",
    "missing": "add this field",
}


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] | None = RunConfig
    for part in loc:
        if model is None:
            return []
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        annotation = field.annotation
        model = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
    return sorted(model.model_fields) if model is not None else []


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
