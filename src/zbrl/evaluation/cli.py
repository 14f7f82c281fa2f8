"""``zbrl eval [--recipe R] [--model M] --data FILE [--n N] [KEY=VALUE ...]``: evaluate a model
outside training.

``--model`` takes what ``model.path`` takes (a checkpoint or any Hugging Face model directory, a
LoRA checkpoint, a ``.gguf`` file, a pulled model's name, a Hub id, ``embedded``); without it the
config's ``model.path`` is evaluated. Dotted overrides change the config as ``zbrl train``'s do;
``--data held_out`` evaluates the held-out split of the config's training data (``data.source``'s,
or the embedded task's), ``--data embedded`` the embedded task's."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from zbrl.config import load_config


def _named(spec: str) -> tuple[str, str]:
    """``NAME=PATH`` or ``PATH`` (named after the file stem)."""
    name, sep, path = spec.partition("=")
    return (name, path) if sep else (Path(spec).stem, spec)


EVAL_FLAGS = {
    "reward": "reward.type",
    "n": "eval.num_samples",
    "temperature": "eval.temperature",
    "max_new_tokens": "eval.max_new_tokens",
    "max_prompts": "eval.max_prompts",
    "batch_size": "eval.batch_size",
}
"""Command-line flag → the config field it sets; a flag left out keeps the config's value."""


def eval_overrides(args: argparse.Namespace) -> list[str]:
    """The command line's dotted overrides, then those of the flags that were given (the
    defaults live in the config)."""
    return [*args.overrides] + [
        f"{field}={getattr(args, flag)}"
        for flag, field in EVAL_FLAGS.items()
        if getattr(args, flag) is not None
    ]


def run_eval_command(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from zbrl.assembly.datasets import encode_prompts
    from zbrl.assembly.environments import build_episode_runner
    from zbrl.assembly.input_checks import open_eval_inputs
    from zbrl.assembly.models import build_backend
    from zbrl.assembly.rewards import build_eval_reward_fn
    from zbrl.assembly.settings import eval_sampling_params
    from zbrl.evaluation.evaluator import EvalSet, evaluate_set
    from zbrl.models.quiet import quiet_transformers

    quiet_transformers()
    cfg = load_config(args.recipe, eval_overrides(args))
    model, field = (args.model, "--model") if args.model else (cfg.model.path, "model.path")
    named = [_named(spec) for spec in args.data]
    opened = open_eval_inputs(cfg, model, named, field=field)  # packages, reward, data, model
    limit = cfg.eval.max_prompts
    sets = [
        (name, encode_prompts(ref, cfg, opened.tokenizer, limit=limit)[0])
        for name, ref in opened.sets
    ]
    backend = build_backend(cfg, opened.model_dir, opened.tokenizer_dir)
    reward = build_eval_reward_fn(cfg)
    params = eval_sampling_params(cfg)
    episodes = build_episode_runner(cfg, backend, params.max_new_tokens)
    out_dir = Path(args.out) if args.out else None
    rows = []
    torch.manual_seed(0)
    for name, prompts in sets:
        start = time.time()
        with tqdm(total=len(prompts), desc=f"eval {name}", unit="prompt") as bar:
            metrics, records = evaluate_set(
                backend,
                episodes,
                reward,
                EvalSet(name, prompts),
                params,
                batch_size=cfg.eval.batch_size,
                on_batch=bar.update,
            )
        rows.append((name, metrics, time.time() - start))
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            with open(out_dir / f"{name}.jsonl", "w", encoding="utf-8") as f:
                for rec in records:
                    f.write(json.dumps(rec) + "\n")
    print(format_table(rows))
    return 0


def format_table(rows: list[tuple[str, dict[str, float], float]]) -> str:
    ks = sorted(
        {k for _, m, _ in rows for k in m if k.startswith("pass@")}, key=lambda k: int(k[5:])
    )
    header = ["set", "prompts", "accuracy", "format", *ks, "mean len", "seconds"]
    lines = [header]
    for name, m, secs in rows:
        lines.append(
            [
                name,
                f"{m['num_prompts']:.0f}",
                f"{m['accuracy']:.3f}",
                f"{m['format_acc']:.3f}",
                *[f"{m[k]:.3f}" for k in ks],
                f"{m['mean_length']:.1f}",
                f"{secs:.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    out = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)
