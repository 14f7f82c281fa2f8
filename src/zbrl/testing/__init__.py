"""Test parts that a run imports by module path, and so must ship in the product.

A test names these in a run's config (``reward.type=zbrl.testing.faults:failing_reward``,
``algorithm.advantage=zbrl.testing.faults:failing_on_rank1_advantage``,
``environment.type=zbrl.testing.environments:Reply``), and the processes that resolve such a path
are Ray workers and ``zbrl`` CLI subprocesses: they import from the installed package and do not
have ``tests/`` on their path. Everything else the tests share (processes, CLI runs, backends,
data-parallel and handoff harnesses) lives in ``tests/helpers/``.

- :mod:`zbrl.testing.faults`: rewards and advantages that fail or hang on purpose.
- :mod:`zbrl.testing.environments`: environments whose episodes run a known number of turns.
"""
