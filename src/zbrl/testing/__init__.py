"""Helpers for testing zbrl and runs built on it (fault injection)."""
