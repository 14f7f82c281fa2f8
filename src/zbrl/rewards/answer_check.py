"""Is a predicted final answer equivalent to the gold one?

:func:`answers_equivalent` compares with ``math_verify`` (symbolic: ``\\frac{1}{2}`` = ``0.5`` =
``1/2``, sets, intervals, ...) and falls back to a normalised string match. It never raises on a
bad prediction: a parse failure, a timeout or a crash is a wrong answer. A bad *gold* answer (empty
or not a string) raises ``ValueError``: that is a dataset problem.

Protection against pathological inputs (math_verify calls sympy, which can run for ever on
``9^{9^{9}}`` or deeply nested braces, holding the GIL):

* math_verify's own timeouts use ``signal.alarm``, which only works in the main thread, so they are
  disabled (``parsing_timeout=None``, ``timeout_seconds=None``) and scoring works from any thread;
* a static guard skips math_verify (string match only) for answers longer than
  :data:`MAX_ANSWER_CHARS` characters, nested deeper than :data:`MAX_NESTING_DEPTH` brackets,
  with an exponent inside an exponent, a huge integer exponent or a huge factorial;
* with ``timeout_s`` set (the default) the math_verify step runs in a worker process of a small
  pool and is abandoned, the worker killed, after ``timeout_s`` seconds
  (:func:`run_with_deadline`). ``timeout_s=None`` runs in-process: faster, no hard deadline.

This module also holds :class:`MathAnswerReward`, the shared scoring rule of the math rewards
(``think_answer_tags``, ``boxed``); they differ only in how they extract the answer.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import logging
import math
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zbrl.rewards.base import BaseReward, Example, RewardContext, RewardResult
from zbrl.rewards.length import LengthShaping

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
"""Default hard deadline of one math_verify comparison (seconds; the seed used 5 s alarms)."""
MAX_ANSWER_CHARS = 256
"""Answers longer than this are compared by string only (math_verify parse time grows quickly)."""
MAX_NESTING_DEPTH = 8
"""Answers with more nested brackets are compared by string only (parse time is exponential)."""
_MAX_EXPONENT_DIGITS = 4
_MAX_FACTORIAL_DIGITS = 5

MatchMethod = str
"""``"math_verify"``, ``"string"`` or ``"none"``: what decided the comparison."""


# --------------------------------------------------------------------------------------------
# Text normalisation


def _unicode_table() -> dict[int, str]:
    table = {0xFF01 + i: chr(0x21 + i) for i in range(0x5E)}  # full-width ASCII forms
    for minus in (0x2212, 0xFE63, 0x2796):  # minus sign, small minus, heavy minus
        table[minus] = "-"
    for space in (0x00A0, 0x2007, 0x2009, 0x202F, 0x3000):  # no-break, figure, thin, ideographic
        table[space] = " "
    return table


_UNICODE_TABLE = _unicode_table()
_LATEX_NOISE = re.compile(r"\\(?:left|right|displaystyle|!|,|;|:|\s)")
_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|operatorname)\s*(?=\{)")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac\b")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def fold_unicode(text: str) -> str:
    """Map full-width ASCII forms to ASCII, unicode minus signs to ``-``, odd spaces to ``' '``."""
    return text.translate(_UNICODE_TABLE)


def normalize_answer(text: str) -> str:
    """The string-match form of an answer.

    Folds unicode (see :func:`fold_unicode`), strips ``$...$``, a whole-answer ``\\boxed{}``,
    ``\\left``/``\\right`` and spacing commands, ``\\text``-like command names (keeping their
    content), all whitespace, trailing periods, thousands-separator commas (only in a number
    such as ``1,234,567.5``), braces (``{}``, ``\\{\\}``); then case-folds. ``\\dfrac`` and
    ``\\tfrac`` become ``\\frac``.
    """
    s = fold_unicode(text).strip().rstrip(".").rstrip()
    while len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s[1:-1].strip()
    boxed = _whole_boxed_content(s)
    if boxed is not None:
        s = boxed
    s = _LATEX_NOISE.sub("", s)
    s = _TEXT_COMMANDS.sub("", s)
    s = _FRAC_VARIANTS.sub(r"\\frac", s)
    s = "".join(s.split())
    s = s.rstrip(".")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = s.replace("\\{", "").replace("\\}", "").replace("{", "").replace("}", "")
    return s.casefold()


def _whole_boxed_content(s: str) -> str | None:
    """``X`` when ``s`` is exactly ``\\boxed{X}``."""
    if not s.startswith("\\boxed{") or not s.endswith("}"):
        return None
    end = match_brace(s, len("\\boxed"))
    return s[len("\\boxed{") : end] if end == len(s) - 1 else None


def match_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_index``, or None when it never closes.

    Escaped braces (``\\{``, ``\\}``) do not count.
    """
    depth = 0
    i = open_index
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


# --------------------------------------------------------------------------------------------
# Static guard


_OPEN = "([{"
_CLOSE = ")]}"
_EXPONENT = re.compile(r"\^|\*\*")
_TOKEN = re.compile(r"\\?[\w.]*")
_FACTORIAL = re.compile(r"(\d+)\s*!")


def unsafe_reason(text: str) -> str | None:
    """Why ``text`` should not be given to math_verify (None when it may be)."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    depth = max_depth = 0
    for ch in text:
        if ch in _OPEN:
            depth += 1
            max_depth = max(max_depth, depth)
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
    if max_depth > MAX_NESTING_DEPTH:
        return f"nested deeper than {MAX_NESTING_DEPTH} brackets"
    for m in _EXPONENT.finditer(text):
        operand, rest = _exponent_operand(text, m.end())
        if _EXPONENT.search(operand) or _EXPONENT.match(rest.lstrip()):
            return "an exponent inside an exponent"
        digits = operand.strip("{}() ").lstrip("+-")
        if digits.isdigit() and len(digits) > _MAX_EXPONENT_DIGITS:
            return f"an integer exponent with more than {_MAX_EXPONENT_DIGITS} digits"
    for m in _FACTORIAL.finditer(text):
        if len(m.group(1)) > _MAX_FACTORIAL_DIGITS:
            return f"a factorial of a number with more than {_MAX_FACTORIAL_DIGITS} digits"
    return None


def _exponent_operand(text: str, start: int) -> tuple[str, str]:
    """Split ``text[start:]`` into the exponent operand (a group or a token) and the rest."""
    i = start
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] in _OPEN:
        depth = 0
        for j in range(i, len(text)):
            if text[j] in _OPEN:
                depth += 1
            elif text[j] in _CLOSE:
                depth -= 1
                if depth == 0:
                    return text[i : j + 1], text[j + 1 :]
        return text[i:], ""
    m = _TOKEN.match(text, i)
    end = m.end() if m else i
    return text[i:end], text[end:]


# --------------------------------------------------------------------------------------------
# math_verify


class _DropTimeoutDisabledWarning(logging.Filter):
    """math_verify warns once that its timeout is off; zbrl enforces its own deadline."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


@functools.lru_cache(maxsize=1)
def _math_verify() -> tuple[Any, Any, list[Any]]:
    """Import math_verify lazily (it pulls in sympy) and build the seed's extraction config."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [
        ExprExtractionConfig(),
        LatexExtractionConfig(
            boxed_match_priority=0,
            normalization_config=NormalizationConfig(
                basic_latex=True,
                units=True,
                malformed_operators=False,
                nits=False,
                boxed="all",
                equations=False,
            ),
        ),
    ]
    return parse, verify, config


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[Any, ...]:
    parse, _, config = _math_verify()
    boxed = text if "\\boxed" in text else "\\boxed{" + text + "}"
    try:
        return tuple(parse(boxed, extraction_config=config, parsing_timeout=None))
    except Exception:  # math_verify catches most errors itself; anything left is a parse failure
        return ()


def math_verify_equal(pred: str, gold: str) -> bool | None:
    """math_verify's verdict on two (guarded) answers; None when either could not be parsed.

    Runs without math_verify's signal-based timeouts: call it through :func:`run_with_deadline`
    when the inputs are untrusted.
    """
    gold_parsed = _parse(gold)
    pred_parsed = _parse(pred)
    if not gold_parsed or not pred_parsed:
        return None
    _, verify, _ = _math_verify()
    try:
        return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None))
    except Exception:
        return False


def warm_up() -> None:
    """Import math_verify and run one comparison (sympy initialises lazily: ~0.5 s once)."""
    math_verify_equal("1/2", "0.5")


# --------------------------------------------------------------------------------------------
# The comparison


def check_gold(gold: object, *, field: str = "gt_answer") -> str:
    """Return the gold answer, or raise ``ValueError`` naming the dataset problem."""
    if not isinstance(gold, str):
        raise ValueError(
            f"the gold answer {field!r} must be a non-empty string, got {type(gold).__name__} "
            f"{gold!r:.80}; fix the dataset row (write the answer as a JSON string)"
        )
    if not gold.strip():
        raise ValueError(
            f"the gold answer {field!r} is empty; fix the dataset row (every math example needs "
            f"its final answer)"
        )
    return gold


def answers_equivalent(
    pred: str | None, gold: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S
) -> tuple[bool, MatchMethod]:
    """Whether ``pred`` is equivalent to ``gold``, and what decided it.

    ``method`` is ``"math_verify"`` when math_verify judged (correct, or both parsed and found
    different), ``"string"`` when the normalised string match decided (it is tried whenever
    math_verify does not say "equal": unparsable, guarded, timed out or different), and ``"none"``
    when there was nothing to compare (``pred`` None or blank).

    Both sides are wrapped in ``\\boxed{}`` unless already boxed and parsed with LaTeX and plain
    expression extraction. ``timeout_s`` is the hard deadline of the math_verify step, run in a
    worker process; None runs it in this process (no hard deadline, the static guard only).
    """
    gold = check_gold(gold)
    if pred is None:
        return False, "none"
    if not isinstance(pred, str):
        raise TypeError(
            f"answers_equivalent: pred must be a str or None, got {type(pred).__name__}"
        )
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"answers_equivalent: timeout_s must be > 0 or None, got {timeout_s}")
    pred_text = fold_unicode(pred).strip()
    gold_text = fold_unicode(gold).strip()
    if not pred_text:
        return False, "none"
    guarded = unsafe_reason(pred_text) is not None or unsafe_reason(gold_text) is not None
    verdict: bool | None = None
    if not guarded:
        if timeout_s is None:
            verdict = math_verify_equal(pred_text, gold_text)
        else:
            try:
                verdict = run_with_deadline(math_verify_equal, (pred_text, gold_text), timeout_s)
            except (DeadlineExceeded, WorkerCrashed) as exc:
                logger.warning(
                    "math_verify gave no verdict on %.80r (%s); string match only", pred, exc
                )
                verdict = None
    if verdict:
        return True, "math_verify"
    if guarded:  # pathological text: only an exact match (up to whitespace) counts
        same = "".join(pred_text.split()) == "".join(gold_text.split())
    else:
        same = normalize_answer(pred_text) == normalize_answer(gold_text)
    if same:
        return True, "string"
    return False, "math_verify" if verdict is False else "string"


# --------------------------------------------------------------------------------------------
# Hard deadlines: a small pool of worker processes


class DeadlineExceeded(TimeoutError):
    """The function did not finish within its deadline; its worker process was killed."""


class WorkerCrashed(RuntimeError):
    """The worker process died while running the function."""


class WorkerStartError(RuntimeError):
    """A worker process could not be started (an environment problem: it is not retried)."""


_HEADER = struct.Struct(">Q")
_SELF_DESTRUCT_GRACE_S = 5
_WORKER_BOOT = (
    "import sys; from zbrl.rewards.answer_check import _worker_main; _worker_main(sys.argv[1:])"
)


def _write_message(stream: Any, data: bytes) -> None:
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact_blocking(stream: Any, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _worker_main(preload: Sequence[str]) -> None:
    """Entry point of a worker process: run pickled ``(fn, args, kwargs, timeout_s)`` requests."""
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # stray prints of user functions go to stderr, not into the reply pipe
    # Self-destruct (default SIGALRM action) a little after the deadline, should the parent die.
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    for target in preload:
        module, _, function = target.partition(":")
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()
    _write_message(replies, pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            (size,) = _HEADER.unpack(_read_exact_blocking(requests, _HEADER.size))
            request = _read_exact_blocking(requests, size)
        except EOFError:
            return
        try:
            fn, args, kwargs, timeout_s = pickle.loads(request)
        except Exception as exc:
            reply: tuple[str, Any] = (
                "err",
                RuntimeError(f"worker cannot unpickle the task: {exc!r}"),
            )
        else:
            signal.alarm(math.ceil(timeout_s) + _SELF_DESTRUCT_GRACE_S)
            try:
                reply = ("ok", fn(*args, **kwargs))
            except Exception as exc:
                reply = ("err", exc)
            finally:
                signal.alarm(0)
        try:
            data = pickle.dumps(reply)
        except Exception as exc:
            data = pickle.dumps(("err", RuntimeError(f"worker cannot pickle the result: {exc!r}")))
        _write_message(replies, data)


class _Worker:
    """One worker process and its request/reply pipes."""

    def __init__(self, preload: Sequence[str], startup_timeout_s: float) -> None:
        env = dict(os.environ)
        paths = [p if p else os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the parent only
        )
        hint = "(its error, if any, is on stderr); or score in-process with timeout_s=None"
        try:
            status, _ = pickle.loads(self._receive(time.monotonic() + startup_timeout_s))
        except DeadlineExceeded:
            self.kill()
            raise WorkerStartError(
                f"the deadline worker process did not start within {startup_timeout_s} s {hint}"
            ) from None
        except WorkerCrashed as exc:
            self.kill()
            msg = f"the deadline worker process failed to start: {exc} {hint}"
            raise WorkerStartError(msg) from None
        except BaseException:
            self.kill()
            raise
        if status != "ready":
            self.kill()
            raise WorkerStartError(f"the deadline worker sent {status!r} instead of 'ready'")

    def call(self, request: bytes, timeout_s: float) -> tuple[str, Any]:
        try:
            assert self.proc.stdin is not None
            _write_message(self.proc.stdin, request)
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise WorkerCrashed(f"deadline worker is gone: {exc!r}") from None
        data = self._receive(time.monotonic() + timeout_s)
        return pickle.loads(data)

    def _receive(self, deadline: float) -> bytes:
        header = self._read_exact(_HEADER.size, deadline)
        (size,) = _HEADER.unpack(header)
        return self._read_exact(size, deadline)

    def _read_exact(self, n: int, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        buf = bytearray()
        while len(buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(max(1, math.ceil(remaining * 1000))):
                if time.monotonic() >= deadline:
                    raise DeadlineExceeded("deadline exceeded")
                continue
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                code = self.proc.poll()
                raise WorkerCrashed(f"deadline worker exited (exit code {code})")
            buf += chunk
        return bytes(buf)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class DeadlinePool:
    """Up to ``max_workers`` reusable worker processes that run functions under a deadline.

    A worker whose function misses its deadline (or that dies) is killed and replaced on demand;
    start-up time does not count against the deadline. Callers from many threads share the pool;
    when all workers are busy a caller waits for one. POSIX only.
    """

    def __init__(
        self,
        max_workers: int = 2,
        *,
        preload: Sequence[str] = ("zbrl.rewards.answer_check:warm_up",),
        startup_timeout_s: float = 120.0,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"DeadlinePool.max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.preload = tuple(preload)
        self.startup_timeout_s = startup_timeout_s
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._starting = 0
        self._closed = False

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """``fn(*args, **kwargs)`` in a worker; raises :class:`DeadlineExceeded` after
        ``timeout_s`` seconds and :class:`WorkerCrashed` if the worker dies. Exceptions raised by
        ``fn`` are re-raised here. ``fn`` must be picklable (a module-level function)."""
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        try:
            request = pickle.dumps((fn, tuple(args), dict(kwargs or {}), timeout_s))
        except Exception as exc:
            raise TypeError(
                f"run_with_deadline cannot send {fn!r} to a worker process ({exc}); pass a "
                f"module-level function and picklable arguments"
            ) from exc
        worker = self._acquire()
        healthy = False
        try:
            status, value = worker.call(request, timeout_s)
            healthy = True
        except DeadlineExceeded:
            raise DeadlineExceeded(
                f"{getattr(fn, '__qualname__', fn)!s} did not finish within {timeout_s} s; its "
                f"worker process was killed"
            ) from None
        finally:
            self._release(worker, healthy)
        if status == "err":
            raise value
        return value

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("DeadlinePool is shut down")
                if self._idle:
                    return self._idle.pop()
                if len(self._all) + self._starting < self.max_workers:
                    self._starting += 1
                    break
                self._cond.wait()
        try:
            worker = _Worker(self.preload, self.startup_timeout_s)
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._starting -= 1
            self._all.add(worker)
        return worker

    def _release(self, worker: _Worker, healthy: bool) -> None:
        with self._cond:
            if healthy and not self._closed:
                self._idle.append(worker)
            else:
                self._all.discard(worker)
            self._cond.notify()
        if not healthy:
            worker.kill()

    def shutdown(self) -> None:
        """Kill every worker; later ``run`` calls raise."""
        with self._cond:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
            self._idle.clear()
            self._cond.notify_all()
        if os.getpid() == self.pid:
            for worker in workers:
                worker.kill()


_default_pool: DeadlinePool | None = None
_default_pool_lock = threading.Lock()


def default_pool() -> DeadlinePool:
    """The process-wide pool used by :func:`run_with_deadline` (a fresh one after a fork)."""
    global _default_pool
    with _default_pool_lock:
        if _default_pool is None or _default_pool.pid != os.getpid():
            if _default_pool is None:
                atexit.register(_shutdown_default_pool)
            _default_pool = DeadlinePool()
        return _default_pool


def _shutdown_default_pool() -> None:
    pool = _default_pool
    if pool is not None:
        pool.shutdown()


def run_with_deadline(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    kwargs: Mapping[str, Any] | None = None,
    pool: DeadlinePool | None = None,
) -> Any:
    """Run ``fn(*args, **kwargs)`` in a worker process and return its result within ``timeout_s``
    seconds, or raise :class:`DeadlineExceeded` (the worker is killed, so even a computation that
    holds the GIL in C code is stopped). Safe to call from any thread."""
    return (pool or default_pool()).run(fn, args, timeout_s, kwargs)


# --------------------------------------------------------------------------------------------
# The shared scoring rule of the math rewards


class MathAnswerReward(BaseReward):
    """Score = answer credit + format bonus + length penalty.

    * answer credit: ``correct_reward`` when the extracted answer is equivalent to the gold one
      and (the format is valid, or ``ctx.eval_mode``), else ``wrong_reward``; in training a
      badly formatted response is not checked at all;
    * ``format_reward`` is added when the format is valid (default 0: format only gates);
    * ``length_shaping.penalty(...)`` is added to every response in training (not in eval),
      whether or not an answer was extracted.

    ``format_acc`` is 1.0 for valid format; ``ans_acc`` is 1.0 exactly when the answer got
    credit (correct, and format valid or eval mode). ``metadata`` holds ``format_valid``,
    ``answer_correct`` (None when not checked), ``match_method``, ``length_penalty`` and
    ``reason`` (``"correct"``, ``"wrong_answer"``, ``"no_answer"`` or ``"bad_format: ..."``).
    Subclasses implement :meth:`extract`.
    """

    name = "math"

    def __init__(
        self,
        *,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
        format_reward: float = 0.0,
        length_shaping: LengthShaping | Mapping[str, Any] | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        answer_field: str = "gt_answer",
    ) -> None:
        for option, value in (
            ("correct_reward", correct_reward),
            ("wrong_reward", wrong_reward),
            ("format_reward", format_reward),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{self.name}: {option} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{self.name}: {option} must be finite, got {value}")
        if correct_reward < wrong_reward:
            raise ValueError(
                f"{self.name}: correct_reward ({correct_reward}) is below wrong_reward "
                f"({wrong_reward}); a correct answer must not score less than a wrong one"
            )
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"{self.name}: timeout_s must be > 0 or None, got {timeout_s}")
        if isinstance(length_shaping, Mapping):
            length_shaping = LengthShaping(**length_shaping)
        if length_shaping is not None and not isinstance(length_shaping, LengthShaping):
            raise TypeError(
                f"{self.name}: length_shaping must be a LengthShaping, a dict of its fields or "
                f"None, got {type(length_shaping).__name__}"
            )
        self.correct_reward = float(correct_reward)
        self.wrong_reward = float(wrong_reward)
        self.format_reward = float(format_reward)
        self.length_shaping = length_shaping
        self.timeout_s = timeout_s
        self.answer_field = answer_field

    def extract(self, response: str) -> tuple[str | None, bool, str | None]:
        """``(answer or None, format_valid, why the format is invalid or None)``."""
        raise NotImplementedError

    def gold(self, example: Example) -> str:
        if self.answer_field not in example:
            raise ValueError(
                f"{self.name} reward: the example has no {self.answer_field!r} field (fields: "
                f"{', '.join(sorted(map(str, example))) or 'none'}); add the gold answer to the "
                f"dataset row"
            )
        return check_gold(example[self.answer_field], field=self.answer_field)

    def score(self, response: str, example: Example, ctx: RewardContext) -> RewardResult:
        gold = self.gold(example)
        answer, format_valid, format_problem = self.extract(response)
        checked = answer is not None and (format_valid or ctx.eval_mode)
        correct, method = False, "none"
        if checked:
            correct, method = answers_equivalent(answer, gold, timeout_s=self.timeout_s)
        reward = self.correct_reward if correct else self.wrong_reward
        if format_valid:
            reward += self.format_reward
        penalty = 0.0
        if self.length_shaping is not None and not ctx.eval_mode:
            penalty = self.length_shaping.penalty(ctx.response_tokens, ctx.truncated)
            reward += penalty
        if correct:
            reason = "correct"
        elif answer is None:
            reason = "no_answer"
        elif not format_valid:
            reason = f"bad_format: {format_problem}"
        else:
            reason = "wrong_answer"
        return RewardResult(
            reward=reward,
            format_acc=1.0 if format_valid else 0.0,
            ans_acc=1.0 if correct else 0.0,
            parsed=answer,
            metadata={
                "format_valid": format_valid,
                "answer_correct": correct if checked else None,
                "match_method": method,
                "length_penalty": penalty,
                "reason": reason,
            },
        )
