"""Validate ``zbrl plan``: plan other shapes from a real 1x1 run, run those shapes for real, and
compare predicted with measured trained samples/s, idle shares and mean staleness.

Each repeat runs the recipe as 1 producer x 1 consumer, plans 2x1, 1x2 and 2x2 (producers x
consumers; two consumers train data-parallel with ``training.engine``, DDP by default) from that
run with the machine's cores taken into account (``--run-cores``/``--cores`` of ``zbrl plan``, fair
sharing, data-parallel ranks as one competitor), then runs each shape with the same settings. Every
run has its own local Ray (loopback only). The 1x1 row is the run planning itself (a check of the
model, not of a prediction). Figures are steady state (the first tenth of the steps left out, as
the planner does); with ``--repeats`` every figure is the median over the repeats.

    python bench/plan_validation.py                        # demo recipe, 50 steps, 1 repeat
    python bench/plan_validation.py --repeats 3 --json out.json --plot out.png
    python bench/plan_validation.py --shapes 2x1 --steps 40 key=value ...
    python bench/plan_validation.py --repeats 3 --keep runs/pv    # keep the run directories
    python bench/plan_validation.py --repeats 3 --replan runs/pv  # re-plan them, no new runs

Where a shape has two consumers and 2x2 is among the shapes, the row "2x2 from 1x2" plans 2x2 from
the real 1x2 run, and the data-parallel efficiency that would have predicted 1x2 is printed.
Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from zbrl.config import load_config
from zbrl.launch.driver import run_training
from zbrl.planning import read_rates, simulate
from zbrl.planning.command import DEFAULT_DP_EFFICIENCY
from zbrl.planning.compare import (
    Comparison,
    measured_figures,
    median_comparison,
    predicted_figures,
    render_table,
)
from zbrl.planning.rates import RunRates
from zbrl.planning.simulate import Shape, measured_shape

REPO = Path(__file__).resolve().parents[1]
CPUS_PER_WORKER = 0.5
"""Ray CPUs asked per worker, so that 2x2 fits a 2-core machine (placement only: each worker runs
``launch.torch_threads`` threads whatever it asks)."""


def parse_shape(text: str) -> tuple[int, int]:
    p, _, c = text.partition("x")
    return int(p), int(c)


def run_shape(args: argparse.Namespace, producers: int, consumers: int, out: Path) -> dict:
    engine = "single" if consumers == 1 else args.engine
    cfg = load_config(
        args.recipe,
        [
            *args.overrides,
            f"launch.num_producers={producers}",
            f"launch.num_consumers={consumers}",
            f"launch.producer_num_cpus={CPUS_PER_WORKER}",
            f"launch.consumer_num_cpus={CPUS_PER_WORKER}",
            f"training.engine={engine}",
            f"training.max_steps={args.steps}",
            f"logging.run_dir={out}",
            "logging.progress=false",
            "logging.save_final=false",
            "eval.sets={}",
        ],
    )
    return run_training(cfg)


def plan(
    base: Path,
    producers: int,
    consumers: int,
    args: argparse.Namespace,
    dp_efficiency: float,
    load: float | None = None,
) -> dict:
    """The plan of ``producers x consumers`` from the run ``base``, at the background load
    measured in ``base`` (or at ``load``)."""
    rates, shape = _rates_and_shape(base, producers, consumers, args, dp_efficiency)
    if load is not None:
        shape = replace(shape, background_load=load)
    return predicted_figures(simulate(rates, shape))


def _rates_and_shape(
    base: Path, producers: int, consumers: int, args: argparse.Namespace, dp_efficiency: float
) -> tuple[RunRates, Shape]:
    rates = read_rates(base, args.cores)
    shape = measured_shape(
        rates,
        producers=producers,
        consumers=consumers,
        cores=args.cores,
        dp_efficiency=dp_efficiency,
        steps=args.sim_steps,
        seed=0,
    )
    return rates, shape


def fitted_dp_efficiency(base: Path, consumers: int, measured: float, args) -> float:
    """The ``dp_efficiency`` under which the plan from ``base`` gives the ``measured`` samples/s
    of 1 producer x ``consumers`` (bisection; a diagnostic of what the assumption missed)."""
    lo, hi = 0.02, 1.0
    rates, shape = _rates_and_shape(base, 1, consumers, args, 1.0)
    if simulate(rates, shape).samples_per_s <= measured:
        return 1.0
    for _ in range(20):
        mid = (lo + hi) / 2
        if simulate(rates, replace(shape, dp_efficiency=mid)).samples_per_s > measured:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    parser.add_argument("--steps", type=int, default=50, help="training steps per real run")
    parser.add_argument("--shapes", default="2x1,1x2,2x2", help="producers x consumers to check")
    parser.add_argument("--engine", default="ddp", choices=["ddp", "fsdp2"])
    parser.add_argument(
        "--cores",
        type=int,
        default=os.cpu_count(),
        help="cores the workers share (default: this machine's)",
    )
    parser.add_argument("--dp-efficiency", type=float, default=DEFAULT_DP_EFFICIENCY)
    parser.add_argument("--sim-steps", type=int, default=200, help="simulated steps per plan")
    parser.add_argument("--repeats", type=int, default=1, help="medians over this many repeats")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--plot", default=None, help="predicted-vs-measured plot (PNG)")
    parser.add_argument("--keep", default=None, help="keep the run directories under here")
    parser.add_argument(
        "--replan",
        default=None,
        metavar="DIR",
        help="no runs: plan again from the runs kept under DIR by --keep (planner changes)",
    )
    args = parser.parse_args()
    if args.replan:
        args.keep = args.replan
    shapes = [parse_shape(s) for s in args.shapes.split(",")]

    load_before = os.getloadavg()
    per_shape: dict[str, list[Comparison]] = {}
    loads: dict[str, list[float | None]] = {}  # background load measured in each run
    fitted: list[float] = []  # the dp_efficiency that would have predicted 1x2
    at_load: dict[str, list[Comparison]] = {}  # planned at the load each run measured
    with tempfile.TemporaryDirectory(prefix="zbrl-planval-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for rep in range(args.repeats):
            base = root / f"r{rep}-1x1"
            if not args.replan:
                run_shape(args, 1, 1, base)
            g = read_rates(base).group_size
            todo = [(1, 1), *shapes]
            for producers, consumers in todo:
                name = f"{producers}x{consumers}"
                out = base if (producers, consumers) == (1, 1) else root / f"r{rep}-{name}"
                predicted = plan(base, producers, consumers, args, args.dp_efficiency)
                if out != base and not args.replan:
                    run_shape(args, producers, consumers, out)
                c = Comparison(name, predicted, measured_figures(out, g))
                per_shape.setdefault(name, []).append(c)
                loads.setdefault(name, []).append(read_rates(out, args.cores).background_load)
                if loads[name][-1] is not None:  # diagnostic: the same plan at the run's load
                    at_load.setdefault(name, []).append(
                        Comparison(
                            name,
                            plan(
                                base,
                                producers,
                                consumers,
                                args,
                                args.dp_efficiency,
                                loads[name][-1],
                            ),
                            c.measured,
                        )
                    )
                print(
                    f"repeat {rep + 1}/{args.repeats} {name}: {_one_line(c)}; background load "
                    f"{_num(loads[name][-1])} (planned with {_num(loads['1x1'][-1])})",
                    flush=True,
                )
            if (1, 2) in shapes:
                dp = root / f"r{rep}-1x2"
                fitted.append(
                    fitted_dp_efficiency(
                        base, 2, per_shape["1x2"][-1].measured["samples_per_s"], args
                    )
                )
                if (2, 2) in shapes:  # data-parallel consumers measured: plan from them
                    name = "2x2 from 1x2"
                    c = Comparison(
                        name,
                        plan(dp, 2, 2, args, args.dp_efficiency),
                        measured_figures(root / f"r{rep}-2x2", g),
                    )
                    per_shape.setdefault(name, []).append(c)
                    print(f"repeat {rep + 1}/{args.repeats} {name}: {_one_line(c)}", flush=True)
    load_after = os.getloadavg()

    rows = [median_comparison(name, cs) for name, cs in per_shape.items()]
    print(
        f"\n{args.steps} steps per run, {args.repeats} repeat(s) (medians), planned from the 1x1 "
        f"run with {args.cores} cores shared (data-parallel engine {args.engine}, assumed "
        f"efficiency {args.dp_efficiency}); the 1x1 row is the run planning itself"
    )
    print(render_table(rows))
    loaded_rows = [median_comparison(name, cs) for name, cs in at_load.items()]
    if loaded_rows:
        print(
            "\ndiagnostic: the same plans at the background load each run measured (separates "
            "the model's error from the load's drift between runs; for data-parallel shapes the "
            "measured load also holds what data-parallel training adds (the split batch's "
            "take, the all-reduce's communication), so those rows are not predictions)"
        )
        print(render_table(loaded_rows))
    measured_loads = [
        f"{name} {statistics.median(v):.2f}"
        for name, v in loads.items()
        if all(x is not None for x in v)
    ]
    if measured_loads:
        print(
            "background load measured in each run (median; other runnable processes on the "
            f"cores, the plans assume the 1x1 run's): {', '.join(measured_loads)}"
        )
    if fitted:
        print(
            f"the data-parallel efficiency that would have predicted 1x2's samples/s: "
            f"{statistics.median(fitted):.2f} (median; assumed {args.dp_efficiency}); "
            "'2x2 from 1x2' is planned from the 1x2 run, whose consumers were data-parallel"
        )
    print(
        f"load average (1/5/15 min) before {_load(load_before)}, after {_load(load_after)}; "
        f"{os.cpu_count()} cores"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "steps": args.steps,
                    "repeats": args.repeats,
                    "cores": args.cores,
                    "engine": args.engine,
                    "dp_efficiency": args.dp_efficiency,
                    "load_before": load_before,
                    "load_after": load_after,
                    "medians": [r.as_dict() for r in rows],
                    "medians_at_run_load": [r.as_dict() for r in loaded_rows],
                    "runs": {k: [c.as_dict() for c in cs] for k, cs in per_shape.items()},
                    "background_load": loads,
                    "fitted_dp_efficiency": fitted,
                },
                indent=2,
            )
        )
    if args.plot:
        plot(rows, per_shape, Path(args.plot))


def _one_line(c: Comparison) -> str:
    p, m = c.predicted, c.measured
    return (
        f"samples/s {p['samples_per_s']:.1f} vs {m['samples_per_s']:.1f}, "
        f"prod idle {p['producer_idle_frac']:.0%} vs {m['producer_idle_frac']:.0%}, "
        f"cons idle {p['consumer_idle_frac']:.0%} vs {m['consumer_idle_frac']:.0%}"
    )


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def plot(rows: list[Comparison], per_shape: dict[str, list[Comparison]], path: Path) -> None:
    """Predicted against measured samples/s and idle shares, one point per shape (medians) and
    faint points per repeat; the diagonal and the bounds around it."""
    try:
        import matplotlib
    except ImportError:
        print(f"--plot: matplotlib is not installed, no plot written to {path}")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zbrl.planning.compare import IDLE_BOUND, THROUGHPUT_BOUND

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    top = max(max(r.predicted["samples_per_s"], r.measured["samples_per_s"]) for r in rows) * 1.15
    xs = [0, top]
    a.plot(xs, xs, color="grey", lw=1)
    a.fill_between(
        xs,
        [0, top * (1 - THROUGHPUT_BOUND)],
        [0, top * (1 + THROUGHPUT_BOUND)],
        color="grey",
        alpha=0.15,
        label=f"±{THROUGHPUT_BOUND:.0%}",
    )
    for i, r in enumerate(rows):
        color = f"C{i}"
        for c in per_shape[r.shape]:
            a.scatter(
                c.measured["samples_per_s"], c.predicted["samples_per_s"], alpha=0.3, s=12, c=color
            )
        a.scatter(r.measured["samples_per_s"], r.predicted["samples_per_s"], s=40, c=color)
        a.annotate(r.shape, (r.measured["samples_per_s"], r.predicted["samples_per_s"]))
    a.set_xlim(0, top)
    a.set_ylim(0, top)
    a.set_xlabel("measured trained samples/s")
    a.set_ylabel("predicted trained samples/s")
    a.legend(loc="upper left")
    b.plot([0, 1], [0, 1], color="grey", lw=1)
    b.fill_between(
        [0, 1],
        [-IDLE_BOUND, 1 - IDLE_BOUND],
        [IDLE_BOUND, 1 + IDLE_BOUND],
        color="grey",
        alpha=0.15,
        label=f"±{IDLE_BOUND * 100:.0f} points",
    )
    for role, marker in (("producer", "o"), ("consumer", "s")):
        key = f"{role}_idle_frac"
        b.scatter(
            [r.measured[key] for r in rows],
            [r.predicted[key] for r in rows],
            marker=marker,
            label=f"{role} idle",
        )
        for r in rows:
            b.annotate(r.shape, (r.measured[key], r.predicted[key]))
    b.set_xlim(0, 1)
    b.set_ylim(0, 1)
    b.set_xlabel("measured idle share")
    b.set_ylabel("predicted idle share")
    b.legend(loc="upper left")
    fig.suptitle("zbrl plan: predicted vs measured (steady state, medians)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
