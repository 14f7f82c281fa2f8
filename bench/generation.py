"""Generation throughput of the rollout backends: transformers ``generate`` against vLLM.

Both backends sample ``--prompts`` prompts × ``--samples`` completions × up to ``--tokens`` new
tokens (temperature 1, sampled-token log-probs on, as a producer asks) from the same saved model
directory, on CPU, with ``--threads`` torch/OpenMP threads. Two models:

- ``embedded``: the embedded default's architecture (hidden 128, 2 layers; about 0.5M parameters);
- ``embedded-34m``: the same family at hidden 512, 8 layers (about 34M parameters).

Random weights (speed does not depend on them). Each (model, backend) runs in a fresh subprocess
(vLLM changes process-wide thread settings); a warm-up call, then the median of ``--repeats``
timed calls. Tokens/s counts the tokens actually generated (an EOS may end a completion early).
Needs vLLM (run it with ``.venv-vllm/bin/python``; ``make setup-vllm``).

Usage::

    .venv-vllm/bin/python bench/generation.py            # both models, ~3 min on 2 idle cores
    .venv-vllm/bin/python bench/generation.py --quick    # the embedded model only, fewer calls
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# tests/helpers: the test harness this bench reuses (vllm_settings)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

MODELS = {
    "embedded": {"hidden_size": 128, "num_layers": 2, "num_heads": 4},
    "embedded-34m": {"hidden_size": 512, "num_layers": 8, "num_heads": 8},
}
BACKENDS = ("transformers", "vllm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="the embedded model, 2 repeats")
    p.add_argument(
        "--child", nargs=3, metavar=("MODEL_DIR", "BACKEND", "OUT"), help=argparse.SUPPRESS
    )
    return p.parse_args(argv)


def build_backend(model_dir: str, backend: str):
    import torch

    if backend == "vllm":
        from helpers.backends import vllm_settings
        from zbrl.rollout.backends.vllm.backend import VllmBackend

        settings = vllm_settings(max_model_len=256)
        return VllmBackend(model_dir, model_dir, settings)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return TransformersBackend(model, AutoTokenizer.from_pretrained(model_dir))


def child(args: argparse.Namespace) -> None:
    """Time one backend on one model directory; write the result as JSON."""
    import torch

    from zbrl.rollout.backends.base import SamplingParams

    model_dir, backend_name, result_path = args.child
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    started = time.perf_counter()
    backend = build_backend(model_dir, backend_name)
    load_s = time.perf_counter() - started
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(7, 100, (args.prompt_len,), generator=gen).tolist()
        for _ in range(args.prompts)
    ]
    params = SamplingParams(
        n=args.samples,
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=args.tokens,
        stop_strings=(),
    )
    backend.generate(prompts[:4], params)  # warm-up
    rates = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = backend.generate(prompts, params)
        dt = time.perf_counter() - t0
        rates.append(sum(c.token_ids.numel() for group in out for c in group) / dt)
    Path(result_path).write_text(json.dumps({"load_s": load_s, "tokens_per_s": rates}))


def make_model(root: Path, name: str) -> Path:
    from zbrl.embedded.tiny_model import create_embedded_model

    model_dir = root / name
    create_embedded_model(model_dir, seed=0, **MODELS[name])
    return model_dir


def parameter_count(model_dir: Path) -> int:
    from safetensors.torch import load_file

    return sum(t.numel() for t in load_file(model_dir / "model.safetensors").values())


def run_child(args: argparse.Namespace, model_dir: Path, backend: str, root: Path) -> dict:
    out = root / f"{model_dir.name}-{backend}.json"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "VLLM_LOGGING_LEVEL": "ERROR",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(model_dir),
        backend,
        str(out),
        *("--prompts", str(args.prompts), "--samples", str(args.samples)),
        *("--tokens", str(args.tokens), "--prompt-len", str(args.prompt_len)),
        *("--threads", str(args.threads), "--repeats", str(args.repeats)),
    ]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    if args.quick:
        args.repeats = 2
    names = ["embedded"] if args.quick else list(MODELS)
    print(
        f"{args.prompts} prompts x {args.samples} samples x <= {args.tokens} tokens, "
        f"prompt {args.prompt_len} tokens, T=1, {args.threads} thread(s), CPU, float32; "
        f"median of {args.repeats}"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in names:
            model_dir = make_model(root, name)
            params = parameter_count(model_dir)
            result = {b: run_child(args, model_dir, b, root) for b in BACKENDS}
            hf = statistics.median(result["transformers"]["tokens_per_s"])
            vl = statistics.median(result["vllm"]["tokens_per_s"])
            rows.append((name, params, hf, vl, result["vllm"]["load_s"]))
    print()
    print(
        "| model | params | transformers tok/s | vLLM tok/s | vLLM / transformers | vLLM load s |"
    )
    print("|---|---|---|---|---|---|")
    for name, params, hf, vl, load_s in rows:
        print(
            f"| {name} | {params / 1e6:.1f}M | {hf:,.0f} | {vl:,.0f} | {vl / hf:.2f} "
            f"| {load_s:.1f} |"
        )


if __name__ == "__main__":
    main()
