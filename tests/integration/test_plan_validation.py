"""``zbrl plan`` against a real run: plan 2 producers x 1 consumer from a short real 1x1 run on a
local Ray (loopback only, the embedded model), run 2x1 for real, and compare.

This test guards the planner against being grossly wrong (a second producer ignored, the cores'
sharing dropped, rates read from the wrong window), not against the tight bounds of issue 12
(samples/s within 15%, idle shares within 5 points): those are timings on a shared machine, and
timed bounds belong in ``bench/plan_validation.py``, which prints the table with repeats and
medians (results: docs/performance.md). Here one pair of 6-second runs on a shared 2-core machine
is noisy: over a dozen pairs the throughput error spread over -10%..+14% and the consumer's idle
error over -5.8..+6.4 points, its sign changing between CI runs (+5.4, +4.1, +3.0 at e8f4dfd;
-5.0, -4.5, -5.8 at ebbf348), so a bound of 5 points failed CI on noise alone. The guard bounds
(``GUARD_THROUGHPUT``, ``GUARD_IDLE``) are about twice that spread. On 2 cores the demo is
bound by its consumer, so 1x1 and 2x1 train about as fast (docs/performance.md); what a second
producer changes is the producers' idle share, 20% at 1x1 against 55% at 2x1, so a planner that
ignored it would miss by some 35 points and fail.
"""

import os
from pathlib import Path

import pytest

from zbrl.config import load_config
from zbrl.launch.driver import run_training
from zbrl.planning import read_rates, simulate
from zbrl.planning.compare import Comparison, measured_figures, predicted_figures, render_table
from zbrl.planning.simulate import measured_shape

# its own Ray per run and its own 20-step warm start, as when its bounds were measured (no
# local_ray, no run_cache): on the shared Ray with the tests' 5-step warm start, one run of this
# test missed the idle bounds by 2 points (load 9-18; which change did it was not isolated).
# serial: it plans for the background load it measures, so no other test runs beside it
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo.yaml"
STEPS = 30
GUARD_THROUGHPUT = 0.25
"""Largest relative error of the predicted samples/s this test accepts (the bench's bound: 15%)."""
GUARD_IDLE = 0.12
"""Largest error of a predicted idle share, in points, this test accepts (the bench's: 5)."""
LOAD_CHANGE = 1.0
"""Largest change of the background load between the two runs (other processes competing for
the cores) under which the comparison says something about the planner: it predicts for the
load it measured in the 1x1 run (``--background-load run``)."""
CORES = os.cpu_count() or 1


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def run(run_dir: Path, cache: Path, producers: int) -> None:
    cfg = load_config(
        DEMO,
        [
            f"logging.run_dir={run_dir}",
            f"logging.cache_dir={cache}",
            "logging.progress=false",
            "logging.save_final=false",
            "model.warm_start.steps=20",
            "eval.sets={}",
            "transport.max_staleness=1",  # what the bounds below and performance.md's tables use
            f"training.max_steps={STEPS}",
            f"launch.num_producers={producers}",
            "launch.producer_num_cpus=0.5",
            "launch.consumer_num_cpus=0.5",
        ],
    )
    run_training(cfg)


def pair(root: Path, cache: Path) -> tuple[Comparison, float, float | None]:
    """Plan 2x1 from a real 1x1 run, run 2x1: the comparison and both runs' background loads."""
    base, target = root / "1x1", root / "2x1"
    run(base, cache, producers=1)
    rates = read_rates(base, CORES)  # the machine's cores, shared: CPU times and background
    shape = measured_shape(
        rates, producers=2, consumers=1, cores=CORES, dp_efficiency=0.9, steps=200, seed=0
    )
    prediction = simulate(rates, shape)
    assert prediction.max_staleness <= 1
    run(target, cache, producers=2)
    load = read_rates(target, CORES).background_load
    c = Comparison("2x1", predicted_figures(prediction), measured_figures(target, rates.group_size))
    return c, shape.background_load, load


def test_a_plan_from_a_real_1x1_run_predicts_a_real_2x1_run(tmp_path, cache):
    c, planned_load, load = pair(tmp_path / "pair", cache)
    table = render_table([c])
    print(table)
    if load is not None and abs(load - planned_load) > LOAD_CHANGE:
        # on a busy shared machine the load moved between the runs: the plan's premise is gone
        pytest.skip(f"background load {planned_load:.2f} -> {load:.2f} between the runs")
    assert c.measured["mean_staleness"] <= 1
    errors = {
        "samples_per_s": abs(c.throughput_error) <= GUARD_THROUGHPUT,
        "producer_idle_frac": abs(c.idle_error("producer")) <= GUARD_IDLE,
        "consumer_idle_frac": abs(c.idle_error("consumer")) <= GUARD_IDLE,
    }
    assert errors == dict.fromkeys(errors, True), table
