"""Per-core work rates of zbrl's producer and consumer against plain transformers, on one core.

The demo's model (warm-started embedded model) and prompts: ``--prompts`` prompts × G samples,
up to the recipe's ``max_new_tokens``. Generation: plain ``model.generate`` (sampling, raw logits
kept) against zbrl's transformers backend (the same call plus each sampled token's log-prob and
the response cut at EOS), with transformers' ``generate`` and with zbrl's own decode loop
(``rollout.backend.fast_decode``, the default). Training: one plain forward/backward/AdamW
step on the right-padded batch against zbrl's train step (GRPO loss, the recipe's settings, in
float32) on full rows with fixed micro-batches, on full rows with length-sorted micro-batches
under a token budget (``training.train_microbatch_tokens``), and with each group's prompt run
once (``training.share_prompts``, the default), the last also in bfloat16 compute (the demo's
``model.dtype``).
The rows trained are the completions generated (real lengths). Variants alternate within each
repeat; medians of ``--repeats``. Rates count real tokens (prompt + response, no padding) per
second per torch thread.

    python bench/per_core_rates.py                  # the demo recipe, 1 thread, 7 repeats
    python bench/per_core_rates.py --threads 2 --budget 768 --budget 1536
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from zbrl.assembly.artifacts import prepare_artifacts
from zbrl.assembly.datasets import encode_prompts
from zbrl.assembly.models import build_backend, build_trainer, load_tokenizer
from zbrl.assembly.settings import sampling_params
from zbrl.config import load_config
from zbrl.models.quiet import quiet_transformers

REPO = Path(__file__).resolve().parents[1]
# tests/helpers: the test harness this bench reuses (random rollout groups)
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    from helpers.data_parallel import Case, make_groups

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--budget", type=int, action="append", help="token budgets to try")
    args = p.parse_args()
    quiet_transformers()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = load_config(args.recipe, ["training.device=cpu", "rollout.backend.type=transformers"])
    art = prepare_artifacts(cfg, verbose=False)
    tokenizer = load_tokenizer(cfg, art.tokenizer_dir)
    prompts, _ = encode_prompts(art.train_path, cfg, tokenizer, limit=args.prompts)
    backend = build_backend(cfg, art.model_dir, art.tokenizer_dir)
    params = sampling_params(cfg)
    ids = [pr.prompt_ids for pr in prompts]

    completions = backend.generate(ids, params)
    groups = make_groups(Case("bench", (), len(prompts), group_size=params.n), 100)
    for group, prompt, comps in zip(groups, prompts, completions, strict=True):
        group.prompt_ids = list(prompt.prompt_ids)
        group.response_ids = [c.token_ids for c in comps]
        group.behaviour_logprobs = [c.logprobs for c in comps]
    real_tokens = sum(len(g.prompt_ids) * g.group_size + sum(g.response_lengths) for g in groups)
    gen_tokens = sum(sum(g.response_lengths) for g in groups)

    rows = len(groups) * params.n
    budgets = args.budget or [rows * 48 // 4, rows * 48 // 2]

    def trainer(*overrides: str):
        tuned = load_config(args.recipe, ["training.device=cpu", "model.dtype=float32", *overrides])
        return build_trainer(tuned, art.model_dir, tokenizer, 1000)

    trainers = {"zbrl, fixed micro-batches": trainer("training.share_prompts=false")}
    for b in budgets:
        trainers[f"zbrl, token budget {b}"] = trainer(
            "training.share_prompts=false", f"training.train_microbatch_tokens={b}"
        )
    trainers["zbrl, shared prompts"] = trainer("training.share_prompts=true")
    trainers["zbrl, shared prompts, bf16"] = trainer(
        "training.share_prompts=true", "model.dtype=bfloat16"
    )
    plain = _PlainStep(art.model_dir, groups, tokenizer.pad_token_id or 0, cfg.algorithm.lr)
    model = backend.model

    def plain_generate() -> None:
        input_ids, attention = backend._left_pad(ids)
        model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n,
            do_sample=True,
            temperature=params.temperature,
            top_p=1.0,
            top_k=0,
            return_dict_in_generate=True,
            output_logits=True,
            pad_token_id=backend.pad_id,
        )

    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    generate_backend = TransformersBackend(model, tokenizer, fast_decode=False)
    variants = {
        ("generate", "plain transformers"): plain_generate,
        ("generate", "zbrl backend, generate"): lambda: generate_backend.generate(ids, params),
        ("generate", "zbrl backend, own loop"): lambda: backend.generate(ids, params),
        ("train", "plain transformers"): plain.step,
        **{("train", name): (lambda t=t: t.train(groups)) for name, t in trainers.items()},
    }
    times: dict[tuple[str, str], list[float]] = {k: [] for k in variants}
    for rep in range(args.repeats + 1):
        for key, fn in variants.items():
            start = time.perf_counter()
            fn()
            if rep:  # the first round warms up
                times[key].append(time.perf_counter() - start)

    print(
        f"\nper-core rates, {args.threads} thread(s), medians of {args.repeats}: "
        f"{len(prompts)} prompts x {params.n} samples, {gen_tokens} generated tokens, "
        f"{real_tokens} tokens trained per step"
    )
    header = f"{'work':<9} {'variant':<28} {'median s':>9} {'tokens/s/core':>14} {'vs plain':>9}"
    print(header)
    print("-" * len(header))
    for work in ("generate", "train"):
        base = statistics.median(times[(work, "plain transformers")])
        count = gen_tokens if work == "generate" else real_tokens
        for (w, name), ts in times.items():
            if w != work:
                continue
            med = statistics.median(ts)
            rate = count / med / args.threads
            print(f"{work:<9} {name:<28} {med:>9.4f} {rate:>14.0f} {base / med:>8.2f}x")


class _PlainStep:
    """Forward/backward/AdamW of a plain transformers model on the right-padded batch (the
    sampled tokens' log-likelihood: the same model work as a policy-gradient step)."""

    def __init__(self, model_dir: Path, groups, pad_id: int, lr: float) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        seqs = [g.prompt_ids + r.tolist() for g in groups for r in g.response_ids]
        width = max(len(s) for s in seqs)
        self.ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        self.attention = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            self.ids[i, : len(s)] = torch.tensor(s)
            self.attention[i, : len(s)] = 1

    def step(self) -> None:
        logits = self.model(input_ids=self.ids, attention_mask=self.attention).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1)
        picked = logp.gather(-1, self.ids[:, 1:, None]).squeeze(-1)
        loss = -(picked * self.attention[:, 1:]).sum() / self.attention.sum()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()


if __name__ == "__main__":
    main()
