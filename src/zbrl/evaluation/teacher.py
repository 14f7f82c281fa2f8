"""The distillation teacher's figures for the run summary: its accuracy on the run's eval sets,
measured by the evaluator's own code path and sampling settings (as ``zbrl eval --model
TEACHER`` measures a model), and the producers' teacher calls."""

from __future__ import annotations

import time
from typing import Any

from zbrl.assembly.teacher import teacher_dir
from zbrl.config import RunConfig


def teacher_summary(
    cfg: RunConfig, results: dict[str, Any], buffer_stats: dict[str, float]
) -> dict[str, Any]:
    """The run summary's teacher figures: ``eval_accuracy_teacher`` (the teacher's accuracy on
    the first eval set, measured as the student's is) and ``teacher`` (its name, every eval
    set's metrics, the producers' teacher calls and the groups dropped because a call failed);
    empty without ``algorithm.distill``."""
    distill = cfg.algorithm.distill
    if distill is None:
        return {}
    from zbrl.rollout.producer import ProducerResult

    counts = [
        r.teacher
        for r in results.values()
        if isinstance(r, ProducerResult) and r.teacher is not None
    ]
    figures: dict[str, Any] = {
        "name": distill.teacher,
        "calls": sum(c.calls for c in counts),
        "failed_calls": sum(c.failed_calls for c in counts),
        "sequences": sum(c.sequences for c in counts),
        "tokens": sum(c.tokens for c in counts),
        "failed_groups_dropped": int(buffer_stats["groups_dropped_teacher_failed"]),
        "failed_responses": int(buffer_stats["responses_teacher_failed"]),
    }
    evals = evaluate_teacher(cfg) if cfg.eval.sets else {}
    figures["eval"] = evals
    first = next(iter(evals.values()), {})
    return {"eval_accuracy_teacher": first.get("accuracy"), "teacher": figures}


def evaluate_teacher(cfg: RunConfig) -> dict[str, dict[str, float]]:
    """The teacher on every ``eval.sets`` set, by the evaluator's code path and sampling
    settings (as ``zbrl eval --model TEACHER`` would measure it), in this process."""
    import torch

    from zbrl.assembly.datasets import encode_prompts, eval_ref
    from zbrl.assembly.environments import build_episode_runner
    from zbrl.assembly.model_source import load_tokenizer
    from zbrl.assembly.models import build_backend
    from zbrl.assembly.rewards import build_eval_reward_fn
    from zbrl.assembly.settings import eval_sampling_params
    from zbrl.evaluation.evaluator import EvalSet, evaluate_set

    path = teacher_dir(cfg, verbose=False)
    tokenizer = load_tokenizer(cfg, path)
    backend = build_backend(cfg, path, path)
    reward = build_eval_reward_fn(cfg)
    params = eval_sampling_params(cfg)
    episodes = build_episode_runner(cfg, backend, params.max_new_tokens)
    out = {}
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12345)  # the evaluator's seed
        for name, value in cfg.eval.sets.items():
            prompts, _ = encode_prompts(
                eval_ref(cfg, value), cfg, tokenizer, limit=cfg.eval.max_prompts
            )
            metrics, _ = evaluate_set(
                backend,
                episodes,
                reward,
                EvalSet(name, prompts),
                params,
                batch_size=cfg.eval.batch_size,
            )
            out[name] = metrics
    print(
        f"[zbrl] teacher {cfg.algorithm.distill.teacher}: "
        + ", ".join(f"{n} accuracy {m.get('accuracy', float('nan')):.3f}" for n, m in out.items())
        + f" ({time.perf_counter() - started:.0f}s)",
        flush=True,
    )
    return out
