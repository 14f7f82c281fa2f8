"""Peak memory and time of token log-prob computation: naive vs chunked vs from-hidden.

Paths (all compute float32 log-probs of B·T sampled tokens over a V-word vocabulary):

- ``naive``           ``log_softmax(logits.float() / T).gather(tokens)`` on the full logits;
- ``chunked``         :func:`zbrl.algorithms.logprobs_from_logits` (row chunks, custom backward);
- ``naive-hidden``    ``hidden @ W.T`` then ``naive`` (the full logits are created inside the op);
- ``from-hidden``     :func:`zbrl.algorithms.logprobs_from_hidden` (never builds the full logits).

Each (path, mode) runs in a fresh subprocess so that peaks do not mix. The peak is the memory the
operation needs *on top of its inputs* (logits, or hidden + LM-head weight): on CUDA
``torch.cuda.max_memory_allocated`` minus the allocation before the op; on CPU the child's
``ru_maxrss`` high-water mark minus its resident set size just before the op. ``fwd+bwd`` includes
the gradient of the inputs (for the logits paths a full [B, T, V] tensor in the logits' dtype,
which every path must produce). The ratio for the hidden paths is against ``naive-hidden``, for
the logits paths against ``naive``. Time is the median of ``--repeats`` runs.

Usage::

    python bench/logprob_memory.py          # B=8 T=1024 V=32000 H=64: ~2 min on 2 idle CPU cores
    python bench/logprob_memory.py --quick  # tiny sizes, a few seconds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

PATHS = ("naive", "chunked", "naive-hidden", "from-hidden")
MODES = ("fwd", "fwd+bwd")
MIB = 1024 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="B, sequences")
    parser.add_argument("--seq", type=int, default=1024, help="T, tokens per sequence")
    parser.add_argument("--vocab", type=int, default=32000, help="V, vocabulary size")
    parser.add_argument("--hidden", type=int, default=64, help="H, hidden size (hidden paths)")
    parser.add_argument("--chunk-size", type=int, default=1024, help="rows per chunk")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="logits dtype")
    parser.add_argument(
        "--hidden-dtype",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="hidden/LM-head dtype; auto = --dtype on CUDA, fp32 on CPU (CPU bf16 matmul is slow)",
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per path and mode")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--quick", action="store_true", help="B=2, T=256, V=8000, H=64, 2 repeats (smoke test)"
    )
    parser.add_argument("--child", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.seq, args.vocab, args.hidden, args.repeats = 2, 256, 8000, 64, 2
    return args


# ------------------------------------------------------------------------------------ child side


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def max_rss_bytes() -> int:
    # Linux reports ru_maxrss in KiB (macOS in bytes; this bench targets Linux).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_child(args: argparse.Namespace) -> dict:
    import torch

    from zbrl.algorithms import logprobs_from_hidden, logprobs_from_logits

    path, mode = args.child
    device = torch.device(
        "cuda"
        if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        else "cpu"
    )
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    hidden_dtype = resolve_hidden_dtype(args, device.type)
    hidden_dtype = torch.bfloat16 if hidden_dtype == "bf16" else torch.float32
    backward = mode == "fwd+bwd"
    rows, temperature, chunk = args.batch * args.seq, args.temperature, args.chunk_size

    def naive(logits_BTV, tokens_BT):
        log_probs = torch.log_softmax(logits_BTV.float() / temperature, dim=-1)
        return log_probs.gather(-1, tokens_BT.unsqueeze(-1)).squeeze(-1)

    def make_inputs(batch: int, seq: int):
        gen = torch.Generator(device=device).manual_seed(0)
        tokens = torch.randint(0, args.vocab, (batch, seq), device=device, generator=gen)
        weights = torch.randn(batch, seq, device=device, generator=gen)
        if path in ("naive", "chunked"):  # allocate directly in `dtype`: no float32 temporary
            logits = torch.empty(batch, seq, args.vocab, device=device, dtype=dtype)
            logits.normal_(generator=gen).requires_grad_(backward)
            return (logits,), tokens, weights
        hidden = torch.empty(batch, seq, args.hidden, device=device, dtype=hidden_dtype)
        weight = torch.empty(args.vocab, args.hidden, device=device, dtype=hidden_dtype)
        hidden.normal_(generator=gen).requires_grad_(backward)
        weight.normal_(generator=gen).mul_(args.hidden**-0.5).requires_grad_(backward)
        return (hidden, weight), tokens, weights

    def op(tensors, tokens):
        if path == "naive":
            return naive(tensors[0], tokens)
        if path == "chunked":
            return logprobs_from_logits(
                tensors[0], tokens, temperature=temperature, chunk_size=chunk
            )
        if path == "naive-hidden":
            return naive(tensors[0] @ tensors[1].t(), tokens)
        logprobs, _ = logprobs_from_hidden(
            *tensors, tokens, temperature=temperature, chunk_size=chunk
        )
        return logprobs

    def run_once(tensors, tokens, weights) -> float:
        for tensor in tensors:
            tensor.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.set_grad_enabled(backward):
            logprobs = op(tensors, tokens)
            if backward:
                (logprobs * weights).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        del logprobs
        return time.perf_counter() - start

    warm = make_inputs(1, 8)  # load kernels and libraries before the baseline
    run_once(*warm)
    del warm
    tensors, tokens, weights = make_inputs(args.batch, args.seq)
    result = {"path": path, "mode": mode, "device": device.type, "rows": rows}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = current_rss_bytes()
        # ru_maxrss is a high-water mark: if it already sits above the baseline, a smaller op
        # peak would be hidden. Flag it instead of reporting a wrong number silently.
        result["hidden_by_earlier_peak_mib"] = max(0, max_rss_bytes() - baseline) / MIB
    times = [run_once(tensors, tokens, weights) for _ in range(args.repeats)]
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        peak = max_rss_bytes() - baseline
    result["peak_mib"] = peak / MIB
    result["median_s"] = statistics.median(times)
    return result


# ----------------------------------------------------------------------------------- parent side


def resolve_hidden_dtype(args: argparse.Namespace, device_type: str) -> str:
    if args.hidden_dtype != "auto":
        return args.hidden_dtype
    return args.dtype if device_type == "cuda" else "fp32"


def child_command(args: argparse.Namespace, path: str, mode: str) -> list[str]:
    command = [sys.executable, os.path.abspath(__file__), "--child", path, mode]
    flags = ("batch", "seq", "vocab", "hidden", "chunk_size", "dtype", "hidden_dtype")
    for flag in (*flags, "temperature"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    command += ["--repeats", str(args.repeats), "--device", args.device]
    return command


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)))
        return 0
    paths = [p for p in args.paths.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(paths) - set(PATHS)) + sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"unknown --paths/--modes entries {unknown}; choose from {PATHS} {MODES}")
    logits_mib = args.batch * args.seq * args.vocab * (2 if args.dtype == "bf16" else 4) / MIB
    print(
        f"log-prob memory bench: B={args.batch} T={args.seq} V={args.vocab} H={args.hidden} "
        f"chunk={args.chunk_size} dtype={args.dtype} temperature={args.temperature} "
        f"repeats={args.repeats}\n"
        f"full logits in {args.dtype}: {logits_mib:.0f} MiB; a float32 copy: "
        f"{args.batch * args.seq * args.vocab * 4 / MIB:.0f} MiB\n"
    )
    results = []
    for mode in modes:
        for path in paths:
            proc = subprocess.run(
                child_command(args, path, mode), capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                raise SystemExit(f"child {path} {mode} failed:\n{proc.stderr}")
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))

    device = results[0]["device"] if results else "?"
    print(
        f"device: {device}; logits paths in {args.dtype}, hidden paths in "
        f"{resolve_hidden_dtype(args, device)}; peak = memory above the inputs "
        f"(see module docstring)\n"
    )
    header = f"{'mode':<8} {'path':<13} {'peak MiB':>9} {'vs naive':>9} {'median s':>9}"
    print(header)
    print("-" * len(header))
    for row in results:
        reference_path = "naive-hidden" if "hidden" in row["path"] else "naive"
        reference = next(
            (r for r in results if r["mode"] == row["mode"] and r["path"] == reference_path), None
        )
        ratio = (
            f"{row['peak_mib'] / reference['peak_mib']:.3f}"
            if reference and reference["peak_mib"] > 0
            else "-"
        )
        print(
            f"{row['mode']:<8} {row['path']:<13} {row['peak_mib']:>9.1f} {ratio:>9} "
            f"{row['median_s']:>9.3f}"
        )
        if row.get("hidden_by_earlier_peak_mib", 0) > 16:
            print(
                f"  warning: a pre-op peak of {row['hidden_by_earlier_peak_mib']:.0f} MiB "
                f"may hide part of this path's peak"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
