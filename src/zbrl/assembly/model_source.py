"""The run's model and tokenizer sources resolved to local directories and opened once, before
anything is created: they hold a model, a tokenizer and a chat template that renders (see
:mod:`zbrl.models.sources` for the forms ``model.path`` takes), and the tokenizer loaded.

Nothing here imports torch at import time: the driver loads the tokenizer without the model
classes (docs/performance.md, Start-up)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zbrl.config import EMBEDDED, RunConfig
from zbrl.errors import RunError


def user_model_dir(cfg: RunConfig, *, verbose: bool = True) -> Path:
    """The local directory of a non-embedded ``model.path`` (downloaded or converted if need be)."""
    from zbrl.models.sources import resolve

    return resolve(cfg.model.path, cfg.logging.cache_dir, field="model.path", verbose=verbose)


def user_tokenizer_dir(cfg: RunConfig, *, verbose: bool = True) -> Path | None:
    """The local directory of ``model.tokenizer_path``; None when it is unset (``model.path``'s
    directory holds the tokenizer)."""
    from zbrl.models.sources import resolve

    spec = cfg.model.tokenizer_path
    if spec is None:
        return None
    return resolve(spec, cfg.logging.cache_dir, field="model.tokenizer_path", verbose=verbose)


def load_tokenizer(cfg: RunConfig, tokenizer_dir: Path):
    """The tokenizer in ``tokenizer_dir`` with ``model.chat_template`` applied when set; a
    RunError when it is left without a chat template."""
    from transformers import AutoTokenizer

    from zbrl.models.chat_template import apply_chat_template_setting

    tokenizer = AutoTokenizer.from_pretrained(
        tokenizer_dir, trust_remote_code=cfg.model.trust_remote_code
    )
    return apply_chat_template_setting(
        tokenizer, cfg.model.chat_template, model=tokenizer_label(cfg)
    )


def tokenizer_label(cfg: RunConfig) -> str:
    """How error messages name the run's tokenizer."""
    if cfg.model.tokenizer_path is not None:
        return f"model.tokenizer_path={cfg.model.tokenizer_path!r}"
    return f"model.path={cfg.model.path!r}"


@dataclass(frozen=True)
class OpenedModel:
    """The run's model and tokenizer as the pre-flight opened them, for the build to use."""

    model_dir: Path | None
    """The local directory of a user's ``model.path``; None for the embedded model (built later,
    :mod:`zbrl.assembly.embedded`)."""
    tokenizer_dir: Path | None
    """The local directory of the tokenizer (``model.tokenizer_path``'s, else the model's);
    None for the embedded model's own."""
    tokenizer: Any
    """The tokenizer, loaded and its chat template checked to render; None for the embedded
    model's own, or when only the directories were resolved (loaded when a prompt is
    encoded)."""


def open_model_source(cfg: RunConfig, *, verbose: bool = True) -> OpenedModel:
    """Pre-flight, the first half of the build (before any run directory): the model and
    tokenizer are had here (:func:`resolve_model_source`), the tokenizer loads, and its chat
    template (or ``model.chat_template``) renders a prompt. Instant for the embedded default.
    Raises RunError; what it opened is kept for the build."""
    resolved = resolve_model_source(cfg, verbose=verbose)
    if resolved.tokenizer_dir is None:
        return resolved  # the embedded model, with its own template
    return replace(resolved, tokenizer=open_tokenizer(cfg, resolved.tokenizer_dir))


def resolve_model_source(cfg: RunConfig, *, verbose: bool = True) -> OpenedModel:
    """The model and tokenizer directories (a Hub id is downloaded, a GGUF file converted, both
    cached), checked to hold a model and tokenizer files, and ``model.chat_template``'s file
    read when it names one; the tokenizer is not loaded (None). All None for the embedded
    model."""
    from zbrl.models.chat_template import is_template_path, read_chat_template

    m = cfg.model
    if m.chat_template is not None and is_template_path(m.chat_template):
        read_chat_template(m.chat_template)  # the file exists
    if m.path == EMBEDDED and m.tokenizer_path is None:
        return OpenedModel(None, None, None)  # built locally, with its own template
    from zbrl.models.layer_types import check_model_layers
    from zbrl.models.quiet import quiet_transformers
    from zbrl.models.sources import check_model_dir, check_tokenizer_dir

    quiet_transformers()
    model_dir = None
    if m.path != EMBEDDED:
        model_dir = user_model_dir(cfg, verbose=verbose)
        check_model_dir(model_dir, field="model.path", spec=m.path)
        check_model_layers(
            model_dir,
            packing=cfg.training.packing,
            where=f"model.path={m.path!r}",
            trust_remote_code=m.trust_remote_code,
        )
    tokenizer_dir = user_tokenizer_dir(cfg, verbose=verbose) or model_dir
    assert tokenizer_dir is not None  # the embedded model without a tokenizer_path returned
    field = "model.tokenizer_path" if m.tokenizer_path is not None else "model.path"
    check_tokenizer_dir(tokenizer_dir, field=field, spec=m.tokenizer_path or m.path)
    return OpenedModel(model_dir, tokenizer_dir, None)


def open_tokenizer(cfg: RunConfig, tokenizer_dir: Path) -> Any:
    """The run's tokenizer from ``tokenizer_dir``, checked to load and to render a prompt: a
    RunError naming the field and the fix otherwise."""
    from zbrl.models.chat_template import check_renders

    try:
        tokenizer = load_tokenizer(cfg, tokenizer_dir)
    except (OSError, ValueError, KeyError) as exc:
        raise RunError(
            f"{tokenizer_label(cfg)}: no tokenizer loads from {tokenizer_dir} "
            f"({type(exc).__name__}: {exc}); set model.tokenizer_path to the model's tokenizer"
        ) from None
    check_renders(tokenizer, model=tokenizer_label(cfg))
    return tokenizer
