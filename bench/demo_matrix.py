"""Demo runs side by side: variants x seeds, each run pinned to its own cores, and a table of
what the issue targets ask about: overlap efficiency, each side's idle share, held-out gain,
start-up to the end of the first training step, per-token staleness.

    python bench/demo_matrix.py --variant new=. --variant old=/tmp/old \\
        --variant inflight=.:rollout.inflight_updates.enabled=true --seeds 0 1 2

A variant is ``NAME=TREE[:override ...]``: a checkout (its ``src`` is put first on PYTHONPATH,
so two versions of zbrl can run side by side) and ``zbrl train`` overrides, separated by ``:``.
Every run trains ``recipes/demo.yaml`` of its own tree with ``seed=S``. Runs are started in
order, as many at once as there are groups of ``--cores-per-run`` cores among ``--cores`` (each
run's processes, Ray's included, inherit its core set through ``taskset``), so on a machine with
enough cores every run has quiet cores of its own. Each tree's cache is its ``.cache/zbrl``
(build the warm start once first, or link the caches). Prints one line per run and the means per
variant; ``--out`` keeps the run directories.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    name: str
    tree: Path
    overrides: tuple[str, ...]


def parse_variant(text: str) -> Variant:
    name, _, rest = text.partition("=")
    tree, *overrides = rest.split(":")
    if not name or not tree:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: want NAME=TREE[:override ...]")
    return Variant(name, Path(tree).resolve(), tuple(overrides))


def figures(summary: dict) -> dict:
    initial, final = summary["eval_accuracy_initial"], summary["eval_accuracy_final"]
    gain = None if initial is None or final is None else final - initial
    return {
        "overlap": summary["overlap_efficiency"],
        "idle_p": summary["producer_idle_frac"],
        "idle_c": summary["consumer_idle_frac"],
        "gain": gain,
        "startup_s": summary.get("startup_s"),  # absent before the start-up breakdown existed
        "token_staleness": summary.get("mean_token_staleness", summary.get("mean_staleness")),
        "wall_s": summary["wall_s"],
    }


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", type=parse_variant, action="append", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--cores-per-run", type=int, default=2)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="cores to use")
    p.add_argument("--first-core", type=int, default=0, help="use cores from this one on")
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--out", default="/tmp/zbrl-demo-matrix")
    p.add_argument("--python", default=sys.executable)
    a = p.parse_args(argv)

    slots = [
        ",".join(str(c) for c in range(i, i + a.cores_per_run))
        for i in range(a.first_core, a.first_core + a.cores - a.cores_per_run + 1, a.cores_per_run)
    ]
    jobs = [(v, s) for s in a.seeds for v in a.variant]  # seeds outermost: variants interleave
    print(f"{len(jobs)} runs, {len(slots)} at once on cores {slots}", flush=True)
    running: dict[str, tuple[subprocess.Popen, Variant, int, Path, float]] = {}
    results: list[tuple[Variant, int, dict | None]] = []
    free = list(slots)
    while jobs or running:
        while jobs and free:
            variant, seed = jobs.pop(0)
            cores = free.pop(0)
            run_dir = Path(a.out) / f"{variant.name}-s{seed}"
            cmd = ["taskset", "-c", cores, a.python, "-m", "zbrl.cli", "train", "recipes/demo.yaml",
                   f"seed={seed}", f"logging.run_dir={run_dir}", *variant.overrides]  # fmt: skip
            path = [str(variant.tree / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
            Path(a.out).mkdir(parents=True, exist_ok=True)
            log = open(Path(a.out) / f"{variant.name}-s{seed}.log", "w")  # noqa: SIM115
            proc = subprocess.Popen(cmd, cwd=variant.tree, env=env, stdout=log, stderr=log)
            running[cores] = (proc, variant, seed, run_dir, time.monotonic())
        time.sleep(1)
        for cores, (proc, variant, seed, run_dir, started) in list(running.items()):
            if proc.poll() is None and time.monotonic() - started < a.timeout_s:
                continue
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
            summary = run_dir / "summary.json"
            got = figures(json.loads(summary.read_text())) if summary.is_file() else None
            results.append((variant, seed, got))
            print(f"{variant.name} seed {seed}: rc {proc.returncode} {got}", flush=True)
            del running[cores]
            free.append(cores)

    print("\n| variant | seed | overlap | producer idle | consumer idle | held-out gain "
          "| start-up s | token staleness |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for variant, seed, got in sorted(results, key=lambda r: (r[0].name, r[1])):
        if got is None:
            print(f"| {variant.name} | {seed} | failed | | | | | |")
            continue
        print(f"| {variant.name} | {seed} | {fmt(got['overlap'])} | {fmt(got['idle_p'], '.1%')} "
              f"| {fmt(got['idle_c'], '.1%')} | {fmt(got['gain'], '+.3f')} "
              f"| {fmt(got['startup_s'], '.1f')} | {fmt(got['token_staleness'])} |")  # fmt: skip
    print("\nmeans (medians for start-up):")
    for variant in a.variant:
        got = [g for v, _, g in results if v.name == variant.name and g is not None]
        if not got:
            continue

        def mean(key: str, rows: list[dict] = got) -> float | None:
            values = [g[key] for g in rows if g[key] is not None]
            return statistics.fmean(values) if values else None

        starts = [g["startup_s"] for g in got if g["startup_s"] is not None]
        print(f"  {variant.name}: {len(got)} runs, overlap {fmt(mean('overlap'))}, "
              f"idle p/c {fmt(mean('idle_p'), '.1%')}/{fmt(mean('idle_c'), '.1%')}, "
              f"gain {fmt(mean('gain'), '+.3f')}, start-up "
              f"{fmt(statistics.median(starts) if starts else None, '.1f')} s, "
              f"token staleness {fmt(mean('token_staleness'))}")  # fmt: skip
    return 0 if all(g is not None for _, _, g in results) else 1


if __name__ == "__main__":
    sys.exit(main())
