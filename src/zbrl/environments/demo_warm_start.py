"""The tool demo's warm start: the embedded tiny model taught, briefly and on purpose not to the
end, to answer 3-digit products through the calculator (or, for the side-by-side without tools,
directly), cached like the addition warm start (:mod:`zbrl.models.warm_start`).

Each training sequence is built the way an episode is: the prompt through the chat template,
each assistant turn's text and EOS (in the loss), and the calculator's message as the episode
runner appends it (:class:`~zbrl.rollout.turns.TurnFormatter`; outside the loss). So the
warm start and RL train the same token sequences. Training stops after ``steps`` or once greedy
accuracy on a probe of unseen training problems, run as real episodes, reaches
``stop_at_accuracy``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from zbrl.data.synthetic import extract_answer
from zbrl.environments import demo_task
from zbrl.environments.tool_env import ToolEnvironment, ToolSettings
from zbrl.environments.tools import Calculator
from zbrl.models.tiny import build_tiny_model, save_model_dir
from zbrl.models.tokenizer import build_tokenizer
from zbrl.models.warm_start import MARKER
from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
from zbrl.rollout.transcripts import ChatTranscript
from zbrl.rollout.turns import TurnFormatter

_CACHE_VERSION = 1
PROBE_SIZE = 64
CHECK_EVERY = 25
MAX_TURNS = 3
MAX_TOTAL_TOKENS = 64
TURN_TOKENS = 24


@dataclass(frozen=True)
class DemoWarmStartSettings:
    tools: bool
    seed: int
    steps: int
    stop_at_accuracy: float | None
    batch_size: int
    lr: float
    warmup_steps: int = 20
    n_train: int = 4000
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4

    def key(self) -> str:
        task = {
            "tools": demo_task.TOOLS_SYSTEM_PROMPT,
            "plain": demo_task.PLAIN_SYSTEM_PROMPT,
            "trace": demo_task.trace(demo_task.make_row(347, 628, tools=True), tools=True),
        }
        blob = json.dumps({"v": _CACHE_VERSION, "task": task, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_demo_warm_start(
    cache_dir: str | Path, settings: DemoWarmStartSettings, *, verbose: bool = True
) -> Path:
    """The warm-started model directory, trained and cached on first use."""
    cache_dir = Path(cache_dir)
    kind = "tools" if settings.tools else "plain"
    target = cache_dir / f"warm-multiply-{kind}-{settings.key()}"
    if (target / MARKER).is_file():
        if verbose:
            print(f"[zbrl] warm start: reusing {target}", flush=True)
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=".warm-", dir=cache_dir))
    try:
        summary = _build(settings, work, verbose=verbose)
        (work / MARKER).write_text(json.dumps(summary, indent=2) + "\n")
        try:
            os.rename(work, target)
        except OSError:
            if not (target / MARKER).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def episode_runner(model, tokenizer) -> tuple[EpisodeRunner, Any]:
    """Greedy-capable episodes with the calculator in the tags format (the demo's setting), and
    the backend that generates them."""
    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    backend = TransformersBackend(model, tokenizer)
    env = ToolEnvironment(
        [Calculator()],
        ToolSettings(
            call_format="tags",
            on_error="reply",
            max_result_chars=100,
            tool_timeout_s=5.0,
            stop_after_call=False,
        ),
    )
    runner = EpisodeRunner(
        env,
        ChatTranscript(TurnFormatter(tokenizer, "user", eos_ids=backend.eos_ids)),
        EpisodeLimitSettings(max_turns=MAX_TURNS, max_total_tokens=MAX_TOTAL_TOKENS),
    )
    return runner, backend


def sequence(tokenizer, formatter: TurnFormatter, row: dict, *, tools: bool):
    """(prompt ids, response ids, loss mask over the response) of the row's ideal episode."""
    prompt = _ids(tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True))
    ids: list[int] = []
    mask: list[bool] = []
    last_model: list[int] = []
    for role, content in demo_task.trace(row, tools=tools):
        if role == "assistant":
            turn = [*tokenizer.encode(content, add_special_tokens=False), tokenizer.eos_token_id]
            last_model = turn
            ids += turn
            mask += [True] * len(turn)
        else:
            env, _ = formatter.environment_ids(last_model, content)
            ids += env
            mask += [False] * len(env)
    return prompt, ids, mask


def _ids(value) -> list[int]:
    return list(value["input_ids"] if hasattr(value, "keys") else value)


def accuracy(model, tokenizer, rows: list[dict], *, tools: bool, temperature: float) -> float:
    """Answer accuracy of ``rows`` as episodes (with the calculator when ``tools``)."""
    from zbrl.rollout.backends.base import SamplingParams
    from zbrl.types import EncodedPrompt

    runner, backend = episode_runner(model, tokenizer)
    if not tools:
        runner.limits = EpisodeLimitSettings(max_turns=1, max_total_tokens=MAX_TOTAL_TOKENS)
    params = SamplingParams(
        n=1,
        temperature=temperature,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=TURN_TOKENS,
        stop_strings=(),
    )
    template = tokenizer.apply_chat_template
    prompts = [
        EncodedPrompt(str(i), _ids(template(r["messages"], add_generation_prompt=True)), r)
        for i, r in enumerate(rows)
    ]
    correct = 0
    for start in range(0, len(prompts), 64):
        for prompt, (episode,) in zip(
            prompts[start : start + 64],
            runner.run(backend.generate, prompts[start : start + 64], params),
        ):
            correct += extract_answer(episode.text) == prompt.example["gt_answer"]
    return correct / max(1, len(rows))


def _build(s: DemoWarmStartSettings, out_dir: Path, *, verbose: bool) -> dict:
    started = time.perf_counter()
    torch.manual_seed(s.seed)
    tokenizer = build_tokenizer()
    model = build_tiny_model(
        tokenizer,
        hidden_size=s.hidden_size,
        num_layers=s.num_layers,
        num_heads=s.num_heads,
        seed=s.seed,
    )
    formatter = TurnFormatter(tokenizer, "user", eos_ids={tokenizer.eos_token_id})
    pool = demo_task.make_rows(s.n_train + PROBE_SIZE, seed=s.seed, split="train", tools=s.tools)
    rows, probe = pool[: s.n_train], pool[s.n_train :]
    examples = [sequence(tokenizer, formatter, r, tools=s.tools) for r in rows]
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, s.warmup_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warmup))
    generator = torch.Generator().manual_seed(s.seed)
    probe_log: dict[str, float] = {}
    losses: list[float] = []
    for step in range(1, s.steps + 1):
        model.train()
        picks = torch.randint(len(examples), (s.batch_size,), generator=generator).tolist()
        loss = model(**_batch([examples[i] for i in picks], tokenizer.pad_token_id)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if s.stop_at_accuracy is not None and step % CHECK_EVERY == 0:
            model.eval()
            acc = accuracy(model, tokenizer, probe, tools=s.tools, temperature=0.0)
            probe_log[str(step)] = round(acc, 4)
            if verbose:
                print(
                    f"[zbrl] warm start (multiply, tools={s.tools}): step {step} loss "
                    f"{losses[-1]:.3f} probe greedy accuracy {acc:.2f}",
                    flush=True,
                )
            if acc >= s.stop_at_accuracy:
                break
    model.eval()
    save_model_dir(model, tokenizer, out_dir)
    return {
        "settings": asdict(s),
        "steps_trained": len(losses),
        "final_loss": losses[-1] if losses else None,
        "probe_greedy_accuracy": probe_log,
        "train_seconds": round(time.perf_counter() - started, 1),
    }


def _batch(examples, pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(p) + len(r) for p, r, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (prompt, response, mask) in enumerate(examples):
        full = torch.tensor(prompt + response)
        input_ids[i, : len(full)] = full
        attention[i, : len(full)] = 1
        trained = torch.tensor(mask)
        labels[i, len(prompt) : len(full)] = torch.where(trained, full[len(prompt) :], -100)
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}
