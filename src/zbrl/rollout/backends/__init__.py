"""Inference backends."""

from zbrl.rollout.backends.base import Completion, InferenceBackend, SamplingParams

__all__ = ["Completion", "InferenceBackend", "SamplingParams"]
