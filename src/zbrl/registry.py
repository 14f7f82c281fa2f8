"""Name → object registries with an import-path escape hatch.

Pluggable parts (advantage estimators, policy losses, reward functions) are registered under a
short name. Anything containing a colon is treated as ``package.module:attribute`` and imported,
so users can plug in their own function without touching zbrl.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of pluggable objects of one kind (``kind`` is used in error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register ``obj`` under ``name``; registering a name twice is an error."""

        def decorator(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """Look up ``name``, or import ``module:attribute`` when the name contains a colon."""
        if ":" in name:
            return import_object(name, self.kind)
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise KeyError(
                f"unknown {self.kind} {name!r}; known: {known}; "
                f"or give an import path 'package.module:function'"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def import_object(path: str, kind: str = "object"):
    """Import ``package.module:attribute`` and return the attribute, with a clear error."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{kind} path {path!r} must look like 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"cannot import module {module_name!r} for {kind} {path!r}: {exc}"
        ) from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ImportError(
            f"module {module_name!r} has no attribute {attr!r} ({kind} {path!r})"
        ) from None
    return obj
