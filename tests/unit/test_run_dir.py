"""One run at a time in a run directory; fresh fallback names never collide."""

import re
import subprocess
import sys
import textwrap
import time

import pytest

from zbrl.launch.run_dir import LOCK_FILE, RunDirInUse, claim_run_dir

NOON = time.mktime((2030, 1, 2, 12, 0, 0, 0, 0, -1))


def test_a_second_claim_of_a_held_run_dir_is_refused_with_the_dir_and_the_fix(tmp_path):
    run_dir = tmp_path / "runs" / "demo"
    first, lock = claim_run_dir(run_dir)
    assert first == run_dir and lock.held
    with pytest.raises(RunDirInUse) as err:
        claim_run_dir(run_dir)
    message = str(err.value)
    assert str(run_dir) in message
    assert "another run" in message and "logging.run_dir" in message and "wait" in message
    (run_dir / "metrics.jsonl").write_text("{}\n")  # the first run writes: still refused
    with pytest.raises(RunDirInUse):
        claim_run_dir(run_dir)
    lock.release()
    # ended: its directory is kept as it is and the next run gets a fresh one
    second, lock2 = claim_run_dir(run_dir)
    assert second != run_dir and second.parent == run_dir.parent
    assert second.name.startswith("demo-") and lock2.held
    assert (run_dir / "metrics.jsonl").read_text() == "{}\n"
    lock2.release()


def test_an_empty_run_dir_left_by_a_run_that_ended_early_is_reused(tmp_path):
    run_dir = tmp_path / "demo"
    _, lock = claim_run_dir(run_dir)
    lock.release()  # ended before writing anything: only the lock file is there
    again, lock = claim_run_dir(run_dir)
    assert again == run_dir
    lock.release()


def test_fallback_names_in_the_same_second_are_distinct_and_created(tmp_path):
    run_dir = tmp_path / "demo"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("old run\n")
    claims = [claim_run_dir(run_dir, now=NOON) for _ in range(3)]
    dirs = [d for d, _ in claims]
    assert len(set(dirs)) == 3
    assert [d.name for d in dirs] == [
        "demo-20300102-120000",
        "demo-20300102-120000-2",
        "demo-20300102-120000-3",
    ]
    assert all(d.is_dir() and (d / LOCK_FILE).is_file() for d in dirs)
    for _, lock in claims:
        lock.release()


def test_a_run_dir_held_by_another_process_is_refused_naming_that_process(tmp_path):
    run_dir = tmp_path / "demo"
    holder = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from zbrl.launch.run_dir import claim_run_dir

        claim_run_dir(Path({str(run_dir)!r}))
        print("held", flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunDirInUse) as err:
            claim_run_dir(run_dir)
        assert str(run_dir) in str(err.value) and f"process {proc.pid}" in str(err.value)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    # its lock went with the process: the (empty) directory can be claimed now
    claimed, lock = claim_run_dir(run_dir)
    assert claimed == run_dir
    lock.release()


def test_processes_racing_for_one_finished_run_dir_get_distinct_fallbacks(tmp_path):
    run_dir = tmp_path / "demo"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("old run\n")
    racer = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from zbrl.launch.run_dir import claim_run_dir

        sys.stdin.readline()  # all start together
        path, lock = claim_run_dir(Path({str(run_dir)!r}), now={NOON})
        print(path, flush=True)
        sys.stdin.read()  # hold the lock until told to end
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", racer], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    try:
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        paths = [p.stdout.readline().strip() for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)
    assert all(paths) and len(set(paths)) == 4
    assert {p.rsplit("/", 1)[1] for p in paths} <= {
        "demo-20300102-120000",
        *(f"demo-20300102-120000-{n}" for n in range(2, 5)),
    }


def test_the_driver_holds_the_run_dir_while_inside_and_writes_the_config(tmp_path):
    from zbrl.cli import DEMO_RECIPE
    from zbrl.config import load_config
    from zbrl.launch.driver import prepare_run_dir

    cfg = load_config(DEMO_RECIPE, [f"logging.run_dir={tmp_path / 'run'}"])

    def prepare():
        return prepare_run_dir(cfg, resume=None, sibling_if_used=False)

    with prepare() as run_dir:
        assert run_dir == tmp_path / "run" and (run_dir / "config.yaml").is_file()
        with pytest.raises(RunDirInUse, match=re.escape(str(run_dir))), prepare():
            pass
    with prepare() as second:  # released at the end; the finished one is kept
        assert second != run_dir and (second / "config.yaml").is_file()
