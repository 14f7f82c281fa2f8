"""Reward scoring throughput: responses scored per second (median of 3 runs).

    python bench/rewards.py            # ~500 math responses per reward, 32 programs for code
    python bench/rewards.py --quick    # ~100 math responses, 8 programs, 1 run
    python bench/rewards.py --code     # the code reward and the sandbox backends only

Math responses come in GRPO-like groups (8 responses per prompt, the gold answer shared): ~40%
correct in varied forms (fractions, decimals, thousands separators, LaTeX), ~30% wrong, ~30%
malformed. Each run uses fresh prompts, so parse caches only help within a group, as in training.
Modes: ``worker`` is the default (math_verify in a worker process under a 5 s deadline, every
check of a batch in one round trip); ``worker 1-by-1`` scores the same batch one response per
call (one round trip each: how producers scored before batching); ``in-process`` is
``timeout_s=None`` (static guard only). ``code`` runs small stdin/stdout
programs in the sandbox (``zbrl.rewards.code``), once per sandbox backend (``bwrap`` only where
bubblewrap works). Last, the per-program cost of each backend: the median wall time of one trivial
program (``run_python("print(1)")``), the backends interleaved, and bwrap's as a ratio of
rlimits'.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from fractions import Fraction

from zbrl.rewards import RewardContext, build_reward
from zbrl.sandbox import SandboxLimits, run_python
from zbrl.sandbox.bubblewrap import probe_bwrap

GROUP = 8


def math_item(rng: random.Random) -> tuple[str, list[str]]:
    """A gold answer and equivalent spellings of it."""
    kind = rng.choice(["int", "big", "frac", "neg"])
    if kind == "int":
        n = rng.randint(0, 999)
        return str(n), [str(n), f"{n}.0", f"$${n}$$".replace("$$", "$")]
    if kind == "big":
        n = rng.randint(1000, 10**7)
        return str(n), [str(n), f"{n:,}"]
    if kind == "neg":
        n = -rng.randint(1, 500)
        return str(n), [str(n), f"\u2212{-n}"]
    q = Fraction(rng.randint(1, 9), rng.choice([2, 4, 5, 8]))
    if q.denominator == 1:
        q += Fraction(1, 2)
    latex = f"\\frac{{{q.numerator}}}{{{q.denominator}}}"
    return latex, [
        latex,
        f"{q.numerator}/{q.denominator}",
        str(float(q)),
        f"\\dfrac{{{q.numerator}}}{{{q.denominator}}}",
    ]


def math_batch(kind: str, n: int, seed: int) -> tuple[list[str], list[dict], list[RewardContext]]:
    rng = random.Random(seed)
    responses, examples = [], []
    while len(responses) < n:
        gold, forms = math_item(rng)
        for _ in range(GROUP):
            roll = rng.random()
            answer = rng.choice(forms) if roll < 0.4 else str(rng.randint(-50, 2000))
            think = "Let me work this out. " * rng.randint(5, 60)
            if kind == "think_answer_tags":
                text = f"<think>{think}</think><answer>{answer}</answer>"
                if roll >= 0.7:
                    text = rng.choice([text + " extra", text.replace("</think>", ""), think])
            else:
                text = f"{think} So the answer is \\boxed{{{answer}}}."
                if roll >= 0.7:
                    text = rng.choice([think, text.replace("}.", "")])
            responses.append(text)
            examples.append({"gt_answer": gold})
    ctx = RewardContext(response_tokens=256, max_new_tokens=1024)
    return responses[:n], examples[:n], [ctx] * n


PROGRAMS = {
    "correct": "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
    "wrong": "```python\na, b = map(int, input().split())\nprint(a - b)\n```",
    "crash": "```python\nraise SystemExit(1)\n```",
    "unfenced": "a, b = map(int, input().split())\nprint(a + b)",
}


def code_batch(n: int, seed: int) -> tuple[list[str], list[dict], list[RewardContext]]:
    rng = random.Random(seed)
    kinds = rng.choices(list(PROGRAMS), weights=[6, 2, 1, 1], k=n)
    responses, examples = [], []
    for kind in kinds:
        pairs = [(rng.randint(-99, 99), rng.randint(-99, 99)) for _ in range(3)]
        tests = {
            "inputs": [f"{a} {b}\n" for a, b in pairs],
            "outputs": [f"{a + b}\n" for a, b in pairs],
        }
        responses.append(PROGRAMS[kind])
        examples.append({"test_cases": tests})
    ctx = RewardContext(response_tokens=64, max_new_tokens=512)
    return responses, examples, [ctx] * n


def one_by_one(reward):
    """``reward`` scoring each response in a call of its own."""

    def score_batch(responses, examples, contexts):
        return [
            reward.score_batch([r], [e], [c])[0] for r, e, c in zip(responses, examples, contexts)
        ]

    return type("OneByOne", (), {"score_batch": staticmethod(score_batch)})()


def measure(
    reward, make_batch: Callable[[int], tuple], runs: int, seed: int = 0
) -> tuple[int, float, float]:
    """(responses, median seconds, mean reward); batches ``seed``, ``seed + 1``, ... (give each
    mode its own seeds: the parse cache of a worker would otherwise have seen them)."""
    warm = make_batch(10_000)
    reward.score_batch(*warm)  # start workers, import math_verify / the sandbox
    times, means, n = [], [], 0
    for run in range(runs):
        responses, examples, contexts = make_batch(seed + run)
        n = len(responses)
        start = time.perf_counter()
        results = reward.score_batch(responses, examples, contexts)
        times.append(time.perf_counter() - start)
        means.append(sum(r.reward for r in results) / n)
    return n, statistics.median(times), statistics.mean(means)


def sandbox_backends() -> list[str]:
    probe = probe_bwrap()
    if not probe.works:
        print(f"bwrap: not usable here ({probe.error})")
        return ["rlimits"]
    return ["rlimits", "bwrap"]


def program_overhead(backends: list[str], runs: int) -> dict[str, float]:
    """Median seconds of one trivial program per backend (the backends interleaved)."""
    times: dict[str, list[float]] = {b: [] for b in backends}
    for _ in range(runs + 1):  # the first round warms up
        for backend in backends:
            limits = SandboxLimits(backend=backend)  # type: ignore[arg-type]
            start = time.perf_counter()
            run = run_python("print(1)", "", limits)
            times[backend].append(time.perf_counter() - start)
            assert run.ok and run.backend == backend, run
    return {b: statistics.median(t[1:]) for b, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer responses, one run")
    parser.add_argument("--code", action="store_true", help="the code reward and sandbox only")
    args = parser.parse_args()
    runs = 1 if args.quick else 3
    n_math = 96 if args.quick else 496
    n_code = 8 if args.quick else 32

    rows = []
    for name in () if args.code else ("think_answer_tags", "boxed"):
        modes = (("worker", 5.0), ("worker 1-by-1", 5.0), ("in-process", None))
        for k, (mode, timeout_s) in enumerate(modes):
            reward = build_reward(name, timeout_s=timeout_s)
            if mode == "worker 1-by-1":
                reward = one_by_one(reward)
            n, seconds, mean = measure(
                reward, lambda seed, name=name: math_batch(name, n_math, seed), runs, 1000 * k
            )
            rows.append((name, mode, n, seconds, n / seconds, mean))
    backends = sandbox_backends()
    for backend in backends:
        code = build_reward("code", limits={"backend": backend})
        n, seconds, mean = measure(code, lambda seed: code_batch(n_code, seed), runs)
        rows.append(("code", f"sandbox {backend}", n, seconds, n / seconds, mean))

    print(f"reward scoring throughput (median of {runs} run{'s' * (runs > 1)})")
    header = (
        f"{'reward':<18} {'mode':<15} {'responses':>9} {'seconds':>9} {'resp/s':>9} {'mean r':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, mode, n, seconds, rate, mean in rows:
        print(f"{name:<18} {mode:<15} {n:>9} {seconds:>9.3f} {rate:>9.1f} {mean:>7.3f}")

    overhead_runs = 10 if args.quick else 60
    medians = program_overhead(backends, overhead_runs)
    print(f"\none trivial program (median of {overhead_runs}, backends interleaved)")
    for backend, seconds in medians.items():
        print(f"  {backend:<8} {seconds * 1000:7.1f} ms")
    if "bwrap" in medians:
        print(f"  bwrap / rlimits = {medians['bwrap'] / medians['rlimits']:.2f}")


if __name__ == "__main__":
    main()
