"""Overrides of a tiny run that would go on far longer than a fault or network test watches it:
such a test inspects or breaks the run while it trains and then kills it."""

from __future__ import annotations

from pathlib import Path

from helpers.runs import WARM_START_STEPS


def endless_tiny_run(run_dir: Path, cache_dir: Path) -> list[str]:
    return [
        f"logging.run_dir={run_dir}",
        f"logging.cache_dir={cache_dir}",
        "logging.progress=false",
        "logging.save_final=false",
        f"model.warm_start.steps={WARM_START_STEPS}",
        "data.synthetic.num_train=64",
        "data.num_epochs=1000",  # far longer than the test lets it run
        "rollout.generation.max_new_tokens=8",
        "rollout.generation.num_generations=2",
        "rollout.inference_batch_size=2",
        "rollout.inference_microbatch_size=2",
        "training.train_batch_size=2",
        "training.train_microbatch_size=4",
        "training.max_steps=1000000",
    ]
