"""The code sandbox: correct programs pass, and runaway or hostile programs are contained.

Every containment test checks three things: the program was stopped or denied, it is scored as a
failure, and this (calling) process is unharmed — the sandbox still runs a correct program and no
process of the candidate's process group is left behind. The hostile programs run against both
backends (``backend`` fixture): ``rlimits`` always, ``bwrap`` where bubblewrap works (skipped
elsewhere, a failure when ``ZBRL_REQUIRE_BWRAP=1``, as in CI). Where the two differ (a program
that defeats the audit hook), each test asserts what its backend really does.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from zbrl.sandbox import bubblewrap, execution
from zbrl.sandbox.bubblewrap import BwrapProbe, SandboxUnavailableError
from zbrl.sandbox.programs import (
    ProgramResult,
    SandboxLimits,
    TestCase,
    normalise_stdout,
    parse_call_args,
    run_program,
    run_programs,
    run_python,
)

LIMITS = SandboxLimits(timeout_s=1.0, memory_mb=256)
BACKENDS = ["rlimits", "bwrap"]
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
ADD_TESTS = [TestCase("1 2\n", "3\n"), TestCase("10 -3\n", "7\n")]


def _processes_in_group(pgid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:  # fields after "(comm)": state, ppid, pgrp, ...
            pids.append(int(name))
    return pids


def require_bwrap() -> None:
    """Skip without a working bubblewrap; fail instead when ``ZBRL_REQUIRE_BWRAP=1`` (CI)."""
    probe = bubblewrap.probe_bwrap()
    if probe.works:
        return
    if os.environ.get("ZBRL_REQUIRE_BWRAP") == "1":
        pytest.fail(f"ZBRL_REQUIRE_BWRAP=1 but bubblewrap does not work here: {probe.error}")
    pytest.skip(f"bubblewrap does not work here: {probe.error}")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "bwrap":
        require_bwrap()
    return request.param


def limits_for(backend: str, **changes: object) -> SandboxLimits:
    return dataclasses.replace(LIMITS, backend=backend, **changes)  # type: ignore[arg-type]


def assert_contained(result: ProgramResult) -> None:
    """Failed, nothing left running, and the sandbox still works for the next program."""
    assert not result.all_passed
    assert result.pass_fraction < 1.0
    assert result.pid is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(result.pid, 0)
    assert _processes_in_group(result.pid) == []
    follow_up = run_program(ADD, ADD_TESTS, limits=limits_for(result.backend))
    assert follow_up.statuses == ["pass", "pass"]
    assert follow_up.backend == result.backend


# ------------------------------------------------------------------------------------------------
# Correct and incorrect programs
# ------------------------------------------------------------------------------------------------


def test_stdin_stdout_program_passes() -> None:
    result = run_program(ADD, ADD_TESTS, limits=LIMITS)
    assert result.statuses == ["pass", "pass"]
    assert result.passed == [True, True]
    assert result.pass_fraction == 1.0
    assert result.all_passed
    assert all(t.duration_s > 0 for t in result.tests)


def test_whitespace_is_normalised_per_line() -> None:
    source = "print('1   ')\nprint()\nprint('2\\t')\nprint()\nprint()\n"
    result = run_program(source, [TestCase("", "1\n\n2")], limits=LIMITS)
    assert result.statuses == ["pass"]
    assert normalise_stdout("a  \r\nb\n\n\n") == ["a", "b"]
    # Interior blank lines and leading spaces still matter.
    assert run_program(source, [TestCase("", "1\n2")], limits=LIMITS).statuses == ["wrong_answer"]
    assert run_program("print(' 3')", [TestCase("", "3")], limits=LIMITS).statuses == [
        "wrong_answer"
    ]


def test_wrong_answer_fails_only_the_wrong_tests() -> None:
    result = run_program(ADD, [TestCase("1 2\n", "3\n"), TestCase("2 2\n", "5\n")], limits=LIMITS)
    assert result.statuses == ["pass", "wrong_answer"]
    assert result.pass_fraction == 0.5
    assert not result.all_passed


def test_syntax_error_fails_every_test() -> None:
    result = run_program("def f(:\n    pass\n", ADD_TESTS, limits=LIMITS)
    assert result.statuses == ["runtime_error", "runtime_error"]
    assert "SyntaxError" in result.tests[0].stderr_tail
    assert result.pass_fraction == 0.0


def test_exception_is_a_runtime_error_with_stderr_tail() -> None:
    source = (
        "import sys\nprint('partial')\nprint('oops', file=sys.stderr)\nraise KeyError('boom')\n"
    )
    result = run_program(source, [TestCase("", "partial")], limits=LIMITS)
    assert result.statuses == ["runtime_error"]
    assert "oops" in result.tests[0].stderr_tail
    assert "KeyError" in result.tests[0].detail
    assert "runner.py" not in result.tests[0].stderr_tail  # only the program's frames


def test_exit_and_stdin_idioms_work() -> None:
    source = (
        "import sys\n"
        "data = sys.stdin.buffer.read().split()\n"
        "print(sum(map(int, data)))\n"
        "sys.stdout.flush()\n"
        "exit()\n"
    )
    assert run_program(source, [TestCase("1 2 3\n", "6")], limits=LIMITS).statuses == ["pass"]
    source = "print(sum(map(int, open(0).read().split())))\nquit(0)\n"
    assert run_program(source, [TestCase("4 5", "9")], limits=LIMITS).statuses == ["pass"]
    failing_exit = "print(3)\nraise SystemExit(2)\n"
    assert run_program(failing_exit, [TestCase("", "3")], limits=LIMITS).statuses == [
        "runtime_error"
    ]


def test_stdlib_imports_and_workdir_files_work() -> None:
    source = (
        "import collections, heapq, bisect, itertools, functools, math, re, json, fractions\n"
        "import decimal, datetime, random, string, statistics, typing, dataclasses, threading\n"
        "from collections import namedtuple\n"
        "P = namedtuple('P', 'x y')\n"
        "with open('scratch.txt', 'w') as f:\n"
        "    f.write('ok')\n"
        "t = threading.Thread(target=lambda: None)\n"
        "t.start(); t.join()\n"
        "print(open('scratch.txt').read(), P(1, 2).y, math.gcd(12, 18))\n"
    )
    assert run_program(source, [TestCase("", "ok 2 6")], limits=LIMITS).statuses == ["pass"]


def test_each_test_runs_in_a_fresh_process() -> None:
    source = (
        "import sys\nseen = getattr(sys, 'zbrl_seen', 0)\nsys.zbrl_seen = seen + 1\nprint(seen)\n"
    )
    result = run_program(source, [TestCase("", "0")] * 3, limits=LIMITS)
    assert result.statuses == ["pass"] * 3


# ------------------------------------------------------------------------------------------------
# Function-call tests
# ------------------------------------------------------------------------------------------------


def test_function_call_top_level_function() -> None:
    source = "def add(a, b):\n    return a + b\n"
    tests = [TestCase("[1, 2]", "3"), TestCase("[[1], [2]]", "[1, 2]"), TestCase("[1, 1]", "3")]
    result = run_program(source, tests, fn_name="add", limits=LIMITS)
    assert result.statuses == ["pass", "pass", "wrong_answer"]


def test_function_call_solution_class_and_json_normalisation() -> None:
    source = (
        "class Solution:\n"
        "    def twoSum(self, nums, target):\n"
        "        seen = {}\n"
        "        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n"
        "                return (seen[target - x], i)\n"
        "            seen[x] = i\n"
    )
    tests = [TestCase("[[2, 7, 11, 15], 9]", "[0, 1]"), TestCase("[3, 2, 4]\n6", "[1, 2]")]
    result = run_program(source, tests, fn_name="twoSum", limits=LIMITS)
    assert result.statuses == ["pass", "pass"]  # tuple == list after JSON; one arg per line


def test_function_call_wrapped_expected_value_and_failures() -> None:
    source = "def f(x):\n    return x * 2\n"
    assert run_program(source, [TestCase("[4]", "[8]")], fn_name="f", limits=LIMITS).all_passed
    missing = run_program(source, [TestCase("[4]", "8")], fn_name="g", limits=LIMITS)
    assert missing.statuses == ["runtime_error"]
    assert "neither g()" in missing.tests[0].detail
    unserialisable = run_program(
        "def f(x):\n    return {x}\n", [TestCase("[1]", "[1]")], fn_name="f", limits=LIMITS
    )
    assert unserialisable.statuses == ["runtime_error"]


def test_parse_call_args_formats() -> None:
    assert parse_call_args('[1, [2, 3], "a"]') == [1, [2, 3], "a"]
    assert parse_call_args('[1, 2]\n3\n\n"x"') == [[1, 2], 3, "x"]
    assert parse_call_args("5") == [5]
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        parse_call_args("1\nnot json")


def test_invalid_tests_are_rejected_before_running() -> None:
    with pytest.raises(ValueError, match="at least one"):
        run_program(ADD, [], limits=LIMITS)
    with pytest.raises(ValueError, match="test 1: expected return value is not JSON"):
        run_program("def f(): pass", [TestCase("[]", "1"), TestCase("[]", "abc")], fn_name="f")
    with pytest.raises(ValueError, match="candidate 1: test 0"):
        run_programs([(ADD, ADD_TESTS, None), ("", [TestCase("x y", "1")], "f")])
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb must be at least 64"):
        SandboxLimits(memory_mb=8)


# ------------------------------------------------------------------------------------------------
# Containment, against both backends
# ------------------------------------------------------------------------------------------------


def test_infinite_loop_times_out_and_skips_the_rest(backend: str) -> None:
    source = "n = int(input())\nwhile n == 1:\n    pass\nprint(n)\n"
    tests = [TestCase("0", "0"), TestCase("1", "1"), TestCase("2", "2")]
    result = run_program(source, tests, limits=limits_for(backend))
    assert result.backend == backend
    assert result.statuses == ["pass", "timeout", "skipped"]
    assert_contained(result)
    keep_going = limits_for(backend, continue_after_timeout=True)
    result = run_program(source, tests, limits=keep_going)
    assert result.statuses == ["pass", "timeout", "pass"]
    assert_contained(result)


def test_cpu_time_limit_kills_busy_loop(backend: str) -> None:
    limits = limits_for(backend, timeout_s=10.0, cpu_s=1)
    result = run_program("while True:\n    pass\n", [TestCase("", "")], limits=limits)
    assert result.statuses == ["timeout"]
    assert "CPU" in result.tests[0].detail
    assert_contained(result)


def test_sleeping_program_and_total_timeout() -> None:
    limits = SandboxLimits(timeout_s=1.0, memory_mb=256, total_timeout_s=1.0)
    source = "import time\ntime.sleep(0.6)\nprint(1)\n"
    result = run_program(source, [TestCase("", "1")] * 3, limits=limits)
    assert result.statuses == ["pass", "timeout", "skipped"]
    assert_contained(result)


@pytest.mark.parametrize(
    "source",
    [
        "import os\nwhile True:\n    os.fork()\n",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "import subprocess\nsubprocess.run(['sleep', '100'])\n",
        "import os\nos.system('sleep 100 &')\n",
        "import os\nos.posix_spawn('/bin/sleep', ['sleep', '100'], {})\n",
        "import os\nos.execv('/bin/sleep', ['sleep', '100'])\n",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()\n",
        "import importlib\nimportlib.import_module('_posixsubprocess')\n",
    ],
    ids=["fork", "fork-retry", "subprocess", "system", "posix_spawn", "exec", "mp", "raw"],
)
def test_process_creation_is_contained(source: str, backend: str) -> None:
    result = run_program(source, [TestCase("", "never")], limits=limits_for(backend))
    assert result.statuses[0] in ("runtime_error", "timeout")
    assert_contained(result)


@pytest.mark.parametrize(
    "source",
    [
        "x = bytearray(50 * 1024 ** 3)\nprint(len(x))\n",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n",
        "s = [0] * 10\nwhile True:\n    s = s + s\n",
    ],
    ids=["bytearray-50GiB", "growing-list", "doubling"],
)
def test_huge_allocation_is_a_memory_failure(source: str, backend: str) -> None:
    # a generous wall clock: on a loaded machine the doubling list must hit the memory limit,
    # not the 1 s timeout, for the status to be the one under test
    limits = limits_for(backend, timeout_s=10.0)
    result = run_program(source, [TestCase("", "1")], limits=limits)
    assert result.statuses == ["memory"]
    assert_contained(result)


@pytest.mark.parametrize(
    "source",
    [
        "while True:\n    print('spam' * 100)\n",
        "import sys\nwhile True:\n    sys.stdout.buffer.write(b'x' * 4096)\n",
        "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)\n",
        "def f():\n    return 'x' * (10 ** 6)\n",
    ],
    ids=["print", "buffer", "stderr", "return-value"],
)
def test_endless_output_is_an_output_limit(source: str, backend: str) -> None:
    fn_name = "f" if "def f" in source else None
    test = TestCase("[]", '"x"') if fn_name else TestCase("", "spam")
    result = run_program(source, [test], fn_name=fn_name, limits=limits_for(backend))
    assert result.statuses == ["output_limit"]
    assert_contained(result)


def test_large_file_write_is_capped(backend: str) -> None:
    limits = limits_for(backend, timeout_s=2.0, max_file_bytes=1024 * 1024)
    source = "with open('big.bin', 'wb') as f:\n    while True:\n        f.write(b'x' * 65536)\n"
    result = run_program(source, [TestCase("", "")], limits=limits)
    assert result.statuses == ["output_limit"]
    assert_contained(result)


def test_many_files_fill_only_the_bwrap_workdir(backend: str) -> None:
    """Files each under ``max_file_bytes`` but 8 MiB together: bwrap's tmpfs of 4 MiB refuses
    them (ENOSPC), while the rlimits backend caps single files only and lets them all be written
    (on the host's disk, until the directory is removed)."""
    limits = limits_for(backend, max_file_bytes=1024 * 1024, max_workdir_bytes=4 * 1024 * 1024)
    source = (
        "for i in range(8):\n"
        "    with open(f'part{i}.bin', 'wb') as f:\n"
        "        f.write(b'x' * (1024 * 1024 - 1))\n"
        "print('wrote 8 MiB')\n"
    )
    result = run_program(source, [TestCase("", "wrote 8 MiB")], limits=limits)
    if backend == "bwrap":
        assert result.statuses == ["runtime_error"]
        assert "No space left" in result.tests[0].detail
        assert_contained(result)
    else:
        assert result.statuses == ["pass"]


@pytest.mark.parametrize("how", ["open", "os.open", "pathlib", "rename", "chdir"])
def test_write_outside_the_workdir_is_denied(how: str, backend: str) -> None:
    # in the checkout: outside the working directory of both backends (bwrap's is its own /tmp)
    target = str(Path(__file__).resolve().parent / f"zbrl_escape_{uuid.uuid4().hex}")
    folder, name = os.path.split(target)
    sources = {
        "open": f"open({target!r}, 'w').write('escaped')\nprint('done')\n",
        "os.open": f"import os\nos.open({target!r}, os.O_WRONLY | os.O_CREAT)\nprint('done')\n",
        "pathlib": f"import pathlib\npathlib.Path({target!r}).write_text('x')\nprint('done')\n",
        "rename": f"import os\nopen('a', 'w').close()\nos.rename('a', {target!r})\nprint('done')\n",
        "chdir": f"import os\nos.chdir({folder!r})\nopen({name!r}, 'w').close()\nprint('done')\n",
    }
    try:
        result = run_program(sources[how], [TestCase("", "done")], limits=limits_for(backend))
        assert not os.path.exists(target)
        assert result.statuses == ["runtime_error"]
        detail = result.tests[0].detail
        if backend == "bwrap" and (how == "chdir" or Path(folder).is_relative_to("/tmp")):
            # the folder does not exist in the jail; a checkout under /tmp (CI's clone may be
            # there) even looks to the hook like a path inside the jail's own /tmp workdir
            assert "FileNotFoundError" in detail or "not allowed" in detail
        else:  # the audit hook, in both backends
            assert "not allowed" in detail
        assert_contained(result)
    finally:
        if os.path.exists(target):
            os.remove(target)


def test_rlimits_workdir_is_fresh_and_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[str] = []

    def mkdtemp(prefix: str = "") -> str:
        path = tmp_path / f"{prefix}{len(made)}"
        path.mkdir()
        made.append(os.path.realpath(path))
        return str(path)

    monkeypatch.setattr(execution.tempfile, "mkdtemp", mkdtemp)
    expected = os.path.realpath(tmp_path / "zbrl-sandbox-0")
    source = "import os\nopen('left.txt', 'w').close()\nprint(os.path.realpath(os.getcwd()))\n"
    result = run_program(source, [TestCase("", expected)], limits=limits_for("rlimits"))
    assert result.statuses == ["pass"]
    assert made == [expected]
    assert not os.path.exists(expected)


def test_bwrap_workdir_is_an_empty_tmpfs_each_time() -> None:
    require_bwrap()
    source = "import os\nprint(os.getcwd(), os.listdir('.'))\nopen('left.txt', 'w').close()\n"
    for _ in range(2):
        run = run_python(source, limits=limits_for("bwrap"))
        assert (run.status, run.stdout, run.backend) == ("ok", "/tmp []\n", "bwrap")


def test_reading_private_files_is_denied(backend: str) -> None:
    for path in ("/etc/passwd", f"/proc/{os.getpid()}/environ", str(Path.home())):
        source = (
            f"import os\npath = {path!r}\n"
            "print(open(path).read()[:10] if os.path.isfile(path) else os.listdir(path))\n"
        )
        result = run_program(source, [TestCase("", "x")], limits=limits_for(backend))
        assert result.statuses == ["runtime_error"], path
        assert "not allowed" in result.tests[0].detail
    assert_contained(result)


HOOK_BYPASS = (
    "import os, posixpath\n"
    "# the audit hook resolves paths with os.path.realpath, whose helper lives in a module the\n"
    "# program can change: make every path resolve to the working directory\n"
    "posixpath._joinrealpath = lambda path, rest, strict, seen: (os.getcwd(), True)\n"
)


def test_a_program_that_defeats_the_hook_is_contained_only_by_bwrap(
    backend: str, tmp_path: Path
) -> None:
    """The audit hook is not a boundary: a program that defeats it reads and writes the host's
    files under ``rlimits``. Under ``bwrap`` the same program finds neither the checkout, nor a
    secret in the home directory or in the host's /tmp, and cannot write outside its tmpfs."""
    secret = f"s3cret-{uuid.uuid4().hex}"
    in_tmp = tmp_path / "secret.txt"
    in_tmp.write_text(secret)
    in_home = Path.home() / f".zbrl-sandbox-test-{uuid.uuid4().hex}"
    escape = tmp_path / "escaped.txt"
    checkout_file = Path(__file__).resolve()
    source = HOOK_BYPASS + (
        "seen = []\n"
        f"for path in {[str(in_tmp), str(in_home), str(checkout_file)]!r}:\n"
        "    try:\n"
        "        seen.append(open(path).read()[:60])\n"
        "    except OSError as exc:\n"
        "        seen.append(type(exc).__name__)\n"
        "try:\n"
        f"    open({str(escape)!r}, 'w').write('x')\n"
        "    seen.append('wrote')\n"
        "except OSError as exc:\n"
        "    seen.append(type(exc).__name__)\n"
        "print(seen)\n"
    )
    try:
        in_home.write_text(secret)
        run = run_python(source, limits=limits_for(backend))
    finally:
        in_home.unlink()
    assert run.status == "ok", run
    if backend == "bwrap":
        assert run.stdout == str(["FileNotFoundError"] * 4) + "\n"
        assert not escape.exists()
    else:  # not contained: documented in docs/sandbox.md
        assert run.stdout.count(secret) == 2
        assert "The code sandbox:" in run.stdout  # this file's docstring
        assert "'wrote'" in run.stdout
        assert escape.read_text() == "x"


def test_parent_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("ZBRL_SECRET", secret)
    source = (
        "import os\n"
        f"secret = {secret!r}\n"
        "leak = any('ZBRL_SECRET' in k or secret in v for k, v in os.environ.items())\n"
        f"for path in ('/proc/{os.getpid()}/environ', '/proc/{os.getppid()}/environ'):\n"
        "    try:\n"
        "        leak = leak or secret.encode() in open(path, 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        "print('LEAK' if leak else 'CLEAN')\n"
        "print(sorted(os.environ))\n"
    )
    names = ["HOME", "LANG", "LC_ALL", "PATH", "TMPDIR"]
    if backend == "bwrap":
        names.insert(4, "PWD")  # bwrap sets it to the working directory, /tmp
    expected = f"CLEAN\n{names}\n"
    result = run_program(source, [TestCase("", expected)], limits=limits_for(backend))
    assert result.statuses == ["pass"]
    assert os.environ["ZBRL_SECRET"] == secret


@pytest.mark.parametrize("namespace", [True, False], ids=["netns-if-available", "no-unshare"])
def test_network_access_is_blocked(namespace: bool, backend: str) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        source = (
            "def attempt():\n"
            "    try:\n"
            "        import socket\n"
            f"        socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "        return True\n"
            "    except Exception:\n"
            "        pass\n"
            "    try:\n"
            "        import _socket\n"
            "        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
            "        s.settimeout(1)\n"
            f"        s.connect(('127.0.0.1', {port}))\n"
            "        return True\n"
            "    except Exception:\n"
            "        pass\n"
            "    try:\n"
            "        import sys, importlib\n"
            "        sys.meta_path[:] = [\n"
            "            m for m in sys.meta_path if 'Blocker' not in type(m).__name__\n"
            "        ]\n"
            "        sock = importlib.import_module('socket')\n"
            f"        sock.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "        return True\n"
            "    except Exception:\n"
            "        pass\n"
            "    return False\n"
            "print('connected' if attempt() else 'blocked')\n"
        )
        limits = limits_for(backend, timeout_s=3.0, network_namespace=namespace)
        result = run_program(source, [TestCase("", "connected")], limits=limits)
        assert result.statuses == ["wrong_answer"]  # ran to the end, printed "blocked"
        if backend == "bwrap":
            assert result.network_namespace  # always its own, whatever network_namespace says
        elif not namespace:
            assert not result.network_namespace  # the audit hook alone blocked it
        listener.settimeout(0.3)
        with pytest.raises(socket.timeout):
            listener.accept()
        assert_contained(result)
    finally:
        listener.close()


def test_killing_other_processes_is_denied(backend: str) -> None:
    source = f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nprint('x')\n"
    result = run_program(source, [TestCase("", "x")], limits=limits_for(backend))
    assert result.statuses == ["runtime_error"]
    assert_contained(result)


def test_leftover_thread_does_not_outlive_the_test(backend: str) -> None:
    source = (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(100,), daemon=False).start()\n"
        "print('done')\n"
    )
    result = run_program(source, [TestCase("", "done")], limits=limits_for(backend))
    assert result.statuses == ["pass"]
    assert _processes_in_group(result.pid) == []


# ------------------------------------------------------------------------------------------------
# The bubblewrap jail itself, without the audit hook: what the namespaces alone contain
# ------------------------------------------------------------------------------------------------


def run_in_jail(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in the jail the bwrap backend uses, in a plain interpreter: no runner, no hook."""
    require_bwrap()
    path = bubblewrap.probe_bwrap().path
    assert path is not None
    argv = [*bubblewrap.jail_argv(path, 1024 * 1024, None), bubblewrap.interpreter(), "-I", "-S"]
    return subprocess.run(
        [*argv, "-c", code],
        capture_output=True,
        text=True,
        env=bubblewrap.jail_env(),
        timeout=30,
        start_new_session=True,
        check=False,
    )


def test_jail_has_no_route_to_the_hosts_loopback() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print(type(exc).__name__)\n"
        )
        done = run_in_jail(code)
        assert (done.returncode, done.stdout) == (0, "ConnectionRefusedError\n"), done.stderr
        listener.settimeout(0.3)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()


def _host_processes_with_argv(argv: list[str]) -> list[int]:
    wanted = "\0".join(argv) + "\0"
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if Path(f"/proc/{name}/cmdline").read_text() == wanted:
                    found.append(int(name))
            except OSError:
                continue
    return found


def test_jail_processes_die_with_it_and_see_no_host_process() -> None:
    marker = ["/bin/sleep", f"{uuid.uuid4().int % 10**6 + 1000}.5"]
    code = (
        "import os, subprocess\n"
        f"subprocess.Popen({marker!r}, start_new_session=True)  # escapes the group, not the ns\n"
        "print(os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    done = run_in_jail(code)
    assert done.returncode == 0, done.stderr
    pid, visible = done.stdout.split(" ", 1)
    assert pid == "1"  # the jailed program is its PID namespace's init
    assert len(ast.literal_eval(visible)) <= 2  # itself and the sleep; no process of the host
    deadline = time.monotonic() + 5
    while _host_processes_with_argv(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _host_processes_with_argv(marker) == []


def test_jail_filesystem_is_read_only_and_hides_the_host(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    checkout_file = Path(__file__).resolve()
    code = (
        "import os\n"
        "print(sorted(os.listdir('/')))\n"
        f"for path in ({str(secret)!r}, {str(checkout_file)!r}, '/etc/passwd', '/etc/shadow'):\n"
        "    print(os.path.exists(path))\n"
        "for path in ('/usr/x', '/etc/x', '/x', '/dev/x', '/dev/shm/x'):\n"
        "    try:\n"
        "        open(path, 'w')\n"
        "        print('wrote', path)\n"
        "    except OSError as exc:\n"
        "        print(exc.errno)\n"
        "open('/tmp/scratch', 'w').write('tmpfs is writable')\n"
        "print(open('/tmp/scratch').read())\n"
    )
    done = run_in_jail(code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    top = set(ast.literal_eval(lines[0]))
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp"}
    allowed |= {d.split("/")[1] for d in bubblewrap._interpreter_dirs()}
    allowed.add(bubblewrap.JAIL_RUNNER.split("/")[1])
    assert top <= allowed
    assert {"usr", "proc", "dev", "tmp"} <= top
    assert lines[1:5] == ["False"] * 4
    assert lines[5:10] == ["30"] * 5  # EROFS: all but the working directory is read-only
    assert lines[10] == "tmpfs is writable"
    assert not Path("/usr/x").exists()


# ------------------------------------------------------------------------------------------------
# Choosing the backend
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> BwrapProbe:
    probe = BwrapProbe(path=None, error="bwrap is not installed (not found on PATH)")
    monkeypatch.setattr(bubblewrap, "probe_bwrap", lambda: probe)
    monkeypatch.setattr(bubblewrap, "_warned", False)
    return probe


def test_auto_falls_back_to_rlimits_with_one_warning(
    no_bwrap: BwrapProbe, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="zbrl.sandbox.bubblewrap"):
        result = run_program(ADD, ADD_TESTS, limits=LIMITS)
        assert bubblewrap.resolve_backend("auto") == "rlimits"
    assert result.backend == "rlimits"
    assert result.statuses == ["pass", "pass"]
    warnings = [r for r in caplog.records if r.name == "zbrl.sandbox.bubblewrap"]
    assert len(warnings) == 1
    assert "apt-get install bubblewrap" in warnings[0].getMessage()
    assert "not installed" in warnings[0].getMessage()


def test_bwrap_backend_refuses_to_fall_back(no_bwrap: BwrapProbe) -> None:
    with pytest.raises(SandboxUnavailableError, match="backend 'bwrap' does not work here") as e:
        run_program(ADD, ADD_TESTS, limits=limits_for("bwrap"))
    assert "not installed" in str(e.value)
    assert "apt-get install bubblewrap" in str(e.value)
    assert "reward.sandbox.backend=rlimits" in str(e.value)


def test_rlimits_backend_never_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe() -> BwrapProbe:
        raise AssertionError("probed")

    monkeypatch.setattr(bubblewrap, "probe_bwrap", probe)
    assert run_program(ADD, ADD_TESTS, limits=limits_for("rlimits")).backend == "rlimits"


def test_probe_runs_once_and_reports_why_it_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    run_probe = bubblewrap._run_probe
    monkeypatch.setattr(bubblewrap, "_probe", None)
    monkeypatch.setattr(
        bubblewrap, "_run_probe", lambda: calls.append(1) or BwrapProbe(path="/x", error="no")
    )
    assert bubblewrap.probe_bwrap() is bubblewrap.probe_bwrap()
    assert calls == [1]
    monkeypatch.setattr(bubblewrap.shutil, "which", lambda name: None)
    assert "not installed" in (run_probe().error or "")
    monkeypatch.setattr(bubblewrap.shutil, "which", lambda name: "/bin/false")
    failed = run_probe()
    assert not failed.works
    assert "failed (exit 1" in (failed.error or "")


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        SandboxLimits(backend="docker")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# run_python: one program, its output back (the building block of a Python tool)
# ------------------------------------------------------------------------------------------------


def test_run_python_returns_output_and_failures(backend: str) -> None:
    limits = limits_for(backend)
    run = run_python("print(input()[::-1])", "abc\n", limits)
    assert (run.status, run.stdout, run.ok, run.backend) == ("ok", "cba\n", True, backend)
    failed = run_python("print('before')\n1 / 0\n", limits=limits)
    assert (failed.status, failed.stdout) == ("runtime_error", "before\n")
    assert "ZeroDivisionError" in failed.stderr_tail
    assert "ZeroDivisionError" in failed.detail
    looping = run_python("print('started', flush=True)\nwhile True:\n    pass\n", limits=limits)
    assert (looping.status, looping.stdout) == ("timeout", "started\n")
    flood = run_python("while True:\n    print('x' * 1000)\n", limits=limits)
    assert flood.status == "output_limit"
    assert 0 < len(flood.stdout) <= limits.max_output_bytes
    syntax = run_python("def f(:\n", limits=limits)
    assert syntax.status == "runtime_error"
    assert "SyntaxError" in syntax.stderr_tail


# ------------------------------------------------------------------------------------------------
# Batches
# ------------------------------------------------------------------------------------------------


def test_batch_of_64_with_infinite_loops() -> None:
    doubler = "print(int(input()) * 2)\n"
    looper = "x = int(input())\nwhile True:\n    x += 1\n"
    looping = {i for i in range(64) if i % 8 == 3}
    candidates = [
        (looper if i in looping else doubler, [TestCase(f"{i}\n", f"{2 * i}\n")], None)
        for i in range(64)
    ]
    limits = SandboxLimits(timeout_s=1.0, memory_mb=256)
    results = run_programs(candidates, limits, max_workers=2)
    assert len(results) == 64
    timed_out = {i for i, r in enumerate(results) if r.statuses == ["timeout"]}
    passed = {i for i, r in enumerate(results) if r.statuses == ["pass"]}
    assert timed_out == looping
    assert len(looping) == 8
    assert passed == set(range(64)) - looping
    for result in results:
        assert _processes_in_group(result.pid) == []


def test_run_programs_keeps_order_and_handles_empty_input() -> None:
    assert run_programs([], LIMITS) == []
    candidates = [(f"print({i})", [TestCase("", str(i))], None) for i in range(6)]
    candidates[2] = ("print('wrong')", [TestCase("", "2")], None)
    results = run_programs(candidates, LIMITS, max_workers=3)
    assert [r.statuses[0] for r in results] == ["pass", "pass", "wrong_answer"] + ["pass"] * 3
    with pytest.raises(ValueError, match="max_workers"):
        run_programs(candidates, LIMITS, max_workers=0)


def test_bwrap_gets_rlimit_nproc_from_the_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jail's /proc shows only the jail, so for a non-root user the parent counts the user's
    tasks on the host and sends ``RLIMIT_NPROC`` with the job."""
    require_bwrap()
    monkeypatch.setattr(execution.os, "getuid", lambda: 1000)
    monkeypatch.setattr(execution, "user_task_count", lambda uid: 40 if uid == 1000 else -1)
    source = "import resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC))\n"
    run = run_python(source, limits=limits_for("bwrap", max_processes=7))
    assert (run.status, run.stdout) == ("ok", "(47, 47)\n")


def test_jail_uses_newer_bwrap_options_only_when_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bubblewrap, "supported_options", lambda path: frozenset())
    old = bubblewrap.jail_argv(f"/old/{uuid.uuid4().hex}/bwrap", 4096, None)
    assert "--size" not in old and "--disable-userns" not in old
    assert old[-5:] == ("--remount-ro", "/dev", "--remount-ro", "/", "--")
    both = frozenset({"--size", "--disable-userns"})
    monkeypatch.setattr(bubblewrap, "supported_options", lambda path: both)
    new = bubblewrap.jail_argv(f"/new/{uuid.uuid4().hex}/bwrap", 4096, "/r.py")
    assert new[new.index("--size") + 1 : new.index("--size") + 4] == ("4096", "--tmpfs", "/tmp")
    assert "--disable-userns" in new
    assert new[new.index("/r.py") + 1] == bubblewrap.JAIL_RUNNER
