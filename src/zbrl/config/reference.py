"""Generate the configuration reference (docs/config.md) from the models themselves.

python -m zbrl.config.reference > docs/config.md
"""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from zbrl.config.plugin import variant_tag
from zbrl.config.run import RunConfig


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]  # Optional[X] reads as X | None
        return " | ".join(_type_name(a) for a in rest) + " | None"
    text = str(annotation).replace("typing.", "")
    return text.replace("NoneType", "None")


def _yaml_value(value: Any) -> Any:
    """A default as a recipe would write it: a section as its fields (a plug-in's as
    ``{type: x}``), lists and dicts element by element."""
    if isinstance(value, BaseModel):
        variant = getattr(value, "type", None)
        return {"type": variant} if isinstance(variant, str) else value.model_dump(mode="json")
    if isinstance(value, list):
        return [_yaml_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _yaml_value(v) for k, v in value.items()}
    return value


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return "required"
    if isinstance(value, BaseModel) and not isinstance(getattr(value, "type", None), str):
        return "(section)"
    return json.dumps(_yaml_value(value), default=str)


def _is_list(annotation: Any) -> bool:
    """``list[...]`` (possibly optional)."""
    if typing.get_origin(annotation) is list:
        return True
    return any(typing.get_origin(arg) is list for arg in typing.get_args(annotation))


def _is_optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _tag(model: type[BaseModel]) -> str:
    return variant_tag(model) if "type" in model.model_fields else model.__name__


def _rows(model: type[BaseModel], prefix: str, note: str = "") -> list[tuple[str, str, str, str]]:
    """One row per field; a nested section's fields follow it (``a.b``), a list's element fields
    as ``a[].b``, and a plug-in's variant fields as ``a.b`` marked with their ``type``."""
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = _models_in(field.annotation)
        doc = note + " ".join((field.description or "").split())
        if nested and _is_list(field.annotation):
            kinds = " or ".join(m.__name__ for m in nested)
            rows.append((path, f"list of {kinds}", _default(field), doc))
            for m in nested:
                marker = f"(type `{_tag(m)}`) " if len(nested) > 1 else ""
                rows += _rows(m, path + "[].", note=marker)
        elif len(nested) == 1:
            optional = _is_optional(field.annotation)
            kind = nested[0].__name__ + (" or None (optional section)" if optional else "")
            default = _default(field) if optional else "(section)"
            rows.append((path, kind, default, doc))
            rows += _rows(nested[0], path + ".")
        elif nested:
            kinds = ", ".join(f"`{_tag(m)}`" for m in nested)
            none = " or None" if _is_optional(field.annotation) else ""
            rows.append((path, f"one of {kinds} (by `type`){none}", _default(field), doc))
            for m in nested:
                rows += _rows(m, path + ".", note=f"(type `{_tag(m)}`) ")
        else:
            rows.append((path, _type_name(field.annotation), _default(field), doc))
    return rows


def markdown_reference() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `zbrl.config` by `python -m zbrl.config.reference`; do not edit by hand.",
        "Every field can be set in a YAML recipe or overridden on the command line as",
        "`section.field=value` (values parse as YAML). A plug-in section (one of several `type`s)",
        "is tuned field by field too: a row marked (type `x`) applies when the section's `type`",
        "is `x` (`rollout.backend.type=vllm rollout.backend.max_model_len=4096`); the recipe's",
        "type is kept, else the section's default (its `default` column) gives it; a section",
        "without a default (`data.source`) needs its `type` set. A list of sections (`a[].b`) is",
        "set whole, as a YAML list (`reward.extra=[{type: boxed, weight: 0.5}]`).",
        "`zbrl validate RECIPE` prints the resolved config. Presets (`algorithm.preset`) fill the",
        "fields they name unless you set them.",
        "",
        "| field | type | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for path, kind, default, doc in _rows(RunConfig, ""):
        cells = [f"`{path}`", kind.replace("|", "\\|"), f"`{default}`", doc.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_reference(), end="")
