"""`zbrl resume` planning: the saved config plus overrides, refusals that name what differs, and
nothing in the run dir touched before every check passed."""

from __future__ import annotations

import json
import os
import signal
import warnings

import pytest
import torch

from zbrl.cli import DEMO_RECIPE, main
from zbrl.config import load_config, resolved_yaml
from zbrl.launch.resume import (
    FIXED_ON_RESUME,
    ResumeError,
    _at,
    plan_resume,
    truncate_logs,
)
from zbrl.launch.run_dir import RunDirHasCheckpoints, claim_run_dir
from zbrl.launch.signals import Interrupted, StopSignals
from zbrl.training.checkpoint import (
    CheckpointError,
    IncompleteCheckpointWarning,
    save_checkpoint,
)


class Weights:
    rank = 0

    def save_pretrained(self, directory) -> None:
        torch.save({"w": torch.ones(4)}, directory / "weights.pt")


def make_run(tmp_path, steps=()):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(DEMO_RECIPE, [f"logging.run_dir={run_dir}"])
    (run_dir / "config.yaml").write_text(resolved_yaml(cfg))
    for step in steps:
        save_checkpoint(Weights(), None, run_dir / "checkpoints" / f"step-{step}", state={})
    return run_dir


def snapshot(run_dir):
    return {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_resume_takes_the_saved_config_with_overrides_and_the_newest_checkpoint(tmp_path):
    run_dir = make_run(tmp_path, steps=(4, 8))
    cfg, checkpoint = plan_resume(run_dir, ["training.max_steps=900", "algorithm.lr=0.5"])
    assert checkpoint.version == 8 and checkpoint.path == run_dir / "checkpoints" / "step-8"
    assert cfg.training.max_steps == 900 and cfg.algorithm.lr == 0.5
    assert cfg.run_dir == str(run_dir)


def test_every_fixed_field_exists_in_the_config():
    data = load_config(DEMO_RECIPE, []).model_dump(mode="json")
    optional = ("data.max_prompts", "data.source")  # None in the demo recipe
    assert all(
        _at(data, dotted) is not None for dotted in FIXED_ON_RESUME if dotted not in optional
    )


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("rollout.generation.num_generations=16", "rollout.generation.num_generations: 8"),
        ("launch.num_producers=3", "launch.num_producers: 1"),
        ("seed=99", "seed: "),
        ("model.dtype=float32", "model: "),
    ],
)
def test_resume_refuses_what_it_cannot_honour_and_touches_nothing(tmp_path, override, field):
    run_dir = make_run(tmp_path, steps=(4,))
    before = snapshot(run_dir)
    with pytest.raises(ResumeError, match="resume cannot change") as err:
        plan_resume(run_dir, [override])
    assert field in str(err.value) and str(run_dir / "config.yaml") in str(err.value)
    assert snapshot(run_dir) == before


def test_resume_without_a_checkpoint_or_a_config_names_the_path(tmp_path, capsys):
    run_dir = make_run(tmp_path)
    with pytest.raises(CheckpointError, match=f"{run_dir / 'checkpoints'} holds no complete"):
        plan_resume(run_dir, [])
    assert main(["resume", str(tmp_path / "nowhere")]) == 1
    assert f"{tmp_path / 'nowhere'} is not a zbrl run directory" in capsys.readouterr().err


def test_logs_are_cut_back_to_the_checkpoint(tmp_path):
    log = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "loss": 0.1}) + "\n" for s in range(1, 8)]
    log.write_text("".join(rows) + '{"step": 8, "lo')  # and a torn last line
    truncate_logs(tmp_path, 5)
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_train_into_a_run_dir_with_checkpoints_is_refused_naming_both_ways_out(tmp_path):
    run_dir = make_run(tmp_path, steps=(4,))
    with pytest.raises(RunDirHasCheckpoints) as err:
        claim_run_dir(run_dir)
    assert f"zbrl resume {run_dir}" in str(err.value) and "logging.run_dir=PATH" in str(err.value)
    sibling, lock = claim_run_dir(run_dir, sibling_if_used=True)  # what `zbrl demo` does
    lock.release()
    assert sibling != run_dir and sibling.name.startswith("run-")


def test_first_signal_asks_to_stop_and_the_second_exits_at_once():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # whatever an earlier test left
    try:
        _first_signal_stops_second_exits()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # restored on leaving
    finally:
        signal.signal(signal.SIGINT, before)


def _first_signal_stops_second_exits():
    with StopSignals() as signals:
        with pytest.raises(Interrupted):  # outside the graceful phase: at once
            os.kill(os.getpid(), signal.SIGTERM)
        with signals.graceful():
            os.kill(os.getpid(), signal.SIGINT)
            assert signals.requested and signals.name == "SIGINT"
            with pytest.raises(Interrupted) as second:
                os.kill(os.getpid(), signal.SIGINT)
        assert second.value.signum == signal.SIGINT


def test_resume_with_only_a_corrupt_checkpoint_says_so_and_touches_nothing(tmp_path, capsys):
    run_dir = make_run(tmp_path, steps=(6,))
    weights = run_dir / "checkpoints" / "step-6" / "weights.pt"
    weights.write_bytes(weights.read_bytes()[:10])
    before = snapshot(run_dir)
    with pytest.warns(IncompleteCheckpointWarning) as caught:
        assert main(["resume", str(run_dir)]) == 1
    (warning,) = caught
    assert f"skipping {run_dir / 'checkpoints' / 'step-6'} is incomplete" in str(warning.message)
    shown = warnings.formatwarning(warning.message, warning.category, "f.py", 1)
    assert shown.startswith("warning: skipping ")  # one plain line on the command line
    assert "holds no complete checkpoint to resume from" in capsys.readouterr().err
    assert snapshot(run_dir) == before
