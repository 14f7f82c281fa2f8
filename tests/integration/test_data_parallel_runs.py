"""One producer and two data-parallel consumers (DDP and FSDP2) train end to end on a local Ray
(loopback only; the consumers' gloo group meets on 127.0.0.1) with the embedded tiny model."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers.runs import WARM_START_STEPS
from zbrl.assembly.artifacts import prepare_artifacts
from zbrl.config import load_config
from zbrl.launch.driver import RunFailed, run_training
from zbrl.telemetry.report import render_report

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo.yaml"


@pytest.fixture
def cache(run_cache):
    return run_cache


def tiny_overrides(run_dir, cache, engine):
    return [
        f"logging.run_dir={run_dir}",
        f"logging.cache_dir={cache}",
        "logging.progress=false",
        f"model.warm_start.steps={WARM_START_STEPS}",
        "data.synthetic.num_train=200",
        "eval.sets={}",
        "rollout.generation.max_new_tokens=16",
        "rollout.generation.num_generations=4",
        "rollout.inference_batch_size=2",
        "rollout.inference_microbatch_size=2",
        "reward.soft_overlong_punishment=true",  # rewards differ inside groups from the start
        "reward.cache_length=12",
        "training.train_batch_size=2",
        "training.train_microbatch_size=4",
        "training.max_steps=3",
        "transport.max_staleness=1",
        "launch.num_consumers=2",
        f"training.engine={engine}",
        "launch.producer_num_cpus=0.5",
        "launch.consumer_num_cpus=0.5",
    ]


# FSDP2 end to end in the slow tier; tests/unit/test_data_parallel.py checks both engines' steps
# both in the slow tier: the fast tier keeps the DDP numerics on spawned ranks (test_data_parallel)
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_one_producer_two_consumers_train_within_the_staleness_bound(tmp_path, cache, engine):
    run_dir = tmp_path / "run"
    cfg = load_config(DEMO, tiny_overrides(run_dir, cache, engine))
    summary = run_training(cfg)
    assert summary["steps"] == 3
    assert summary["samples_trained"] == 3 * 2 * 4  # each batch counted once, not per rank
    # rank 0 alone reports each step; every step within the staleness bound
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert sorted(m["step"] for m in steps) == [1, 2, 3]
    assert all(0 <= m["staleness_max"] <= 1 for m in steps)
    assert all(m["trained_tokens"] > 0 for m in steps)
    # both ranks trained every step
    spans = [json.loads(x) for x in (run_dir / "timeline.jsonl").read_text().splitlines()]
    trained = {(s["worker"], s["name"]) for s in spans if s["name"] == "train_step"}
    assert trained == {("consumer-0", "train_step"), ("consumer-1", "train_step")}
    report = render_report(run_dir)
    assert "consumer-0" in report and "consumer-1" in report and "producer-0" in report
    # rank 0 wrote a loadable checkpoint that moved away from the start
    final = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step-3")
    start = AutoModelForCausalLM.from_pretrained(prepare_artifacts(cfg, verbose=False).model_dir)
    assert final.config.architectures == ["LlamaForCausalLM"]
    assert any(not torch.equal(v, start.state_dict()[k]) for k, v in final.state_dict().items())
    assert not list((run_dir / "checkpoints").glob("*.partial"))


@pytest.mark.slow
def test_a_consumer_failing_mid_step_ends_the_run_with_its_name(tmp_path, cache):
    # rank 1 raises in its first step while rank 0 waits for it in a collective: the run must end
    # (not hang until the group's timeout) and name consumer-1 and the cause
    overrides = [
        *tiny_overrides(tmp_path / "run", cache, "ddp"),
        "algorithm.advantage=zbrl.testing.faults:failing_on_rank1_advantage",
    ]
    with pytest.raises(RunFailed, match="consumer-1 failed: InjectedFault: injected consumer"):
        run_training(load_config(DEMO, overrides))
