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
        # with pytest-xdist (`-n 2 --dist loadgroup`) a file's tests run on one worker, so its
        # module-scoped fixtures (a distributed run, a trained model) are built once, and the
        # tests that start a local Ray run one after another on one worker: two Ray clusters at
        # once would each size themselves to the whole machine
        group = "ray" if "integration" in item.keywords else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


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
