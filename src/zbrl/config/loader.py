"""YAML recipes, dotted command-line overrides, and readable validation errors."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from zbrl.config.plugin import is_import_path, variant_tag
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
    """Apply ``section.key=value`` overrides (values parsed as YAML) to a copy of ``raw``.

    A plug-in section is tuned field by field: ``rollout.backend.max_model_len=512`` keeps the
    recipe's backend (``backend: vllm`` becomes ``{type: vllm, max_model_len: 512}``), and on a
    section the recipe does not set, the field's default variant applies (the plug-in unions'
    validators fill in ``type``), so an option of another variant is refused by name.
    """
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
            if isinstance(child, str) and not is_import_path(child):
                child = {"type": child}  # a plug-in's shorthand keeps its type when tuned
            elif not isinstance(child, dict):
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
    return yaml.safe_dump(_type_first(cfg.model_dump(mode="json")), sort_keys=False)


def _type_first(value: Any) -> Any:
    """Plug-in sections read best with their ``type`` on top."""
    if isinstance(value, dict):
        ordered = {"type": value["type"]} if "type" in value else {}
        ordered.update((k, _type_first(v)) for k, v in value.items() if k != "type")
        return ordered
    if isinstance(value, list):
        return [_type_first(v) for v in value]
    return value


def _describe(err: dict[str, Any]) -> str:
    path, model = _walk(err["loc"])
    loc = ".".join(path)
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "union_tag_invalid":
        msg = f"unknown type {err['ctx']['tag']!r}"
    if err["type"] == "union_tag_not_found":
        variants = ", ".join(_tagged_models(_field_at(path)))
        return f"field '{loc}': no type; add {loc}.type=... (one of: {variants})"
    if err["type"] == "extra_forbidden":
        _, model = _walk(err["loc"][:-1])
        removed = getattr(model, "REMOVED_FIELDS", {}).get(path[-1]) if path else None
        if removed is not None:
            return f"field '{loc}' was removed: {removed}"
        known = sorted(model.model_fields) if model is not None else []
        variant = _variant_note(model)
        hint = f"; known fields here{variant}: {', '.join(known)}" if known else ""
        return f"field '{loc}': unknown field{hint}{_other_variant_hint(loc, path[-1])}"
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
    "union_tag_invalid": "use one of {expected_tags} ('import' = 'package.module:function')",
    "missing": "add this field",
}


def _walk(loc: tuple[Any, ...]) -> tuple[list[str], type[BaseModel] | None]:
    """The user-facing dotted path of an error location and the model it ends in.

    Pydantic puts a discriminated union's tag into the location (``advantage.rloo.eps``); the
    tag is dropped from the path and selects the variant model.
    """
    path: list[str] = []
    model: type[BaseModel] | None = RunConfig
    pending_union: dict[str, type[BaseModel]] | None = None
    for part in loc:
        text = str(part)
        if text.startswith("function-"):
            continue
        if pending_union is not None:
            chosen = pending_union.get(text)
            pending_union = None
            if chosen is not None:
                model = chosen
                continue
        path.append(text)
        field = model.model_fields.get(text) if model is not None else None
        if field is None:
            model = None
            continue
        variants = _tagged_models(field.annotation)
        if len(variants) > 1:
            pending_union, model = variants, None
        else:
            model = next(iter(variants.values()), None)
    return path, model


def _field_at(path: list[str]) -> Any:
    """The annotation of the field at a user-facing dotted ``path`` (None where the path passes
    through a plug-in union, whose variant is not known here, or names no field)."""
    model: type[BaseModel] | None = RunConfig
    annotation: Any = None
    for part in path:
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        annotation = field.annotation
        variants = _tagged_models(annotation)
        model = next(iter(variants.values())) if len(variants) == 1 else None
    return annotation


def _other_variant_hint(loc: str, field_name: str) -> str:
    """``; it belongs to type vllm: add rollout.backend.type=vllm`` when ``field_name`` is an
    option of another variant of the plug-in union at ``loc``."""
    parent = loc.rpartition(".")[0]
    variants = _tagged_models(_field_at(parent.split("."))) if parent else {}
    owners = [tag for tag, model in variants.items() if field_name in model.model_fields]
    if not owners:
        return ""
    return f"; it belongs to type {' or '.join(owners)}: add {parent}.type={owners[0]}"


def _tagged_models(annotation: Any) -> dict[str, type[BaseModel]]:
    """Models inside a field annotation, keyed by their union tag (``type`` or ``import``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        tag = variant_tag(annotation) if "type" in annotation.model_fields else annotation.__name__
        return {tag: annotation}
    out: dict[str, type[BaseModel]] = {}
    for arg in typing.get_args(annotation):
        out.update(_tagged_models(arg))
    return out


def _variant_note(model: type[BaseModel] | None) -> str:
    if model is None or "type" not in model.model_fields:
        return ""
    default = model.model_fields["type"].default
    kind = default if isinstance(default, str) else "an import path"
    return f" (for type {kind})"


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
