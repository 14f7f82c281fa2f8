"""Pluggable parts as discriminated unions on ``type`` (docs/architecture.md, Conventions).

Each built-in variant is a section whose ``type`` is a ``Literal`` and whose fields are exactly
the options that variant uses, so a setting that does not apply to the chosen variant is an
unknown field and is refused by name. A ``type`` containing a colon (``package.module:function``)
selects the variant tagged :data:`IMPORT_TAG`, which carries free ``options`` for the user's code.

A plain string is shorthand for ``{"type": string}`` (``algorithm.advantage=rloo`` on the
command line), and a mapping without ``type`` means the field's default variant.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Tag

from zbrl.config.base import Section

IMPORT_TAG = "import"
"""The tag of the import-path variant of every plug-in union."""


def is_import_path(value: object) -> bool:
    """True for ``package.module:attribute`` strings."""
    if not isinstance(value, str):
        return False
    module, sep, attr = value.partition(":")
    return bool(sep and module.strip() and attr.strip())


def plugin_tag(value: Any) -> str | None:
    """The union tag of raw input (dict or string) or of a built model."""
    if isinstance(value, str):
        raw: Any = value
    elif isinstance(value, dict):
        raw = value.get("type")
    else:
        raw = getattr(value, "type", None)
    if is_import_path(raw):
        return IMPORT_TAG
    return raw if isinstance(raw, str) else None


def as_plugin_dict(value: Any, default: type[Section]) -> Any:
    """Expand the string shorthand ``"name"`` to ``{"type": "name"}``, and give a mapping without
    ``type`` the default variant's (``algorithm.policy_loss.clip_eps_high=0.3`` on the command
    line tunes the default loss); leave anything else to validation."""
    if isinstance(value, str):
        return {"type": value}
    if isinstance(value, dict) and "type" not in value:
        return {"type": variant_tag(default), **value}
    return value


def plugin_union(*variants: type[Section]) -> Any:
    """``Annotated[Union[...], Discriminator]`` over ``variants``, each tagged with its ``type``
    default, the import-path variant with :data:`IMPORT_TAG`."""
    members = tuple(Annotated[v, Tag(variant_tag(v))] for v in variants)
    return Annotated[Union[members], Discriminator(plugin_tag)]  # noqa: UP007


def variant_tag(variant: type[Section]) -> str:
    default = variant.model_fields["type"].default
    return default if isinstance(default, str) and not is_import_path(default) else IMPORT_TAG


def check_import_path(value: str) -> str:
    """Validator of an import-path variant's ``type``."""
    if not is_import_path(value):
        raise ValueError(f"{value!r} is not an import path; write it as 'package.module:function'")
    return value
