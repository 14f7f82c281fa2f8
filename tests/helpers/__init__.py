"""The harness the tests share, imported as ``helpers.<module>`` from every test directory
(``pythonpath`` in pyproject.toml puts ``tests/`` on the path). Processes started with
multiprocessing's spawn inherit the test process's path; Ray workers and ``zbrl`` subprocesses do
not, so what a run's config names by module path lives in :mod:`zbrl.testing` instead."""
