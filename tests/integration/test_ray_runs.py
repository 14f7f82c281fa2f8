"""End-to-end runs on a local Ray (loopback only) with the embedded tiny model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers.runs import WARM_START_STEPS
from zbrl.assembly.artifacts import prepare_artifacts
from zbrl.config import load_config
from zbrl.errors import RunError
from zbrl.launch.driver import run_training

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo.yaml"


def small_overrides(tmp_path, cache):
    return [
        f"logging.run_dir={tmp_path / 'run'}",
        f"logging.cache_dir={cache}",
        "logging.progress=false",
        f"model.warm_start.steps={WARM_START_STEPS}",
        "data.synthetic.num_train=200",
        "data.synthetic.num_eval=16",
        "eval.max_prompts=8",
        "rollout.generation.max_new_tokens=16",
        "rollout.generation.num_generations=4",
        "rollout.inference_batch_size=2",
        "rollout.inference_microbatch_size=2",
        "training.train_batch_size=2",
        "training.train_microbatch_size=8",
    ]


@pytest.fixture
def cache(run_cache):
    return run_cache


def test_short_run_trains_saves_and_reports(tmp_path, cache):
    # length shaping makes rewards differ inside groups even before the policy gets answers right
    shaping = ["reward.soft_overlong_punishment=true", "reward.cache_length=12"]
    extra = [*shaping, "training.max_steps=3", "logging.log_rollout_interval=2"]
    cfg = load_config(DEMO, [*small_overrides(tmp_path, cache), *extra])
    summary = run_training(cfg)
    run_dir = tmp_path / "run"
    assert summary["steps"] == 3
    assert summary["samples_trained"] == 3 * 2 * 4
    for key in ("wall_s", "producer_idle_frac", "consumer_idle_frac", "weight_sync_latency_p50_s"):
        assert summary[key] is not None and summary[key] >= 0, key
    assert 0 <= summary["eval_accuracy_initial"] <= 1
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["steps"] == 3
    # checkpoint: HF format, loadable, and different from the starting weights
    final = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step-3")
    start_dir = prepare_artifacts(cfg, verbose=False).model_dir  # the warm start it began from
    start = AutoModelForCausalLM.from_pretrained(start_dir)
    changed = [
        k for k, v in final.state_dict().items() if not torch.equal(v, start.state_dict()[k])
    ]
    assert changed
    # telemetry files
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = sorted(m["step"] for m in metrics if "loss" in m)
    assert train_steps == [1, 2, 3]
    assert any("eval_accuracy" in m for m in metrics)
    names = {json.loads(x)["name"] for x in (run_dir / "timeline.jsonl").read_text().splitlines()}
    assert {"generate", "train_step", "wait_for_data", "publish_weights", "load_weights"} <= names
    trace = json.loads((run_dir / "trace.json").read_text())
    assert trace["traceEvents"]
    assert (run_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run_dir / "eval" / "0.jsonl").is_file() and (run_dir / "eval" / "3.jsonl").is_file()
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and {r["step"] for r in rollouts} == {2}
    assert len(rollouts[0]["responses"]) == 4 and isinstance(rollouts[0]["responses"][0], str)


# the slow tier (make test-slow), with one producer and with two (the partial batch is one
# producer's): each is a whole run of ~18 s
@pytest.mark.slow
@pytest.mark.parametrize("producers", [1, 2])
def test_data_running_out_mid_batch_exits_cleanly(tmp_path, cache, producers):
    overrides = [
        *small_overrides(tmp_path, cache),
        f"launch.num_producers={producers}",
        "launch.producer_num_cpus=0.5",
        "data.max_prompts=5",
        "eval.sets={}",
        "logging.save_final=false",
    ]
    summary = run_training(load_config(DEMO, overrides))
    # 5 prompts in batches of 2: two full batches and the last prompt as a partial batch
    assert summary["steps"] == 3
    assert summary["partial_batches"] == 1
    assert summary["samples_trained"] == 5 * 4
    assert summary["samples_generated"] == 5 * 4


@pytest.mark.slow  # `zbrl train` in a subprocess: its own Ray
def test_injected_producer_failure_ends_run_with_clear_error(tmp_path, cache):
    overrides = [
        *small_overrides(tmp_path, cache),
        "reward.type=zbrl.testing.faults:failing_reward",
        "eval.sets={}",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "zbrl.cli", "train", str(DEMO), *overrides],
        capture_output=True,
        text=True,
        timeout=300,  # the run must end by itself well before this bound
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "producer-0 failed" in proc.stderr
    assert "injected producer failure" in proc.stderr


@pytest.mark.slow  # broadcast end to end (tests/unit/test_broadcast_sync.py: the protocol)
def test_broadcast_weight_sync_run_records_where_workers_ran(tmp_path, cache):
    overrides = [
        *small_overrides(tmp_path, cache),
        "transport.weight_sync.type=broadcast",
        "transport.weight_sync.bucket_mb=0.25",  # several buckets per version
        "launch.num_producers=2",
        "launch.producer_num_cpus=0.5",
        "training.max_steps=3",
        "logging.save_final=false",
    ]
    summary = run_training(load_config(DEMO, overrides))
    assert summary["steps"] == 3
    # the producers and the evaluator (it evaluates the step-3 weights) received broadcasts
    assert summary["weight_sync_latency_p50_s"] is not None
    assert summary["eval_final"] is not None
    workers = {w["name"]: w for w in summary["workers"]}
    assert set(workers) == {"producer-0", "producer-1", "consumer-0", "evaluator"}
    assert {w["role"] for w in workers.values()} == {"producer", "consumer", "evaluator"}
    assert workers["producer-1"]["num_cpus"] == 0.5 and workers["consumer-0"]["num_cpus"] == 1.0
    assert all(w["node_ip"] == "127.0.0.1" and w["pid"] > 0 for w in workers.values())
    saved = json.loads((tmp_path / "run" / "workers.json").read_text())
    assert saved == summary["workers"]


def test_resources_the_cluster_cannot_grant_fail_before_any_worker(tmp_path, cache):
    overrides = [
        *small_overrides(tmp_path, cache),
        "launch.producer_num_gpus=1",  # the local Ray has no GPU
        "launch.placement_timeout_s=3",
        "eval.sets={}",
    ]
    # refused by the pre-flight against the Ray this process runs, before the run directory
    with pytest.raises(
        RunError,
        match=r"need 1 GPU \(launch.num_producers=1 x launch.producer_num_gpus=1\) but the Ray "
        r"this process runs has 0",
    ):
        run_training(load_config(DEMO, overrides))
    assert not (tmp_path / "run").exists()


def test_a_reward_worker_the_cluster_cannot_place_fails_at_start(tmp_path, cache):
    from zbrl.embedded.reward_model import build_tiny_reward_model, save_reward_model
    from zbrl.embedded.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_tiny_reward_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=1)
    rm_dir = save_reward_model(model, tokenizer, tmp_path / "rm")
    overrides = [
        *small_overrides(tmp_path, cache),
        "reward.type=reward_model",
        f"reward.path={rm_dir}",
        "reward.workers=1",
        "reward.worker_num_gpus=1",  # the local Ray has no GPU
        "launch.placement_timeout_s=3",
        "eval.sets={}",
    ]
    with pytest.raises(
        RunError,
        match=r"need 1 GPU \(reward.workers=1 x reward.worker_num_gpus=1\) but the Ray this "
        r"process runs has 0",
    ):
        run_training(load_config(DEMO, overrides))
    assert not (tmp_path / "run").exists()


def test_a_placement_the_cluster_cannot_grant_names_every_group(tmp_path, cache):
    """On a cluster the pre-flight cannot see the resources (they are known once Ray connects):
    there ``reserve`` waits ``launch.placement_timeout_s`` and names what it could not place."""
    from zbrl.launch.placement import reserve

    overrides = [
        *small_overrides(tmp_path, cache),
        "launch.producer_num_gpus=1",  # the local Ray has no GPU
        "reward.type=reward_model",
        "reward.path=unused",  # reserve reads only the worker counts and resources
        "reward.workers=1",
        "reward.worker_num_gpus=1",
        "launch.placement_timeout_s=2",
    ]
    with pytest.raises(
        RunError,
        match=r"did not grant.*1 x \{'CPU': 1.0, 'GPU': 1.0\} \(producers.*"
        r"1 x \{'CPU': 1.0, 'GPU': 1.0\} \(reward workers\).*has \{'CPU': \d.*reward\.workers",
    ):
        reserve(load_config(DEMO, overrides))
    import ray

    assert ray.util.placement_group_table() == {} or all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values()
    )
