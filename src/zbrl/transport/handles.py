"""Uniform calls to a shared object that is either local (tests) or a Ray actor (runs).

``transport`` never creates actors (only ``zbrl.launch`` does); it only talks to handles it is
given, so Producer and Consumer run unchanged in one process with local handles.
"""

from __future__ import annotations

from typing import Any, Protocol


class Handle(Protocol):
    """Call a method of a shared object and wait for its result."""

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any: ...

    def put_object(self, value: Any) -> Any: ...

    def get_object(self, payload: Any, timeout: float | None = None) -> Any: ...


class LocalHandle:
    """An in-process object; payloads are passed by reference."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return getattr(self.target, method)(*args)

    def put_object(self, value: Any) -> Any:
        return value

    def get_object(self, payload: Any, timeout: float | None = None) -> Any:
        return payload


class RayHandle:
    """A Ray actor; payloads travel through the object store (wrapped in a list so that an
    ObjectRef passed to an actor method stays a reference instead of being resolved)."""

    def __init__(self, actor: Any, default_timeout: float | None = 600.0) -> None:
        self.actor = actor
        self.default_timeout = default_timeout

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        import ray

        ref = getattr(self.actor, method).remote(*args)
        return ray.get(ref, timeout=timeout if timeout is not None else self.default_timeout)

    def put_object(self, value: Any) -> Any:
        import ray

        return [ray.put(value)]

    def get_object(self, payload: Any, timeout: float | None = None) -> Any:
        import ray

        return ray.get(payload[0], timeout=timeout)
