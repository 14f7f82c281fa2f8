"""Scalar metrics sinks: JSON lines (always), TensorBoard and Weights & Biases (optional).

Every sink takes ``log(step, {name: float})`` and ``close()``. ``JsonlSink`` writes
``RUN_DIR/metrics.jsonl``, one object per call: ``{"step": n, "time": unix_seconds, name: value,
...}``, values as floats, non-finite values (NaN, ±inf) as ``null`` so the file stays strict JSON.
TensorBoard and wandb are zbrl extras (``pip install 'zbrl[tensorboard]'`` / ``'zbrl[wandb]'``),
imported only when their sink is built; a missing package is an ``ImportError`` that names the
extra. A run checks for them before it starts (:mod:`zbrl.launch.preflight`), so these errors
are for direct use of the sinks.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from zbrl.errors import RunError

METRICS_FILE = "metrics.jsonl"
_RESERVED = ("step", "time")


@runtime_checkable
class MetricsSink(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def to_float(name: str, value: Any) -> float:
    """``float(value)`` (accepts Python/numpy/0-d torch numbers) with an error naming the metric."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"metric {name!r} must be a number, got {type(value).__name__}: {value!r}"
        ) from None


class JsonlSink:
    """Appends one JSON object per ``log`` call to ``RUN_DIR/metrics.jsonl`` (flushed each call)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._file: IO[str] | None = None

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        row: dict[str, Any] = {"step": int(step), "time": time.time()}
        for name, value in metrics.items():
            if name in _RESERVED:
                raise ValueError(f"metric name {name!r} is reserved in {METRICS_FILE}; rename it")
            x = to_float(name, value)
            row[name] = x if math.isfinite(x) else None
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of ``RUN_DIR/metrics.jsonl`` in file order; ``[]`` when the file does not exist.

    ``step`` comes back as an int, every other value as a float, ``null`` as ``nan``. An
    unterminated last line (a run killed mid-write) is skipped; any other bad line is a
    ``ValueError`` naming file and line.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            row = {"step": int(raw["step"])}
            for k, v in raw.items():
                if k != "step":
                    row[k] = math.nan if v is None else float(v)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            if lineno == len(lines) and not text.endswith("\n"):
                continue
            raise ValueError(f"{path}:{lineno}: not a metrics record: {e!r}") from None
        rows.append(row)
    return rows


class TensorBoardSink:
    """Scalars to TensorBoard event files under ``log_dir`` (needs the ``tensorboard`` package)."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                "TensorBoardSink needs the 'tensorboard' package: install zbrl's tensorboard "
                f"extra (pip install 'zbrl[tensorboard]'), or set logging.tensorboard=false ({e})"
            ) from e
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, to_float(name, value), global_step=int(step))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Scalars to a Weights & Biases run (needs the ``wandb`` package)."""

    def __init__(
        self, project: str, run_name: str | None = None, config: Mapping[str, Any] | None = None
    ) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "WandbSink needs the 'wandb' package: install zbrl's wandb extra "
                f"(pip install 'zbrl[wandb]'), or set logging.wandb=false ({e})"
            ) from e
        try:
            self._run = wandb.init(project=project, name=run_name, config=dict(config or {}))
        except Exception as e:  # wandb's own errors (no API key, no network) have no common base
            raise RunError(
                f"logging.wandb=true, but wandb.init failed ({type(e).__name__}: {e}); log in "
                "with `wandb login` (or set WANDB_API_KEY), set WANDB_MODE=offline to log "
                "locally, or set logging.wandb=false"
            ) from None

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log({k: to_float(k, v) for k, v in metrics.items()}, step=int(step))

    def close(self) -> None:
        self._run.finish()


class MultiSink:
    """Fans every call out to several sinks; ``close`` closes all of them even if one fails."""

    def __init__(self, sinks: Iterable[MetricsSink]) -> None:
        self.sinks = list(sinks)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        first_error: BaseException | None = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error
