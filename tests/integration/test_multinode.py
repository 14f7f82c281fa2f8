"""A run on a multi-node Ray cluster (three one-CPU nodes, all on 127.0.0.1): the workers land on
different nodes, weights cross nodes by broadcast, the policy trains; losing a node ends the run
with an error that names the worker that was on it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from endless_run import endless_tiny_run
from transformers import AutoModelForCausalLM

from helpers import cli_process
from helpers.clusters import read_answer, start_cluster, stop_tree
from helpers.procs import kill_tree
from zbrl.assembly.artifacts import prepare_artifacts
from zbrl.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEMO = REPO / "recipes" / "demo.yaml"
BOUND_S = 600.0  # a run's start and training on a loaded 2-core machine
LOSS_BOUND_S = 30.0  # from a node's removal to the run's error (issue 8)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(process, {"address", "head", "workers"}) of a head and two worker nodes, 1 CPU each."""
    log = tmp_path_factory.mktemp("cluster") / "stderr.log"
    proc = start_cluster(["--workers", "2", "--cpus", "1"], log)
    try:
        line = read_answer(proc, 180)
        assert line, f"the cluster did not start:\n{log.read_text()[-3000:]}"
        yield proc, json.loads(line)
    finally:
        stop_tree(proc)  # the helper, its nodes' processes and their workers


def _cluster_overrides(address: str) -> list[str]:
    return [
        f"launch.ray_address={address}",
        "launch.num_producers=2",
        "launch.num_consumers=1",
        "launch.placement=spread",
        "transport.weight_sync.type=broadcast",
        "eval.sets={}",
    ]


def test_a_2x2_run_spreads_over_nodes_and_trains(cluster, tmp_path, run_cache):
    _, info = cluster
    run_dir, cache = tmp_path / "run", run_cache
    overrides = [
        *endless_tiny_run(run_dir, cache),
        *_cluster_overrides(info["address"]),
        "launch.num_consumers=2",  # two data-parallel consumers (one gloo group, packed)
        "training.engine=ddp",
        "launch.producer_num_cpus=0.5",
        "launch.consumer_num_cpus=0.5",
        "training.max_steps=3",
        "logging.save_final=true",
        # length shaping makes rewards differ inside a group even before answers are right
        "reward.soft_overlong_punishment=true",
        "reward.cache_length=4",
        "rollout.generation.num_generations=4",
        "training.train_microbatch_size=8",
    ]
    returncode, err = cli_process.finish(
        *cli_process.start(tmp_path, "train", "train", str(DEMO), *overrides), BOUND_S
    )
    assert returncode == 0, err[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    workers = {w["name"]: w for w in summary["workers"]}
    assert set(workers) == {"producer-0", "producer-1", "consumer-0", "consumer-1"}
    assert workers["consumer-0"]["node_id"] == workers["consumer-1"]["node_id"]  # packed
    nodes = {w["node_id"] for w in workers.values()}
    assert len(nodes) >= 2, workers
    assert nodes <= {info["head"], *info["workers"]}
    assert all(w["node_ip"] == "127.0.0.1" for w in workers.values())
    # it trained: three steps, the producers (on other nodes) loaded broadcast versions, and the
    # final weights differ from the starting ones
    assert summary["steps"] == 3 and summary["samples_trained"] == 3 * 2 * 4
    assert summary["weight_sync_latency_p50_s"] is not None
    final = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step-3")
    start_dir = prepare_artifacts(load_config(DEMO, overrides), verbose=False).model_dir
    start = AutoModelForCausalLM.from_pretrained(start_dir)
    start_state = start.state_dict()
    changed = [k for k, v in final.state_dict().items() if not torch.equal(v, start_state[k])]
    assert changed


def _training_under_way(metrics: Path) -> bool:
    if not metrics.is_file():
        return False
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return any("loss" in r for r in rows)


def test_losing_a_node_ends_the_run_naming_the_worker_on_it(cluster, tmp_path, run_cache):
    proc_cluster, info = cluster
    run_dir = tmp_path / "run"
    overrides = [
        *endless_tiny_run(run_dir, run_cache),
        *_cluster_overrides(info["address"]),
        "launch.max_producer_restarts=0",  # else a lost producer is restarted (if there is room)
        "launch.max_consumer_restarts=0",  # else a lost consumer's restart is tried first
    ]
    proc, stderr = cli_process.start(tmp_path, "train", "train", str(DEMO), *overrides)
    try:
        deadline = time.monotonic() + BOUND_S
        while not _training_under_way(run_dir / "metrics.jsonl"):
            assert proc.poll() is None, f"the run ended early:\n{stderr.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.5)
        workers = json.loads((run_dir / "workers.json").read_text())
        victim = next(n for n in info["workers"] if any(w["node_id"] == n for w in workers))
        lost = {w["name"] for w in workers if w["node_id"] == victim}
        proc_cluster.stdin.write(f"remove {victim}\n")
        proc_cluster.stdin.flush()
        assert read_answer(proc_cluster, 60).strip() == f"removed {victim}"
        deadline = time.monotonic() + LOSS_BOUND_S  # the error must come promptly
        # the driver prints "[zbrl] error: ..." when it sees the failure, "error: ..." at exit
        while not any(
            x.startswith(("error:", "[zbrl] error:")) for x in stderr.read_text().splitlines()
        ):
            assert time.monotonic() < deadline, f"no error {LOSS_BOUND_S}s after the node left"
            time.sleep(0.25)
        returncode = proc.wait(timeout=BOUND_S)  # and the run ends by itself
    finally:
        kill_tree(proc)
    errors = [x for x in stderr.read_text().splitlines() if x.startswith("error:")]
    print(stderr.read_text()[-3000:])  # shown with pytest -s
    assert returncode == 1, stderr.read_text()[-3000:]
    assert len(errors) == 1, stderr.read_text()[-3000:]
    assert any(f"error: {name} " in errors[0] for name in lost), (lost, errors[0])
