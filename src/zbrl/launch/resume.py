"""``zbrl resume RUN_DIR``: continue a run from its newest complete checkpoint.

The run's saved ``config.yaml`` is the config, with the user's overrides on top (a higher
``training.max_steps``, a new learning rate...). Overrides that resume cannot honour — another
model or tokenizer, other data, another group size or number of producers (their shards would
change), another seed — are refused, naming each field with its saved and requested values.
Everything is checked before anything in the run dir changes; then the logs that run past the
checkpoint (a crash after it) are cut back to it, so that they continue from there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zbrl.config import RunConfig, load_config
from zbrl.errors import RunError
from zbrl.launch.run_dir import CHECKPOINTS
from zbrl.training.checkpoint import Checkpoint, CheckpointError, find_latest

FIXED_ON_RESUME = (
    "model",
    "data.train_path",
    "data.source",
    "data.synthetic",
    "data.max_prompts",
    "data.shuffle",
    "data.seed",
    "seed",
    "rollout.generation.num_generations",
    "launch.num_producers",
    "launch.num_consumers",
    "training.train_batch_size",
)
"""Fields a resumed run must keep (dotted paths into the resolved config)."""
STEP_LOGS = ("metrics.jsonl", "trained_uids.jsonl", "rollouts.jsonl")
"""JSONL logs whose lines carry a ``step``; cut back to the checkpoint on resume."""


class ResumeError(RunError):
    """The run cannot be resumed as asked; the message names the path or field and the fix."""


def plan_resume(run_dir: Path, overrides: list[str]) -> tuple[RunConfig, Checkpoint]:
    """The config to continue with and the checkpoint to continue from; nothing is modified."""
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ResumeError(
            f"{run_dir} is not a zbrl run directory ({config_path} is missing); give the "
            "directory a `zbrl train` run wrote"
        )
    saved = load_config(config_path, [])
    cfg = load_config(config_path, [*overrides, f"logging.run_dir={run_dir}"])
    check_compatible(saved, cfg, config_path)
    checkpoint = find_latest(run_dir / CHECKPOINTS)
    if checkpoint is None:
        raise CheckpointError(
            f"{run_dir / CHECKPOINTS} holds no complete checkpoint to resume from; start a new "
            f"run with `zbrl train` (logging.save_interval sets how often checkpoints are saved)"
        )
    return cfg, checkpoint


def check_compatible(saved: RunConfig, cfg: RunConfig, config_path: Path) -> None:
    """Refuse overrides that change a field in :data:`FIXED_ON_RESUME`."""
    old, new = saved.model_dump(mode="json"), cfg.model_dump(mode="json")
    changed = []
    for dotted in FIXED_ON_RESUME:
        before, after = _at(old, dotted), _at(new, dotted)
        if before != after:
            changed.append(
                f"{dotted}: {json.dumps(before)} in {config_path}, now {json.dumps(after)}"
            )
    if changed:
        raise ResumeError(
            "resume cannot change " + "; ".join(changed) + ". Drop those overrides, or start a "
            "new run with `zbrl train` (optionally from a checkpoint's weights: model.path=DIR)"
        )


def truncate_logs(run_dir: Path, step: int) -> None:
    """Drop the lines of the step logs that lie past ``step`` (written after the checkpoint)."""
    for name in STEP_LOGS:
        path = run_dir / name
        if not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _kept(_step_of(line), step)]
        if len(kept) != len(lines):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            tmp.replace(path)


def _kept(line_step: int | None, step: int) -> bool:
    return line_step is not None and line_step <= step


def _step_of(line: str) -> int | None:
    """The line's step; None for a line that is not a JSON object with one (a torn last line)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _at(data: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data
