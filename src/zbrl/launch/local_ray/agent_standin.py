"""What a local raylet starts instead of Ray's dashboard agent when that agent would have nothing
to run (:func:`zbrl.launch.local_ray.replacements.idle_agent_replaced`).

With Ray's minimal install (no dashboard packages: zbrl's dependencies) the dashboard agent
loads none of its modules. It starts Python, imports Ray (0.5 CPU-s, while the run's other
processes start on the same cores), writes -1 ("not in use") to the files of its three ports
and then only watches the raylet; the raylet, for its part, waits for those files before it
registers, so every run waited for that import. This program does the same in a few
milliseconds with the standard library alone: it writes -1 to each port file it is given
(whole, by rename, as the raylet reads them while they appear) and stays alive until the raylet
ends (the raylet treats an agent that exits as a failure) or sends it SIGTERM, as it does when
it stops.

    python -S agent_standin.py PORT_FILE [PORT_FILE ...]

Nothing here imports zbrl or Ray.
"""

from __future__ import annotations

import os
import sys
import time

NOT_IN_USE = "-1"
"""What a port file holds for a service that is not running (as Ray's agent writes it)."""

PARENT_POLL_S = 0.5
"""How often it looks whether the raylet is still its parent. (No parent-death signal: Linux
sends it when the raylet's *thread* that started this program ends, and the raylet takes an
agent that exits for a failed one.)"""


def persist_not_in_use(path: str) -> None:
    """Write :data:`NOT_IN_USE` to ``path`` whole: to a temporary name, then renamed."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(NOT_IN_USE)
    os.replace(tmp, path)


RAYLET_PID_ENV = "RAY_RAYLET_PID"
"""Set by the raylet in the environment of the agents it starts."""


def raylet_pid() -> int:
    """The raylet's pid: the one it gave (so that a raylet gone before this program looked is
    seen as gone), else this process's parent."""
    given = os.environ.get(RAYLET_PID_ENV, "")
    return int(given) if given.isdigit() else os.getppid()


def main(port_files: list[str]) -> int:
    raylet = raylet_pid()
    for path in port_files:
        persist_not_in_use(path)
    while os.getppid() == raylet:  # re-parented: the raylet has ended
        time.sleep(PARENT_POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
