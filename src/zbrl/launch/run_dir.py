"""A run's directory: one run at a time in it.

A run holds an exclusive ``flock`` on ``RUN_DIR/.zbrl-run.lock`` for its whole life (the kernel
drops it when the process ends, however it ends). A second run configured with the same directory
is refused while the first holds it, and so is one holding checkpoints of an earlier run (unless
``sibling_if_used``, as ``zbrl demo`` asks). A configured directory with other content (an earlier
run without checkpoints) is left as it is and the run gets a fresh sibling,
``NAME-YYYYmmdd-HHMMSS`` (``-2``, ``-3``, ... when that name is taken), created with an exclusive
``mkdir`` so two runs never get the same one.

Nothing is created before a run's checks have passed: :func:`check_run_dir` refuses what
:func:`claim_run_dir` would refuse (a live run in it, earlier checkpoints, a path that cannot be
a directory) without touching the file system, so the driver calls it first and claims the
directory only when everything else is ready.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from zbrl.errors import RunError
from zbrl.training.checkpoint import has_checkpoints

CHECKPOINTS = "checkpoints"
LOCK_FILE = ".zbrl-run.lock"
MAX_FALLBACKS = 1000


class RunDirInUse(RunError):
    """Another run holds the run directory."""


class RunDirHasCheckpoints(RunError):
    """The run directory holds checkpoints of an earlier run; a new run will not overwrite it."""


class RunDirLock:
    """An open, locked lock file; :meth:`release` unlocks and closes it (the file stays)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor of the open file drops the flock


def try_lock(run_dir: Path, shared: bool = False) -> RunDirLock | None:
    """Lock ``run_dir`` (exclusively, or shared to test that no run holds it) without waiting;
    None when another process (or another open of the file in this one) holds it."""
    # O_CLOEXEC: processes this one starts (Ray's raylet and workers) must not keep the lock
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if not shared:  # for people and for the refusal message: who holds it
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    return RunDirLock(run_dir / LOCK_FILE, fd)


def holds_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` has anything in it besides the lock file."""
    return run_dir.is_dir() and any(p.name != LOCK_FILE for p in run_dir.iterdir())


def check_run_dir(configured: Path, sibling_if_used: bool = False) -> None:
    """Refuse, without creating or changing anything, what :func:`claim_run_dir` would refuse:
    a path that is a file or cannot be created, checkpoints of an earlier run (unless
    ``sibling_if_used``), a live run holding it. A finished run in it is no refusal (the run
    gets a sibling)."""
    if configured.exists() and not configured.is_dir():
        raise RunError(
            f"run dir {configured} is a file; give the run a directory (name=OTHER or "
            "logging.run_dir=PATH)"
        )
    _check_creatable(configured)
    if not sibling_if_used:
        _refuse_checkpoints(configured)
    if _held_by_a_run(configured):
        raise RunDirInUse(_in_use_message(configured))


def check_resumable_run_dir(run_dir: Path) -> None:
    """Refuse, without changing anything, what :func:`lock_existing_run_dir` would refuse."""
    if not run_dir.is_dir():
        raise RunError(f"run dir {run_dir} does not exist")
    if _held_by_a_run(run_dir):
        raise RunDirInUse(_in_use_message(run_dir))


def _check_creatable(configured: Path) -> None:
    """The nearest existing ancestor of ``configured`` is a directory this process may write."""
    ancestor = configured.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise RunError(
            f"run dir {configured} cannot be created: {ancestor} is a file; give the run another "
            "directory (logging.run_dir=PATH)"
        )
    if ancestor != configured.absolute() and not os.access(ancestor, os.W_OK | os.X_OK):
        raise RunError(
            f"run dir {configured} cannot be created: {ancestor} is not writable by this user; "
            "give the run a directory you can write (logging.run_dir=PATH)"
        )


def _held_by_a_run(run_dir: Path) -> bool:
    """Whether a live run holds ``run_dir``'s lock (read-only: no lock file is created)."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: no run has ever held it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _refuse_checkpoints(configured: Path) -> None:
    if has_checkpoints(configured / CHECKPOINTS):
        raise RunDirHasCheckpoints(
            f"run dir {configured} holds checkpoints of an earlier run ({configured / CHECKPOINTS})"
            f"; continue that run with `zbrl resume {configured}`, or start a new one in another "
            "directory (name=OTHER or logging.run_dir=PATH)"
        )


def claim_run_dir(
    configured: Path, now: float | None = None, sibling_if_used: bool = False
) -> tuple[Path, RunDirLock]:
    """The directory this run uses (``configured`` or a fresh sibling) and the lock held on it.

    Raises RunDirInUse when a live run holds ``configured``, and RunDirHasCheckpoints when it
    holds checkpoints (unless ``sibling_if_used``: then a fresh sibling, as for any finished run).
    ``now`` (seconds since the epoch) is the time used in a fallback name; the current time when
    None.
    """
    configured.parent.mkdir(parents=True, exist_ok=True)
    if not sibling_if_used:
        _refuse_checkpoints(configured)
    if not holds_a_run(configured):
        configured.mkdir(exist_ok=True)
        lock = try_lock(configured)
        if lock is None:
            raise RunDirInUse(_in_use_message(configured))
        if not holds_a_run(configured):
            return configured, lock
        lock.release()  # a run claimed, filled and left it between the two checks
    probe = try_lock(configured, shared=True)
    if probe is None:
        raise RunDirInUse(_in_use_message(configured))
    probe.release()
    return _claim_fallback(configured, now)


def lock_existing_run_dir(run_dir: Path) -> tuple[Path, RunDirLock]:
    """Lock the run dir of a run being resumed; RunDirInUse when a live run holds it."""
    if not run_dir.is_dir():
        raise RunError(f"run dir {run_dir} does not exist")
    lock = try_lock(run_dir)
    if lock is None:
        raise RunDirInUse(_in_use_message(run_dir))
    return run_dir, lock


def _claim_fallback(configured: Path, now: float | None) -> tuple[Path, RunDirLock]:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = f"{configured.name}-{stamp}"
    for n in range(1, MAX_FALLBACKS + 1):
        path = configured.with_name(base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir(exist_ok=False)  # atomic: exactly one run creates a given name
        except FileExistsError:
            continue
        lock = try_lock(path)
        if lock is not None:  # None only if a run configured with exactly this name got it
            return path, lock
    raise RunError(
        f"run dir {configured} holds a finished run and {MAX_FALLBACKS} names {base}[-N] are "
        "taken; set another logging.run_dir or name"
    )


def _in_use_message(run_dir: Path) -> str:
    try:
        pid = (run_dir / LOCK_FILE).read_text().strip()
    except OSError:
        pid = ""
    holder = f" (process {pid})" if pid.isdigit() else ""
    return (
        f"run dir {run_dir} is in use by another run{holder}, which holds {run_dir / LOCK_FILE}; "
        "give this run another directory (name=OTHER or logging.run_dir=PATH) or wait until that "
        "run has ended"
    )
