"""Named algorithm presets: each expands into ordinary config fields (explicit values win).

Sources of the settings: GRPO (Shao et al. 2024, DeepSeekMath), DAPO (Yu et al. 2025: clip-higher
0.28, token-level loss, dynamic sampling, overlong filtering and soft punishment), Dr.GRPO (Liu et
al. 2025: no std normalisation, constant length normaliser), RLOO (Ahmadian et al. 2024),
REINFORCE++ (Hu 2025: batch-whitened advantages, token-level loss).
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "grpo": {
        "algorithm": {
            "advantage": "grpo",
            "loss_aggregation": "seq-mean-token-mean",
            "beta": 0.01,
            "kl_estimator": "k3",
            "clip_eps_low": 0.2,
            "clip_eps_high": 0.2,
        },
    },
    "dapo": {
        "algorithm": {
            "advantage": "grpo",
            "loss_aggregation": "token-mean",
            "beta": 0.0,
            "clip_eps_low": 0.2,
            "clip_eps_high": 0.28,
            "filter_range": [0.0, 1.0],  # strict: keep 0 < correct < G, for any G
            "filter_truncated_response": True,
            "dynamic_batching": True,
        },
        "reward": {"soft_overlong_punishment": True},
    },
    "dr_grpo": {
        "algorithm": {
            "advantage": "dr_grpo",
            "loss_aggregation": "seq-mean-token-sum-norm",
            "beta": 0.0,
            "clip_eps_low": 0.2,
            "clip_eps_high": 0.2,
        },
    },
    "rloo": {
        "algorithm": {
            "advantage": "rloo",
            "loss_aggregation": "seq-mean-token-mean",
            "beta": 0.0,
        },
    },
    "reinforce_pp": {
        "algorithm": {
            "advantage": "reinforce_pp",
            "reinforce_group_baseline": True,
            "loss_aggregation": "token-mean",
            "beta": 0.01,
            "kl_estimator": "k2",
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
        current = expanded.get(section)
        merged = dict(current) if isinstance(current, dict) else {}
        for key, value in values.items():
            merged.setdefault(key, value)
        expanded[section] = merged
    return expanded
