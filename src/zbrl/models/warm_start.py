"""A short, cached supervised warm start of the embedded tiny model on the synthetic task.

The warm start teaches the *format* (``<think>…</think><answer>…</answer>`` then EOS) and part of
the arithmetic, and stops on purpose well short of what supervised training could reach: a few
hundred steps on the train split, so that the policy starts with partial answer accuracy and the
demo's RL run has something to improve. Loss is on the assistant tokens only (the completion and
its closing EOS), never on the prompt.

The result is a normal model directory (``save_pretrained``), cached under
``cache_dir/warm-<key>`` where the key hashes every setting; a ``WARM_START_COMPLETE`` marker
(JSON with the settings and the measured accuracies) is written last, and the directory is built
under a temporary name and renamed into place, so a half-written cache is never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from zbrl.data.synthetic import (
    SYSTEM_PROMPT,
    extract_answer,
    make_arithmetic_rows,
    make_row,
    reference_completion,
)

if TYPE_CHECKING:  # imported where a model is trained: a cached warm start is found without them
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

MARKER = "WARM_START_COMPLETE"
_CACHE_VERSION = 2
"""Bump when the warm-start code changes in a way that changes its result."""
PROBE_SIZE = 64
"""Train-split problems held back from the warm start's rows to decide when to stop."""
CHECK_EVERY = 25
"""Steps between probe checks."""
_FORMAT_RE = re.compile(r"<think>.*?</think><answer>.*?</answer>", re.DOTALL)


@dataclass(frozen=True)
class WarmStartSettings:
    """Everything that determines a warm-started model (and hence its cache key)."""

    seed: int
    steps: int
    stop_at_accuracy: float | None
    batch_size: int
    lr: float
    warmup_steps: int
    n_train: int
    min_digits: int
    max_digits: int
    hidden_size: int
    num_layers: int
    num_heads: int

    def key(self) -> str:
        task = {"system_prompt": SYSTEM_PROMPT, "example": reference_completion(make_row(37, 48))}
        blob = json.dumps({"v": _CACHE_VERSION, "task": task, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_warm_start(
    cache_dir: str | Path,
    *,
    seed: int = 0,
    steps: int = 500,
    stop_at_accuracy: float | None = 0.4,
    batch_size: int = 32,
    lr: float = 2e-3,
    warmup_steps: int = 20,
    n_train: int = 4000,
    min_digits: int = 1,
    max_digits: int = 2,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    eval_size: int = 200,
    verbose: bool = True,
) -> Path:
    """Return the directory of the warm-started model, training (and caching) it if needed.

    Training stops after ``steps`` or, when ``stop_at_accuracy`` is set, as soon as greedy
    answer accuracy on a probe of train-split problems *not* in the training rows reaches it
    (checked every :data:`CHECK_EVERY` steps). The learning rate warms up linearly and then stays
    constant — no decay to zero, which would leave the model in a minimum so sharp that RL at
    any useful learning rate destabilises it. ``eval_size`` held-out problems are scored at the
    end (greedy and sampled at temperature 1.0) and recorded in the marker; ``0`` skips that.
    """
    settings = WarmStartSettings(
        seed=seed,
        steps=steps,
        stop_at_accuracy=stop_at_accuracy,
        batch_size=batch_size,
        lr=lr,
        warmup_steps=warmup_steps,
        n_train=n_train,
        min_digits=min_digits,
        max_digits=max_digits,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
    )
    cache_dir = Path(cache_dir)
    target = cache_dir / f"warm-{settings.key()}"
    if (target / MARKER).is_file():
        if verbose:
            print(f"[zbrl] warm start: reusing {target}", flush=True)
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    if target.exists():  # an interrupted earlier build: no marker, so rebuild it
        shutil.rmtree(target, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=".warm-", dir=cache_dir))
    try:
        summary = _build(settings, work, eval_size=eval_size, verbose=verbose)
        (work / MARKER).write_text(json.dumps(summary, indent=2) + "\n")
        try:
            os.rename(work, target)
        except OSError:  # another process finished the same warm start first
            if not (target / MARKER).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def read_warm_start_summary(model_dir: str | Path) -> dict:
    """The settings and measured accuracies recorded by :func:`ensure_warm_start`."""
    return json.loads((Path(model_dir) / MARKER).read_text())


def _build(settings: WarmStartSettings, out_dir: Path, *, eval_size: int, verbose: bool) -> dict:
    from zbrl.models.quiet import quiet_transformers
    from zbrl.models.tiny import build_tiny_model, save_model_dir
    from zbrl.models.tokenizer import build_tokenizer

    quiet_transformers()
    started = time.perf_counter()
    tokenizer = build_tokenizer()
    model = build_tiny_model(
        tokenizer,
        hidden_size=settings.hidden_size,
        num_layers=settings.num_layers,
        num_heads=settings.num_heads,
        seed=settings.seed,
    )
    digits = {"min_digits": settings.min_digits, "max_digits": settings.max_digits}
    pool = make_arithmetic_rows(
        settings.n_train + PROBE_SIZE, seed=settings.seed, split="train", **digits
    )
    rows, probe = pool[: settings.n_train], pool[settings.n_train :]
    probe_log: dict[str, float] = {}

    def reached_target(step: int) -> bool:
        if settings.stop_at_accuracy is None or step % CHECK_EVERY:
            return False
        acc = evaluate(model, tokenizer, probe, temperature=0.0)["answer_acc"]
        probe_log[str(step)] = round(acc, 4)
        if verbose:
            print(f"[zbrl] warm start: step {step} probe greedy accuracy {acc:.2f}", flush=True)
        return acc >= settings.stop_at_accuracy

    losses = train_sft(
        model,
        tokenizer,
        rows,
        steps=settings.steps,
        batch_size=settings.batch_size,
        lr=settings.lr,
        warmup_steps=settings.warmup_steps,
        seed=settings.seed,
        verbose=verbose,
        should_stop=reached_target,
    )
    save_model_dir(model, tokenizer, out_dir)
    summary: dict = {
        "settings": asdict(settings),
        "steps_trained": len(losses),
        "final_loss": losses[-1] if losses else None,
        "probe_greedy_accuracy": probe_log,
        "train_seconds": round(time.perf_counter() - started, 1),
    }
    if eval_size:
        held_out = make_arithmetic_rows(eval_size, seed=settings.seed, split="eval", **digits)
        summary["heldout_greedy"] = evaluate(model, tokenizer, held_out, temperature=0.0)
        summary["heldout_sampled_t1"] = evaluate(
            model, tokenizer, held_out, temperature=1.0, seed=settings.seed
        )
        if verbose:
            print(
                f"[zbrl] warm start: {len(losses)} steps; held-out answer accuracy greedy "
                f"{summary['heldout_greedy']['answer_acc']:.2f}, sampled (T=1) "
                f"{summary['heldout_sampled_t1']['answer_acc']:.2f}",
                flush=True,
            )
    return summary


def _prompt_and_full_ids(
    tokenizer: PreTrainedTokenizerBase, row: dict
) -> tuple[list[int], list[int]]:
    prompt = tokenizer.apply_chat_template(
        row["messages"], add_generation_prompt=True, tokenize=False
    )
    full = tokenizer.apply_chat_template(
        [*row["messages"], {"role": "assistant", "content": reference_completion(row)}],
        tokenize=False,
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    if full_ids[: len(prompt_ids)] != prompt_ids:
        raise ValueError("chat template: the generation prompt is not a prefix of the full chat")
    return prompt_ids, full_ids


def _sft_batch(
    examples: Sequence[tuple[list[int], list[int]]], pad_id: int
) -> dict[str, torch.Tensor]:
    import torch

    width = max(len(full) for _, full in examples)
    input_ids_BT = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels_BT = torch.full((len(examples), width), -100, dtype=torch.long)
    mask_BT = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (prompt, full) in enumerate(examples):  # right padding: positions start at 0
        input_ids_BT[i, : len(full)] = torch.tensor(full)
        labels_BT[i, len(prompt) : len(full)] = torch.tensor(full[len(prompt) :])
        mask_BT[i, : len(full)] = 1
    return {"input_ids": input_ids_BT, "attention_mask": mask_BT, "labels": labels_BT}


def train_sft(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int = 20,
    seed: int = 0,
    verbose: bool = True,
    should_stop: Callable[[int], bool] | None = None,
) -> list[float]:
    """Supervised steps on ``reference_completion`` targets (assistant tokens only).

    AdamW, linear warm-up over ``warmup_steps`` then a constant learning rate.
    ``should_stop(step)`` is called after each step (1-based) and ends training when it returns
    True. Returns the per-step losses.
    """
    import torch

    examples = [_prompt_and_full_ids(tokenizer, row) for row in rows]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, warmup_steps))
    )
    losses: list[float] = []
    started = time.perf_counter()
    report_every = max(1, steps // 10)
    for step in range(steps):
        model.train()
        picks = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        batch = _sft_batch([examples[i] for i in picks], tokenizer.pad_token_id)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if verbose and ((step + 1) % report_every == 0 or step + 1 == steps):
            print(
                f"[zbrl] warm start: step {step + 1}/{steps} loss {losses[-1]:.3f} "
                f"({time.perf_counter() - started:.0f}s)",
                flush=True,
            )
        if should_stop is not None and should_stop(step + 1):
            break
    model.eval()
    return losses


def generate_responses(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    *,
    temperature: float,
    max_new_tokens: int = 32,
    batch_size: int = 256,
) -> list[str]:
    """Decoded responses (special tokens dropped) for each row; ``temperature=0`` is greedy."""
    import torch

    with torch.no_grad():
        return _generate_responses(model, tokenizer, rows, temperature, max_new_tokens, batch_size)


def _generate_responses(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    temperature: float,
    max_new_tokens: int,
    batch_size: int,
) -> list[str]:
    was_training = model.training
    model.eval()
    responses: list[str] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        prompts = [
            tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
            for r in chunk
        ]
        enc = tokenizer(
            prompts,
            add_special_tokens=False,
            padding=True,
            padding_side="left",
            return_tensors="pt",
        )
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            **(sampling if temperature > 0 else {"do_sample": False}),
        )
        new_tokens = out[:, enc["input_ids"].shape[1] :]
        responses += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    model.train(was_training)
    return responses


def evaluate(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    *,
    temperature: float,
    max_new_tokens: int = 32,
    seed: int = 0,
) -> dict[str, float]:
    """Quick held-out check: format accuracy and exact-match answer accuracy.

    This is a self-contained sanity check for the warm start, not the project's reward function
    (``zbrl.rewards``); the answer must be in ``<answer>`` and equal ``gt_answer`` as a string.
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        responses = generate_responses(
            model, tokenizer, rows, temperature=temperature, max_new_tokens=max_new_tokens
        )
    fmt = [bool(_FORMAT_RE.fullmatch(r.strip())) for r in responses]
    ans = [extract_answer(r) == str(row["gt_answer"]) for r, row in zip(responses, rows)]
    n = max(1, len(rows))
    return {"format_acc": sum(fmt) / n, "answer_acc": sum(ans) / n}
