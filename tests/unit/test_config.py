import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zbrl.cli import main
from zbrl.config import (
    PRESETS,
    ConfigError,
    RunConfig,
    apply_overrides,
    load_config,
    read_recipe,
    resolved_yaml,
)

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def test_config_imports_no_heavy_frameworks():
    code = (
        "import sys, zbrl.config\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'ray', 'transformers'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_parses(recipe):
    cfg = load_config(recipe)
    assert isinstance(cfg, RunConfig)
    # the resolved config round-trips through YAML into the same config
    again = RunConfig.model_validate(yaml.safe_load(resolved_yaml(cfg)))
    assert again == cfg


def test_recipes_exist():
    assert any(p.name == "demo.yaml" for p in RECIPES)


GPU_RECIPES = [p for p in RECIPES if p.name.endswith("_gpu.yaml")]
HUB_GPU_RECIPES = ["grpo_qwen2.5_0.5b_instruct_gpu.yaml", "grpo_qwen2.5_1.5b_instruct_gpu.yaml"]


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=[p.name for p in GPU_RECIPES])
def test_gpu_recipes_compute_in_bfloat16_on_gpus(recipe):
    from zbrl.assembly.shared_settings import weight_sync_backend

    cfg = load_config(recipe)
    assert cfg.model.dtype == "bfloat16"  # float32 masters are the engine's, whatever this is
    assert cfg.launch.producer_num_gpus > 0 and cfg.launch.consumer_num_gpus > 0
    assert cfg.training.device == "auto"
    # the in-run evaluator gets a GPU only with NCCL weight sync (it takes a producer's share)
    assert not cfg.eval.sets or weight_sync_backend(cfg) == "nccl"


@pytest.mark.parametrize("name", HUB_GPU_RECIPES)
def test_hub_gpu_recipes_name_a_hub_model_and_a_real_task(name):
    from zbrl.models.sources import classify

    assert name in [p.name for p in GPU_RECIPES]
    cfg = load_config(GPU_RECIPES[0].parent / name)
    assert classify(cfg.model.path).kind == "hub"
    assert cfg.model.path.startswith("Qwen/Qwen2.5-")
    assert cfg.data.source is not None and cfg.data.source.type == "reasoning_gym"
    assert cfg.data.source.eval_size > 0 and cfg.reward.type == "reasoning_gym"


def test_seed_defaults():
    cfg = RunConfig()
    a = cfg.algorithm
    loss = a.policy_loss
    assert a.lr == 1e-6 and loss.clip_eps_low == 0.2 and loss.clip_eps_high == 0.2
    assert loss.dual_clip_c is None and a.max_norm == 1.0
    assert a.advantage.type == "grpo" and a.advantage.eps == 1e-6
    assert cfg.rollout.generation.temperature == 1.0 and cfg.rollout.generation.top_k == -1


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_expand_into_fields(name):
    cfg = load_config(None, [f"algorithm.preset={name}"])
    for section, values in PRESETS[name].items():
        resolved = getattr(cfg, section).model_dump(mode="json")
        for key, value in values.items():
            if isinstance(value, dict):  # a plug-in: the preset's type and options, in full
                assert {k: resolved[key][k] for k in value} == value, (section, key)
                continue
            expected = list(value) if isinstance(value, tuple) else value
            assert resolved[key] == expected, (section, key)


def test_dapo_preset_values_and_explicit_override_wins():
    cfg = load_config(None, ["algorithm.preset=dapo", "algorithm.policy_loss.clip_eps_high=0.3"])
    assert cfg.algorithm.policy_loss.clip_eps_high == 0.3  # explicit beats preset
    assert cfg.algorithm.policy_loss.clip_eps_low == 0.2  # the preset fills the rest
    assert cfg.algorithm.filter_range == (0.0, 1.0)
    assert cfg.algorithm.loss_aggregation == "token-mean"
    assert cfg.reward.soft_overlong_punishment is True
    text = resolved_yaml(cfg)
    assert "preset: dapo" in text and "clip_eps_high: 0.3" in text


@pytest.mark.parametrize("group_size", [8, 100, 128, 256])
def test_dapo_filter_keeps_exactly_the_mixed_groups_for_any_group_size(group_size):
    """DAPO keeps a group unless all or none are correct, whatever G (issue 14: (0.01, 0.99)
    dropped a group with 1 correct of 128)."""
    from zbrl.algorithms import group_in_accuracy_range

    filter_range = load_config(None, ["algorithm.preset=dapo"]).algorithm.filter_range
    for correct in range(group_size + 1):
        ans_acc = [1.0] * correct + [0.0] * (group_size - correct)
        assert group_in_accuracy_range(ans_acc, filter_range) == (0 < correct < group_size)


def test_overrides_parse_yaml_values():
    raw = apply_overrides({}, ["a.b=3", "a.c=[1, 2]", "d=true", "e.f=hello"])
    assert raw == {"a": {"b": 3, "c": [1, 2]}, "d": True, "e": {"f": "hello"}}


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match=r"section\.field=value"):
        apply_overrides({}, ["algorithm.lr"])


def test_one_fsdp2_consumer_is_accepted_when_it_offloads_to_the_host():
    from zbrl.launch.process_group import consumer_group

    cfg = load_config(None, ["training.engine={type: fsdp2, cpu_offload: true}"])
    assert cfg.launch.num_consumers == 1
    host, spec = consumer_group(cfg)  # fully_shard needs a process group, of one rank
    try:
        assert spec is not None and spec.world_size == 1 and spec.backend == "gloo"
    finally:
        del host
    assert consumer_group(load_config(None, [])) == (None, None)


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (
            ["algorithm.policy_loss.clip_eps_low=1.5"],
            ["algorithm.policy_loss.clip_eps_low", "1.5", "below 1"],
        ),
        (["algorithm.foo=1"], ["algorithm.foo", "unknown field", "policy_loss"]),
        (
            ["training.train_batch_size=8", "training.train_microbatch_size=7"],
            ["train_microbatch_size", "not divisible", "divisor of 64"],
        ),
        (
            ["training.train_batch_size=6", "training.train_minibatch_size=4"],
            ["train_minibatch_size", "not divisible"],
        ),
        (
            ["rollout.generation.num_generations=1", "training.train_microbatch_size=1"],
            ["num_generations", "num_generations >= 2"],
        ),
        (
            ["rollout.inference_batch_size=6", "rollout.inference_microbatch_size=4"],
            ["inference_batch_size", "divides"],
        ),
        (["algorithm.filter_range=[0.9, 0.1]"], ["filter_range", "low < high"]),
        (["algorithm.policy_loss.dual_clip_c=0.5"], ["policy_loss.dual_clip_c", "above 1"]),
        (["algorithm.kl_estimator=k9"], ["kl_estimator", "k3"]),
        (["rollout.backend.type=sglang"], ["backend", "transformers"]),
        (
            [
                "reward.soft_overlong_punishment=true",
                "reward.cache_length=64",
                "rollout.generation.max_new_tokens=32",
            ],
            ["cache_length", "max_new_tokens"],
        ),
        (
            ["reward.soft_overlong_punishment=true", "reward.truncated_penalty=-0.5"],
            ["truncated_penalty", "at most -1.0"],
        ),
        (
            ["rollout.backend.type=vllm", "rollout.backend.tensor_parallel_size=2"],
            ["tensor_parallel_size", "producer_num_gpus"],
        ),
        (
            ["rollout.backend.type=vllm", "launch.producer_num_gpus=1"],
            ["eval.sets={}", "zbrl eval"],
        ),
        (
            ["rollout.backend.type=vllm", "rollout.backend.max_model_len=64"],
            ["rollout.backend.max_model_len", "max_new_tokens"],
        ),
        (["transport.buffer_capacity=2"], ["buffer_capacity", "train_batch_size"]),
        (["launch.num_consumers=2"], ["launch.num_consumers=2", "training.engine=ddp"]),
        (
            ["training.engine=fsdp2"],
            ["training.engine=fsdp2", "launch.num_consumers >= 2", "cpu_offload=true"],
        ),
        (
            ["launch.num_consumers=3", "training.engine=ddp"],
            ["train_batch_size (8)", "launch.num_consumers (3)", "multiple of 3"],
        ),
        (
            ["launch.num_consumers=2", "training.engine={type: ddp, backend: nccl}"],
            ["backend=nccl", "launch.consumer_num_gpus", "backend=gloo"],
        ),
        (
            ["launch.num_consumers=2", "training.engine=ddp", "launch.consumer_num_gpus=2"],
            ["launch.consumer_num_gpus=1"],
        ),
        (
            [
                "launch.num_consumers=2",
                "training.engine=fsdp2",
                "training.engine.context_parallel_size=4",
            ],
            ["context_parallel_size=4 must divide launch.num_consumers (2)"],
        ),
        (["launch.parallel.tp_size=2"], ["tp_size", "not supported", "training.engine=fsdp2"]),
        (["launch.parallel.dp_size=2"], ["launch.parallel was replaced", "launch.num_consumers"]),
    ],
)
def test_bad_values_name_the_field_and_the_fix(overrides, needles):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)


def test_group_estimator_allows_g1_with_plain_reinforce():
    cfg = load_config(
        None,
        [
            "rollout.generation.num_generations=1",
            "training.train_microbatch_size=1",
            "algorithm.advantage.type=reinforce_pp",
            "algorithm.advantage.group_baseline=false",
        ],
    )
    assert cfg.rollout.generation.num_generations == 1


def test_derived_values():
    cfg = load_config(None, ["name=abc", "rollout.generation.max_new_tokens=100"])
    assert cfg.run_dir == "runs/abc"
    assert cfg.cache_length == 25
    assert cfg.minibatch_size == cfg.training.train_batch_size


def test_every_field_has_a_docstring():
    missing = []

    def walk(model, prefix):
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(prefix + name)
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, prefix + name + ".")

    walk(RunConfig, "")
    assert missing == []


def test_yaml_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nalgorithm:\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: invalid YAML"):
        read_recipe(bad)


def test_missing_recipe_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_recipe(tmp_path / "nope.yaml")


def test_validate_cli_prints_resolved_config(capsys):
    demo = next(p for p in RECIPES if p.name == "demo.yaml")
    assert main(["validate", str(demo), "algorithm.lr=0.001"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["algorithm"]["lr"] == 0.001
    assert out["algorithm"]["preset"] == "grpo"


def test_validate_cli_bad_value_exits_nonzero(capsys):
    demo = next(p for p in RECIPES if p.name == "demo.yaml")
    assert main(["validate", str(demo), "algorithm.policy_loss.clip_eps_low=1.5"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.policy_loss.clip_eps_low" in err and "1.5" in err


def test_docs_config_reference_is_up_to_date():
    from zbrl.config.reference import markdown_reference

    doc = Path(__file__).resolve().parents[2] / "docs" / "config.md"
    assert doc.read_text() == markdown_reference(), (
        "docs/config.md is stale: run `python -m zbrl.config.reference > docs/config.md`"
    )


def test_eval_command_takes_its_defaults_from_the_config():
    """`zbrl eval` flags left out keep the config's values (one source of defaults)."""
    from zbrl.cli import build_parser
    from zbrl.evaluation.cli import eval_overrides

    args = build_parser().parse_args(["eval", "--model", "m", "--data", "d.jsonl"])
    assert eval_overrides(args) == []
    given = build_parser().parse_args(
        ["eval", "--model", "m", "--data", "d", "--n", "4", "--temperature", "0"]
    )
    cfg = load_config(None, eval_overrides(given))
    assert (cfg.eval.num_samples, cfg.eval.temperature) == (4, 0.0)
    assert cfg.eval.batch_size == RunConfig().eval.batch_size


def test_context_parallel_batch_divides_by_data_parallel_slices():
    """Groups of context_parallel_size consumers share one slice: 4 consumers in groups of 2
    train 2 slices, so a batch of 6 groups is fine and one of 5 names the slices."""
    base = ["launch.num_consumers=4", "training.engine=fsdp2"]
    cfg = load_config(
        None, [*base, "training.engine.context_parallel_size=2", "training.train_batch_size=6"]
    )
    assert cfg.training.engine.context_parallel_size == 2
    with pytest.raises(ConfigError, match=r"not divisible by the 2 data-parallel slices"):
        load_config(
            None,
            [*base, "training.engine.context_parallel_size=2", "training.train_batch_size=5"],
        )
