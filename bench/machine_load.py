"""The machine's load around a benchmark, printed under its table so that a figure measured on
a busy machine says so."""

from __future__ import annotations

import os


def load_line(before: tuple[float, float, float], after: tuple[float, float, float]) -> str:
    """``load average (1/5/15 min) before 0.4/0.6/0.7, after 2.1/1.0/0.8 on 2 cores`` from two
    ``os.getloadavg()`` readings."""

    def fmt(values: tuple[float, float, float]) -> str:
        return "/".join(f"{x:.1f}" for x in values)

    return (
        f"load average (1/5/15 min) before {fmt(before)}, after {fmt(after)} "
        f"on {os.cpu_count()} cores"
    )
