"""Generate the configuration reference (docs/config.md) from the models themselves.

python -m zbrl.config.reference > docs/config.md
"""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

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
    text = str(annotation).replace("typing.", "")
    return text.replace("NoneType", "None")


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return "required"
    if isinstance(value, BaseModel):
        variant = getattr(value, "type", None)
        return json.dumps({"type": variant}) if isinstance(variant, str) else "(section)"
    return json.dumps(value, default=str)


def _rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = _models_in(field.annotation)
        doc = " ".join((field.description or "").split())
        if nested and len(nested) == 1:
            rows.append((path, nested[0].__name__, "(section)", doc))
            rows += _rows(nested[0], path + ".")
        elif nested:
            kinds = ", ".join(m.__name__ for m in nested)
            rows.append((path, f"one of {kinds} (by `type`)", _default(field), doc))
            for m in nested:
                rows += _rows(m, f"{path}[{m.__name__}].")
        else:
            rows.append((path, _type_name(field.annotation), _default(field), doc))
    return rows


def markdown_reference() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `zbrl.config` by `python -m zbrl.config.reference`; do not edit by hand.",
        "Every field can be set in a YAML recipe or overridden on the command line as",
        "`section.field=value` (values parse as YAML). `zbrl validate RECIPE` prints the resolved",
        "config. Presets (`algorithm.preset`) fill the fields they name unless you set them.",
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
