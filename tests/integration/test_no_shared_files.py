"""A cluster whose nodes share no files: the second node runs in a mount namespace of its own,
with an empty tmpfs over the directory that holds the run, the cache (the warm start) and
everything else the driver wrote, and another working directory. The workers all land on that
node (the head has no CPUs): they get the model through the object store, their checkpoints,
eval files and uid log reach the head's run directory, and `zbrl resume` on the head continues
from the checkpoint written at SIGINT.

Needs ``unshare --mount`` (root, or a user namespace): skipped where the machine refuses it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from endless_run import endless_tiny_run

from helpers.cli_process import BOUND_S, finish, start
from helpers.clusters import CLUSTER_SCRIPT, read_answer, start_cluster, stop_tree
from helpers.procs import descendants, kill_tree, process_name
from zbrl.training.checkpoint import find_latest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEMO = REPO / "recipes" / "demo.yaml"


def can_unshare_mounts() -> bool:
    try:
        done = subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def wait_for_line(path: Path, needle: str, proc: subprocess.Popen, bound_s: float) -> str:
    deadline = time.monotonic() + bound_s
    while True:
        text = path.read_text() if path.is_file() else ""
        if needle in text:
            return text
        assert proc.poll() is None, f"ended before {needle!r}:\n{text[-3000:]}"
        assert time.monotonic() < deadline, f"no {needle!r} within {bound_s}s:\n{text[-3000:]}"
        time.sleep(0.5)


@pytest.fixture
def two_nodes(tmp_path):
    """(address, hidden directory, the second node's process): a head with no CPUs and a second
    node with 2, which sees an empty tmpfs where the head sees ``hidden``."""
    if not can_unshare_mounts():
        pytest.skip("unshare --mount is not permitted here")
    hidden, node_cwd = tmp_path / "head-only", tmp_path / "node2-cwd"
    hidden.mkdir()
    node_cwd.mkdir()
    head = start_cluster(["--workers", "0", "--cpus", "0"], tmp_path / "head.log")
    node = None
    try:
        line = read_answer(head, 180)
        assert line, (tmp_path / "head.log").read_text()[-3000:]
        address = json.loads(line)["address"]
        script = (
            f'mount -t tmpfs zbrl-node2 "{hidden}" && cd "{node_cwd}" && exec "{sys.executable}" '
            f'"{CLUSTER_SCRIPT}" --join {address} --cpus 2'
        )
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
        log = tmp_path / "node2.log"
        with open(log, "w") as out:
            node = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        wait_for_line(log, '{"node": ', node, 120)
        yield address, hidden, node
    finally:
        if node is not None:
            stop_tree(node)  # end of input: the node stops its processes
        stop_tree(head)  # and the helper shuts the head down


def loss_rows(metrics: Path) -> int:
    if not metrics.is_file():
        return 0
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return sum("loss" in r for r in rows)


def test_a_run_on_nodes_sharing_no_files_stops_and_resumes_from_the_head(two_nodes, tmp_path):
    address, hidden, node = two_nodes
    run_dir, cache = hidden / "run", hidden / "cache"
    overrides = [
        *endless_tiny_run(run_dir, cache),
        f"launch.ray_address={address}",
        "launch.num_producers=1",
        "launch.num_consumers=1",
        "eval.interval=2",
        "eval.max_prompts=4",
        "eval.max_new_tokens=4",
    ]
    proc, stderr = start(tmp_path, "train", "train", str(DEMO), *overrides)
    try:
        deadline = time.monotonic() + BOUND_S
        while loss_rows(run_dir / "metrics.jsonl") < 3:
            assert proc.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        kill_tree(proc)
    err = stderr.read_text()
    assert code == 128 + signal.SIGINT, err[-3000:]
    assert f"continue with: zbrl resume {run_dir}" in err

    # the producer and the consumer ran on the second node (the head has no CPUs), which could
    # not see the head's files
    workers = {w["name"]: w for w in json.loads((run_dir / "workers.json").read_text())}
    assert workers["producer-0"]["node_id"] == workers["consumer-0"]["node_id"], workers

    # the stop checkpoint, the uid log and the eval files are on the head
    stopped = find_latest(run_dir / "checkpoints")
    assert stopped is not None and stopped.version >= 3, err[-3000:]
    uids = (run_dir / "trained_uids.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in uids] == list(range(1, stopped.version + 1))
    # the evaluations at the start and at least one more (which steps depends on the evaluator's
    # pace; wherever it ran, its files are on the head)
    evaluated = {p.name for p in (run_dir / "eval").iterdir()}
    assert "0.jsonl" in evaluated and len(evaluated) >= 2, (evaluated, workers)

    # the second node got the warm start through the object store, into its own cache
    raylets = [p for p in descendants(node.pid) if process_name(p) == "raylet"]
    assert raylets, "the second node's raylet is gone"
    its_cache = Path(f"/proc/{raylets[0]}/root") / str(cache).lstrip("/")
    assert any((its_cache / "shipped").iterdir())
    assert not (cache / "shipped").exists()  # nothing of it on the head

    target = stopped.version + 2
    args = ["resume", str(run_dir), f"training.max_steps={target}", "logging.save_final=true"]
    code, err = finish(*start(tmp_path, "resume", *args))
    assert code == 0, err[-3000:]
    assert (
        f"resuming from {stopped.path} (step {stopped.version})"
        in (tmp_path / "resume.stdout").read_text()
    )
    final = find_latest(run_dir / "checkpoints")
    assert final is not None and final.version == target
    uids = (run_dir / "trained_uids.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in uids] == list(range(1, target + 1))
