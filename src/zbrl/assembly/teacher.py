"""The distillation teacher of a run (``algorithm.distill``): its directory (the embedded teacher
built and cached, or a model directory / Hub id resolved), the check that it shares the
student's tokenizer (before the run directory is claimed), the producers' teacher settings, and
its held-out accuracy for the run summary (measured by the evaluator's own code path)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from zbrl.config import RunConfig
from zbrl.errors import RunError
from zbrl.rollout.teacher import TeacherSettings

FIELD = "algorithm.distill.teacher"


def teacher_dir(cfg: RunConfig, *, verbose: bool = True) -> Path:
    """The teacher's local model directory: the embedded teacher (built on first use, then
    found in ``logging.cache_dir``), or the directory ``distill.teacher`` names (a Hub id or a
    pulled name fetched into the cache)."""
    from zbrl.assembly.embedded import embedded_teacher_dir
    from zbrl.models.sources import check_model_dir, resolve

    distill = cfg.algorithm.distill
    if distill is None:
        raise ValueError("teacher_dir: the config has no algorithm.distill")
    if distill.embedded_teacher:
        return embedded_teacher_dir(cfg, verbose=verbose)
    spec = distill.teacher
    path = resolve(spec, cfg.logging.cache_dir, field=FIELD, verbose=verbose)
    check_model_dir(path, field=FIELD, spec=spec)
    return path


def check_same_tokenizer(teacher: Path, student_tokenizer: Path) -> None:
    """The teacher scores the student's token ids, so both must map ids to the same strings:
    a RunError naming the field otherwise."""
    from transformers import AutoTokenizer

    from zbrl.models.quiet import quiet_transformers

    quiet_transformers()
    try:
        theirs = AutoTokenizer.from_pretrained(teacher)
    except Exception as e:
        raise RunError(
            f"{FIELD}: the teacher's directory {teacher} has no tokenizer that loads "
            f"({type(e).__name__}: {e}); the teacher must ship the student's tokenizer"
        ) from None
    ours = AutoTokenizer.from_pretrained(student_tokenizer)
    differ = tokenizer_difference(ours, theirs)
    if differ is not None:
        raise RunError(
            f"{FIELD}: the teacher's tokenizer ({teacher}) differs from the student's "
            f"({student_tokenizer}): {differ}; distillation compares log-probs of the same "
            "token ids, so give a teacher of the student's family (same tokenizer)"
        )


def tokenizer_difference(ours: Any, theirs: Any) -> str | None:
    """How two tokenizers differ on what distillation needs (the vocabulary and the end of
    sequence); None when they agree."""
    vocab, other = ours.get_vocab(), theirs.get_vocab()
    if vocab != other:
        missing = len(vocab.keys() - other.keys())
        moved = sum(1 for k, v in vocab.items() if k in other and other[k] != v)
        return f"{missing} of the student's tokens are missing and {moved} have other ids"
    if ours.eos_token_id != theirs.eos_token_id:
        return f"eos id {theirs.eos_token_id} against the student's {ours.eos_token_id}"
    return None


def teacher_settings(cfg: RunConfig) -> TeacherSettings | None:
    """What a producer needs to load the teacher (None without ``algorithm.distill``); the
    directory is the driver's (built or fetched before the workers start)."""
    distill = cfg.algorithm.distill
    if distill is None:
        return None
    from zbrl.assembly.models import device_of, inference_dtype_name

    return TeacherSettings(
        model_dir=str(teacher_dir(cfg, verbose=False)),
        dtype=inference_dtype_name(cfg),
        device=str(device_of(cfg)),
        batch_size=distill.batch_size,
        trust_remote_code=cfg.model.trust_remote_code,
    )


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
