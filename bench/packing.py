"""Training tokens/s of the three training layouts side by side: padded full rows, shared prompts
and packed rows (``training.share_prompts`` / ``training.packing``, docs/performance.md).

One zbrl train step (the GRPO loss, one optimizer step, float32, CPU) on the same rollout groups
in each layout, on two models and two length profiles:

- models: the embedded tiny model (random weights), and SmolLM2-135M (the pulled
  ``smollm2-135m`` when ``zbrl models pull smollm2-135m`` has put it in the cache, otherwise a
  random-weight model of its shape: 30 layers, hidden 576, 9 heads, 3 key/value heads,
  intermediate 1536, vocabulary 49152; the table says which);
- lengths: ``long-uneven`` (prompts of 40–80 tokens, responses uniformly 16–256 tokens),
  ``arithmetic`` (the SmolLM2 arithmetic recipe's shape: ChatML prompts of about 40 tokens,
  responses of 2–24 tokens, its ``max_new_tokens``) and ``demo`` (the embedded demo's: prompts of
  30–32 tokens, responses of 16–24, as its warm-started policy samples them).

Token values are random (the work does not depend on them). Padded rows and shared prompts cut
micro-batches of ``--rows`` rows (the recipe's ``train_microbatch_size`` unless given); packed
rows take a budget of ``--budget`` packed tokens. Every variant of a setting trains the same
groups; rates count the rows' real tokens (prompt + response per row, no padding, the same count
for every variant). Variants alternate order each repeat, after one warm-up round; medians of
``--repeats``.

``--clock cpu`` times each step by the process's CPU time instead of the wall clock: with one
torch thread (``--threads 1``) a step's CPU seconds are what it would take alone on a core, so
the ratios hold on a machine other processes are loading, where wall times swing with the load.

    python bench/packing.py                          # both models, both profiles, 3 repeats
    python bench/packing.py --models tiny --repeats 5
    python bench/packing.py --models smollm2 --threads 1 --clock cpu   # on a busy machine
    python bench/packing.py --models tiny --profiles demo --prompts 8 --rows 64 --budget none \
        --threads 1 --clock cpu                     # the demo's shapes and micro-batches
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from machine_load import load_line
from zbrl.assembly.models import build_engine
from zbrl.assembly.settings import step_settings
from zbrl.config import RunConfig, load_config
from zbrl.models.catalogue import default_cache_dir, model_dir
from zbrl.models.gguf_convert import is_converted
from zbrl.models.quiet import quiet_transformers
from zbrl.training.train_step import Trainer
from zbrl.types import RolloutGroup

REPO = Path(__file__).resolve().parents[1]
SMOLLM2_SHAPE = {
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
}
PROFILES = {
    # name: (prompt length range, response length range)
    "long-uneven": ((40, 80), (16, 256)),
    "arithmetic": ((36, 44), (2, 24)),
    # the demo's (recipes/demo.yaml): embedded-task prompts of 30-32 tokens; responses of
    # 16-24 tokens, as the warm-started policy samples them in its first 40 steps (mean 20.2,
    # 97% within 16-27, each step's longest 24 at the median); run with --prompts 8 --rows 64
    # --budget none, the demo's micro-batches
    "demo": ((30, 32), (16, 24)),
}
LAYOUTS = ("padded full rows", "shared prompts", "packed")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    p.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated")
    p.add_argument("--prompts", type=int, default=2, help="groups per step")
    p.add_argument("--samples", type=int, default=8, help="responses per prompt (G)")
    p.add_argument("--rows", type=int, default=8, help="rows per padded micro-batch")
    p.add_argument(
        "--budget",
        type=budget_arg,
        default=1024,
        help="packed tokens per micro-batch; none: --rows rows per packed micro-batch in ticket "
        "order (training.train_microbatch_tokens unset, as in the demo)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time steps by the wall clock or by the process's CPU time (use with --threads 1)",
    )
    args = p.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu needs --threads 1: with more threads CPU time is not a step's time")
    return args


def budget_arg(text: str) -> int | None:
    return None if text == "none" else int(text)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet_transformers()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    results: list[tuple[str, str, int, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in args.models.split(","):
            path, label = model_path(model_name, Path(tmp))
            for profile in args.profiles.split(","):
                cfg = bench_config(path, args)
                rates, tokens = bench_setting(cfg, path, profile, args)
                results.append((label, profile, tokens, rates))
    load_after = os.getloadavg()
    print(
        f"\nzbrl train step tokens/s, float32, CPU, {args.threads} torch thread(s); "
        f"{args.prompts} prompts x {args.samples} responses per step; padded layouts "
        f"{args.rows} rows per micro-batch, packed {packed_batching(args)}; "
        f"medians of {args.repeats} interleaved repeats; {args.clock} clock"
    )
    print(load_line(load_before, load_after))
    print_table(results)


def packed_batching(args: argparse.Namespace) -> str:
    if args.budget is None:
        return f"{args.rows} rows per micro-batch (no token budget)"
    return f"{args.budget} tokens per micro-batch"


def model_path(name: str, tmp: Path) -> tuple[Path, str]:
    """The model directory of ``name`` and its label in the table."""
    from zbrl.embedded.tiny_model import create_embedded_model

    if name == "tiny":
        return create_embedded_model(tmp / "tiny", seed=0), "embedded tiny"
    if name != "smollm2":
        raise SystemExit(f"--models: unknown model {name!r} (tiny, smollm2)")
    pulled = model_dir("smollm2-135m", default_cache_dir())
    if is_converted(pulled):
        return pulled, "SmolLM2-135M"
    print(
        f"SmolLM2-135M is not pulled into {pulled}: using a random-weight model of its shape",
        file=sys.stderr,
    )
    return smollm2_shaped(tmp / "smollm2-shaped"), "SmolLM2-135M-shaped (random)"


def smollm2_shaped(directory: Path) -> Path:
    """A random-weight Llama of SmolLM2-135M's shape saved to ``directory``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2_SHAPE, tie_word_embeddings=True, max_position_embeddings=2048)
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def bench_config(path: Path, args: argparse.Namespace) -> RunConfig:
    return load_config(
        None,
        [
            f"model.path={path}",
            "model.dtype=float32",
            "training.device=cpu",
            f"rollout.generation.num_generations={args.samples}",
            f"training.train_batch_size={args.prompts}",
            f"training.train_microbatch_size={args.rows}",
            "algorithm.beta=0.0",
            "data.allow_embedded_task_with_user_model=true",  # no data is read
        ],
    )


def layout_config(cfg: RunConfig, layout: str, budget: int) -> RunConfig:
    update = {
        "padded full rows": {"share_prompts": False, "packing": False},
        "shared prompts": {"share_prompts": True, "packing": False},
        "packed": {"share_prompts": True, "packing": True, "train_microbatch_tokens": budget},
    }[layout]
    return cfg.model_copy(update={"training": cfg.training.model_copy(update=update)})


def bench_setting(
    cfg: RunConfig, path: Path, profile: str, args: argparse.Namespace
) -> tuple[dict[str, float], int]:
    """Median tokens/s of each layout on one model and length profile, and the step's tokens."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    groups = random_groups(profile, args.prompts, args.samples, vocab, args.seed)
    warm = random_groups(profile, 1, 2, vocab, args.seed + 1)
    tokens = sum(len(g.prompt_ids) * g.group_size + sum(g.response_lengths) for g in groups)
    engine = build_engine(cfg, path, total_steps=1000)  # one model for every layout
    trainers = {
        layout: Trainer(engine, step_settings(layout_config(cfg, layout, args.budget), 0))
        for layout in LAYOUTS
    }
    runs: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for rnd in range(args.repeats + 1):
        order = LAYOUTS if rnd % 2 else LAYOUTS[::-1]
        for layout in order:
            batch = warm if rnd == 0 else groups
            seconds = timed(lambda t=trainers[layout], b=batch: t.train(b), args.clock)
            if rnd:
                runs[layout].append(tokens / seconds)
                print(
                    f"{path.name} {profile} repeat {rnd}: {layout}: {seconds:.3f} s",
                    file=sys.stderr,
                    flush=True,
                )
    return {layout: statistics.median(r) for layout, r in runs.items()}, tokens


def timed(fn: Callable[[], object], clock: str) -> float:
    """Seconds ``fn`` took: wall-clock, or the process's CPU time (``clock="cpu"``)."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    start = now()
    fn()
    return now() - start


def random_groups(
    profile: str, prompts: int, samples: int, vocab: int, seed: int
) -> list[RolloutGroup]:
    """``prompts`` groups of ``samples`` responses with ``profile``'s lengths, varied rewards
    (every row has a non-zero GRPO advantage), none truncated."""
    (p_low, p_high), (r_low, r_high) = PROFILES[profile]
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for b in range(prompts):
        lengths = [rng.randint(r_low, r_high) for _ in range(samples)]
        groups.append(
            RolloutGroup(
                uid=f"bench-{b}",
                prompt_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(p_low, p_high))],
                response_ids=[torch.randint(3, vocab, (n,), generator=gen) for n in lengths],
                behaviour_logprobs=[-1.0 - torch.rand(n, generator=gen) for n in lengths],
                rewards=[float(i % 2) + 0.01 * i for i in range(samples)],
                format_acc=[1.0] * samples,
                ans_acc=[float(i % 2) for i in range(samples)],
                truncated=[False] * samples,
                policy_version=0,
                temperature=1.0,
                producer=0,
                ticket=b,
            )
        )
    return groups


def print_table(results: list[tuple[str, str, int, dict[str, float]]]) -> None:
    header = (
        f"| {'model':<28} | {'lengths':<11} | {'tokens':>6} | "
        + " | ".join(f"{layout:>16}" for layout in LAYOUTS)
        + f" | {'packed/padded':>13} | {'packed/shared':>13} |"
    )
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for label, profile, tokens, rates in results:
        cells = " | ".join(f"{rates[layout]:>16.0f}" for layout in LAYOUTS)
        padded = rates["packed"] / rates["padded full rows"]
        shared = rates["packed"] / rates["shared prompts"]
        print(
            f"| {label:<28} | {profile:<11} | {tokens:>6} | {cells} | {padded:>12.2f}x "
            f"| {shared:>12.2f}x |"
        )


if __name__ == "__main__":
    main()
