"""Start-up of ``zbrl train recipes/demo.yaml eval.sets={}``: from the command's start to the end
of its first training step, with the breakdown the run's summary.json carries (docs/performance.md,
"Start-up").

Each run is a fresh process, started the way the ``zbrl`` console script starts it, with
``training.max_steps`` cut short (the start-up does not depend on it) and the run's directory in a
temporary folder. The warm start and the task come from the checkout's cache (``.cache/zbrl``:
the first run on a fresh clone builds them), seen through a temporary cache folder whose
``prompts`` (the encoded prompts, :mod:`zbrl.assembly.prompt_cache`) are its own: one run of each
variant before the measured ones fills it, as a clone's first run does; ``--cold-prompts`` empties
it before every run (every start encodes its prompts). The
total is measured from outside (the time just before the process is started to the end of the
first ``train_step`` span) and from inside (the summary's ``startup_s``, from the process's
creation). The benchmark also watches the run from outside while it starts: the time at which
the run's first metrics line (``metrics.jsonl``) appears, as a user watching the run sees it
(``first_metrics_s``), and the CPU seconds each of the run's processes (the driver, Ray's own,
each worker, read from ``/proc`` every ``--sample-s``) used until then (``cpu ...`` rows: where
the two cores went). Each run's line carries the load average at its start.

Variants (``--variant NAME=CHECKOUT``, e.g. an older commit unpacked with
``git archive <commit> | tar -x -C /tmp/old``) run interleaved, round by round, so that they share
the machine's load; each runs its own code (``PYTHONPATH=CHECKOUT/src``) and recipe.

``--local-ray fast plain`` measures each checkout with each ``launch.local_ray`` mode, side by
side in the same rounds (``fast``: zbrl's replacements of Ray internals and its fork server;
``plain``: Ray as it ships; docs/local-ray.md).

    python bench/startup.py --runs 5
    python bench/startup.py --runs 5 --local-ray fast plain
    python bench/startup.py --runs 5 --variant before=/tmp/old --variant after=.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND = ["train", "recipes/demo.yaml", "eval.sets={}"]
CONSOLE_SCRIPT = "import sys; from zbrl.cli import main; sys.exit(main())"


def run_once(
    checkout: Path, out: Path, steps: int, extra: list[str], cache: Path, sample_s: float
) -> dict:
    """One ``zbrl train`` of ``checkout``'s code; its start-up figures."""
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    argv = [*COMMAND, f"training.max_steps={steps}", f"logging.run_dir={run_dir}"]
    argv += [f"logging.cache_dir={cache}", *extra]
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    log = out / "run.log"
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", CONSOLE_SCRIPT, *argv],
            cwd=checkout,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
        first_metrics, cpu = watch(proc, run_dir / "metrics.jsonl", t0, sample_s)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(
            f"{checkout}: zbrl train exited {proc.returncode}; the end of {log}:\n{tail}"
        )
    ends = [
        s["end"]
        for s in map(json.loads, (run_dir / "timeline.jsonl").read_text().splitlines())
        if s["name"] == "train_step" and s["start"] >= t0
    ]
    summary = json.loads((run_dir / "summary.json").read_text())
    figures = {"measured_s": min(ends) - t0}
    if first_metrics is not None:
        figures["first_metrics_s"] = first_metrics
    if summary.get("startup_s") is not None:
        figures["startup_s"] = summary["startup_s"]
        figures.update(summary["startup"])
        for worker, parts in summary.get("startup_workers", {}).items():
            figures[f"{worker} startup"] = parts["total_s"]
    figures.update({f"cpu {name}": seconds for name, seconds in cpu.items()})
    if cpu:
        figures["cpu all"] = sum(cpu.values())
    return figures


def watch(
    proc: subprocess.Popen, metrics: Path, t0: float, sample_s: float, timeout_s: float = 900.0
) -> tuple[float | None, dict[str, float]]:
    """Wait for ``proc`` to end; returns when (seconds after ``t0``) ``metrics`` got its first
    line, and the CPU seconds of ``proc``'s process tree by kind up to then (empty when
    ``sample_s`` is 0 or ``/proc`` is missing)."""
    first: float | None = None
    cpu: dict[int, tuple[str, float]] = {}
    next_sample = 0.0
    while proc.poll() is None:
        now = time.time()
        if now - t0 > timeout_s:
            proc.kill()
            raise SystemExit(f"zbrl train did not end within {timeout_s} s")
        if first is None:
            if metrics.exists() and metrics.stat().st_size > 0:
                first = now - t0
                if sample_s > 0:
                    sample_tree(proc.pid, cpu)  # the last sample: CPU up to the first metrics
            elif sample_s > 0 and now >= next_sample:
                sample_tree(proc.pid, cpu)
                next_sample = now + sample_s
        time.sleep(0.01)
    by_kind: dict[str, float] = {}
    for kind, seconds in cpu.values():
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    return first, dict(sorted(by_kind.items()))


TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def sample_tree(root: int, cpu: dict[int, tuple[str, float]]) -> None:
    """Add (or update) the kind and CPU seconds of ``root`` and each of its descendants in
    ``cpu`` (pid -> (kind, seconds)); a process that ended keeps its last sample."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S)
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    for pid in tree:
        if pid in stats:
            kind = process_kind(pid, root)
            if kind == "ray worker" and pid in cpu:
                kind = cpu[pid][0]  # an actor's title, once seen, over "ray::IDLE"
            cpu[pid] = (kind, stats[pid][1])


def process_kind(pid: int, root: int) -> str:
    """What a process of the run is: the driver, one of Ray's own, a worker (by its actor's
    class, from the title Ray gives it), or the program it runs."""
    if pid == root:
        return "driver"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "other"
    line = b" ".join(argv).decode(errors="replace")
    if line.startswith("ray::"):
        name = line[5:].split()[0].split(".")[0]
        return "ray worker" if name in ("IDLE", "") else name
    program = Path(argv[0].decode(errors="replace")).name
    if program in RAY_PROGRAMS:
        return RAY_PROGRAMS[program]
    for marker, kind in RAY_SCRIPTS:
        if marker in line:
            return kind
    return program or "other"


RAY_PROGRAMS = {"gcs_server": "ray gcs", "raylet": "ray raylet"}
"""Ray's own executables (the raylet's command line names the agents' scripts too)."""
RAY_SCRIPTS = (
    ("dashboard/agent.py", "ray dashboard agent"),
    ("runtime_env/agent", "ray runtime-env agent"),
    ("log_monitor.py", "ray log monitor"),
    ("default_worker.py", "ray worker"),
    ("agent_standin.py", "zbrl agent stand-in"),
    ("local_ray.forkserver", "zbrl fork server"),
    ("worker_exec.py", "zbrl worker stand-in"),
)
"""Markers in the command lines of Ray's Python processes."""


def bench_cache(tmp: Path) -> Path:
    """A cache folder that shows the checkout's cache entries (warm starts, tasks) but keeps its
    own encoded prompts."""
    cache = tmp / "cache"
    cache.mkdir()
    shared = REPO / ".cache" / "zbrl"
    shared.mkdir(parents=True, exist_ok=True)
    for entry in shared.iterdir():
        if entry.name != "prompts":
            (cache / entry.name).symlink_to(entry)
    return cache


def medians(rows: list[dict]) -> dict[str, float]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {k: statistics.median(r[k] for r in rows if k in r) for k in keys}


def table(results: dict[str, list[dict]]) -> str:
    names = list(results)
    med = {n: medians(rows) for n, rows in results.items()}
    keys = list(dict.fromkeys(k for n in names for k in med[n]))
    width = max(len(k) for k in keys)
    head = f"{'median s':<{width}}  " + "  ".join(f"{n:>10}" for n in names)
    lines = [head, "-" * len(head)]
    for k in keys:
        cells = "  ".join(f"{med[n][k]:>10.2f}" if k in med[n] else f"{'-':>10}" for n in names)
        lines.append(f"{k:<{width}}  {cells}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each variant")
    parser.add_argument("--steps", type=int, default=3, help="training.max_steps of each run")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=CHECKOUT",
        help="a checkout to measure (default: this one); several run interleaved",
    )
    parser.add_argument(
        "--cold-prompts", action="store_true", help="no cached encoded prompts in any run"
    )
    parser.add_argument(
        "--sample-s",
        type=float,
        default=0.2,
        help="seconds between reads of the processes' CPU times (0: none)",
    )
    parser.add_argument(
        "--local-ray",
        nargs="+",
        choices=["fast", "plain"],
        default=[],
        help="measure each checkout with each launch.local_ray mode, interleaved",
    )
    parser.add_argument("overrides", nargs="*", help="more dotted overrides for every run")
    args = parser.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant) or {"this": str(REPO)}
    checkouts: dict[str, tuple[Path, list[str]]] = {}
    for name, path in variants.items():
        for mode in args.local_ray or [None]:
            label = name if mode is None else (mode if not args.variant else f"{name}/{mode}")
            extra = [*args.overrides, *([f"launch.local_ray={mode}"] if mode else [])]
            checkouts[label] = (Path(path).resolve(), extra)
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="zbrl-startup-") as tmp:
        cache = bench_cache(Path(tmp))
        for name, (checkout, extra) in checkouts.items():  # fills the caches: not measured
            run_once(checkout, Path(tmp) / f"warm-{name.replace('/', '-')}", 1, extra, cache, 0.0)
        results: dict[str, list[dict]] = {name: [] for name in checkouts}
        for i in range(args.runs):
            order = list(checkouts)
            order = order[i % len(order) :] + order[: i % len(order)]  # rotate who goes first
            for name in order:
                out = Path(tmp) / f"{name.replace('/', '-')}-{i}"
                if args.cold_prompts:
                    shutil.rmtree(cache / "prompts", ignore_errors=True)
                load = os.getloadavg()[0]
                checkout, extra = checkouts[name]
                fig = run_once(checkout, out, args.steps, extra, cache, args.sample_s)
                fig["load average"] = load
                results[name].append(fig)
                print(
                    f"{name} run {i}: first metrics line {fig.get('first_metrics_s', -1):.2f} s, "
                    f"first training step ended {fig['measured_s']:.2f} s, "
                    f"CPU {fig.get('cpu all', 0):.1f} s (load average {load:.2f})",
                    flush=True,
                )
    print(f"load average after: {os.getloadavg()}")
    print(f"\nzbrl {' '.join(COMMAND)}: from the command's start (outside the process)")
    prompts = "none cached" if args.cold_prompts else "encoded prompts cached"
    print(
        f"({args.runs} runs of each, interleaved; {prompts}; first_metrics_s: the first line of "
        "metrics.jsonl seen; measured_s: the end of the first train_step span; parts from "
        "summary.json; cpu: seconds of each process up to the first metrics line)\n"
    )
    print(table(results))


if __name__ == "__main__":
    main()
