"""What ``rollout.exact_logprobs`` costs per demo step, side by side with the demo as it ships.

One demo step's work in one process (``recipes/demo.yaml``: its warm-started embedded model; 8
prompts of the embedded task × G = 8 samples of up to 32 tokens; bfloat16 training against
float32 generation), timed part by part:

- ``generate``: the producer's sampling (the same for both);
- ``rescore``: exact only — every sampled sequence through the trainer's forward, one per pass;
- ``train``: one train step (GRPO loss, one optimizer step) on the same groups — the demo's
  micro-batches (64 rows, shared prompts) against one full row per forward.

Both variants run on the same model and groups, alternating each repeat after a warm-up round;
medians of ``--repeats``. With ``--clock cpu`` (the default) a part's time is the process's CPU
seconds with one torch thread, which holds on a machine other processes load; ``--clock wall``
times the wall clock. The last column is exact / demo.

    python bench/exact_logprobs.py                   # 5 repeats, CPU clock
    python bench/exact_logprobs.py --repeats 9 --clock wall
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from machine_load import load_line
from zbrl.assembly.datasets import encode_prompts
from zbrl.assembly.embedded import embedded_policy_dir, embedded_task_files
from zbrl.assembly.models import build_trainer
from zbrl.assembly.settings import producer_settings
from zbrl.config import load_config
from zbrl.embedded.tokenizer import build_tokenizer
from zbrl.models.quiet import quiet_transformers
from zbrl.rollout.backends.transformers.backend import TransformersBackend
from zbrl.types import RolloutGroup

REPO = Path(__file__).resolve().parents[1]


def groups_of(prompts, completions, logprobs, temperature) -> list[RolloutGroup]:
    out = []
    for i, (p, comps) in enumerate(zip(prompts, completions, strict=True)):
        g = len(comps)
        out.append(
            RolloutGroup(
                uid=f"bench:{i}",
                prompt_ids=p,
                response_ids=[c.token_ids for c in comps],
                behaviour_logprobs=logprobs[i],
                rewards=[float(j % 2) for j in range(g)],
                format_acc=[1.0] * g,
                ans_acc=[float(j % 2) for j in range(g)],
                truncated=[False] * g,
                policy_version=0,
                temperature=temperature,
                producer=0,
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    quiet_transformers()
    torch.set_num_threads(1)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    load_before = os.getloadavg()

    cache = f"logging.cache_dir={REPO / '.cache' / 'zbrl'}"  # the repo's, from any directory
    demo = load_config(REPO / "recipes" / "demo.yaml", [cache])
    exact = load_config(REPO / "recipes" / "demo.yaml", [cache, "rollout.exact_logprobs=true"])
    path = embedded_policy_dir(demo)  # built on first use, then found in the cache
    tokenizer = build_tokenizer()
    train_file, _ = embedded_task_files(demo)
    prompts = [p.prompt_ids for p in encode_prompts(train_file, demo, tokenizer)[0][:8]]
    from transformers import AutoModelForCausalLM

    backend = TransformersBackend(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer
    )
    params = producer_settings(demo, 0).sampling
    scoring = producer_settings(exact, 0).exact_logprobs
    trainers = {
        "demo": build_trainer(demo, path, tokenizer, total_steps=1000),
        "exact": build_trainer(exact, path, tokenizer, total_steps=1000),
    }
    times: dict[str, dict[str, list[float]]] = {
        v: {"generate": [], "rescore": [], "train": []} for v in trainers
    }
    torch.manual_seed(0)
    for repeat in range(args.repeats + 1):
        order = list(trainers) if repeat % 2 == 0 else list(reversed(trainers))
        for variant in order:
            start = clock()
            comps = backend.generate(prompts, params)
            generated = clock() - start
            logprobs = [[c.logprobs for c in group] for group in comps]
            rescored = 0.0
            if variant == "exact":
                start = clock()
                logprobs = [
                    backend.score_exact(
                        [(p, c.token_ids) for c in group],
                        temperature=params.temperature,
                        dtype=getattr(torch, scoring.dtype),
                        chunk_size=scoring.chunk_size,
                    )
                    for p, group in zip(prompts, comps, strict=True)
                ]
                rescored = clock() - start
            batch = groups_of(prompts, comps, logprobs, params.temperature)
            start = clock()
            trainers[variant].train(batch, policy_version=0)
            trained = clock() - start
            if repeat:  # the first round warms up
                for part, t in (("generate", generated), ("rescore", rescored), ("train", trained)):
                    times[variant][part].append(t)

    def med(variant: str, part: str) -> float:
        return statistics.median(times[variant][part])

    print(
        f"exact log-probs, one demo step ({path.name}; {args.clock} clock, 1 torch thread, "
        f"median of {args.repeats})"
    )
    print("| part | demo (s) | exact (s) | exact / demo |")
    print("|---|---|---|---|")
    totals = {v: 0.0 for v in trainers}
    for part in ("generate", "rescore", "train"):
        d, e = med("demo", part), med("exact", part)
        totals["demo"] += d
        totals["exact"] += e
        ratio = f"{e / d:.2f}" if d > 0 else "—"
        print(f"| {part} | {d:.3f} | {e:.3f} | {ratio} |")
    print(
        f"| step | {totals['demo']:.3f} | {totals['exact']:.3f} | "
        f"{totals['exact'] / totals['demo']:.2f} |"
    )
    print(load_line(load_before, os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
