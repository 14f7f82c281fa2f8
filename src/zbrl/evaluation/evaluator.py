"""Evaluation of a policy on named held-out sets: accuracy, pass@k, per-sample JSONL.

Samples are generated and scored by the same episode path as the producer's
(:mod:`zbrl.rollout.episodes`), in eval mode; a plain prompt is an episode with no environment
turn."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbrl.rewards.base import RewardFunction
from zbrl.rollout.backends.base import InferenceBackend, SamplingParams
from zbrl.rollout.episodes import EpisodeRunner
from zbrl.types import EncodedPrompt


@dataclass
class EvalSet:
    """A named list of encoded prompts."""

    name: str
    prompts: list[EncodedPrompt]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, HumanEval)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(n: int) -> list[int]:
    """The k of pass@k reported for n samples: powers of two up to n, and n itself."""
    ks = [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []
    return sorted({*ks, n})


def prompt_text(example: dict[str, Any]) -> str:
    """The last user message of an example (what the eval record shows as the prompt)."""
    users = [m["content"] for m in example.get("messages", []) if m.get("role") == "user"]
    return users[-1] if users else ""


def evaluate_set(
    backend: InferenceBackend,
    episodes: EpisodeRunner,
    reward: RewardFunction,
    eval_set: EvalSet,
    params: SamplingParams,
    *,
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``params.n`` episodes per prompt, run by ``episodes`` on ``backend`` and scored by it in
    eval mode (as in training: the final turn, plus the environment's turn rewards); (metrics,
    records)."""
    records: list[dict[str, Any]] = []
    correct_per_prompt: list[int] = []
    for start in range(0, len(eval_set.prompts), batch_size):
        batch = eval_set.prompts[start : start + batch_size]
        completions = episodes.run(backend.generate, batch, params)
        for prompt, comps in zip(batch, completions, strict=True):
            # one reward call per prompt, as the evaluator always scored
            ((_, results),) = episodes.score(reward, [prompt.example], [comps], eval_mode=True)
            correct = 0
            for i, (c, r) in enumerate(zip(comps, results)):
                correct += int(r.ans_acc >= 1.0)
                records.append(
                    {
                        "set": eval_set.name,
                        "uid": prompt.uid,
                        "sample": i,
                        "prompt": prompt_text(prompt.example),
                        "response": c.text,
                        "parsed": r.parsed,
                        "gold": prompt.example.get("gt_answer"),
                        "format_valid": bool(r.format_acc >= 1.0),
                        "ans_valid": bool(r.ans_acc >= 1.0),
                        "reward": None if r.failed else r.reward,  # None: no score
                        "length": int(c.token_ids.numel()),
                        "truncated": c.finish_reason == "length",
                        **episodes.sample_record(c),
                    }
                )
            correct_per_prompt.append(correct)
        if on_batch is not None:
            on_batch(len(batch))
    return summarize(records, correct_per_prompt, params.n), records


def summarize(
    records: list[dict[str, Any]], correct_per_prompt: list[int], n: int
) -> dict[str, float]:
    count = max(1, len(records))
    metrics = {
        "accuracy": sum(r["ans_valid"] for r in records) / count,
        "format_acc": sum(r["format_valid"] for r in records) / count,
        "mean_length": sum(r["length"] for r in records) / count,
        "num_prompts": float(len(correct_per_prompt)),
        "reward_failed": float(sum(r["reward"] is None for r in records)),
    }
    for k in ks_for(n):
        values = [pass_at_k(n, c, k) for c in correct_per_prompt]
        metrics[f"pass@{k}"] = sum(values) / max(1, len(values))
    return metrics


class Evaluator:
    """Evaluates every set and writes ``OUT_DIR/STEP.jsonl`` with per-sample records."""

    def __init__(
        self,
        backend: InferenceBackend,
        episodes: EpisodeRunner,
        reward: RewardFunction,
        sets: list[EvalSet],
        params: SamplingParams,
        *,
        batch_size: int,
        out_dir: str | Path | None,
    ) -> None:
        """``episodes``: runs and scores the samples (on ``backend``), as the producer's does."""
        self.episodes = episodes
        self.backend = backend
        self.reward = reward
        self.sets = sets
        self.params = params
        self.batch_size = batch_size
        self.out_dir = Path(out_dir) if out_dir is not None else None

    def out_file(self, step: int) -> Path:
        """The per-sample records of the evaluation at ``step`` (with an ``out_dir``)."""
        assert self.out_dir is not None
        return self.out_dir / f"{step}.jsonl"

    def run(self, step: int) -> dict[str, dict[str, float]]:
        results: dict[str, dict[str, float]] = {}
        all_records: list[dict[str, Any]] = []
        for eval_set in self.sets:
            metrics, records = evaluate_set(
                self.backend,
                self.episodes,
                self.reward,
                eval_set,
                self.params,
                batch_size=self.batch_size,
            )
            results[eval_set.name] = metrics
            all_records += records
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_file(step), "w", encoding="utf-8") as f:
                for rec in all_records:
                    f.write(json.dumps({"step": step, **rec}) + "\n")
        return results
