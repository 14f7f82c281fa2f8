"""The chat template a run renders prompts with: the tokenizer's own, or ``model.chat_template``.

``model.chat_template`` is either the Jinja text itself (it holds ``{{`` or ``{%``) or the path of
a template file (anything else, whatever its suffix). A path that names no file, and a tokenizer
left without any template, are refused with the fix before anything starts.
"""

from __future__ import annotations

from pathlib import Path

from zbrl.errors import RunError

FIELD = "model.chat_template"
PROBE = [{"role": "user", "content": "What is 2+2?"}]
"""The conversation a template is test-rendered with before a run."""


def is_template_path(value: str) -> bool:
    """Whether a ``model.chat_template`` value is a file's path: Jinja text always holds a
    ``{{`` expression or a ``{%`` statement, a path neither."""
    return "{{" not in value and "{%" not in value


def read_chat_template(value: str) -> str:
    """The template text of a ``model.chat_template`` value (reading the file it names)."""
    if not is_template_path(value):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "no such file"
        raise RunError(
            f"{FIELD}={value!r}: {what}, and it is not template text (no {{{{ or {{%); give "
            "the path of a Jinja template file (e.g. chat_template.jinja) or the template text"
        )
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"{FIELD}={value!r}: cannot be read as a text file ({exc})") from None


def apply_chat_template_setting(tokenizer, override: str | None, *, model: str):
    """Set ``override`` (if any) on ``tokenizer``; a RunError naming ``model`` when the tokenizer
    then has no chat template at all. Returns the tokenizer."""
    if override is not None:
        tokenizer.chat_template = read_chat_template(override)
    if not getattr(tokenizer, "chat_template", None):
        raise RunError(
            f"the tokenizer of {model} has no chat template, so prompts cannot be rendered; set "
            f"{FIELD} to a Jinja chat template (the text, or the path of a .jinja file; see "
            "docs/models.md)"
        )
    return tokenizer


def check_renders(tokenizer, *, model: str) -> str:
    """Render :data:`PROBE` with the generation prompt; a RunError with the template's own error
    when that fails (a syntax error, an unknown filter, a role it rejects)."""
    try:
        return tokenizer.apply_chat_template(PROBE, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # Jinja raises many types; each is a user template error here
        raise RunError(
            f"the chat template of {model} fails on a one-message conversation "
            f"({type(exc).__name__}: {exc}); fix {FIELD} or the tokenizer's template"
        ) from None
