"""LoRA on the vLLM backend: what taking adapters costs against full weights, on CPU.

Three engines of the same model in one process, stepped alternately: ``full`` (no LoRA; a version
is every weight, loaded in place with ``reload_weights``), ``adapters`` (``lora_mode: adapters``:
vLLM's LoRA on, rank ``--rank`` adapters on every linear layer of a block; a version is the
adapters, written as a peft directory and loaded under a new LoRA id) and ``merged``
(``lora_mode: merged``: the same adapters merged into a transformers copy of the base, then every
weight reloaded in place). For each: the bytes of one version (what travels), the time to load
one (median of ``--loads``), and generation tokens/s with a version loaded (``--prompts`` prompts
× ``--samples`` completions × up to ``--tokens`` tokens, temperature 1, median of
``--repeats``).
Random weights and adapters (``B`` nonzero, so the adapters are really computed). Needs vLLM
(``.venv-vllm/bin/python bench/vllm_lora.py``; on a GPU the same script with the ``vllm``
extra, unverified there). Read the ratios: the machine may be shared.

Models: ``embedded`` (hidden 128, 2 layers) and ``embedded-34m`` (hidden 512, 8 layers).
"""

from __future__ import annotations

import argparse
import os
import statistics
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
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=list(MODELS), default="embedded")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--loads", type=int, default=5)
    p.add_argument(
        "--gpu-memory-utilization", type=float, default=0.25, help="per engine (3 engines) on GPU"
    )
    return p.parse_args(argv)


def engine(model_dir: Path, lora, gpu_memory_utilization: float):
    from helpers.backends import vllm_settings
    from zbrl.rollout.backends.vllm.backend import VllmBackend

    settings = vllm_settings(max_model_len=256, gpu_memory_utilization=gpu_memory_utilization)
    return VllmBackend(model_dir, model_dir, settings, lora=lora)


def versions(model_dir: Path, rank: int, seed: int):
    """A full-weight version and an adapter version of the model (random perturbations)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    state = model.state_dict()
    full = {k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
    adapters = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS:
            stem = f"base_model.model.{name}"
            adapters[f"{stem}.lora_A.weight"] = 0.1 * torch.randn(
                rank, module.in_features, generator=gen
            )
            adapters[f"{stem}.lora_B.weight"] = 0.1 * torch.randn(
                module.out_features, rank, generator=gen
            )
    return full, adapters


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch
    from transformers import AutoModelForCausalLM

    from zbrl.embedded.tiny_model import create_embedded_model
    from zbrl.models.lora import AdapterMerger
    from zbrl.rollout.backends.base import SamplingParams
    from zbrl.rollout.backends.vllm.lora import AdapterSpec, MergedAdapters

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_embedded_model(Path(tmp) / args.model, seed=0, **MODELS[args.model])
        spec = AdapterSpec(args.rank, 2.0 * args.rank, TARGETS, str(model_dir), False)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        merged = MergedAdapters(AdapterMerger(base, spec.alpha / spec.rank), spec)
        engines = {
            "full": engine(model_dir, None, args.gpu_memory_utilization),
            "adapters": engine(model_dir, spec, args.gpu_memory_utilization),
            "merged": engine(model_dir, merged, args.gpu_memory_utilization),
        }
        gen = torch.Generator().manual_seed(1)
        prompts = [
            torch.randint(7, 100, (args.prompt_len,), generator=gen).tolist()
            for _ in range(args.prompts)
        ]
        params = SamplingParams(args.samples, 1.0, 1.0, -1, args.tokens, ())
        load_s = {mode: [] for mode in engines}
        sizes = {}
        for i in range(args.loads):
            full, adapters = versions(model_dir, args.rank, seed=10 + i)
            for mode, version in (("full", full), ("adapters", adapters), ("merged", adapters)):
                sizes[mode] = nbytes(version)
                t0 = time.perf_counter()
                engines[mode].load_weights(version)
                load_s[mode].append(time.perf_counter() - t0)
        for backend in engines.values():
            backend.generate(prompts[:4], params)  # warm-up
        rates = {mode: [] for mode in engines}
        for _ in range(args.repeats):
            for mode, backend in engines.items():
                t0 = time.perf_counter()
                out = backend.generate(prompts, params)
                dt = time.perf_counter() - t0
                rates[mode].append(sum(c.token_ids.numel() for g in out for c in g) / dt)
    print(
        f"{args.model}, LoRA rank {args.rank} on every linear layer; {args.prompts} prompts x "
        f"{args.samples} samples x <= {args.tokens} tokens, T=1, {args.threads} thread(s), "
        f"float32; medians of {args.loads} loads, {args.repeats} generations"
    )
    print("| engine | bytes per version | load s | tokens/s | tokens/s / full |")
    print("|---|---|---|---|---|")
    full_rate = statistics.median(rates["full"])
    for mode in engines:
        rate = statistics.median(rates[mode])
        print(
            f"| {mode} | {sizes[mode]:,} | {statistics.median(load_s[mode]):.4f} "
            f"| {rate:,.0f} | {rate / full_rate:.2f} |"
        )


if __name__ == "__main__":
    main()
