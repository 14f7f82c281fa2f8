"""Who may use ``zbrl serve``: its API key (``--api-key``, or ``ZBRL_API_KEY``), and the refusal
to serve beyond loopback without one.

With a key, every request must carry it (``Authorization: Bearer <key>``; else 401). A host that
is not a loopback address exposes the model to whoever reaches the machine, so without a key
``zbrl serve`` refuses to start there (before it binds or loads anything) unless
``--allow-anyone`` says that is meant.
"""

from __future__ import annotations

import ipaddress
import os

from zbrl.errors import RunError

API_KEY_ENV = "ZBRL_API_KEY"
"""The environment variable ``zbrl serve`` takes its key from when ``--api-key`` is not given."""


def serve_api_key(given: str | None) -> str | None:
    """The key requests must carry: ``given`` (``--api-key``), else ``$ZBRL_API_KEY``; None:
    none (an empty value counts as none)."""
    key = given if given is not None else os.environ.get(API_KEY_ENV)
    return key or None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_access(host: str, api_key: str | None, allow_anyone: bool) -> str | None:
    """A RunError when serving on ``host`` without a key would let anyone in and that is not
    allowed; otherwise a warning line to print (None: nothing to say)."""
    if api_key is not None or is_loopback(host):
        return None
    if not allow_anyone:
        raise RunError(
            f"zbrl serve --host {host} is not loopback and has no API key: anyone who reaches "
            f"this machine could use the model. Give one with --api-key KEY (or {API_KEY_ENV}), "
            "or pass --allow-anyone if that is meant"
        )
    return (
        f"serving on {host} without an API key (--allow-anyone): anyone who reaches it may use it"
    )
