"""The workers' typed specs (``zbrl.launch.worker_specs``): each shell and role takes one
frozen spec (the producer its prompts beside it), and a spec missing a field is refused by
name."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from zbrl.launch import worker_specs, workers
from zbrl.launch.shipping import ShippedDir


def _shipped() -> ShippedDir:
    return ShippedDir(path="/m", driver_node="n", fingerprint="f")


def test_each_shell_takes_its_spec_by_type() -> None:
    expected = {
        workers.ProducerWorker: ["spec", "prompts"],
        workers.ConsumerWorker: ["spec", "prompts"],
        workers.EvaluatorWorker: ["spec"],
    }
    for shell, params in expected.items():
        signature = inspect.signature(shell.__init__)
        # Ray adds `_ray_trace_ctx` to a class's __init__ once a test in this process made an
        # actor of it: not one of the shell's own parameters
        own = [p for p in signature.parameters if p != "_ray_trace_ctx"]
        assert own[1:] == params, shell
    annotations = {s: inspect.signature(s.__init__).parameters["spec"].annotation for s in expected}
    assert annotations == {
        workers.ProducerWorker: "ProducerSpec",
        workers.ConsumerWorker: "ConsumerSpec",
        workers.EvaluatorWorker: "EvaluatorSpec",
    }


def test_a_spec_is_frozen_pickles_whole_and_names_a_missing_field() -> None:
    spec = worker_specs.ConsumerSpec(
        cfg_data={"seed": 1}, index=1, model=_shipped(), reference=_shipped(),
        tokenizer=_shipped(), run_dir="/r", total_steps=5, buffer="b", store="s", hub="h",
    )  # fmt: skip
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert spec.group is None and spec.head_files is None and spec.trainer_state is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.index = 2  # type: ignore[misc]
    with pytest.raises(TypeError, match="initial_version"):
        worker_specs.EvaluatorSpec(
            cfg_data={}, model=_shipped(), tokenizer=_shipped(), eval_sets={}, run_dir="/r",
            store="s", hub="h",
        )  # type: ignore[call-arg]  # fmt: skip
