"""The tiny model families end to end: a DDP and an FSDP2 step on two gloo ranks equal one
process (MoE router loss and hybrid caches included), and ``zbrl train`` on the demo with a
Qwen3.5 model directory, packed (refused before the run directory) and not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.data_parallel import Case, run_case, run_distributed
from zbrl.testing.model_families import create_family_dir

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo.yaml"
STEP = Case("family", ("training.train_microbatch_size=2", "algorithm.lr=1e-4"), 3, seed=5)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    """The families, the MoE one with its router loss out of the objective (still measured):
    a micro-batch's load-balancing loss is not a sum over its tokens, so it depends on how rows
    fall into micro-batches, which differs between one process and two ranks."""
    root = tmp_path_factory.mktemp("families")
    dirs = {f: create_family_dir(f, root / f) for f in ("qwen3_moe", "qwen3_5_text")}
    config_path = dirs["qwen3_moe"] / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "router_aux_loss_coef": 0.0}))
    return dirs


@pytest.mark.multiprocess
@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_text"])
def test_two_ranks_match_one_process(family_dirs, tmp_path, engine, family):
    want = run_case(STEP, "single", 1, family_dirs[family])
    got = run_distributed(engine, [STEP], family_dirs[family], tmp_path / "results.pt")[STEP.name]
    for g, w in zip(got["grads"], want["grads"], strict=True):
        assert g.keys() == w.keys()
        for name, ref in w.items():
            torch.testing.assert_close(g[name], ref, atol=1e-6, rtol=0, msg=f"{engine} {name}")
    for key in ("loss", "num_tokens"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], abs=1e-5), key
    if family == "qwen3_moe":  # measured per micro-batch, which the ranks cut differently
        assert got["metrics"]["router_aux_loss"] == pytest.approx(
            want["metrics"]["router_aux_loss"], rel=1e-2
        )


def _train(tmp_path: Path, model_dir: Path, run_dir: Path, *extra: str):
    overrides = [
        f"model.path={model_dir}",
        "data.allow_embedded_task_with_user_model=true",
        "training.max_steps=3",
        f"logging.run_dir={run_dir}",
        *extra,
    ]
    return subprocess.run(
        [sys.executable, "-m", "zbrl.cli", "train", str(DEMO), *overrides],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )


def test_qwen3_5_trains_the_demo_and_packing_is_refused_before_the_run(family_dirs, tmp_path):
    run_dir = tmp_path / "run"
    done = _train(tmp_path, family_dirs["qwen3_5_text"], run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    mismatch = [r["mismatch_abs_logp"] for r in rows if "mismatch_abs_logp" in r]
    assert mismatch and max(mismatch) < 5e-3

    packed_dir = tmp_path / "packed"
    refused = _train(tmp_path, family_dirs["qwen3_5_text"], packed_dir, "training.packing=true")
    assert refused.returncode != 0
    errors = [x for x in refused.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "'linear_attention'" in errors[0], refused.stderr[-2000:]
    assert not packed_dir.exists()
