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
creation).

Variants (``--variant NAME=CHECKOUT``, e.g. an older commit unpacked with
``git archive <commit> | tar -x -C /tmp/old``) run interleaved, round by round, so that they share
the machine's load; each runs its own code (``PYTHONPATH=CHECKOUT/src``) and recipe.

    python bench/startup.py --runs 5
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


def run_once(checkout: Path, out: Path, steps: int, extra: list[str], cache: Path) -> dict:
    """One ``zbrl train`` of ``checkout``'s code; its start-up figures."""
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    argv = [*COMMAND, f"training.max_steps={steps}", f"logging.run_dir={run_dir}"]
    argv += [f"logging.cache_dir={cache}", *extra]
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    log = out / "run.log"
    t0 = time.time()
    with log.open("w") as f:
        rc = subprocess.run(
            [sys.executable, "-c", CONSOLE_SCRIPT, *argv],
            cwd=checkout,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=900,
        ).returncode
    if rc != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"{checkout}: zbrl train exited {rc}; the end of {log}:\n{tail}")
    ends = [
        s["end"]
        for s in map(json.loads, (run_dir / "timeline.jsonl").read_text().splitlines())
        if s["name"] == "train_step" and s["start"] >= t0
    ]
    summary = json.loads((run_dir / "summary.json").read_text())
    figures = {"measured_s": min(ends) - t0}
    if summary.get("startup_s") is not None:
        figures["startup_s"] = summary["startup_s"]
        figures.update(summary["startup"])
        for worker, parts in summary.get("startup_workers", {}).items():
            figures[f"{worker} startup"] = parts["total_s"]
    return figures


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
    parser.add_argument("--steps", type=int, default=2, help="training.max_steps of each run")
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
    parser.add_argument("overrides", nargs="*", help="more dotted overrides for every run")
    args = parser.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant) or {"this": str(REPO)}
    checkouts = {name: Path(path).resolve() for name, path in variants.items()}
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="zbrl-startup-") as tmp:
        cache = bench_cache(Path(tmp))
        for name, checkout in checkouts.items():  # fills the caches: not measured
            run_once(checkout, Path(tmp) / f"warm-{name}", 1, args.overrides, cache)
        results: dict[str, list[dict]] = {name: [] for name in checkouts}
        for i in range(args.runs):
            order = list(checkouts)
            order = order[i % len(order) :] + order[: i % len(order)]  # rotate who goes first
            for name in order:
                out = Path(tmp) / f"{name}-{i}"
                if args.cold_prompts:
                    shutil.rmtree(cache / "prompts", ignore_errors=True)
                fig = run_once(checkouts[name], out, args.steps, args.overrides, cache)
                results[name].append(fig)
                print(f"{name} run {i}: {fig['measured_s']:.2f} s", flush=True)
    print(f"load average after: {os.getloadavg()}")
    print(f"\nzbrl {' '.join(COMMAND)}: start to the end of the first training step")
    prompts = "none cached" if args.cold_prompts else "encoded prompts cached"
    print(f"({args.runs} runs of each, interleaved; {prompts}; parts from summary.json)\n")
    print(table(results))


if __name__ == "__main__":
    main()
