"""Reward functions by name, and user rewards by ``package.module:function`` path.

* :data:`REWARDS` maps a name (``think_answer_tags``, ``boxed``, ``code``) to a reward class or
  factory; :func:`register_reward` adds one.
* :func:`build_reward` turns a name or an import path plus keyword options into a
  :class:`~zbrl.rewards.base.RewardFunction`.

An import path may name a reward class (instantiated with the options), a reward object (used as
is) or a plain function ``fn(response, example, ctx, **options)`` returning a ``RewardResult``, a
number, or a ``(reward, format_acc, ans_acc)`` tuple; a function is wrapped by
:class:`FunctionReward`.

The ``code`` reward is imported only when asked for, so importing :mod:`zbrl.rewards` stays light.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import traceback
from collections.abc import Callable, Mapping
from numbers import Real
from typing import Any, TypeVar

from zbrl.registry import Registry, import_object
from zbrl.rewards.base import (
    BaseReward,
    Example,
    RewardContext,
    RewardFunction,
    RewardResult,
    failed_result,
)

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger(__name__)

REWARDS: Registry[Callable[..., RewardFunction]] = Registry("reward")
"""Registered reward classes/factories; ``factory(**options)`` returns a RewardFunction."""

LAZY_REWARDS: dict[str, str] = {
    "code": "zbrl.rewards.code",
    "http": "zbrl.rewards.http",
    "reward_model": "zbrl.rewards.reward_model",
    "last_number": "zbrl.rewards.last_number",
    "reasoning_gym": "zbrl.rewards.reasoning_gym",
}
"""Built-in rewards registered by importing their module on first use."""


def register_reward(name: str) -> Callable[[F], F]:
    """Decorator: register a reward class (or factory) under ``name``.

    A registered class without its own ``name`` attribute gets ``name``.
    """
    register = REWARDS.register(name)

    def decorator(obj: F) -> F:
        if isinstance(obj, type) and "name" not in vars(obj):
            obj.name = name  # type: ignore[attr-defined]
        return register(obj)

    return decorator


def known_rewards() -> list[str]:
    """Registered names, plus the built-ins imported on first use."""
    return sorted(set(REWARDS.names()) | set(LAZY_REWARDS))


def build_reward(name_or_path: str, **options: Any) -> RewardFunction:
    """Build a reward from a registered name or a ``package.module:attribute`` path.

    ``options`` are keyword arguments of the reward class (or of every call, for a function).
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(
            f"reward type must be a registered name or 'package.module:function', got "
            f"{name_or_path!r}; known: {', '.join(known_rewards())}"
        )
    if ":" in name_or_path:
        return _build_from_path(name_or_path, options)
    return _instantiate(name_or_path, lookup_reward(name_or_path), options)


def build_user_reward(
    path: str, options: Mapping[str, Any], *, timeout_s: float | None
) -> RewardFunction:
    """A user reward by import path: a function gets ``options`` on every call and runs under
    ``timeout_s`` (see :class:`FunctionReward`); a reward class is built with ``options``."""
    return _build_from_path(path, options, timeout_s=timeout_s)


def lookup_reward(name: str) -> Callable[..., RewardFunction]:
    """The registered reward class or factory ``name`` (built-ins imported on first use)."""
    if name not in REWARDS and name in LAZY_REWARDS:
        importlib.import_module(LAZY_REWARDS[name])
    if name not in REWARDS:
        raise KeyError(
            f"unknown reward {name!r}; known: {', '.join(known_rewards())}; or give an import "
            f"path 'package.module:function' to a function fn(response, example, ctx)"
        )
    return REWARDS.get(name)


def _instantiate(
    label: str, factory: Callable[..., Any], options: Mapping[str, Any]
) -> RewardFunction:
    _check_options(label, factory, options, leading=0)
    reward = factory(**options)
    if isinstance(reward, type) or not isinstance(reward, RewardFunction):
        raise TypeError(
            f"reward {label!r} built a {type(reward).__name__}, not a reward: it needs a 'name' "
            f"attribute and 'score' and 'score_batch' methods (subclass zbrl.rewards.BaseReward)"
        )
    return reward


def _build_from_path(
    path: str, options: Mapping[str, Any], *, timeout_s: float | None = None
) -> RewardFunction:
    obj = import_object(path, "reward")
    if isinstance(obj, type):
        return _instantiate(path, obj, options)
    if isinstance(obj, RewardFunction):
        if options:
            raise TypeError(
                f"reward {path!r} is a ready-made reward object and takes no options; got "
                f"{sorted(options)}. Point the path at its class to pass options"
            )
        return obj
    if callable(obj):
        return FunctionReward(obj, path, options, timeout_s=timeout_s)
    raise TypeError(
        f"reward {path!r} is a {type(obj).__name__}, not a function fn(response, example, ctx) "
        f"or a reward class"
    )


def _check_options(
    label: str, target: Callable[..., Any], options: Mapping[str, Any], leading: int
) -> None:
    """Fail early, naming the reward, when ``target`` cannot take ``options``."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    try:
        signature.bind(*([None] * leading), **options)
    except TypeError as exc:
        accepted = [
            p.name
            for p in list(signature.parameters.values())[leading:]
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        raise TypeError(
            f"reward {label!r} cannot take options {sorted(options)}: {exc}; it accepts: "
            f"{', '.join(accepted) or 'no options'}"
        ) from None


class UserRewardError(RuntimeError):
    """A user reward raised; the message carries the user's own traceback (file and line)."""


class FunctionReward(BaseReward):
    """A user function ``fn(response, example, ctx, **options)`` as a RewardFunction.

    Return values are normalised by :func:`to_reward_result`. An exception from the function is
    re-raised as :class:`UserRewardError` whose message ends with the function's traceback.

    With ``timeout_s`` every call runs in a worker process that is killed when the deadline passes
    (:mod:`zbrl.rewards.deadline`, as for the math rewards): a call that misses it gets no score
    (:func:`~zbrl.rewards.base.failed_result`, ``timed_out=True``: its group is not trained), with
    a warning; the count is :attr:`timeouts`. The function must then be importable by its path
    (it is, when it came from one). ``timeout_s=None`` calls it in-process without a deadline.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        path: str,
        options: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ):
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"reward {path!r}: timeout_s must be > 0 or None, got {timeout_s}")
        self.fn = fn
        self.name = path
        self.options = dict(options or {})
        self.timeout_s = timeout_s
        self.timeouts = 0
        self._pool = None
        _check_options(path, fn, self.options, leading=3)

    def score(self, response: str, example: Example, ctx: RewardContext) -> RewardResult:
        args = (self.fn, self.name, response, example, ctx, self.options)
        if self.timeout_s is None:
            return to_reward_result(call_user_reward(*args), self.name)
        from zbrl.rewards.deadline import DeadlineExceeded, DeadlinePool

        if self._pool is None:
            self._pool = DeadlinePool(max_workers=1, preload=())
        try:
            value = self._pool.run(call_user_reward, args, self.timeout_s)
        except DeadlineExceeded:
            self.timeouts += 1
            logger.warning(
                "reward %s did not return within %.1f s (reward.timeout_s); no score, the "
                "group is not trained (%d time(s) so far)",
                self.name,
                self.timeout_s,
                self.timeouts,
            )
            return failed_result(
                f"no return within {self.timeout_s} s (reward.timeout_s)", timed_out=True
            )
        return to_reward_result(value, self.name)


def call_user_reward(
    fn: Callable[..., Any],
    label: str,
    response: str,
    example: Example,
    ctx: RewardContext,
    options: Mapping[str, Any],
) -> Any:
    """``fn(response, example, ctx, **options)``; an exception becomes a :class:`UserRewardError`
    carrying the user's traceback as text (tracebacks do not survive a process boundary)."""
    try:
        return fn(response, example, ctx, **options)
    except Exception as exc:
        trace = traceback.format_exc().rstrip()
        raise UserRewardError(
            f"reward {label!r} raised {type(exc).__name__}: {exc}\n{trace}"
        ) from exc


def to_reward_result(value: object, label: str) -> RewardResult:
    """Normalise a reward function's return value.

    * a ``RewardResult`` is kept;
    * a number ``r`` (bool and int included) becomes ``RewardResult(r, format_acc=1.0,
      ans_acc=clip(r, 0, 1))`` — return a tuple or a RewardResult to set the accuracies yourself;
    * ``(reward, format_acc, ans_acc)`` (tuple or list of numbers) becomes a RewardResult.

    Anything else is a ``TypeError`` naming ``label``; a non-finite reward or an accuracy outside
    [0, 1] is a ``ValueError``.
    """
    if isinstance(value, RewardResult):
        result = value
    elif isinstance(value, Real):
        r = float(value)
        result = RewardResult(reward=r, format_acc=1.0, ans_acc=min(max(r, 0.0), 1.0))
    elif (
        isinstance(value, (tuple, list))
        and len(value) == 3
        and all(isinstance(v, Real) for v in value)
    ):
        result = RewardResult(
            reward=float(value[0]), format_acc=float(value[1]), ans_acc=float(value[2])
        )
    else:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise TypeError(
            f"reward function {label!r} returned {type(value).__name__} {shown}; it must return "
            f"a RewardResult, a number, or a (reward, format_acc, ans_acc) tuple of numbers"
        )
    if not math.isfinite(result.reward):
        raise ValueError(f"reward function {label!r} returned a non-finite reward {result.reward}")
    for field_name in ("format_acc", "ans_acc"):
        acc = getattr(result, field_name)
        if not 0.0 <= acc <= 1.0:
            raise ValueError(
                f"reward function {label!r} returned {field_name}={acc}, not in [0, 1]"
            )
    return result
