"""transformers without its per-file progress bars and info logs, in every process of zbrl that
loads it (the driver, the workers, the warm-start build)."""

from __future__ import annotations


def quiet_transformers() -> None:
    """No per-file progress bars from transformers in worker logs; errors only."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
