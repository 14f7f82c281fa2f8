"""Config of the off-policy corrections, GSPO and PPO with a critic: presets, resolved config, and
the named checks that refuse bad combinations with the field and the fix."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zbrl.config import PRESETS, ConfigError, load_config, resolved_yaml
from zbrl.config.rollout import TransformersBackend


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates_and_shows_the_correction(name):
    cfg = load_config("recipes/demo.yaml", [f"algorithm.preset={name}"])
    text = resolved_yaml(cfg)
    for field in ("correction: none", "correction_level: token", "correction_cap: 2.0"):
        assert field in text, (name, field)


def test_ppo_preset_has_gae_and_a_critic():
    a = load_config(None, ["algorithm.preset=ppo"]).algorithm
    assert a.advantage.type == "gae" and a.advantage.gamma == 1.0 and a.advantage.lam == 0.95
    assert a.critic is not None and a.critic.value_clip == 0.2
    assert a.policy_loss.type == "ppo_clip"


def test_gspo_preset():
    a = load_config(None, ["algorithm.preset=gspo", "algorithm.correction=decoupled"]).algorithm
    assert a.policy_loss.type == "gspo" and a.policy_loss.clip_eps_high == 4e-4
    assert a.loss_aggregation == "seq-mean-token-mean"


def test_correction_options_parse():
    a = load_config(
        None,
        [
            "algorithm.correction=mis",
            "algorithm.correction_level=geometric",
            "algorithm.correction_cap=inf",
        ],
    ).algorithm
    assert (a.correction, a.correction_level, a.correction_cap) == (
        "mis",
        "geometric",
        float("inf"),
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.correction=tis", "algorithm.correction_cap=1.0"], r"correction_cap \(1.0\)"),
        (["algorithm.correction=decoupled", "algorithm.correction_cap=0.5"], "must be > 1"),
        (["algorithm.advantage=gae"], "algorithm.critic is not set"),
        (["algorithm.critic={}"], "does not use values"),
        (
            ["algorithm.preset=ppo", "algorithm.advantage.kl_in_reward=true"],
            "algorithm.beta is 0",
        ),
        (["algorithm.preset=gspo", "algorithm.correction=tis"], "use algorithm.correction=dec"),
        (["algorithm.proximal=loglinear"], "only applies to algorithm.correction=decoupled"),
    ],
)
def test_bad_combinations_are_refused_with_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.preset=ppo"],
        ["algorithm.correction=decoupled"],
        ["algorithm.correction=decoupled", "algorithm.proximal=loglinear"],
    ],
)
def test_step_start_passes_are_refused_on_data_parallel_engines(overrides):
    data_parallel = ["launch.num_consumers=2", "training.engine=ddp"]
    with pytest.raises(ConfigError, match="single-process training engine only"):
        load_config(None, [*overrides, *data_parallel])
    load_config(None, [*data_parallel, "algorithm.correction=tis"])  # no step-start pass


def test_cap_below_one_is_fine_without_a_correction():
    assert load_config(None, ["algorithm.correction_cap=0.5"]).algorithm.correction == "none"


def test_correction_needs_a_backend_with_behaviour_logprobs(monkeypatch):
    without = replace(TransformersBackend.capabilities, behaviour_logprobs=False)
    monkeypatch.setattr(TransformersBackend, "capabilities", without)
    with pytest.raises(ConfigError, match="needs the behaviour policy's log-probs"):
        load_config(None, ["algorithm.correction=decoupled"])
    load_config(None, ["algorithm.correction=none"])  # the plain loss is not this check's business
