"""The distillation teacher of a run (``algorithm.distill``): its directory (the embedded teacher
built and cached, or a model directory / Hub id resolved) and the check that it shares the
student's tokenizer (before the run directory is claimed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zbrl.config import RunConfig
from zbrl.errors import RunError

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
        ours_only = len(vocab.keys() - other.keys())
        theirs_only = len(other.keys() - vocab.keys())
        moved = sum(1 for k, v in vocab.items() if k in other and other[k] != v)
        return (
            f"the vocabularies differ ({ours_only} tokens only the student has, {theirs_only} "
            f"only the teacher has, {moved} with other ids)"
        )
    if ours.eos_token_id != theirs.eos_token_id:
        return f"eos id {theirs.eos_token_id} against the student's {ours.eos_token_id}"
    return None
