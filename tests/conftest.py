import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# One torch thread, in this process and the processes the tests start (inherited): the tests'
# models are tiny, and on a 2-core machine shared with Ray workers and other processes two
# threads per process wait on each other. Measured on the shared 2-core build machine (load ~16):
# three tests of test_consumer.py took 26.0 s of calls with torch's default threads, 1.5 s with one.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _has_vllm() -> bool:
    from zbrl.rollout.backends.vllm.backend import vllm_available

    return vllm_available()


def _has_trl() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None


def pytest_collection_modifyitems(config, items):
    skips = {}
    if not _has_trl():
        skips["peers"] = pytest.mark.skip(reason="needs TRL (make setup-peers)")
    if not _has_cuda():
        skips["gpu"] = pytest.mark.skip(reason="needs a CUDA GPU")
    if not _has_vllm():
        skips["vllm"] = pytest.mark.skip(reason="needs vLLM (make test-vllm)")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            if getattr(config.option, "loadgroup", False):  # an xdist worker, --dist loadgroup
                name_the_group(item, group)
        if "serial" in item.keywords and running_in_parallel(config):
            item.add_marker(pytest.mark.skip(reason=SERIAL_SKIP))


FILE_SCOPES = {"module", "class"}
"""Scopes of fixtures built once for a test file (or a class in it)."""

SERIAL_SKIP = (
    "marked serial: it reads the machine's load, so it runs without pytest-xdist "
    "(make test-slow runs it after the parallel part)"
)


def xdist_group(item: pytest.Item) -> str | None:
    """The pytest-xdist group (`--dist loadgroup`) of a test: its file's (its directory's for a
    package-scoped fixture) when it uses a fixture built once for the file (a spawned
    distributed run, a trained model, a vLLM engine), so that the fixture is built once, on one
    worker; None otherwise, and the worker that is free next takes the test.

    Tests that start a local Ray (marked ``integration``) are grouped like any other: each local
    Ray binds ports the OS picks (``zbrl.launch.ray_setup.start_local_ray``), keeps its files in
    a session directory of its own and reserves the CPUs it is given, not the machine's, and
    the processes a test watches are found below its own run's pid (``helpers.procs``), so two
    at once on two workers only share the cores."""
    path = item.nodeid.split("::")[0]
    # pytest keeps a test function's fixtures (the ones it asks for and theirs) in _fixtureinfo
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    scopes = {fixturedef.scope for fixturedefs in defs for fixturedef in fixturedefs}
    if "package" in scopes:
        return path.rsplit("/", 1)[0]
    if scopes & FILE_SCOPES:
        return path
    return None


def name_the_group(item: pytest.Item, group: str) -> None:
    """Append ``@group`` to the test's id, which is what pytest-xdist's loadgroup scheduler groups
    by. pytest-xdist 3.8 does that itself by setting ``item._nodeid``, which pytest 9.2 no longer
    reads (its node ids are structured, ``item._id``): with it alone no test was grouped
    (pytest-xdist issue #1386), and test_data_parallel.py's spawned DDP pair was built on both
    workers (2 x 200 s of setup at load 20). Nothing is appended where the id has it already."""
    from _pytest.nodeid import NodeId

    if not item.nodeid.endswith(f"@{group}"):
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


def running_in_parallel(config: pytest.Config) -> bool:
    """Whether this session hands its tests to pytest-xdist workers (``-n 2``)."""
    numprocesses = getattr(config.option, "numprocesses", None)
    return bool(numprocesses) or hasattr(config, "workerinput")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised embedded model directory (built once per test session)."""
    from zbrl.embedded.tiny_model import create_embedded_model

    return create_embedded_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def task_files(tmp_path_factory):
    from zbrl.embedded.addition_task import write_task

    return write_task(tmp_path_factory.mktemp("task"), n_train=64, n_eval=16, seed=3)


@pytest.fixture(scope="session")
def run_cache(tmp_path_factory) -> Path:
    """The ``logging.cache_dir`` shared by the tests' runs (in this process or a subprocess): the
    first run builds the synthetic task and the warm start there, the others reuse them (runs
    with ``model.warm_start.steps`` = ``helpers.runs.WARM_START_STEPS`` and seed 0 share
    one warm start). A test that needs a cold cache makes its own."""
    return tmp_path_factory.mktemp("run-cache")
