"""Rollout producers and their inference backends."""

from zbrl.rollout.producer import Producer, ProducerResult, ProducerSettings

__all__ = ["Producer", "ProducerResult", "ProducerSettings"]
