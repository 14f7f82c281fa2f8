"""bench/gpu_check.py without a GPU: one line saying why, exit status 2, nothing run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def test_it_refuses_in_one_line_where_no_gpu_is(tmp_path):
    if Path("/dev/nvidiactl").exists():
        pytest.skip("an NVIDIA GPU is here: the check would run")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpu_check: refused: ")
    assert "CUDA" in lines[0]
    assert not (tmp_path / "out").exists()
