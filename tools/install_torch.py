"""Install torch into this virtual environment: the CPU build unless the machine has an NVIDIA GPU.

Run by the Makefile with the venv's own python (``python tools/install_torch.py VERSION``).

- An NVIDIA GPU (``nvidia-smi -L`` lists one): torch from the default index, the CUDA build.
- No GPU, or ``--cpu``: the CPU build from PyTorch's CPU wheel index, when that index answers
  within a few seconds. When it does not (a machine that reaches only PyPI or a mirror), torch
  comes from the default index: pip then takes a CPU wheel where the pip configuration provides
  one (a find-links directory or a mirror holding ``+cpu`` wheels), and on a stock Linux x86-64
  pip the CUDA build (several GB), which this script says.

Prints one line naming the build that was installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 5.0  # bounds DNS as well as the connection (a thread, joined with a limit)


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def index_reachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    answered = []

    def probe() -> None:
        try:
            with urllib.request.urlopen(url + "/", timeout=timeout_s) as response:
                answered.append(response.status < 400)
        except Exception:
            answered.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    return bool(answered and answered[0])


def installed_build() -> str:
    code = (
        "import torch; c = torch.version.cuda; "
        "print(torch.__version__, f'(CUDA {c} build)' if c else '(CPU build)')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="torch version, e.g. 2.13.0")
    parser.add_argument("--cpu", action="store_true", help="the CPU build even with a GPU")
    args = parser.parse_args()
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    requirement = f"torch=={args.version}"
    if not args.cpu and has_nvidia_gpu():
        print("setup: NVIDIA GPU found: torch from the default index (its CUDA build)", flush=True)
        command = [*pip, requirement]
    elif index_reachable(CPU_INDEX):
        print(f"setup: no NVIDIA GPU: torch's CPU build from {CPU_INDEX}", flush=True)
        command = [*pip, "--index-url", CPU_INDEX, requirement]
    else:
        print(
            f"setup: no NVIDIA GPU, and {CPU_INDEX} is unreachable (probed for at most "
            f"{PROBE_TIMEOUT_S:.0f} s): torch from the default index (a CPU wheel where pip's "
            "configuration provides one, else the CUDA build, several GB)",
            flush=True,
        )
        command = [*pip, requirement]
    subprocess.run(command, check=True)
    print(f"setup: installed torch {installed_build()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
