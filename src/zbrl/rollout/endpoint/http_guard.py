"""What the endpoint checks of a request before it reads its body: the server's API key and the
body's declared size.

A body larger than ``max_request_bytes`` is refused **413** (``request_too_large``) before a
byte of it is read: HTTP's status for a body the server will not take (RFC 9110, 15.5.14), which
clients and proxies know not to retry unchanged. It is not OpenAI's 400
``context_length_exceeded``: the server has not read the body, so it cannot say how many tokens
it holds (a body within the limit whose prompt is too long gets that 400 instead). A missing
``Content-Length`` is 411, a malformed or negative one 400; after any of these the connection is
closed (its unread body would be taken for the next request).
"""

from __future__ import annotations

import secrets
from typing import Any

from zbrl.rollout.endpoint.openai_api import RequestError


def check_key(expected: str | None, bearer: str | None) -> None:
    """Refuse (401) a request without the server's key, when it has one."""
    if expected is None:
        return
    if bearer is None or not secrets.compare_digest(bearer.encode(), expected.encode()):
        raise RequestError(
            "missing or wrong API key: send the server's key as Authorization: Bearer <key> "
            "(the key given to zbrl serve --api-key or ZBRL_API_KEY)",
            status=401,
            code="invalid_api_key",
        )


def content_length(headers: Any, max_bytes: int) -> int:
    """The body's size from its ``Content-Length`` header, within ``max_bytes``; a RequestError
    (411, 400 or 413, see the module docstring) otherwise."""
    raw = headers.get("Content-Length")
    if raw is None:
        if headers.get("Transfer-Encoding"):
            raise RequestError(
                "chunked request bodies are not supported; send a Content-Length",
                status=411,
                code="length_required",
            )
        return 0
    text = raw.strip()
    if not text.isdigit():  # int() would take "+5", " 5", "5_0" and "-1"
        raise RequestError(
            f"malformed Content-Length header: {raw[:40]!r} (a byte count is expected)",
            code="invalid_content_length",
        )
    length = int(text)
    if length > max_bytes:
        raise RequestError(
            f"the request body is {length} bytes, more than this server takes ({max_bytes} "
            "bytes; zbrl serve --max-request-bytes)",
            status=413,
            code="request_too_large",
        )
    return length
