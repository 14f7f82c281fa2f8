"""Uniform calls to a shared object that is either local (tests) or a Ray actor (runs).

``transport`` never creates actors (only ``zbrl.launch`` does); it only talks to handles it is
given, so Producer and Consumer run unchanged in one process with local handles.

A handle is called with the target class's method itself (``handle.call(RolloutBuffer.take, n)``),
never with a name string, so a misspelt method is an AttributeError where the call is written and
a type checker sees it. Roles do not call handles directly: they use the typed clients of
:mod:`zbrl.transport.clients`, the one place per target that names its methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

R = TypeVar("R")


class Handle(Protocol):
    """Call a method of a shared object and wait for its result."""

    def call(self, method: Callable[..., R], *args: Any, timeout: float | None = None) -> R:
        """Run ``method`` (a function of the target's class, e.g. ``RolloutBuffer.take``) on the
        target with ``args``; ``timeout`` bounds the wait for a remote result."""
        ...

    def send(self, method: Callable[..., Any], *args: Any) -> Pending:
        """Start ``method`` on the target without waiting for it; the returned
        :class:`Pending` gives its result (or raises its error) when asked."""
        ...

    def put_object(self, value: Any) -> Any:
        """Store ``value`` where any process can fetch it; returns a small payload to send."""
        ...

    def get_object(self, payload: Any, timeout: float | None = None) -> Any:
        """The value stored by :meth:`put_object`."""
        ...


class Pending(Protocol):
    """A call started with :meth:`Handle.send`."""

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the call; its return value, or its exception raised here."""
        ...


class _Done:
    """A call that already ran (in this process): its value or its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        try:
            self._value = fn()
        except Exception as e:  # kept for result(), as a remote call would
            self._error = e

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class _RayPending:
    def __init__(self, ref: Any, default_timeout: float | None) -> None:
        self.ref = ref
        self.default_timeout = default_timeout

    def result(self, timeout: float | None = None) -> Any:
        import ray

        return ray.get(self.ref, timeout=timeout if timeout is not None else self.default_timeout)


class LocalHandle:
    """An in-process object; payloads are passed by reference.

    The method is looked up by its name on the target, so a test stub that defines the same
    methods stands in for the real class.
    """

    def __init__(self, target: Any) -> None:
        self.target = target

    def call(self, method: Callable[..., R], *args: Any, timeout: float | None = None) -> R:
        return getattr(self.target, method.__name__)(*args)

    def send(self, method: Callable[..., Any], *args: Any) -> Pending:
        return _Done(lambda: getattr(self.target, method.__name__)(*args))

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

    def call(self, method: Callable[..., R], *args: Any, timeout: float | None = None) -> R:
        import ray

        ref = getattr(self.actor, method.__name__).remote(*args)
        return ray.get(ref, timeout=timeout if timeout is not None else self.default_timeout)

    def send(self, method: Callable[..., Any], *args: Any) -> Pending:
        return _RayPending(getattr(self.actor, method.__name__).remote(*args), self.default_timeout)

    def put_object(self, value: Any) -> Any:
        import ray

        return [ray.put(value)]

    def get_object(self, payload: Any, timeout: float | None = None) -> Any:
        import ray

        return ray.get(payload[0], timeout=timeout)
