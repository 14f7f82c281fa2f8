"""The bubblewrap jail of the code sandbox: the probe, the command line, and choosing a backend.

``jail_argv`` builds the ``bwrap`` command line that :mod:`zbrl.sandbox.execution` puts in front
of its runner. What the jail contains (see ``docs/sandbox.md`` for the threat table):

* its own user namespace (nested ones disabled), PID, mount, network, IPC, UTS and cgroup
  namespaces (``--unshare-all``): the host's processes, network interfaces and loopback services
  are out of reach; every process of the jail dies with it (``--die-with-parent``; the runner is
  the namespace's init, ``--as-pid-1``, and the kernel kills a PID namespace whose init is gone;
  without ``--as-pid-1`` bwrap's own init is left as a zombie for the host's init to reap);
* no capabilities (``--cap-drop ALL``), so even a uid of 0 inside cannot remount or undo the binds;
* a filesystem of its own: ``/usr`` and the top-level ``/bin``, ``/sbin``, ``/lib*`` (as the
  symlinks or read-only binds they are on the host), the interpreter's installation
  (``sys.base_prefix``) read-only, ``/etc/ld.so.cache`` and ``/etc/localtime``, a fresh ``/proc``
  for the jail's own PID namespace, a minimal ``/dev``, the runner script read-only, and an empty
  tmpfs of ``max_workdir_bytes`` at ``/tmp`` as the working directory, the only writable place
  (the jail's root and ``/dev`` are remounted read-only). Nothing else: no ``/etc``
  (passwords, keys, resolver), no home directories, no checkout, no dataset files, no ``/sys``.

Choosing a backend: ``resolve_backend("auto")`` is ``"bwrap"`` when the probe (one ``bwrap`` run
of the same command line with ``python -c pass``, once per process) succeeds, else ``"rlimits"``
with a one-time warning saying how to install bubblewrap; ``resolve_backend("bwrap")`` raises
:class:`SandboxUnavailableError` instead of falling back.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from zbrl.errors import RunError

logger = logging.getLogger(__name__)

JAIL_WORKDIR = "/tmp"
"""The jail's working directory, ``HOME`` and ``TMPDIR``: an empty tmpfs."""
JAIL_RUNNER = "/zbrl/sandbox/runner.py"
"""Where the runner script is bound (read-only) inside the jail."""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Top-level system directories made visible, read-only (symlinks stay symlinks)."""
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
"""The only files of ``/etc`` made visible: the loader's cache and the time zone."""
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`, Fedora/RHEL: `dnf install "
    "bubblewrap`, Arch: `pacman -S bubblewrap`; `make setup` does it where apt-get works); in a "
    "container, bwrap also needs user namespaces (Docker's default seccomp profile blocks them)"
)
_PROBE_TIMEOUT_S = 20.0


class SandboxUnavailableError(RunError):
    """The ``bwrap`` sandbox backend was asked for and does not work here."""


@dataclass(frozen=True)
class BwrapProbe:
    """Whether ``bwrap`` is installed and runs the jail here."""

    path: str | None
    """The ``bwrap`` executable, or None when it is not on ``PATH``."""
    error: str | None
    """Why the jail does not work here; None when it does."""

    @property
    def works(self) -> bool:
        return self.path is not None and self.error is None


def interpreter() -> str:
    """The Python executable that runs in the sandbox: the base interpreter (not a virtual
    environment's link to it), so the jail needs only the interpreter's own installation."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _interpreter_dirs() -> list[str]:
    """Directories holding the interpreter and its standard library, outside ``SYSTEM_DIRS``."""
    system = [os.path.realpath(d) for d in SYSTEM_DIRS if os.path.isdir(d)]
    dirs: list[str] = []
    for candidate in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(interpreter())):
        real = os.path.realpath(candidate)
        if not _inside(real, system) and not _inside(real, dirs):
            dirs = [d for d in dirs if not _inside(d, [real])] + [real]
    return dirs


OPTIONAL_OPTIONS = ("--disable-userns", "--size")
"""Options newer than some distributions' bwrap (``--disable-userns`` came with 0.8, ``--size``
with 0.7): used when ``bwrap --help`` lists them. Without ``--size`` the working directory has no
total cap; without ``--disable-userns`` the program could make nested user namespaces."""


@lru_cache(maxsize=8)
def supported_options(bwrap: str) -> frozenset[str]:
    """Which of ``OPTIONAL_OPTIONS`` this ``bwrap`` knows (from its ``--help``)."""
    try:
        help_text = subprocess.run(
            [bwrap, "--help"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    words = set(help_text.split())
    return frozenset(option for option in OPTIONAL_OPTIONS if option in words)


@lru_cache(maxsize=8)
def jail_argv(bwrap: str, workdir_bytes: int, runner: str | None) -> tuple[str, ...]:
    """The ``bwrap`` command line up to and including ``--``; the command to jail follows it."""
    options = supported_options(bwrap)
    argv = [bwrap, "--unshare-all", "--unshare-user"]
    if "--disable-userns" in options:
        argv.append("--disable-userns")
    argv += ["--die-with-parent", "--as-pid-1", "--cap-drop", "ALL"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in SYSTEM_FILES:
        if os.path.exists(path):
            argv += ["--ro-bind", os.path.realpath(path), path]
    for path in _interpreter_dirs():
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if "--size" in options:
        argv += ["--size", str(workdir_bytes)]
    argv += ["--tmpfs", JAIL_WORKDIR, "--chdir", JAIL_WORKDIR]
    if runner is not None:
        argv += ["--ro-bind", runner, JAIL_RUNNER]
    # bwrap makes its root and /dev tmpfs mounts without a size: only /tmp stays writable
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    argv.append("--")
    return tuple(argv)


def jail_env() -> dict[str, str]:
    """The whole environment of a jailed process: nothing is inherited."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": JAIL_WORKDIR,
        "TMPDIR": JAIL_WORKDIR,
    }


def _run_probe() -> BwrapProbe:
    path = shutil.which("bwrap")
    if path is None:
        return BwrapProbe(path=None, error="bwrap is not installed (not found on PATH)")
    command = [*jail_argv(path, 1024 * 1024, None), interpreter(), "-I", "-S", "-c", "pass"]
    try:
        proc = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=jail_env(),
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return BwrapProbe(path=path, error=f"{path} could not run: {exc}")
    if proc.returncode != 0:
        lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        said = lines[-1] if lines else "no message"
        return BwrapProbe(
            path=path,
            error=f"`{path} --unshare-all ... python -c pass` failed (exit {proc.returncode}: "
            f"{said})",
        )
    return BwrapProbe(path=path, error=None)


_probe_lock = threading.Lock()
_probe: BwrapProbe | None = None
_warned = False


def probe_bwrap() -> BwrapProbe:
    """Whether the jail works here; probed once per process (threads wait for the one probe)."""
    global _probe
    with _probe_lock:
        if _probe is None:
            _probe = _run_probe()
        return _probe


def resolve_backend(requested: Literal["auto", "bwrap", "rlimits"]) -> Literal["bwrap", "rlimits"]:
    """The backend that runs a program: see the module docstring."""
    global _warned
    if requested == "rlimits":
        return "rlimits"
    probe = probe_bwrap()
    if probe.works:
        return "bwrap"
    if requested == "bwrap":
        raise SandboxUnavailableError(
            f"code sandbox: backend 'bwrap' does not work here: {probe.error}. To fix: "
            f"{INSTALL_HINT}; or set reward.sandbox.backend=rlimits (or auto) to run programs "
            f"without namespaces (see docs/sandbox.md)"
        )
    with _probe_lock:
        first = not _warned
        _warned = True
    if first:
        logger.warning(
            "code sandbox: bubblewrap is not usable (%s), so programs run under rlimits and an "
            "audit hook only, which is not a security boundary; %s (see docs/sandbox.md)",
            probe.error,
            INSTALL_HINT,
        )
    return "rlimits"
