"""Short runs on a local Ray: on-policy distillation from the embedded teacher (teacher
log-probs reach the trainer, its calls and accuracy reach the summary), and exact behaviour
log-probs (``mismatch_abs_logp`` is 0 at every step of the demo)."""

import json
from pathlib import Path

import pytest

from helpers.runs import WARM_START_STEPS
from zbrl.config import load_config
from zbrl.launch.driver import run_training

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SHORT = [
    "logging.progress=false",
    f"model.warm_start.steps={WARM_START_STEPS}",
    "data.synthetic.num_train=200",
    "rollout.generation.max_new_tokens=16",
    "rollout.generation.num_generations=4",
    "rollout.inference_batch_size=2",
    "rollout.inference_microbatch_size=2",
    "training.train_batch_size=2",
    "training.train_microbatch_size=8",
    "training.max_steps=4",
]


def step_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if "loss" in m]


def test_short_distillation_run(tmp_path, run_cache):
    cfg = load_config(
        RECIPES / "demo_distill.yaml",
        [
            *SHORT,
            f"logging.run_dir={tmp_path / 'run'}",
            f"logging.cache_dir={run_cache}",
            f"algorithm.distill.teacher_warm_start.steps={2 * WARM_START_STEPS}",
            "eval.max_prompts=8",
            "eval.interval=0",
        ],
    )
    summary = run_training(cfg)
    assert summary["steps"] == 4
    steps = step_metrics(Path(summary["run_dir"]))
    assert all(m["distill/reverse_kl"] != 0.0 for m in steps)
    teacher = summary["teacher"]
    assert teacher["name"] == "embedded" and teacher["calls"] >= 4
    assert teacher["tokens"] > 0 and teacher["failed_calls"] == 0
    assert 0.0 <= summary["eval_accuracy_teacher"] <= 1.0
    assert summary["eval_accuracy_teacher"] == teacher["eval"]["heldout"]["accuracy"]


def test_demo_with_exact_logprobs_has_no_mismatch(tmp_path, run_cache):
    cfg = load_config(
        RECIPES / "demo.yaml",
        [
            *SHORT,
            f"logging.run_dir={tmp_path / 'run'}",
            f"logging.cache_dir={run_cache}",
            "eval.sets={}",
            "rollout.exact_logprobs=true",
        ],
    )
    summary = run_training(cfg)
    steps = step_metrics(Path(summary["run_dir"]))
    assert len(steps) == 4
    assert [m["mismatch_abs_logp"] for m in steps] == [0.0] * 4
    assert any(m["mismatch_ratio_max"] == 1.0 for m in steps)  # same-weight tokens were there
