"""The one warm-start builder of the embedded default: a short, cached supervised start of the
tiny model on one of its tasks (:mod:`zbrl.embedded.warm_start_tasks`: the addition task, the
tool demo's multiplication task with or without the calculator).

The warm start teaches the *format* and part of the task, and stops on purpose well short of what
supervised training could reach: after ``steps``, or once greedy accuracy on a probe of train-split
problems *not* in its rows reaches ``stop_at_accuracy``, so that the policy starts with partial
accuracy and the demo's RL run has something to improve. Loss is on the model's tokens only (each
assistant turn and its closing EOS), never on the prompt or an environment's message.

The result is a normal model directory (``save_pretrained``), cached under
``cache_dir/<task prefix>-<key>`` where the key hashes every setting and what the task writes; a
``WARM_START_COMPLETE`` marker (JSON with the settings and the measured accuracies) is written
last, and the directory is built under a temporary name and renamed into place, so a half-written
cache is never reused.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from zbrl.embedded.cached_build import CachedBuild

if TYPE_CHECKING:  # imported where a model is trained: a cached warm start is found without them
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

MARKER = "WARM_START_COMPLETE"
_CACHE = CachedBuild(MARKER, "warm start", ".warm-")
PROBE_SIZE = 64
"""Train-split problems held back from the warm start's rows to decide when to stop."""
CHECK_EVERY = 25
"""Steps between probe checks."""

TrainingSequence = tuple[list[int], list[int], list[bool]]
"""(prompt ids, response ids, loss mask over the response) of one supervised example."""


class WarmStartTask(Protocol):
    """What the builder needs from a task: its rows, the sequence each row is trained as, a
    greedy probe, and what of it enters the cache key."""

    prefix: str
    """The cache directory's name before the key (``warm``, ``warm-multiply-tools``, ...)."""
    cache_version: int
    """Bumped when the task's warm start changes in a way that changes its result."""

    def fingerprint(self) -> dict[str, Any]:
        """What the task writes (system prompts, an example trace): part of the cache key."""
        ...

    def key_fields(self) -> dict[str, Any]:
        """The task's own settings: part of the cache key and of the recorded settings."""
        ...

    def rows(self, n: int, *, seed: int, split: Literal["train", "eval"]) -> list[dict]:
        """``n`` distinct problems of ``split``, deterministic for ``seed``."""
        ...

    def sequences(
        self, tokenizer: PreTrainedTokenizerBase, rows: list[dict]
    ) -> list[TrainingSequence]:
        """Each row's ideal episode as token ids and the loss mask."""
        ...

    def probe_accuracy(
        self, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, rows: list[dict]
    ) -> float:
        """Greedy answer accuracy on ``rows``."""
        ...

    def final_figures(
        self,
        model: LlamaForCausalLM,
        tokenizer: PreTrainedTokenizerBase,
        seed: int,
        *,
        verbose: bool,
    ) -> dict[str, Any]:
        """Held-out figures recorded in the marker once training is done (may be empty)."""
        ...


@dataclass(frozen=True)
class WarmStartSettings:
    """The training settings of a warm start (with the task's own, its cache key)."""

    seed: int = 0
    steps: int = 500
    stop_at_accuracy: float | None = 0.4
    batch_size: int = 32
    lr: float = 2e-3
    warmup_steps: int = 20
    n_train: int = 4000
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4

    def model_config(self, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
        """The warm-started model's config (:func:`zbrl.embedded.tiny_model.tiny_model_config`
        of these sizes)."""
        from zbrl.embedded.tiny_model import tiny_model_config

        return tiny_model_config(
            tokenizer,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
        )


def settings_record(task: WarmStartTask, settings: WarmStartSettings) -> dict[str, Any]:
    """The settings a warm start records and hashes: the training settings and the task's."""
    return {**asdict(settings), **task.key_fields()}


def cache_key(task: WarmStartTask, settings: WarmStartSettings) -> str:
    """The warm start's cache key: its settings, the task's and what the task writes."""
    blob = json.dumps(
        {"v": task.cache_version, "task": task.fingerprint(), **settings_record(task, settings)},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_warm_start(
    cache_dir: str | Path,
    task: WarmStartTask,
    settings: WarmStartSettings,
    *,
    verbose: bool = True,
) -> Path:
    """Return the directory of the warm-started model, training (and caching) it if needed.

    The learning rate warms up linearly and then stays constant — no decay to zero, which would
    leave the model in a minimum so sharp that RL at any useful learning rate destabilises it.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / f"{task.prefix}-{cache_key(task, settings)}"
    return _CACHE.ensure(
        target, lambda work: _build(task, settings, work, verbose=verbose), verbose
    )


def read_warm_start_summary(model_dir: str | Path) -> dict:
    """The settings and measured accuracies recorded by :func:`ensure_warm_start`."""
    return _CACHE.summary(model_dir)


def _build(
    task: WarmStartTask, s: WarmStartSettings, out_dir: Path, *, verbose: bool
) -> dict[str, Any]:
    import torch

    from zbrl.embedded.tiny_model import build_tiny_model, save_model_dir
    from zbrl.embedded.tokenizer import build_tokenizer
    from zbrl.models.quiet import quiet_transformers

    quiet_transformers()
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[]):  # the calling process's random state is left alone
        torch.manual_seed(s.seed)
        tokenizer = build_tokenizer()
        model = build_tiny_model(s.model_config(tokenizer), seed=s.seed)
        pool = task.rows(s.n_train + PROBE_SIZE, seed=s.seed, split="train")
        rows, probe = pool[: s.n_train], pool[s.n_train :]
        probe_log: dict[str, float] = {}

        def reached_target(step: int) -> bool:
            if s.stop_at_accuracy is None or step % CHECK_EVERY:
                return False
            model.eval()
            acc = task.probe_accuracy(model, tokenizer, probe)
            probe_log[str(step)] = round(acc, 4)
            if verbose:
                print(
                    f"[zbrl] warm start ({task.prefix}): step {step} probe greedy accuracy "
                    f"{acc:.2f}",
                    flush=True,
                )
            return acc >= s.stop_at_accuracy

        losses = train_sft(
            model,
            task.sequences(tokenizer, rows),
            pad_id=tokenizer.pad_token_id,
            steps=s.steps,
            batch_size=s.batch_size,
            lr=s.lr,
            warmup_steps=s.warmup_steps,
            seed=s.seed,
            verbose=verbose,
            should_stop=reached_target,
        )
        save_model_dir(model, tokenizer, out_dir)
        summary: dict[str, Any] = {
            "settings": settings_record(task, s),
            "steps_trained": len(losses),
            "final_loss": losses[-1] if losses else None,
            "probe_greedy_accuracy": probe_log,
            "train_seconds": round(time.perf_counter() - started, 1),
        }
        summary.update(task.final_figures(model, tokenizer, s.seed, verbose=verbose))
    if verbose:
        print(f"[zbrl] warm start ({task.prefix}): {len(losses)} steps", flush=True)
    return summary


def sft_batch(examples: Sequence[TrainingSequence], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 outside the loss
    mask and on the prompt) of supervised examples."""
    import torch

    width = max(len(prompt) + len(response) for prompt, response, _ in examples)
    input_ids_BT = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels_BT = torch.full((len(examples), width), -100, dtype=torch.long)
    mask_BT = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (prompt, response, trained) in enumerate(examples):  # positions start at 0
        full_T = torch.tensor(prompt + response)
        input_ids_BT[i, : len(full_T)] = full_T
        mask_BT[i, : len(full_T)] = 1
        response_T = full_T[len(prompt) :]
        labels_BT[i, len(prompt) : len(full_T)] = torch.where(
            torch.tensor(trained, dtype=torch.bool), response_T, -100
        )
    return {"input_ids": input_ids_BT, "attention_mask": mask_BT, "labels": labels_BT}


def train_sft(
    model: LlamaForCausalLM,
    examples: Sequence[TrainingSequence],
    *,
    pad_id: int,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int = 20,
    seed: int = 0,
    verbose: bool = True,
    should_stop: Callable[[int], bool] | None = None,
) -> list[float]:
    """Supervised steps on ``examples`` (loss on the masked response tokens only).

    AdamW, linear warm-up over ``warmup_steps`` then a constant learning rate; batches drawn with
    replacement by a generator seeded with ``seed``. ``should_stop(step)`` is called after each
    step (1-based) and ends training when it returns True. Returns the per-step losses.
    """
    import torch

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
        loss = model(**sft_batch([examples[i] for i in picks], pad_id)).loss
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
