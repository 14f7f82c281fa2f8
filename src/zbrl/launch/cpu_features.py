"""What the driver tells before a run about this machine's CPU, read without importing torch (the
driver imports torch only in the background, while Ray starts: docs/performance.md, Start-up)."""

from __future__ import annotations

from pathlib import Path

from zbrl.config import RunConfig

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""``/proc/cpuinfo`` flags of the instructions that run bfloat16 matrix products natively
(what ``torch.cpu._is_avx512_bf16_supported`` and ``_is_amx_tile_supported`` look for)."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The first processor's flags, or None where ``cpuinfo`` cannot be read (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return None


def trains_on_cpu(cfg: RunConfig, nvidia: Path = Path("/proc/driver/nvidia/gpus")) -> bool:
    """Whether the consumer trains on CPU: ``training.device=cpu``, or ``auto`` on a machine
    whose NVIDIA driver lists no GPU."""
    if cfg.training.device != "auto":
        return cfg.training.device == "cpu"
    return not (nvidia.is_dir() and any(nvidia.iterdir()))


def slow_bf16_notice(cfg: RunConfig, flags: frozenset[str] | None = None) -> str | None:
    """A line saying that ``model.dtype=bfloat16`` will be slow here (training on a CPU with
    neither AVX512-BF16 nor AMX, where bfloat16 matrix products are emulated), or None.
    ``flags``: the CPU's (default: this machine's; unknown flags give no notice)."""
    if cfg.model.dtype != "bfloat16" or not trains_on_cpu(cfg):
        return None
    flags = cpu_flags() if flags is None else flags
    if flags is None or flags & BF16_FLAGS:
        return None
    return (
        "[zbrl] model.dtype=bfloat16 trains on a CPU without AVX512-BF16 or AMX instructions: "
        "its bfloat16 matrix products are emulated, likely slower than float32; set "
        "model.dtype=float32 for speed here (docs/precision.md)"
    )
