"""Named algorithm presets: each expands into ordinary config fields (explicit values win).

Sources of the settings: GRPO (Shao et al. 2024, DeepSeekMath), DAPO (Yu et al. 2025: clip-higher
0.28, token-level loss, dynamic sampling, overlong filtering and soft punishment), Dr.GRPO (Liu et
al. 2025: no std normalisation, constant length normaliser), RLOO (Ahmadian et al. 2024),
REINFORCE++ (Hu 2025: batch-whitened advantages, token-level loss), GSPO (Zheng et al. 2025:
sequence-level ratio and clip, clip range 3e-4 / 4e-4, sequence-mean aggregation), PPO with a critic
(Schulman et al. 2017; Ouyang et al. 2022: GAE with γ = 1, λ = 0.95, a per-token KL folded into
the reward, whitened advantages, a clipped value loss).

Merging is per field and recursive: a value the user set wins, and a preset's plug-in options
(``algorithm.advantage``, ``algorithm.policy_loss``, ``reward``) apply only when the user chose the
same ``type`` as the preset or none. A preset's reward options fill only fields the chosen reward
variant has (DAPO's soft overlong punishment applies to ``think_answer_tags``, ``boxed`` and
``code``, not to a user reward given by import path).
"""

from __future__ import annotations

from typing import Any

from zbrl.config.plugin import as_plugin_dict, plugin_tag, variant_tag
from zbrl.config.rewards import BoxedReward, CodeReward, ThinkAnswerTagsReward

_SHAPED_REWARDS = {variant_tag(v): v for v in (ThinkAnswerTagsReward, BoxedReward, CodeReward)}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "grpo": {
        "algorithm": {
            "advantage": {"type": "grpo"},
            "policy_loss": {"type": "ppo_clip", "clip_eps_low": 0.2, "clip_eps_high": 0.2},
            "loss_aggregation": "seq-mean-token-mean",
            "beta": 0.01,
            "kl_estimator": "k3",
        },
    },
    "dapo": {
        "algorithm": {
            "advantage": {"type": "grpo"},
            "policy_loss": {"type": "ppo_clip", "clip_eps_low": 0.2, "clip_eps_high": 0.28},
            "loss_aggregation": "token-mean",
            "beta": 0.0,
            "filter_range": [0.0, 1.0],  # strict: keep 0 < correct < G, for any G
            "filter_truncated_response": True,
            "dynamic_batching": True,
        },
        "reward": {"soft_overlong_punishment": True},
    },
    "dr_grpo": {
        "algorithm": {
            "advantage": {"type": "dr_grpo"},
            "policy_loss": {"type": "ppo_clip", "clip_eps_low": 0.2, "clip_eps_high": 0.2},
            "loss_aggregation": "seq-mean-token-sum-norm",
            "beta": 0.0,
        },
    },
    "rloo": {
        "algorithm": {
            "advantage": {"type": "rloo"},
            "loss_aggregation": "seq-mean-token-mean",
            "beta": 0.0,
        },
    },
    "reinforce_pp": {
        "algorithm": {
            "advantage": {"type": "reinforce_pp", "group_baseline": True},
            "loss_aggregation": "token-mean",
            "beta": 0.01,
            "kl_estimator": "k2",
        },
    },
    "gspo": {
        "algorithm": {
            "advantage": {"type": "grpo"},
            "policy_loss": {"type": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4},
            "loss_aggregation": "seq-mean-token-mean",
            "beta": 0.0,
        },
    },
    "ppo": {
        "algorithm": {
            "advantage": {"type": "gae", "gamma": 1.0, "lam": 0.95, "whiten": True},
            "policy_loss": {"type": "ppo_clip", "clip_eps_low": 0.2, "clip_eps_high": 0.2},
            "critic": {"value_clip": 0.2},
            "loss_aggregation": "token-mean",
        },
    },
}


def expand_preset(raw: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of the raw config with the preset's fields filled where the user set none."""
    algorithm = raw.get("algorithm")
    if not isinstance(algorithm, dict) or algorithm.get("preset") is None:
        return raw
    name = algorithm["preset"]
    if name not in PRESETS:
        return raw  # the field's own validation reports the unknown name
    expanded = dict(raw)
    for section, values in PRESETS[name].items():
        if section == "reward":
            expanded[section] = _fill_reward(expanded.get(section), values)
        else:
            expanded[section] = _fill(expanded.get(section), values)
    return expanded


def _fill(user: Any, preset: dict[str, Any]) -> Any:
    """``user`` with ``preset``'s keys filled in where absent, recursively; a plug-in whose
    ``type`` the user changed keeps only the user's options."""
    if isinstance(user, str):  # the plug-in shorthand "name"
        user = {"type": user}
    if user is None:
        user = {}
    if not isinstance(user, dict):
        return user  # validation reports the wrong type
    if "type" in user and "type" in preset and user["type"] != preset["type"]:
        return user
    merged = dict(user)
    for key, value in preset.items():
        if key not in merged:
            merged[key] = value
        elif isinstance(value, dict):
            merged[key] = _fill(merged[key], value)
    return merged


def _fill_reward(user: Any, preset: dict[str, Any]) -> Any:
    user = as_plugin_dict(user if user is not None else {}, ThinkAnswerTagsReward)
    if not isinstance(user, dict):
        return user
    variant = _SHAPED_REWARDS.get(plugin_tag(user))
    if variant is None:  # a user reward: the preset's shaping options do not apply
        return user
    applicable = {k: v for k, v in preset.items() if k in variant.model_fields}
    return _fill(user, applicable)
