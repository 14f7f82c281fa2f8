"""What zbrl does by default and has never run on a GPU, beside its plain alternative, in one
command on a machine with one CUDA GPU (about 3-5 minutes on one H100; at most 8).

Each row is a check that runs in a process of its own, with its own time limit, so a check that
fails, hangs or crashes its process leaves the others' rows intact:

- ``fork_server``: Ray workers forked from zbrl's fork server (``launch.local_ray=fast
  launch.fork_workers=true``) that then use CUDA, against a fresh Ray worker (``plain``).
- ``fast_decode``: zbrl's own decode loop in bfloat16 on CUDA against transformers' ``generate``
  on a 0.36B Llama-shaped model (random weights): the same tokens from the same seed, tokens/s.
- ``fsdp2``: the FSDP2 engine's train step on NCCL against the single-process engine. One GPU:
  world size 1 (NCCL on one rank; two ranks need two GPUs).
- ``cuda_ipc``: the same-GPU weight handoff (``transport.weight_sync.type=cuda_ipc``) against the
  object store (bench/weight_handoff.py).
- ``memory_qwen2.5-0.5b``, ``memory_qwen3-moe``: the memory plan's consumer bytes against
  ``torch.cuda.max_memory_allocated`` over two train steps, on random weights of those shapes.
- ``vllm``: vLLM generation, when vLLM is importable.

Without a CUDA GPU it refuses in one line and exits 2. The table is printed and written, with
each check's record, to ``--out`` (default ``$OUT`` or /tmp/gpu_check): gpu_check.md,
gpu_check.json.

On the lent GPU machine (carry .device, built by ../shared/gpu/prepare.sh), from the project root:

    bash .device/setup.sh && export PYTHONPATH=/tmp/site:$PWD/src RAY_USAGE_STATS_ENABLED=0 \\
      PYTHONUNBUFFERED=1 && python3 bench/gpu_check.py

``--cpu-check`` runs every check on the CPU at a small size (gloo for NCCL, no memory peak):
a check of the script itself where no GPU is.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 480.0
"""The whole check's limit: 8 minutes."""


def refusal() -> str | None:
    """Why this machine cannot run the check (None: it has a CUDA GPU torch can use). A CPU
    build of torch is recognised from its version file, without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "torch is not installed"
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        text = ""
    found = re.search(r"^cuda\b[^=]*=\s*(.+?)\s*$", text, re.MULTILINE)
    if found is not None and found.group(1).strip("'\"") == "None":
        return "torch here is a CPU build (no CUDA)"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU"
    return None


# --- the checks (each runs in its own process: `--section NAME`)


class Setup:
    """Where a check runs: ``device`` cuda (or cpu for --cpu-check), the model sizes."""

    def __init__(self, cpu_check: bool, work: Path) -> None:
        self.cpu_check = cpu_check
        self.device = "cpu" if cpu_check else "cuda"
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)

    def llama_dir(self) -> Path:
        """A Llama-shaped model with random weights and the embedded tokenizer: 0.36B
        (24 layers, hidden 896, MLP 4864, 14 heads) on a GPU, the embedded size on the CPU."""
        from zbrl.embedded.tiny_model import create_embedded_model

        target = self.work / ("llama-small" if self.cpu_check else "llama-0.36b")
        if (target / "config.json").exists():
            return target
        arch = {} if self.cpu_check else dict(
            hidden_size=896, num_layers=24, num_heads=14, intermediate_size=4864
        )  # fmt: skip
        return create_embedded_model(target, **arch)

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()


def check_fork_server(s: Setup) -> dict[str, Any]:
    """A Ray actor that uses CUDA, in a worker forked by the fork server and in a fresh one."""
    import ray

    from zbrl.launch.ray_setup import start_local_ray

    @ray.remote
    class Probe:
        def run(self) -> dict[str, Any]:
            import torch

            parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ")
            out = {"forked": b"local_ray.forkserver" in parent, "cuda": torch.cuda.is_available()}
            device = "cuda" if out["cuda"] else "cpu"
            g = torch.Generator(device=device).manual_seed(0)
            x = torch.randn(512, 512, device=device, generator=g)
            out["checksum"] = float((x @ x).sum())
            return out

    rows = {}
    for label, mode, fork in (("default", "fast", True), ("plain", "plain", None)):
        began = time.time()
        start_local_ray(3, mode=mode, fork_workers=fork)
        try:
            options = {} if s.cpu_check else {"num_gpus": 1}
            probe = Probe.options(**options).remote()
            rows[label] = ray.get(probe.run.remote(), timeout=180)
            rows[label]["s"] = round(time.time() - began, 2)
        finally:
            ray.shutdown()
    d, p = rows["default"], rows["plain"]
    ok = d["forked"] and not p["forked"] and d["cuda"] == p["cuda"] == (not s.cpu_check)
    same = abs(d["checksum"] - p["checksum"]) <= 1e-4 * max(1.0, abs(p["checksum"]))
    ok = ok and same  # (threads may differ between the two: the order of a CPU sum with them)
    return {
        "default": f"forked={d['forked']}, CUDA {d['cuda']}, {d['s']:.1f} s to a CUDA result",
        "plain": f"forked={p['forked']}, CUDA {p['cuda']}, {p['s']:.1f} s",
        "ok": bool(ok),
        "note": f"the same matmul result (to 1e-4): {same}",
        "record": rows,
    }


def check_fast_decode(s: Setup) -> dict[str, Any]:
    """zbrl's loop against ``generate`` on one bfloat16 model, the same seeds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zbrl.rollout.backends.base import SamplingParams
    from zbrl.rollout.backends.transformers.backend import TransformersBackend
    from zbrl.rollout.backends.transformers.fast_decode import FastDecoder

    model_dir = s.llama_dir()
    dtype = torch.float32 if s.cpu_check else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    plain = TransformersBackend(model, tokenizer, device=s.device)  # generate (not yet on GPU)
    fast = TransformersBackend(model, tokenizer, device=s.device)
    fast.decoder, fast.fast_decode_off = FastDecoder(fast.model), None  # the loop, forced on
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (24 + 4 * i,), generator=g).tolist() for i in range(16)]
    new = 16 if s.cpu_check else 128
    sampled = SamplingParams(8, 1.0, 1.0, -1, new, ())
    greedy = SamplingParams(1, 0.0, 1.0, -1, new, ())

    def run(backend: TransformersBackend, params: SamplingParams, seed: int):
        torch.manual_seed(seed)
        s.sync()
        began = time.perf_counter()
        groups = backend.generate(prompts, params)
        s.sync()
        took = time.perf_counter() - began
        done = [c for group in groups for c in group]
        return done, sum(len(c.token_ids) for c in done) / took

    run(fast, greedy, 0), run(plain, greedy, 0)  # warm-up (kernels, allocator)
    figures: dict[str, Any] = {}
    for name, params in (("sampled", sampled), ("greedy", greedy)):
        ours, ours_rate = run(fast, params, 1)
        theirs, theirs_rate = run(plain, params, 1)
        same = [a.token_ids.tolist() == b.token_ids.tolist() for a, b in zip(ours, theirs)]
        diffs = [
            float((a.logprobs[:n] - b.logprobs[:n]).abs().max())
            for a, b in zip(ours, theirs)
            if (n := min(len(a.logprobs), len(b.logprobs))) > 0
        ]
        figures[name] = {
            "same_tokens": sum(same) / len(same),
            "fast_tok_s": ours_rate,
            "generate_tok_s": theirs_rate,
            "max_logprob_diff": max(diffs) if diffs else 0.0,
        }
    f = figures["sampled"]
    return {
        "default": f"own loop {f['fast_tok_s']:.0f} tok/s",
        "plain": f"generate {f['generate_tok_s']:.0f} tok/s",
        "ok": figures["sampled"]["same_tokens"] == 1.0 and figures["greedy"]["same_tokens"] == 1.0,
        "note": (
            f"same tokens: sampled {f['same_tokens']:.0%}, greedy "
            f"{figures['greedy']['same_tokens']:.0%}; max |dlogp| {f['max_logprob_diff']:.2g}; "
            f"{'float32' if s.cpu_check else 'bfloat16'}, 16 prompts x 8 x {new} tokens"
        ),
        "record": figures,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _train_steps(s: Setup, overrides: list[str], model_dir: Path, steps: int) -> dict[str, Any]:
    """``steps`` train steps of the project's engine and train step on random full-length groups;
    seconds per step (after the first), the first step's metrics, and the peak device bytes."""
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    from memory_plan import groups
    from zbrl.assembly.models import build_engine
    from zbrl.assembly.settings import step_settings
    from zbrl.config import load_config
    from zbrl.training.train_step import Trainer

    cfg = load_config(None, overrides)
    if s.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    engine = build_engine(cfg, model_dir, total_steps=steps + 1)
    trainer = Trainer(engine, step_settings(cfg, pad_id=0))
    g = cfg.rollout.generation.num_generations
    prompt, response = cfg.data.max_prompt_tokens, cfg.rollout.generation.max_new_tokens
    vocab = engine.policy.config.vocab_size
    times, first = [], None
    for step in range(steps):
        batch = groups(cfg.training.train_batch_size, g, prompt, response, vocab, seed=step + 1)
        s.sync()
        began = time.perf_counter()
        metrics = trainer.train(batch)
        s.sync()
        times.append(time.perf_counter() - began)
        first = first or metrics
    peak = torch.cuda.max_memory_allocated() if s.device == "cuda" else None
    return {"cfg": cfg, "s_per_step": sum(times[1:]) / max(1, len(times) - 1), "first": first,
            "peak": peak}  # fmt: skip


def _loss(metrics: dict[str, float]) -> float:
    keys = [k for k in metrics if "loss" in k]
    return float(metrics[sorted(keys, key=len)[0]]) if keys else float("nan")


def _train_overrides(s: Setup, model_dir: Path, engine: str) -> list[str]:
    size = ["data.max_prompt_tokens=32", "rollout.generation.max_new_tokens=32"]
    if not s.cpu_check:
        size = ["data.max_prompt_tokens=128", "rollout.generation.max_new_tokens=128"]
    return [
        f"model.path={model_dir}",
        "data.allow_embedded_task_with_user_model=true",
        f"training.device={s.device}",
        f"model.dtype={'float32' if s.cpu_check else 'bfloat16'}",
        f"training.engine.type={engine}",
        "training.share_prompts=false",
        "algorithm.beta=0.0",
        "rollout.generation.num_generations=4",
        "training.train_batch_size=4",
        "training.train_microbatch_size=8",
        *size,
    ]


def check_fsdp2(s: Setup) -> dict[str, Any]:
    """The FSDP2 engine on NCCL (world size 1) against the single-process engine."""
    import torch.distributed as dist

    from zbrl.training.distributed import GroupSpec, join_group, leave_group

    model_dir = s.llama_dir()
    port = _free_port()
    backend = "gloo" if s.cpu_check else "nccl"
    master = dist.TCPStore("127.0.0.1", port, 1, True, wait_for_workers=False)
    join_group(GroupSpec("127.0.0.1", port, 1, backend, 120.0), rank=0)
    try:
        # the config refuses fsdp2 on one consumer (it only pays with offload); the engine
        # shards over the group it is in, of world size 1 here
        overrides = [*_train_overrides(s, model_dir, "fsdp2"), "launch.num_consumers=2"]
        sharded = _train_steps(s, overrides, model_dir, 3)
    finally:
        leave_group()
        del master
    single = _train_steps(s, _train_overrides(s, model_dir, "single"), model_dir, 3)
    a, b = _loss(sharded["first"]), _loss(single["first"])
    close = abs(a - b) <= 0.02 * max(1.0, abs(b))
    return {
        "default": f"fsdp2/{backend} {sharded['s_per_step']:.3f} s/step, loss {a:.4f}",
        "plain": f"single {single['s_per_step']:.3f} s/step, loss {b:.4f}",
        "ok": bool(close),
        "note": "world size 1 (one GPU: the engine shards over a group of one); first-step loss "
        f"within 2% of the single engine's: {close}",
        "record": {"fsdp2": sharded["first"], "single": single["first"]},
    }


def check_cuda_ipc(s: Setup) -> dict[str, Any]:
    """bench/weight_handoff.py: CUDA IPC against the object store on the same GPU."""
    out = s.work / "weight_handoff"
    args = [sys.executable, str(REPO / "bench" / "weight_handoff.py"), "--repeats", "3"]
    args += ["--out", str(out), *(["--cpu-check"] if s.cpu_check else [])]
    done = subprocess.run(args, capture_output=True, text=True, timeout=240)
    record = json.loads(Path(f"{out}.json").read_text())
    paths = {r["path"]: r for r in record["paths"]}
    ipc, store = paths["cuda ipc"], paths["object store"]
    return {
        "default": f"cuda_ipc {ipc['handoff_s']:.3f} s/version (route {ipc['route']})",
        "plain": f"object store {store['handoff_s']:.3f} s/version",
        "ok": done.returncode == 0,
        "note": f"{record['gb']:.2f} GB per version; weight_handoff.py exit {done.returncode}",
        "record": record,
    }


def _qwen_dir(s: Setup, kind: str) -> Path:
    """Random weights of Qwen2.5-0.5B's shape, or of a small Qwen3-MoE shape (16 experts, 4
    active), saved as a model directory with the embedded tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from zbrl.embedded.tiny_model import build_tokenizer

    target = s.work / kind
    if (target / "config.json").exists():
        return target
    small = s.cpu_check
    if kind == "qwen2.5-0.5b":
        from transformers import Qwen2Config

        config = Qwen2Config(
            vocab_size=4096 if small else 151936, hidden_size=64 if small else 896,
            intermediate_size=128 if small else 4864, num_hidden_layers=2 if small else 24,
            num_attention_heads=2 if small else 14, num_key_value_heads=1 if small else 2,
            tie_word_embeddings=True, max_position_embeddings=4096,
        )  # fmt: skip
    else:
        from transformers import Qwen3MoeConfig

        config = Qwen3MoeConfig(
            vocab_size=4096 if small else 151936, hidden_size=64 if small else 1024,
            intermediate_size=128 if small else 3072, moe_intermediate_size=32 if small else 768,
            num_hidden_layers=2 if small else 8, num_attention_heads=2 if small else 16,
            num_key_value_heads=1 if small else 4, head_dim=32 if small else 64,
            num_experts=4 if small else 16, num_experts_per_tok=2 if small else 4,
            tie_word_embeddings=False, max_position_embeddings=4096,
        )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(target)
    build_tokenizer().save_pretrained(target)
    return target


def check_memory(s: Setup, kind: str) -> dict[str, Any]:
    """The plan's consumer bytes (without its runtime reserve, which the allocator does not
    see) against the allocator's peak over two train steps."""
    from zbrl.planning.memory import plan_memory
    from zbrl.planning.model_shape import read_shape

    model_dir = _qwen_dir(s, kind)
    overrides = _train_overrides(s, model_dir, "single")
    shape = read_shape(str(model_dir), str(s.work), field="model.path")
    from zbrl.config import load_config

    consumer = plan_memory(load_config(None, overrides), shape).worker("consumer")
    planned = consumer.total - consumer.device.get("runtime", 0)
    measured = _train_steps(s, overrides, model_dir, 2)["peak"]
    gib = 1024**3
    if measured is None:
        note = f"{shape.params / 1e9:.2f}B parameters"
        return {"default": f"plan {planned / gib:.2f} GiB", "plain": "no peak on the CPU",
                "ok": True, "note": note, "record": {}}  # fmt: skip
    error = (planned - measured) / measured
    return {
        "default": f"plan {planned / gib:.2f} GiB",
        "plain": f"measured {measured / gib:.2f} GiB",
        "ok": measured <= planned,
        "note": f"plan {error:+.0%} vs measured; {shape.params / 1e9:.2f}B parameters, bf16 "
        "autocast, 4x8 rows x 256 tokens",
        "record": {"planned": planned, "measured": measured, "parts": consumer.device},
    }


def check_vllm(s: Setup) -> dict[str, Any]:
    """vLLM's generation on the 0.36B model, when vLLM is importable."""
    if importlib.util.find_spec("vllm") is None:
        return {"default": "-", "plain": "-", "ok": None, "note": "vllm is not importable here"}
    from vllm import LLM
    from vllm import SamplingParams as VllmParams

    model_dir = s.llama_dir()
    llm = LLM(model=str(model_dir), dtype="bfloat16", gpu_memory_utilization=0.3, seed=0)
    prompts = [{"prompt_token_ids": list(range(3, 27 + i))} for i in range(16)]
    params = VllmParams(n=8, temperature=1.0, max_tokens=128, ignore_eos=True, logprobs=0)
    llm.generate(prompts[:2], params)  # warm-up
    began = time.perf_counter()
    outputs = llm.generate(prompts, params)
    took = time.perf_counter() - began
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    import vllm

    return {
        "default": f"vllm {vllm.__version__} {tokens / took:.0f} tok/s",
        "plain": "-",
        "ok": tokens == 16 * 8 * 128,
        "note": "16 prompts x 8 x 128 tokens, bfloat16",
        "record": {"tokens": tokens, "s": took},
    }


CHECKS: dict[str, tuple[str, Callable[[Setup], dict[str, Any]], float]] = {
    "fast_decode": ("own decode loop, bf16", check_fast_decode, 150.0),
    "fsdp2": ("FSDP2 step on NCCL", check_fsdp2, 120.0),
    "cuda_ipc": ("same-GPU CUDA IPC handoff", check_cuda_ipc, 150.0),
    "memory_qwen2.5-0.5b": (
        "memory plan, Qwen2.5-0.5B",
        lambda s: check_memory(s, "qwen2.5-0.5b"),
        120.0,
    ),
    "memory_qwen3-moe": ("memory plan, Qwen3-MoE", lambda s: check_memory(s, "qwen3-moe"), 120.0),
    "fork_server": ("Ray workers from the fork server + CUDA", check_fork_server, 150.0),
    "vllm": ("vLLM (if importable)", check_vllm, 120.0),
}
"""Name -> (row title, check, its own time limit in seconds); run in this order."""


# --- the driver


def run_check(name: str, args: argparse.Namespace, work: Path, left_s: float) -> dict[str, Any]:
    """``name`` in a process of its own, within its limit and what is left of the budget."""
    limit = max(5.0, min(CHECKS[name][2], left_s))
    result = work / f"{name}.json"
    command = [sys.executable, __file__, "--section", name, "--work", str(work)]
    command += ["--cpu-check"] if args.cpu_check else []
    began = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
        (work / f"{name}.log").write_text(done.stdout + done.stderr)
        if done.returncode == 0 and result.exists():
            row = json.loads(result.read_text())
        else:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            row = {"ok": False, "note": f"exit {done.returncode}: {last[:200]}"}
    except subprocess.TimeoutExpired:
        row = {"ok": False, "note": f"timed out after {limit:.0f} s"}
    row["s"] = round(time.time() - began, 1)
    return row


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| check | zbrl's default (never ran on a GPU) | plain alternative | result | s | notes |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        verdict = {True: "pass", False: "FAIL", None: "skipped"}[row.get("ok")]
        lines.append(
            f"| {CHECKS[name][0]} | {row.get('default', '-')} | {row.get('plain', '-')} | "
            f"{verdict} | {row['s']:.0f} | {row.get('note', '')} |"
        )
    return "\n".join(lines)


def environment() -> str:
    import torch

    parts = [f"torch {torch.__version__}"]
    if torch.cuda.is_available():
        parts.insert(0, torch.cuda.get_device_name(0))
        parts.append(f"CUDA {torch.version.cuda}")
    for package in ("transformers", "ray", "vllm"):
        try:
            parts.append(f"{package} {importlib.import_module(package).__version__}")
        except Exception:
            parts.append(f"{package} -")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-check", action="store_true", help="run the checks on the CPU")
    parser.add_argument("--only", default="", help="comma-separated subset of the checks")
    parser.add_argument("--out", default=os.environ.get("OUT") or "/tmp/gpu_check")
    parser.add_argument("--section", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.section:  # one check, in this process
        work = Path(args.work)
        row = CHECKS[args.section][1](Setup(args.cpu_check, work))
        (work / f"{args.section}.json").write_text(json.dumps(row, default=str, indent=1))
        return 0
    if not args.cpu_check:
        why = refusal()
        if why is not None:
            print(f"gpu_check: refused: {why}; it runs on a machine with a CUDA GPU "
                  "(--cpu-check runs the script on the CPU)", file=sys.stderr)  # fmt: skip
            return 2
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        print(f"gpu_check: unknown checks {unknown}; choose from {list(CHECKS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    header = f"{environment()}; {'CPU check' if args.cpu_check else 'one GPU'}"
    print(header, flush=True)
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="zbrl-gpu-check-") as tmp:
        for name in names:
            rows[name] = run_check(name, args, Path(tmp), BUDGET_S - (time.time() - began))
            print(f"  {name}: {rows[name].get('ok')} ({rows[name]['s']:.0f} s)", flush=True)
            log = Path(tmp) / f"{name}.log"
            if rows[name].get("ok") is False and log.exists():
                (out / f"{name}.log").write_text(log.read_text()[-20000:])
    text = f"{header}\n\n{table(rows)}\n\n{time.time() - began:.0f} s in all\n"
    print("\n" + text)
    (out / "gpu_check.md").write_text(text)
    (out / "gpu_check.json").write_text(json.dumps(rows, default=str, indent=1))
    return 0 if all(r.get("ok") is not False for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
