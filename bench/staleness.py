"""Staleness sweep: the demo at several ``transport.max_staleness`` × ``algorithm.correction``.

Every run trains the same number of samples (same steps, same batch) from the same warm start and
is evaluated on the held-out split at its start and end. The table shows held-out accuracy (start,
end, gain), wall time, each role's idle share and the *measured* mean staleness (how many policy
versions old the trained samples were); the plot shows accuracy gain and wall time against
``max_staleness``, one line per correction. Runs go one after the other, each with its own local Ray
(loopback only). Results are appended to the JSON file after every run, so a sweep can be split
over several invocations (``--json`` the same file) and re-rendered with ``--report-only``.

    python bench/staleness.py                                    # 5 staleness x 3 corrections
    python bench/staleness.py --staleness 1 4 --corrections none decoupled --steps 150
    python bench/staleness.py --report-only --json staleness.json --plot staleness.png
    python bench/staleness.py --staleness 8 training.train_microbatch_size=8   # slower consumer

Making staleness real: producers only run ahead when generation outpaces training. On the demo
the producer is slightly slower than the consumer, so by default the sweep slows the consumer
without changing the objective: ``--consumer-microbatch 8`` splits each 64-sequence optimizer step
into 8 micro-batches (gradient accumulation is exact, so the update is the same) and adds a second
producer (``--producers 2``). Check the ``mean stale`` column: it should grow with max_staleness.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from zbrl.config import load_config
from zbrl.launch.driver import run_training

REPO = Path(__file__).resolve().parents[1]
KEYS = (
    "steps",
    "samples_trained",
    "eval_accuracy_initial",
    "eval_accuracy_final",
    "wall_s",
    "producer_idle_frac",
    "consumer_idle_frac",
    "mean_staleness",
)


def run_once(args: argparse.Namespace, staleness: int, correction: str, out: Path) -> dict:
    cfg = load_config(
        args.recipe,
        [
            *args.overrides,
            f"transport.max_staleness={staleness}",
            f"algorithm.correction={correction}",
            f"training.max_steps={args.steps}",
            f"training.train_microbatch_size={args.consumer_microbatch}",
            f"launch.num_producers={args.producers}",
            f"logging.run_dir={out}",
            "logging.progress=false",
            "logging.save_final=false",
            "eval.interval=0",
            f"eval.max_prompts={args.eval_prompts}",
        ],
    )
    summary = run_training(cfg)
    return {k: summary.get(k) for k in KEYS}


def load_results(path: Path | None) -> list[dict]:
    if path is None or not path.exists():
        return []
    return json.loads(path.read_text())["runs"]


def save_results(path: Path | None, runs: list[dict]) -> None:
    if path is not None:
        path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")


def _pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:6.1%}"


def render_table(runs: list[dict]) -> str:
    header = (
        f"{'stale':>5} {'correction':<10} {'steps':>5} {'samples':>7} {'acc0':>6} {'acc':>6} "
        f"{'gain':>6} {'wall s':>7} {'prod idle':>9} {'cons idle':>9} {'mean stale':>10}"
    )
    lines = [header, "-" * len(header)]
    for r in sorted(runs, key=lambda r: (r["max_staleness"], r["correction"])):
        acc0, acc = r["eval_accuracy_initial"], r["eval_accuracy_final"]
        gain = None if acc0 is None or acc is None else acc - acc0
        lines.append(
            f"{r['max_staleness']:>5} {r['correction']:<10} {r['steps']:>5} "
            f"{r['samples_trained']:>7} {_pct(acc0)} {_pct(acc)} "
            f"{'   n/a' if gain is None else f'{gain:+6.3f}'} {r['wall_s']:>7.1f} "
            f"{_pct(r['producer_idle_frac']):>9} {_pct(r['consumer_idle_frac']):>9} "
            f"{r['mean_staleness']:>10.2f}"
        )
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax_acc, ax_time = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for correction in sorted({r["correction"] for r in runs}):
        mine = sorted(
            (r for r in runs if r["correction"] == correction), key=lambda r: r["max_staleness"]
        )
        xs = [r["max_staleness"] for r in mine]
        gains = [r["eval_accuracy_final"] - r["eval_accuracy_initial"] for r in mine]
        ax_acc.plot(xs, gains, marker="o", label=correction)
        ax_time.plot(xs, [r["wall_s"] for r in mine], marker="o", label=correction)
    ax_acc.set(xlabel="max_staleness", ylabel="held-out accuracy gain", title="accuracy")
    ax_time.set(xlabel="max_staleness", ylabel="wall time (s)", title="time")
    for ax in (ax_acc, ax_time):
        ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    parser.add_argument(
        "--corrections", nargs="+", default=["none", "decoupled", "tis"], help="corrections"
    )
    parser.add_argument("--producers", type=int, default=2, help="launch.num_producers")
    parser.add_argument(
        "--consumer-microbatch", type=int, default=8, help="training.train_microbatch_size"
    )
    parser.add_argument("--eval-prompts", type=int, default=200, help="held-out prompts")
    parser.add_argument("--json", type=Path, default=None, help="results file (appended to)")
    parser.add_argument("--plot", type=Path, default=None, help="write the plot here (.png)")
    parser.add_argument("--report-only", action="store_true", help="render --json, run nothing")
    args = parser.parse_args()

    runs = load_results(args.json)
    if not args.report_only:
        with tempfile.TemporaryDirectory(prefix="zbrl-staleness-") as tmp:
            for staleness in args.staleness:
                for correction in args.corrections:
                    out = Path(tmp) / f"s{staleness}-{correction}"
                    result = run_once(args, staleness, correction, out)
                    result.update(
                        max_staleness=staleness,
                        correction=correction,
                        producers=args.producers,
                        consumer_microbatch=args.consumer_microbatch,
                        overrides=args.overrides,
                    )
                    runs.append(result)
                    save_results(args.json, runs)
                    print(render_table([result]).splitlines()[-1], flush=True)
    print()
    print(render_table(runs))
    if args.plot is not None and runs:
        plot(runs, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
