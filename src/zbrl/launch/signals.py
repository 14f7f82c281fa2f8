"""SIGINT and SIGTERM on the driver: the first asks the run to stop with a checkpoint, the second
exits at once.

While a run is training (:meth:`StopSignals.graceful`), the first signal only records itself; the
driver's loop sees :attr:`StopSignals.signum`, asks the workers to stop, waits for the consumer's
checkpoint and writes the summary. Outside that phase (start-up, shutdown), or on a second signal,
the handler raises :class:`Interrupted` at once: the driver's ``finally`` still kills the workers
and stops Ray, but nothing is saved. SIGTERM is what Slurm, Kubernetes and ``timeout`` send; Ray
installs its own handler on the driver in ``ray.init``, so these handlers go in after it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from zbrl.errors import RunError

HANDLED = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(RunError):
    """A signal stopped the run cleanly (or as cleanly as it could); the message says how to
    resume. ``exit_code`` is the shell's 128 + signal number."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signum


class Interrupted(KeyboardInterrupt):
    """The run was interrupted before it could stop cleanly (second signal, or during start-up)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Installs the handlers for its ``with`` block (main thread only; elsewhere it does nothing
    and the process's handlers stay)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._graceful = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    @contextlib.contextmanager
    def graceful(self) -> Iterator[None]:
        """Within this block the first signal is recorded (a clean stop), not raised."""
        self._graceful = True
        try:
            yield
        finally:
            self._graceful = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None or not self._graceful:
            raise Interrupted(signum)
        self.signum = signum
        name = signal.Signals(signum).name
        print(
            f"\n[zbrl] {name}: stopping — finishing the current step and writing a checkpoint "
            f"(send {name} again to exit at once, without saving)",
            file=sys.stderr,
            flush=True,
        )
