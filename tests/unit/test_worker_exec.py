"""``zbrl.launch.local_ray.worker_exec``, the stdlib-only stand-in for Ray's
``setup_worker.py``: the
arguments it takes from the raylet's command, and the command it runs for each runtime context
(the one Ray's ``RuntimeEnvContext.exec_worker`` runs, or none where it does not know it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from zbrl.launch.local_ray import worker_exec

WORKER = "/ray/_private/workers/default_worker.py"


def test_its_own_flags_are_taken_in_both_forms_and_the_rest_kept_in_order():
    flags, rest = worker_exec.split_arguments(
        [
            "--serialized-runtime-env-context={}",
            WORKER,
            "--node-ip-address=127.0.0.1",
            "--language",
            "PYTHON",
            "--worker-type=WORKER",
        ]
    )
    assert flags == {"--serialized-runtime-env-context": "{}", "--language": "PYTHON"}
    assert rest == [WORKER, "--node-ip-address=127.0.0.1", "--worker-type=WORKER"]


def test_a_plain_context_runs_the_worker_with_this_python_and_no_shell():
    assert worker_exec.worker_command({}, [WORKER, "--a=1"]) == [sys.executable, WORKER, "--a=1"]
    python = "/opt/other/bin/python"
    context = {"py_executable": python, "env_vars": {"X": "1"}, "java_jars": []}
    assert worker_exec.worker_command(context, [WORKER]) == [python, WORKER]


def test_a_command_prefix_goes_through_bash_with_the_arguments_quoted():
    context = {"command_prefix": ["source", "/env/activate", "&&"]}
    command = worker_exec.worker_command(context, [WORKER, "--name=a b"])
    assert command == [
        "bash",
        "-c",
        f"source /env/activate && exec {sys.executable} {WORKER} '--name=a b'",
    ]


def test_another_entrypoint_replaces_the_workers_program():
    context = {"override_worker_entrypoint": "/container/default_worker.py"}
    assert worker_exec.worker_command(context, [WORKER, "--a=1"])[1:] == [
        "/container/default_worker.py",
        "--a=1",
    ]


def test_a_context_it_does_not_know_is_left_to_rays_program():
    assert worker_exec.worker_command({"new_field": 1}, [WORKER]) is None
    assert worker_exec.worker_command({"java_jars": ["/a.jar"]}, [WORKER]) is None


def test_variables_expand_and_unset_ones_become_empty(monkeypatch):
    monkeypatch.setenv("HOME_OF_TEST", "/h")
    monkeypatch.delenv("ZBRL_TEST_UNSET", raising=False)
    worker_exec.apply_environment({"ZBRL_TEST_X": "${HOME_OF_TEST}/a${ZBRL_TEST_UNSET}"})
    assert os.environ["ZBRL_TEST_X"] == "/h/a"
    monkeypatch.delenv("ZBRL_TEST_X")


def test_run_as_a_script_it_execs_the_worker_with_the_contexts_variables(tmp_path):
    """The program as the raylet runs it: its own folder is off ``sys.path``, the context's
    variables are set, and the worker's program runs in its place (same pid)."""
    program = tmp_path / "worker.py"
    program.write_text(
        "import os, sys, json\n"
        "print(json.dumps({'argv': sys.argv[1:], 'x': os.environ.get('ZBRL_TEST_X'),"
        " 'pid': os.getpid(), 'path0': sys.path[0]}))\n"
    )
    context = json.dumps({"env_vars": {"ZBRL_TEST_X": "set"}})
    env = {k: v for k, v in os.environ.items() if k != worker_exec.FORK_SERVER_ENV}
    proc = subprocess.Popen(
        [
            sys.executable,
            worker_exec.__file__,
            f"--serialized-runtime-env-context={context}",
            "--language=PYTHON",
            str(program),
            "--a=1",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    seen = json.loads(out)
    assert seen["argv"] == ["--a=1"] and seen["x"] == "set" and seen["pid"] == proc.pid
    assert seen["path0"] == str(tmp_path)  # the worker's own folder, as python gives it
    assert Path(worker_exec.__file__).parent != Path(seen["path0"])
