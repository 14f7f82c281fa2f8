"""Evaluation of a policy on named held-out sets: accuracy, pass@k, per-sample JSONL."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbrl.rewards.base import RewardContext, RewardFunction
from zbrl.rollout.backends.base import InferenceBackend, SamplingParams
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
    reward: RewardFunction,
    eval_set: EvalSet,
    params: SamplingParams,
    *,
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
    episodes: Any = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Generate ``params.n`` samples per prompt, score them in eval mode; (metrics, records).
    ``episodes`` (an :class:`~zbrl.environments.runner.EpisodeRunner` on ``backend``): whole
    multi-turn episodes instead, scored as in training (their final turn, plus the
    environment's turn rewards)."""
    records: list[dict[str, Any]] = []
    correct_per_prompt: list[int] = []
    for start in range(0, len(eval_set.prompts), batch_size):
        batch = eval_set.prompts[start : start + batch_size]
        if episodes is not None:
            completions = episodes.run(batch, params)
        else:
            completions = backend.generate([p.prompt_ids for p in batch], params)
        for prompt, comps in zip(batch, completions):
            contexts = [
                RewardContext(
                    response_tokens=int(c.token_ids.numel()),
                    max_new_tokens=params.max_new_tokens,
                    truncated=c.finish_reason == "length",
                    eval_mode=True,
                )
                for c in comps
            ]
            results = _score(reward, episodes, comps, prompt.example, contexts)
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
                        "reward": r.reward,
                        "length": int(c.token_ids.numel()),
                        "truncated": c.finish_reason == "length",
                        **_episode_record(c),
                    }
                )
            correct_per_prompt.append(correct)
        if on_batch is not None:
            on_batch(len(batch))
    return summarize(records, correct_per_prompt, params.n), records


def _score(reward: RewardFunction, episodes: Any, comps: list, example: Any, contexts: list):
    if episodes is None:
        return reward.score_batch([c.text for c in comps], [example] * len(comps), contexts)
    from zbrl.environments.runner import episode_result

    if episodes.score_final_turn:
        scored = reward.score_batch([c.text for c in comps], [example] * len(comps), contexts)
    else:
        scored = [None] * len(comps)
    return [episode_result(c, r) for c, r in zip(comps, scored, strict=True)]


def _episode_record(c: Any) -> dict[str, Any]:
    turns = getattr(c, "turns", None)
    return {} if turns is None else {"transcript": c.transcript, "turns": turns}


def summarize(
    records: list[dict[str, Any]], correct_per_prompt: list[int], n: int
) -> dict[str, float]:
    count = max(1, len(records))
    metrics = {
        "accuracy": sum(r["ans_valid"] for r in records) / count,
        "format_acc": sum(r["format_valid"] for r in records) / count,
        "mean_length": sum(r["length"] for r in records) / count,
        "num_prompts": float(len(correct_per_prompt)),
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
        reward: RewardFunction,
        sets: list[EvalSet],
        params: SamplingParams,
        *,
        batch_size: int,
        out_dir: str | Path | None,
        episodes: Any = None,
    ) -> None:
        self.episodes = episodes
        self.backend = backend
        self.reward = reward
        self.sets = sets
        self.params = params
        self.batch_size = batch_size
        self.out_dir = Path(out_dir) if out_dir is not None else None

    def run(self, step: int) -> dict[str, dict[str, float]]:
        results: dict[str, dict[str, float]] = {}
        all_records: list[dict[str, Any]] = []
        for eval_set in self.sets:
            metrics, records = evaluate_set(
                self.backend,
                self.reward,
                eval_set,
                self.params,
                batch_size=self.batch_size,
                episodes=self.episodes,
            )
            results[eval_set.name] = metrics
            all_records += records
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / f"{step}.jsonl", "w", encoding="utf-8") as f:
                for rec in all_records:
                    f.write(json.dumps({"step": step, **rec}) + "\n")
        return results
