"""The limits a sandboxed program runs under, and which sandbox runs it (``docs/sandbox.md``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

SandboxBackend = Literal["auto", "bwrap", "rlimits"]
"""Which sandbox runs programs: bubblewrap namespaces, rlimits and the audit hook only, or the
first when it works here."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one candidate program (each test gets the per-test limits afresh)."""

    timeout_s: float = 5.0
    """Wall-clock limit per test, in seconds."""
    cpu_s: int | None = None
    """CPU-time limit per test (RLIMIT_CPU), in seconds; None means ``ceil(timeout_s) + 1``."""
    memory_mb: int = 512
    """Address-space limit per test process (RLIMIT_AS), in MiB."""
    max_output_bytes: int = 64 * 1024
    """Most bytes a test may write to stdout (and the most a returned value may encode to)."""
    max_stderr_bytes: int = 1024 * 1024
    """Most bytes a test may write to stderr (only the tail is kept)."""
    max_file_bytes: int = 16 * 1024 * 1024
    """Largest file a test may write (RLIMIT_FSIZE), in bytes."""
    max_open_files: int = 64
    """Open file descriptors per test process (RLIMIT_NOFILE)."""
    max_processes: int = 16
    """Extra tasks beyond those the user already runs (RLIMIT_NPROC; not applied for root, which
    the kernel exempts anyway). Process creation is also denied by the audit hook."""
    total_timeout_s: float | None = None
    """Wall-clock limit for all tests of one candidate together; None means no extra limit."""
    continue_after_timeout: bool = False
    """Keep running the remaining tests after one times out (default: mark them skipped)."""
    network_namespace: bool = True
    """``rlimits`` backend: start the runner in an empty network namespace when ``unshare --net``
    works here (the ``bwrap`` backend always has its own network namespace)."""
    backend: SandboxBackend = "auto"
    """``bwrap``, ``rlimits``, or ``auto`` (bwrap when it works here, else rlimits with a
    warning)."""
    max_workdir_bytes: int = 64 * 1024 * 1024
    """``bwrap`` backend: size of the tmpfs that is the working directory (all files together);
    the ``rlimits`` backend caps single files only."""

    def __post_init__(self) -> None:
        positive = {
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_mb,
            "max_output_bytes": self.max_output_bytes,
            "max_stderr_bytes": self.max_stderr_bytes,
            "max_file_bytes": self.max_file_bytes,
            "max_processes": self.max_processes,
            "max_workdir_bytes": self.max_workdir_bytes,
        }
        if self.cpu_s is not None:
            positive["cpu_s"] = self.cpu_s
        if self.total_timeout_s is not None:
            positive["total_timeout_s"] = self.total_timeout_s
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {value!r}")
        if self.memory_mb < 64:
            raise ValueError(
                f"SandboxLimits.memory_mb must be at least 64 (the interpreter needs it), "
                f"got {self.memory_mb}"
            )
        if self.backend not in get_args(SandboxBackend):
            raise ValueError(
                f"SandboxLimits.backend must be one of {list(get_args(SandboxBackend))}, "
                f"got {self.backend!r}"
            )
        if self.max_open_files < 16:
            raise ValueError(
                f"SandboxLimits.max_open_files must be at least 16, got {self.max_open_files}"
            )

    @property
    def effective_cpu_s(self) -> int:
        """The RLIMIT_CPU value used per test."""
        if self.cpu_s is not None:
            return self.cpu_s
        return int(-(-self.timeout_s // 1)) + 1
