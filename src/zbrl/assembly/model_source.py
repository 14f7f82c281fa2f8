"""The run's model and tokenizer sources resolved to local directories, the pre-flight check
that they hold a model, a tokenizer and a chat template that renders (see
:mod:`zbrl.models.sources` for the forms ``model.path`` takes), and the tokenizer loaded.

Nothing here imports torch at import time: the driver loads the tokenizer without the model
classes (docs/performance.md, Start-up)."""

from __future__ import annotations

from pathlib import Path

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


def check_model_source(cfg: RunConfig) -> None:
    """Pre-flight (before any run directory): the model and tokenizer can be had here (a
    Hub id is downloaded, a GGUF file converted, both cached), the model directory holds a model,
    the tokenizer loads, and its chat template (or ``model.chat_template``) renders a prompt.
    Instant for the embedded default. Raises RunError."""
    from zbrl.models.chat_template import is_template_path, read_chat_template

    m = cfg.model
    if m.chat_template is not None and is_template_path(m.chat_template):
        read_chat_template(m.chat_template)  # the file exists
    if m.path == EMBEDDED and m.tokenizer_path is None:
        return  # built locally, with its own template
    from zbrl.models.sources import check_model_dir, check_tokenizer_dir

    model_dir = None
    if m.path != EMBEDDED:
        model_dir = user_model_dir(cfg)
        check_model_dir(model_dir, field="model.path", spec=m.path)
    tokenizer_dir = user_tokenizer_dir(cfg) or model_dir
    field = "model.tokenizer_path" if m.tokenizer_path is not None else "model.path"
    check_tokenizer_dir(tokenizer_dir, field=field, spec=m.tokenizer_path or m.path)
    check_tokenizer(cfg, tokenizer_dir)


def check_tokenizer(cfg: RunConfig, tokenizer_dir: Path) -> None:
    from zbrl.models.chat_template import check_renders

    try:
        tokenizer = load_tokenizer(cfg, tokenizer_dir)
    except (OSError, ValueError, KeyError) as exc:
        raise RunError(
            f"{tokenizer_label(cfg)}: no tokenizer loads from {tokenizer_dir} "
            f"({type(exc).__name__}: {exc}); set model.tokenizer_path to the model's tokenizer"
        ) from None
    check_renders(tokenizer, model=tokenizer_label(cfg))
