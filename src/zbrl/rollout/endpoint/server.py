"""The endpoint's HTTP server: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``
and ``/v1/models`` over the Python standard library's threading HTTP server (one thread per
connection; ``stream: true`` answered as events synthesized from the finished answer,
:mod:`zbrl.rollout.endpoint.streaming`), on loopback unless configured otherwise.

Which episode a request belongs to is its API key (``Authorization: Bearer <key>``, or the
``X-Zbrl-Episode`` header, which wins): the episode runner opens an episode with
:meth:`Endpoint.open_episode` and hands its key to the agent (every OpenAI client sends its key
with every request). A request with an unknown key is refused (401).
An endpoint made with ``serve_params`` (``zbrl serve``) instead answers any key, each request a
conversation of its own, and records nothing.

During a run the sampling is the run's (temperature, top-p, top-k: the behaviour policy the
trainer corrects for); a request's ``temperature`` and ``top_p`` are ignored, its ``max_tokens``
and ``stop`` are honoured within the episode's token budget. Under ``zbrl serve`` a request's
own values apply.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from zbrl.config.environments import AgentEndpoint
from zbrl.errors import RunError
from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.endpoint import http_guard, limits, responses, streaming, validation
from zbrl.rollout.endpoint import openai_api as api
from zbrl.rollout.endpoint.calls import CallQueue
from zbrl.rollout.endpoint.conversation import ConversationTokens, Renderer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndpointSettings:
    """Where the endpoint listens and how it batches."""

    host: str
    port: int
    """0: a free port."""
    batch_window_s: float
    """Longest wait, after a batch's first call, for the other episodes' calls."""
    max_batch: int
    """Calls per backend batch at most (the concurrency bound)."""
    request_timeout_s: float
    """Longest a request waits for its completion before it is answered 504."""
    context_len: int | None = None
    """The model's context (prompt + completion tokens); a request past it is refused 400
    ``context_length_exceeded`` before the model runs (:mod:`.limits`). None: unchecked."""
    max_request_bytes: int = AgentEndpoint.model_fields["max_request_bytes"].default
    """A body larger than this is refused 413 before it is read (:mod:`.http_guard`)."""
    api_key: str | None = None
    """``zbrl serve --api-key``: every request must carry it (else 401). None: any key is
    accepted (a run's endpoint checks episode keys instead)."""


@dataclass(frozen=True)
class EpisodeBudget:
    """An episode's limits (completion calls, tokens after its prompts) and what a request
    that changes its history does."""

    max_calls: int
    max_total_tokens: int
    on_history_change: str = "refuse"
    """``segment``: it starts a new segment of the episode; ``refuse``: 409 ``prefix_mismatch``."""


@dataclass
class _Open:
    tokens: ConversationTokens
    budget: EpisodeBudget


class Endpoint:
    """Serves the policy over HTTP and records every call's tokens per episode."""

    def __init__(
        self,
        renderer: Renderer,
        settings: EndpointSettings,
        model_name: str,
        serve_params: SamplingParams | None = None,
    ) -> None:
        self.renderer = renderer
        self.settings = settings
        self.model_name = model_name
        self.serve_params = serve_params
        self.episode_params: SamplingParams | None = None
        """The run's sampling for the episodes now open (set by whoever opens them)."""
        self.queue = CallQueue(settings.batch_window_s, settings.max_batch)
        self._episodes: dict[str, _Open] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._longest_token = limits.longest_token_chars(renderer.tokenizer)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> str:
        """Listen (in a daemon thread); the base URL (``http://host:port/v1``)."""
        if self._server is None:
            address = (self.settings.host, self.settings.port)
            try:
                self._server = _Server(address, _handler(self))
            except OSError as e:
                raise RunError(
                    f"the endpoint cannot listen on {address[0]}:{address[1]} ({e.strerror}); "
                    "choose another port (environment.endpoint.port, `zbrl serve --port`; 0 picks "
                    "a free one) or host"
                ) from None
            self._server.daemon_threads = True
            threading.Thread(
                target=self._server.serve_forever, name="zbrl-endpoint", daemon=True
            ).start()
        return self.base_url

    @property
    def base_url(self) -> str:
        assert self._server is not None, "the endpoint is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- episodes --------------------------------------------------------------------------------

    def open_episode(self, budget: EpisodeBudget) -> str:
        """A new episode; its API key."""
        key = "zbrl-ep-" + secrets.token_hex(12)
        with self._lock:
            tokens = ConversationTokens(
                self.renderer, segment_on_change=budget.on_history_change == "segment"
            )
            self._episodes[key] = _Open(tokens, budget)
        return key

    def idle_s(self, key: str) -> float:
        """Seconds since the episode of ``key`` last made a request or got an answer (0 while a
        request of it is being answered: the wait is the endpoint's, not the agent's)."""
        with self._lock:
            tokens = self._episodes[key].tokens
        if tokens.lock.locked():
            return 0.0
        return time.monotonic() - tokens.active_at

    def close_episode(self, key: str) -> ConversationTokens:
        """Forget the episode of ``key`` (its later requests are refused); its tokens."""
        with self._lock:
            return self._episodes.pop(key).tokens

    # -- requests --------------------------------------------------------------------------------

    def handle(self, path: str, key: str | None, body: Any) -> dict[str, Any]:
        """The JSON answer to a POST of ``body`` to ``path``; a RequestError otherwise."""
        chat = path.endswith("/chat/completions")
        asked = responses.read_responses_request(body) if path.endswith("/responses") else None
        if not chat and asked is None and not path.endswith("/completions"):
            raise api.RequestError(f"no such endpoint: {path}", status=404, code="not_found")
        if asked is None:
            validation.check_body(body, chat=chat)
        request = api.read_request(body, chat=chat) if asked is None else None
        episode = self._episode(key)
        tokens = episode.tokens if episode else ConversationTokens(self.renderer)
        if not tokens.lock.acquire(blocking=False):
            raise api.RequestError(
                "another request of this episode is still running; send one at a time",
                status=409,
                code="concurrent_request",
            )
        tokens.active_at = time.monotonic()
        try:
            if asked is not None:
                return self._respond(asked, tokens, episode)
            assert request is not None
            return self._complete(request, tokens, episode, chat)
        finally:
            tokens.active_at = time.monotonic()
            tokens.lock.release()

    def abandoned(self, key: str | None, path: str, error: OSError) -> None:
        """A client closed its connection before its answer was written (an agent that gave up
        on a request, or was stopped): counted on its episode (``env/abandoned_requests``) and
        logged in one line. What the call generated stays in the episode."""
        with self._lock:
            episode = self._episodes.get(key or "")
        if episode is not None:
            with episode.tokens.lock:
                episode.tokens.count("abandoned_requests")
        logger.warning(
            "endpoint: the client of a %s request closed its connection before the answer "
            "(%s%s); counted in env/abandoned_requests",
            path,
            type(error).__name__,
            "" if episode is not None else ", no open episode",
        )

    def _episode(self, key: str | None) -> _Open | None:
        with self._lock:
            episode = self._episodes.get(key or "")
        if episode is None and self.serve_params is None:
            raise api.RequestError(
                "unknown API key: every request must carry the key of an open episode "
                f"(Authorization: Bearer <key>, or the {api.EPISODE_HEADER} header, which a "
                "verifiers harness sends: zbrl.rollout.agents.verifiers_harness.episode_headers)",
                status=401,
                code="invalid_api_key",
            )
        return episode

    def _complete(
        self, request: api.Request, tokens: ConversationTokens, episode: _Open | None, chat: bool
    ) -> dict[str, Any]:
        if episode is not None and tokens.ended:
            return self._ended(chat)
        if episode is not None and tokens.calls_made() >= episode.budget.max_calls:
            return self._end(tokens, "turn_limit", chat)
        before = len(tokens.ids)
        if not before:  # a conversation's first request: refuse a huge one before rendering it
            limits.check_size_bound(request, self.settings.context_len, self._longest_token)
        mark = tokens.mark()
        if chat:
            assert request.messages is not None
            context = tokens.chat_context(request.messages, request.tools)
        else:
            assert request.prompt is not None
            context = tokens.text_context(request.prompt)
        if episode is not None and tokens.tokens_used() >= episode.budget.max_total_tokens:
            tokens.cut(before)  # the message that leaves no room is not part of the episode
            return self._end(tokens, "token_limit", chat)
        try:
            limits.check_context(len(context), request.max_tokens, self.settings.context_len)
        except api.RequestError:
            tokens.rollback(mark)  # refused: the episode is as it was before the request
            raise
        params = self._params(request, tokens, episode)
        room = limits.room(len(context), self.settings.context_len)
        if room is not None:
            params = replace(params, max_new_tokens=min(params.max_new_tokens, room))
        generated = self.queue.submit(context, params).result(
            timeout=self.settings.request_timeout_s
        )
        c = generated.completion
        n_prompt, n_completion = len(context), int(c.token_ids.numel())
        if chat:
            answer = api.assistant_message(c.text, parse_tools=bool(request.tools))
            tokens.record(generated, answer)
            return api.chat_response(
                self.model_name, answer, c.finish_reason, n_prompt, n_completion
            )
        tokens.record(generated, None)
        return api.text_response(self.model_name, c.text, c.finish_reason, n_prompt, n_completion)

    def _respond(
        self, asked: responses.ResponsesRequest, tokens: ConversationTokens, episode: _Open | None
    ) -> dict[str, Any]:
        """A ``/v1/responses`` request, completed on the chat path."""
        history = responses.history_of(tokens.responses, asked.previous_response_id)
        conversation = history + asked.items
        body = asked.chat_body(history)
        validation.check_body(body, chat=True)
        request = api.read_request(body, chat=True)
        chat = self._complete(request, tokens, episode, True)
        response = responses.response_object(chat, asked)
        tokens.responses[response["id"]] = [*conversation, responses.answered_message(chat)]
        return response

    def _end(self, tokens: ConversationTokens, limit: str, chat: bool) -> dict[str, Any]:
        """An episode past a limit ends, truncated, as a built-in episode does (counted in
        ``env/<limit>``); this and every later call get an empty ``length`` answer."""
        tokens.count(limit)
        tokens.ended = True
        return self._ended(chat)

    def _ended(self, chat: bool) -> dict[str, Any]:
        if chat:
            empty = {"role": "assistant", "content": ""}
            return api.chat_response(self.model_name, empty, "length", 0, 0)
        return api.text_response(self.model_name, "", "length", 0, 0)

    def _params(
        self, request: api.Request, tokens: ConversationTokens, episode: _Open | None
    ) -> SamplingParams:
        if episode is None:
            assert self.serve_params is not None
            base = replace(
                self.serve_params,
                temperature=(
                    self.serve_params.temperature
                    if request.temperature is None
                    else float(request.temperature)  # a number: validation.check_body
                ),
                top_p=self.serve_params.top_p if request.top_p is None else float(request.top_p),
            )
            room = base.max_new_tokens
        else:
            assert self.episode_params is not None, "episodes opened without sampling params"
            base = self.episode_params
            room = episode.budget.max_total_tokens - tokens.tokens_used()
        limit = min(base.max_new_tokens, room, request.max_tokens or room)
        stops = tuple(dict.fromkeys(base.stop_strings + request.stop))
        return replace(base, n=1, max_new_tokens=limit, stop_strings=stops)


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024
    """Connections waiting to be accepted (the standard library's 5 refuses a burst of agents)."""


def _handler(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            try:
                http_guard.check_key(endpoint.settings.api_key, _bearer(self.headers))
            except api.RequestError as e:
                self._send(None, e.status, api.error_body(str(e), e.code))
                return
            if self.path.rstrip("/").endswith("/models"):
                self._send(None, 200, api.models_response(endpoint.model_name))
            else:
                body = api.error_body(f"no such endpoint: {self.path}", "not_found")
                self._send(None, 404, body)

        def do_POST(self) -> None:
            try:
                self._post()
            except Exception:  # zbrl's own fault: answered 500 once, logged once
                logger.exception("endpoint: %s failed", self.path)
                self.close_connection = True
                self._send(None, 500, api.error_body("internal error (logged)", "server_error"))

        def _post(self) -> None:
            bearer = _bearer(self.headers)
            key = self.headers.get(api.EPISODE_HEADER) or bearer
            try:
                http_guard.check_key(endpoint.settings.api_key, bearer)
                length = http_guard.content_length(
                    self.headers, endpoint.settings.max_request_bytes
                )
            except api.RequestError as e:  # the body is not read: the connection cannot go on
                self.close_connection = True
                self._send(key, e.status, api.error_body(str(e), e.code))
                return
            raw = self.rfile.read(length)
            body = None
            try:
                body = json.loads(raw or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                status, payload = 400, api.error_body(f"the body is not JSON: {e}", "invalid_json")
            else:
                status, payload = self._answer(key, body)
            stream, include_usage = streaming.stream_options(body)
            if status == 200 and stream:
                events = streaming.event_stream(payload, include_usage)
                self._write(key, status, "text/event-stream", events)
            else:
                self._send(key, status, payload)

        def _answer(self, key: str | None, body: Any) -> tuple[int, dict[str, Any]]:
            try:
                return 200, endpoint.handle(self.path, key, body)
            except api.RequestError as e:
                return e.status, api.error_body(str(e), e.code)
            except TimeoutError:
                return 504, api.error_body("the completion timed out", "timeout")
            except Exception as e:  # zbrl's own fault (a failing backend): 500, logged once
                logger.exception("endpoint: %s failed", self.path)
                return 500, api.error_body(f"{type(e).__name__}: {e}", "server_error")

        def _send(self, key: str | None, status: int, payload: dict[str, Any]) -> None:
            self._write(key, status, "application/json", json.dumps(payload).encode())

        def _write(self, key: str | None, status: int, content_type: str, data: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
            except ConnectionError as e:  # the client left before its answer (an agent gave up)
                self.close_connection = True
                endpoint.abandoned(key, self.path, e)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("endpoint: " + format, *args)

    return Handler


def _bearer(headers: Any) -> str | None:
    auth = headers.get("Authorization") or ""
    return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
