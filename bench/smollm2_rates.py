"""Tokens/s per core of zbrl against plain transformers on SmolLM2-135M-Instruct (CPU).

The SmolLM2 recipe's model (``zbrl models pull smollm2-135m``), chat template and task
(reasoning-gym arithmetic): ``--prompts`` prompts × ``--samples`` samples, up to
``--max-new-tokens`` new tokens, float32, ``--threads`` torch threads. Side by side in one
process, interleaved (the order alternates each repeat), medians of ``--repeats`` after one
warm-up round:

- generation: plain ``model.generate`` (sampling, ``num_return_sequences``, nothing kept but the
  sequences) against zbrl's :class:`TransformersBackend` (the same sampling, plus each sampled
  token's log-prob, responses cut at EOS, each prompt prefilled once). Both draw from the same
  seed each repeat, so they generate the same tokens; rates count generated tokens (to EOS).
- training: a plain policy-gradient step (right-padded micro-batches of ``--microbatch`` rows,
  forward, log-softmax of the response tokens, advantage-weighted loss, backward, gradient
  clipping, AdamW) against zbrl's train step (the recipe's GRPO loss; one optimizer step for the
  batch) with each group's prompt run once (``training.share_prompts``, the default) and on full
  rows, on the same rows: the completions zbrl generated in the first call. Rates count the rows'
  real tokens (prompt + response, no padding), the same count for every variant.

Tokens/s per core divides by the torch threads. On a shared machine compare the ratios; the
script prints the load average before and after.

    python bench/smollm2_rates.py                       # 64 responses <= 48 tokens, 2 threads
    python bench/smollm2_rates.py --prompts 64 --repeats 5   # the issue's 512 responses
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from machine_load import load_line
from zbrl.assembly.artifacts import prepare_artifacts
from zbrl.assembly.datasets import encode_prompts
from zbrl.assembly.models import (
    build_backend,
    build_engine,
    load_policy,
    load_tokenizer,
)
from zbrl.assembly.settings import sampling_params, step_settings
from zbrl.config import load_config
from zbrl.models.quiet import quiet_transformers
from zbrl.training.engine.precision import MASTER_DTYPE
from zbrl.training.train_step import Trainer
from zbrl.types import RolloutGroup

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "smollm2_arithmetic_cpu.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(RECIPE))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8, help="responses per prompt")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--microbatch", type=int, default=32, help="rows per forward/backward")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.microbatch = min(args.microbatch, args.prompts * args.samples)
    quiet_transformers()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    cfg = load_config(
        args.recipe,
        [
            "training.device=cpu",
            "rollout.backend.type=transformers",
            "model.dtype=float32",
            f"rollout.generation.num_generations={args.samples}",
            f"rollout.generation.max_new_tokens={args.max_new_tokens}",
            f"training.train_batch_size={args.prompts}",
            f"training.train_microbatch_size={args.microbatch}",
            "training.train_microbatch_tokens=null",
        ],
    )
    art = prepare_artifacts(cfg, verbose=False)
    tokenizer = load_tokenizer(cfg, art.tokenizer_dir)
    prompts, _ = encode_prompts(art.train_path, cfg, tokenizer, limit=args.prompts)
    ids = [pr.prompt_ids for pr in prompts]
    params = sampling_params(cfg)
    backend = build_backend(cfg, art.model_dir, art.tokenizer_dir)

    torch.manual_seed(0)
    groups = [
        _group(i, prompt, comps)
        for i, (prompt, comps) in enumerate(zip(ids, backend.generate(ids, params), strict=True))
    ]
    train_tokens = sum(len(g.prompt_ids) * g.group_size + sum(g.response_lengths) for g in groups)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    engine = build_engine(cfg, art.model_dir, total_steps=1000)
    shared = Trainer(engine, step_settings(cfg, pad_id))
    full_cfg = cfg.model_copy(
        update={"training": cfg.training.model_copy(update={"share_prompts": False})}
    )
    full = Trainer(engine, step_settings(full_cfg, pad_id))  # the same engine: one zbrl model
    plain_step = PlainStep(load_policy(cfg, art.model_dir, MASTER_DTYPE), cfg.algorithm.lr)
    plain_step.prepare(groups, shared, args.microbatch, pad_id)

    def plain_generate() -> int:
        input_ids, attention = backend._left_pad(ids)
        out = backend.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n,
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            pad_token_id=backend.pad_id,
            eos_token_id=sorted(backend.eos_ids),
        )
        return _generated_tokens(out[:, input_ids.shape[1] :], backend.eos_ids)

    def zbrl_generate() -> int:
        return sum(c.token_ids.numel() for comps in backend.generate(ids, params) for c in comps)

    def train(fn: Callable[[], object]) -> Callable[[], int]:
        def run() -> int:
            fn()
            return train_tokens

        return run

    gen_zbrl = ("generate", "zbrl TransformersBackend")
    variants: dict[tuple[str, str], Callable[[], int]] = {
        ("generate", "plain transformers"): plain_generate,
        gen_zbrl: zbrl_generate,
        ("train", "plain PyTorch step"): train(plain_step.step),
        ("train", "zbrl, shared prompts (default)"): train(lambda: shared.train(groups)),
        ("train", "zbrl, full rows"): train(lambda: full.train(groups)),
    }
    rates, tokens = measure(variants, args.repeats)
    load_after = os.getloadavg()
    same = tokens[("generate", "plain transformers")] == tokens[gen_zbrl]

    responses = len(groups) * params.n
    print(
        f"\nSmolLM2-135M-Instruct, float32, CPU, {args.threads} torch thread(s); "
        f"{len(groups)} prompts x {params.n} = {responses} responses <= {params.max_new_tokens} "
        f"tokens; train rows {train_tokens} tokens (prompt + response), micro-batches of "
        f"{args.microbatch} rows; medians of {args.repeats} interleaved repeats"
    )
    print(load_line(load_before, load_after))
    print(
        "generated tokens per repeat, plain and zbrl: "
        + ("the same" if same else "DIFFERENT")
        + f" ({tokens[gen_zbrl]})"
    )
    print_table(rates, args.threads)


def measure(
    variants: dict[tuple[str, str], Callable[[], int]], repeats: int
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[int]]]:
    """Tokens/s and tokens of each variant per repeat: round 0 warms up; the order alternates
    each round; every variant of a round draws from the same seed."""
    rates: dict[tuple[str, str], list[float]] = {k: [] for k in variants}
    counts: dict[tuple[str, str], list[int]] = {k: [] for k in variants}
    keys = list(variants)
    for rnd in range(repeats + 1):
        for key in keys if rnd % 2 == 0 else keys[::-1]:
            torch.manual_seed(1000 + rnd)
            start = time.perf_counter()
            tokens = variants[key]()
            seconds = time.perf_counter() - start
            label = "warm-up" if rnd == 0 else f"repeat {rnd}"
            print(f"{label}: {key[0]} / {key[1]}: {seconds:.1f} s", file=sys.stderr, flush=True)
            if rnd:
                rates[key].append(tokens / seconds)
                counts[key].append(tokens)
    return rates, counts


def print_table(rates: dict[tuple[str, str], list[float]], threads: int) -> None:
    header = (
        f"| {'work':<8} | {'variant':<30} | {'tokens/s':>8} | {'tokens/s/core':>13} "
        f"| {'zbrl / plain':>12} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for work in ("generate", "train"):
        rows = [(name, statistics.median(r)) for (w, name), r in rates.items() if w == work]
        base = rows[0][1]  # the plain variant comes first
        for name, rate in rows:
            ratio = "" if name.startswith("plain") else f"{rate / base:.2f}x"
            print(
                f"| {work:<8} | {name:<30} | {rate:>8.0f} | {rate / threads:>13.0f} | {ratio:>12} |"
            )


def _group(index: int, prompt: list[int], comps) -> RolloutGroup:
    """The completions of one prompt as a rollout group with varied rewards (so every row has a
    non-zero GRPO advantage), none marked truncated (so no variant drops a row)."""
    n = len(comps)
    return RolloutGroup(
        uid=f"bench-{index}",
        prompt_ids=list(prompt),
        response_ids=[c.token_ids for c in comps],
        behaviour_logprobs=[c.logprobs for c in comps],
        rewards=[float(i % 2) + 0.01 * i for i in range(n)],
        format_acc=[1.0] * n,
        ans_acc=[float(i % 2) for i in range(n)],
        truncated=[False] * n,
        policy_version=0,
        temperature=1.0,
        producer=0,
        ticket=index,
    )


def _generated_tokens(new_tokens_NL: torch.Tensor, eos_ids: set[int]) -> int:
    """Tokens generated per row up to and including its first EOS (``generate`` pads after)."""
    total = 0
    for row in new_tokens_NL.tolist():
        ends = [i for i, t in enumerate(row) if t in eos_ids]
        total += ends[0] + 1 if ends else len(row)
    return total


class PlainStep:
    """A policy-gradient step as one writes it with plain PyTorch and transformers: right-padded
    micro-batches, forward, log-softmax, the response tokens' log-probs weighted by their row's
    advantage (token mean over the batch), backward, gradient clipping at 1.0, AdamW."""

    def __init__(self, model, lr: float) -> None:
        self.model = model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.batches: list[tuple[torch.Tensor, ...]] = []
        self.response_tokens = 0

    def prepare(
        self, groups: list[RolloutGroup], trainer: Trainer, microbatch: int, pad_id: int
    ) -> None:
        """Right-padded micro-batches of the groups' rows with zbrl's GRPO advantages."""
        from zbrl.algorithms.advantages import compute_advantages

        s = trainer.settings
        rewards_BG = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
        adv_BG = compute_advantages(s.advantage, rewards_BG, **s.advantage_kwargs)
        rows = [
            (g.prompt_ids, r.tolist(), float(adv_BG[b, j]))
            for b, g in enumerate(groups)
            for j, r in enumerate(g.response_ids)
        ]
        self.response_tokens = sum(len(r) for _, r, _ in rows)
        for start in range(0, len(rows), microbatch):
            chunk = rows[start : start + microbatch]
            width = max(len(p) + len(r) for p, r, _ in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention = torch.zeros_like(ids)
            response = torch.zeros_like(ids, dtype=torch.float32)
            for i, (p, r, _) in enumerate(chunk):
                ids[i, : len(p) + len(r)] = torch.tensor(p + r)
                attention[i, : len(p) + len(r)] = 1
                response[i, len(p) : len(p) + len(r)] = 1.0
            adv = torch.tensor([a for _, _, a in chunk])
            self.batches.append((ids, attention, response, adv))

    def step(self) -> None:
        for ids, attention, response, adv in self.batches:
            logits = self.model(input_ids=ids, attention_mask=attention).logits
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            picked = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
            weights = response[:, 1:] * adv[:, None]
            loss = -(picked * weights).sum() / self.response_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad()


if __name__ == "__main__":
    main()
