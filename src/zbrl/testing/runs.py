"""Settings shared by the tests' tiny end-to-end runs."""

from __future__ import annotations

WARM_START_STEPS = 5
"""``model.warm_start.steps`` of every tiny run in the tests: with the demo recipe's other
warm-start settings and seed 0, one warm start, built once in the session's shared cache
directory (the ``run_cache`` fixture), serves them all."""
