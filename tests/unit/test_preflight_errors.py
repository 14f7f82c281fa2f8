"""A user's mistake ends in one ``error: ...`` line and a non-zero exit, never a traceback, and a
``zbrl train`` start that fails its checks creates no run directory (issue 20, item 6).

Every start here fails before Ray: ``init_ray`` is replaced by a function that fails the test, so a
check that lets a bad start through is caught, and the one good start shows where the run dir is
created (after every check, just before Ray).
"""

from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from zbrl import cli
from zbrl.config import ConfigError, load_config
from zbrl.launch.run_dir import check_run_dir, try_lock

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "recipes" / "demo.yaml")


class ReachedRay(Exception):
    """Raised in place of starting Ray: the start got past every check."""


@pytest.fixture
def no_ray(monkeypatch):
    import zbrl.launch.driver as driver

    def refuse(cfg):
        raise ReachedRay

    monkeypatch.setattr(driver, "init_ray", refuse)


@pytest.fixture
def start(tmp_path, tiny_model_dir, task_files, no_ray):
    """``zbrl train`` of the demo recipe on the tiny model and the task files, with overrides."""
    runs = tmp_path / "runs"
    base = [
        f"model.path={tiny_model_dir}",
        f"data.train_path={task_files[0]}",
        f"eval.sets={{heldout: {task_files[1]}}}",
        f"logging.run_dir={runs}/run",
        f"logging.cache_dir={tmp_path / 'cache'}",
    ]

    def run(*overrides: str) -> int:
        return cli.main(["train", DEMO, *base, *overrides])

    run.runs = runs
    return run


def error_line(capsys) -> str:
    """The command's stderr, checked to be one ``error:`` message without a traceback."""
    err = capsys.readouterr().err
    assert err.startswith("error: "), err
    assert "Traceback" not in err, err
    return err


# -- the config check: a user model with the embedded task ---------------------------------------


def test_a_user_model_on_the_embedded_task_is_refused_naming_the_opt_in():
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, ["model.path=/models/mine"])
    message = str(err.value)
    assert "model.path='/models/mine'" in message and "data.train_path" in message
    assert "data.allow_embedded_task_with_user_model=true" in message
    cfg = load_config(
        DEMO, ["model.path=/models/mine", "data.allow_embedded_task_with_user_model=true"]
    )
    assert cfg.data.trains_on_embedded
    assert load_config(DEMO).model.path == "embedded"  # the embedded model keeps its task


def test_a_user_model_evaluated_on_the_embedded_task_is_refused():
    with pytest.raises(ConfigError, match=r"eval\.sets\.heldout evaluates the embedded"):
        load_config(DEMO, ["model.path=/models/mine", "data.train_path=/data/train.jsonl"])
    cfg = load_config(
        DEMO, ["model.path=/models/mine", "data.train_path=/data/train.jsonl", "eval.sets={}"]
    )
    assert cfg.eval.sets == {}


# -- zbrl train: every failed start is an error line and leaves no run directory -----------------


def test_the_good_start_claims_its_run_dir_only_after_every_check(start, capsys):
    with pytest.raises(ReachedRay):
        start()
    assert (start.runs / "run" / "config.yaml").is_file()
    assert "train prompts: 64" in capsys.readouterr().out


def _no_template(tmp_path, tiny_model_dir):
    copy = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, copy)
    (copy / "chat_template.jinja").unlink()
    return f"model.path={copy}"


def _system_rejecting_template(tmp_path, tiny_model_dir):
    template = tmp_path / "no-system.jinja"
    template.write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    return f"model.chat_template={template}"


def _non_prefix_template(tmp_path, tiny_model_dir):
    """A template that hides an earlier assistant turn once another message follows."""
    template = tmp_path / "hides-history.jinja"
    template.write_text(
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}[earlier]"
        "{% else %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return f"model.chat_template={template}"


def _not_gguf(tmp_path, tiny_model_dir):
    (tmp_path / "model.gguf").write_text("<html>404 not found</html>")
    return f"model.path={tmp_path / 'model.gguf'}"


def _malformed_hf_file(tmp_path, tiny_model_dir):
    (tmp_path / "hf.jsonl").write_text('{"messages": [\n')
    return f"data.source={{type: hf, path: {tmp_path / 'hf.jsonl'}}}"


def _extra_reward_model_not_a_model(tmp_path, tiny_model_dir):
    extra = "{type: reward_model, weight: 0.5, options: {path: %s}}" % (tmp_path / "none")
    return f"reward.extra=[{extra}]"


def _extra_reward_model_without_weights(tmp_path, tiny_model_dir):
    (tmp_path / "rm").mkdir()
    (tmp_path / "rm" / "config.json").write_text("{}")
    extra = "{type: reward_model, weight: 0.5, options: {path: %s}}" % (tmp_path / "rm")
    return f"reward.extra=[{extra}]"


BAD_STARTS = {
    "missing train file": (
        lambda t, m: "data.train_path=/nonexistent/train.jsonl",
        "data.train_path=",
    ),
    "train path is a directory": (lambda t, m: f"data.train_path={t}", "is a directory"),
    "missing eval file": (lambda t, m: "eval.sets={x: /nonexistent/x.jsonl}", "eval.sets.x="),
    "bad dataset line": (lambda t, m: f"data.train_path={t / 'bad.jsonl'}", "bad.jsonl line 1"),
    "every prompt dropped": (lambda t, m: "data.max_prompt_tokens=1", "max_prompt_tokens"),
    "model dir without a model": (lambda t, m: f"model.path={t}", "without a model"),
    "tokenizer without a chat template": (_no_template, "has no chat template"),
    "template that rejects the system prompt": (
        _system_rejecting_template,
        "data.system_prompt=''",
    ),
    "vllm not installed": (lambda t, m: "rollout.backend.type=vllm", "make setup-vllm"),
    "wandb not installed": (lambda t, m: "logging.wandb=true", "pip install 'zbrl[wandb]'"),
    "tensorboard not installed": (
        lambda t, m: "logging.tensorboard=true",
        "pip install 'zbrl[tensorboard]'",
    ),
    "reward that does not import": (lambda t, m: "reward.type=nowhere.module:fn", "nowhere"),
    "environment that does not import": (
        lambda t, m: "environment={type: nowhere.envs:Env}",
        "environment.type: cannot import nowhere.envs:Env",
    ),
    "environment options that do not fit": (
        lambda t, m: (
            "environment={type: zbrl.environments.tool_env:ToolEnvironment, options: {colour: red}}"
        ),
        "environment.options do not fit",
    ),
    "tool that does not import": (
        lambda t, m: "environment={type: tools, tools: [{type: nowhere.tools:Tool}]}",
        "environment.tools[].type: cannot import nowhere.tools:Tool",
    ),
    "tool options that do not fit": (
        lambda t, m: (
            "environment={type: tools, tools: [{type: "
            "zbrl.environments.tools:Calculator, options: {colour: red}}]}"
        ),
        "environment.tools: options do not fit",
    ),
    "message role the template refuses": (
        lambda t, m: "environment=tools",
        "set environment.message_role to a role it knows",
    ),
    "template that is not prefix-preserving": (
        lambda t, m: [_non_prefix_template(t, m), "environment={type: tools, message_role: user}"],
        "not prefix-preserving",
    ),
    "lora targets that match nothing": (
        lambda t, m: "model.lora={target_modules: [nowhere_proj]}",
        "model.lora.target_modules=['nowhere_proj'] matches no linear layer",
    ),
    "chat template path without .jinja": (
        lambda t, m: f"model.chat_template={t / 'template.txt'}",
        "template.txt': no such file",
    ),
    "extra reward model that is not a model": (
        _extra_reward_model_not_a_model,
        "reward.extra[0].options.path=",
    ),
    "extra reward model without weights": (
        _extra_reward_model_without_weights,
        "no weights",
    ),
    "malformed hf data file": (
        lambda t, m: [_malformed_hf_file(t, m), "data.train_path=embedded", "eval.sets={}"],
        "the data cannot be read",
    ),
    "gguf that is not gguf": (
        _not_gguf,
        "is not a GGUF file",
    ),
}


@pytest.fixture
def missing_packages(monkeypatch):
    """vLLM, wandb and tensorboard look uninstalled (whatever this environment has)."""
    import importlib.util

    import zbrl.rollout.backends.vllm.backend as vllm_backend

    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("wandb", "tensorboard") else find_spec(name, *a),
    )


@pytest.mark.parametrize("case", sorted(BAD_STARTS))
def test_a_failed_start_is_one_error_line_and_creates_no_run_dir(
    case, start, tmp_path, tiny_model_dir, missing_packages, capsys
):
    (tmp_path / "bad.jsonl").write_text('{"messages": "not a list"}\n')
    override, needle = BAD_STARTS[case]
    overrides = override(tmp_path, tiny_model_dir)
    rc = start(*([overrides] if isinstance(overrides, str) else overrides))
    assert rc != 0
    err = error_line(capsys)
    assert needle in err
    assert err.count("\n") == 1, err  # one line, nothing else on stderr
    assert not start.runs.exists()


def test_a_user_model_on_the_embedded_task_fails_the_start_with_exit_2(start, capsys):
    assert start("data.train_path=embedded", "eval.sets={}") == 2
    assert "data.allow_embedded_task_with_user_model" in error_line(capsys)
    assert not start.runs.exists()


def test_a_failing_wandb_init_claims_no_run_dir(start, monkeypatch, capsys):
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)

    def init(**kwargs):
        raise RuntimeError("api_key not configured (no-tty)")

    fake.init = init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    assert start("logging.wandb=true") == 1
    err = error_line(capsys)
    assert "api_key not configured" in err and "wandb login" in err
    assert "logging.wandb=false" in err
    assert not start.runs.exists()


def test_a_run_dir_in_use_or_with_checkpoints_is_refused_before_the_data_is_read(start, capsys):
    run_dir = start.runs / "run"
    (run_dir / "checkpoints" / "step-3").mkdir(parents=True)
    assert start("data.max_prompt_tokens=1") == 1  # the data would fail too: the dir comes first
    assert "zbrl resume" in error_line(capsys)
    shutil.rmtree(run_dir / "checkpoints")
    lock = try_lock(run_dir)
    try:
        assert start() == 1
        assert "in use by another run" in error_line(capsys)
    finally:
        lock.release()
    assert sorted(p.name for p in start.runs.iterdir()) == ["run"]  # no sibling was made


def test_check_run_dir_refuses_a_file_and_creates_nothing(tmp_path):
    (tmp_path / "taken").write_text("")
    with pytest.raises(Exception, match="is a file"):
        check_run_dir(tmp_path / "taken")
    with pytest.raises(Exception, match="cannot be created"):
        check_run_dir(tmp_path / "taken" / "run")
    check_run_dir(tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists()


def test_a_failed_start_in_a_subprocess_prints_no_traceback(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zbrl.cli",
            "train",
            DEMO,
            f"model.path={tiny_model_dir}",
            f"data.train_path={tmp_path / 'missing.jsonl'}",
            "eval.sets={}",
            f"logging.run_dir={runs}/run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert out.stderr.startswith("error: data.train_path=") and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1  # one line
    assert not runs.exists()


# -- the other commands -------------------------------------------------------------------------


def test_resume_and_validate_mistakes_are_error_lines(tmp_path, capsys):
    cases = [
        (["resume", str(tmp_path / "nowhere")], "not a zbrl run directory"),
        (["validate", DEMO, "algorithm.lr"], "must look like section.field=value"),
        (["validate", DEMO, "algorithm.lrr=1"], "unknown field"),
        (["validate", DEMO, "algorithm.lr=fast"], "algorithm.lr"),
        (["validate", str(tmp_path / "none.yaml")], "recipe file not found"),
        (["report", str(tmp_path / "nowhere")], "timeline.jsonl"),
        (["plan", str(tmp_path / "nowhere")], "does not exist"),
    ]
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "timeline.jsonl").write_text('{"worker": "a"\n{"worker": "b"}\n')
    cases.append((["report", str(damaged)], "timeline.jsonl:1: not a span record"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(f"logging: {{run_dir: {run_dir}}}\n")
    cases += [
        (["resume", str(run_dir)], "no complete checkpoint"),
        (["resume", str(run_dir), "training.max_stepz=9"], "unknown field"),
        (["resume", str(run_dir), "seed=3"], "resume cannot change seed"),
    ]
    for argv, needle in cases:
        assert cli.main(argv) != 0, argv
        assert needle in error_line(capsys), argv
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]


def test_eval_mistakes_are_error_lines_before_any_model_loads(
    tmp_path, tiny_model_dir, task_files, monkeypatch, capsys
):
    import zbrl.assembly.models as models

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(models, "build_backend", no_model)
    (tmp_path / "bad.jsonl").write_text('{"messages": "not a list"}\n')
    model, data = str(tiny_model_dir), str(task_files[1])
    cases = [
        (["--model", str(tmp_path / "none"), "--data", data], "does not exist"),
        (["--model", model, "--data", str(tmp_path / "none.jsonl")], "--data none="),
        (["--model", model, "--data", str(tmp_path / "bad.jsonl")], "bad.jsonl line 1"),
        (["--model", model, "--data", data, "--reward", "nowhere.module:fn"], "reward"),
        (
            ["--model", model, "--data", "held_out", f"data.train_path={data}"],
            "--data held_out: the config trains on data.train_path=",
        ),
        (
            [
                *["--model", model, "--data", "held_out", "eval.sets={}"],
                f"data.source={{type: hf, path: {data}}}",
            ],
            "--data held_out: data.source has no eval_split; set data.source.eval_split",
        ),
    ]
    for argv, needle in cases:
        assert cli.main(["eval", *argv]) != 0, argv
        assert needle in error_line(capsys), argv


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            ["data.train_path=embedded", "data.source={type: hf, path: /nowhere/data.jsonl}"],
            "data.source.type=hf, but the 'datasets' package is not installed",
        ),
        (
            [
                "data.train_path=embedded",
                "data.source={type: reasoning_gym, tasks: [basic_arithmetic]}",
                "eval.sets={}",
            ],
            "pip install 'zbrl[reasoning-gym]'",
        ),
    ],
)
def test_a_data_source_without_its_package_names_the_extra(
    start, monkeypatch, capsys, overrides, needle
):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("datasets", "reasoning_gym") else find_spec(name, *a),
    )
    assert start(*overrides) != 0
    assert needle in error_line(capsys)
    assert not start.runs.exists()


@pytest.mark.parametrize("field", ["algorithm.advantage.type", "algorithm.policy_loss.type"])
def test_a_user_algorithm_that_does_not_import_fails_before_the_run_dir(start, capsys, field):
    assert start(f"{field}=nowhere.at_all:fn") != 0
    err = error_line(capsys)
    assert f"{field}='nowhere.at_all:fn'" in err
    assert "cannot import module 'nowhere.at_all'" in err
    assert not start.runs.exists()


def test_a_sandbox_below_the_interpreters_memory_is_refused_by_the_config() -> None:
    with pytest.raises(ConfigError, match=r"reward.sandbox.memory_mb.*at least 64"):
        load_config(DEMO, ["reward.type=code", "reward.sandbox.memory_mb=32"])


def test_validate_imports_a_reward_and_environment_next_to_the_recipe(tmp_path):
    """``zbrl validate`` from the recipe's directory imports the user's modules there, as
    ``python -m`` would: the entry script lives elsewhere (like the console script in the venv's
    ``bin/``), so only the working directory can make them importable."""
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    bin_dir.mkdir()
    (work / "my_reward.py").write_text(
        "def score(response, example, ctx):\n    return 1.0 if '4' in response else 0.0\n"
    )
    (work / "my_env.py").write_text(
        "class Env:\n"
        "    def __init__(self, turns=1):\n"
        "        self.turns = turns\n"
        "    def start(self, example):\n"
        "        raise NotImplementedError\n"
    )
    shutil.copy(DEMO, work / "recipe.yaml")
    entry = bin_dir / "zbrl"
    entry.write_text("import sys\nfrom zbrl.cli import main\nsys.exit(main())\n")

    out = subprocess.run(
        [
            sys.executable,
            str(entry),
            "validate",
            "recipe.yaml",
            "reward.type=my_reward:score",
            "environment={type: my_env:Env, message_role: user, options: {turns: 2}}",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "type: my_reward:score" in out.stdout and "type: my_env:Env" in out.stdout


def test_more_gpus_than_the_machine_has_fail_before_anything_is_written(
    start, tmp_path, monkeypatch, capsys
):
    import zbrl.launch.preflight as preflight

    monkeypatch.setattr(preflight, "local_gpu_count", lambda: 1)
    assert start("launch.num_producers=2", "launch.producer_num_gpus=1") == 1
    err = error_line(capsys)
    assert "the workers need 2 GPUs (launch.num_producers=2 x launch.producer_num_gpus=1)" in err
    assert "but this machine has 1; lower those fields" in err
    assert not start.runs.exists() and not (tmp_path / "cache").exists()


def test_more_cpus_than_the_running_ray_has_fail_before_anything_is_written(
    start, monkeypatch, capsys
):
    """A process that runs Ray already (a test session's, a notebook's) lends it to the run
    as it is: a run that does not fit it is refused by the pre-flight."""
    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: True
    fake.cluster_resources = lambda: {"CPU": 2.0}
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert start("launch.num_producers=2", "launch.consumer_num_cpus=1.5") == 1
    err = error_line(capsys)
    assert (
        "the workers need 3.5 CPUs (launch.num_producers=2 x launch.producer_num_cpus=1, "
        "launch.num_consumers=1 x launch.consumer_num_cpus=1.5) but the Ray this process runs "
        "has 2;"
    ) in err
    assert not start.runs.exists()


@pytest.mark.parametrize(
    ("bundles", "needed"),
    [
        ([(3, 0.6)], 3),  # no two bundles over half a GPU share one
        ([(4, 0.25)], 1),
        ([(2, 1.0), (2, 0.5)], 3),
        ([(1, 0.6), (2, 0.2)], 1),
        ([(1, 0.6), (2, 0.3)], 2),  # 1.2 GPUs in all
        ([(1, 2.0), (1, 0.0)], 2),
    ],
)
def test_gpus_needed_is_what_no_placement_can_do_without(bundles, needed):
    from zbrl.launch.preflight import WorkerAsk, gpus_needed

    asks = [WorkerAsk("f", count, 1.0, gpus) for count, gpus in bundles]
    assert gpus_needed(asks) == needed
