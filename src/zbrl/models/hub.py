"""Hugging Face Hub ids (``ORG/NAME``) as model sources: downloaded with ``snapshot_download`` into
huggingface_hub's own cache when the hub answers; used from that cache when it does not.

Whether the hub answers is decided fast and never hangs: ``HF_HUB_OFFLINE`` (or
``TRANSFORMERS_OFFLINE``) set means offline; otherwise one TCP connection to the endpoint's host,
name lookup included, gets :data:`CONNECT_TIMEOUT_S` seconds.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

from zbrl.errors import RunError

CONNECT_TIMEOUT_S = 3.0
"""Seconds one connection attempt to the hub (name lookup included) may take."""

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
"""``ORG/NAME`` as the hub spells repository ids."""

DOWNLOAD_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.jinja",
    "*.model",
    "*.txt",
    "*.tiktoken",
    "*.py",
]
"""What a training run needs from a model repository: config, weights (safetensors), tokenizer
files, chat template and, for ``trust_remote_code``, the modelling code. ONNX, GGUF and duplicate
PyTorch-pickle weights are left on the hub."""

_fetched: dict[str, Path] = {}


def looks_like_hub_id(spec: str) -> bool:
    return HUB_ID.fullmatch(spec) is not None and not spec.endswith(".gguf")


def fetch_command(repo_id: str) -> str:
    return f"hf download {repo_id}"


def offline_reason() -> str | None:
    """Why the hub cannot be reached from here, or None when it answers."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}:
            return f"{name} is set"
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    return _connect_error(host, port, CONNECT_TIMEOUT_S)


def _connect_error(host: str, port: int, timeout_s: float) -> str | None:
    """None when ``host:port`` accepts a TCP connection within ``timeout_s`` (lookup included,
    run in a daemon thread because ``getaddrinfo`` has no timeout of its own), else the reason."""
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                outcome.append(None)
        except OSError as exc:
            outcome.append(f"{host}:{port}: {exc.strerror or exc}")

    thread = threading.Thread(target=attempt, daemon=True, name="zbrl-hub-probe")
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        return f"{host}:{port}: no answer within {timeout_s:g} s"
    return outcome[0]


def fetch_hub_model(repo_id: str, *, field: str) -> Path:
    """The local snapshot directory of ``repo_id``: downloaded (or brought up to date) when the hub
    answers, taken from the local cache when it does not; a RunError naming the id and how to
    fetch it beforehand when neither works. Fetched once per process."""
    if repo_id in _fetched:
        return _fetched[repo_id]
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    reason = offline_reason()
    try:
        path = Path(
            snapshot_download(
                repo_id, allow_patterns=DOWNLOAD_PATTERNS, local_files_only=reason is not None
            )
        )
    except LocalEntryNotFoundError:
        raise RunError(_offline_message(repo_id, field, reason)) from None
    except HfHubHTTPError as exc:
        first_line = str(exc).strip().splitlines()[0]
        raise RunError(
            f"{field}={repo_id!r}: the Hugging Face Hub refused the download ({first_line}); "
            "check the id, or for a gated model accept its licence on the hub and log in "
            "(`hf auth login`)"
        ) from None
    _fetched[repo_id] = path
    return path


def _offline_message(repo_id: str, field: str, reason: str | None) -> str:
    from huggingface_hub import constants

    why = f"the hub cannot be reached from here ({reason})" if reason else "the download failed"
    return (
        f"{field}={repo_id!r} is a Hugging Face Hub id, but {why} and the model is not in the "
        f"local hub cache ({constants.HF_HUB_CACHE}; no local directory of that name exists "
        f"either). Fetch it beforehand on a machine with network: `{fetch_command(repo_id)}` "
        "(then copy the hub cache here or point HF_HOME at it), or set "
        f"{field} to a local model directory"
    )
