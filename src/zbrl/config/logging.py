"""Where results go and how often."""

from __future__ import annotations

from pydantic import Field

from zbrl.config.base import Section


class LoggingConfig(Section):
    """Run directory, checkpoints and metric sinks."""

    run_dir: str = "runs/{name}"
    """Output directory; ``{name}`` is replaced by the run name."""
    cache_dir: str = ".cache/zbrl"
    """Cache of built artefacts: the embedded model and task, warm starts, GGUF files converted
    to Hugging Face directories (``gguf/``) and models put there by ``zbrl models pull``
    (``models/``)."""
    save_interval: int = Field(default=100, ge=0)
    """Save a resumable checkpoint (HF weights + optimizer, RNG, buffer and sampler state) every
    N training steps (0: only at the end and when interrupted)."""
    save_keep: int = Field(default=3, ge=0)
    """Keep the newest N checkpoints, deleting older ones (0 keeps all)."""
    save_final: bool = True
    """Save a resumable checkpoint at the end of the run (one is always written when the run is
    interrupted)."""
    log_rollout_interval: int = Field(default=20, ge=0)
    """Append decoded samples to rollouts.jsonl every N steps (0 disables)."""
    rollouts_per_log: int = Field(default=4, ge=1)
    """Groups decoded into rollouts.jsonl each time."""
    wandb: bool = False
    """Log metrics to Weights & Biases (needs the ``wandb`` extra: ``pip install 'zbrl[wandb]'``,
    and ``wandb login``); a run asking for it without the package is refused before it starts."""
    wandb_project: str = "zbrl"
    """Weights & Biases project."""
    tensorboard: bool = False
    """Log metrics to TensorBoard under RUN_DIR/tb (needs the ``tensorboard`` extra:
    ``pip install 'zbrl[tensorboard]'``); a run asking for it without the package is refused
    before it starts."""
    progress: bool = True
    """Show a progress bar on the driver."""
