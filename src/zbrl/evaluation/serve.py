"""``zbrl serve MODEL``: the endpoint of agent episodes (:mod:`zbrl.rollout.endpoint`) over a
checkpoint or any model directory, to talk to a trained model or evaluate it with outside tools
that speak the OpenAI API (docs/agents.md). With ``--api-key`` (or ``ZBRL_API_KEY``) requests
must carry that key, else any key is accepted (and a host beyond loopback is refused:
:mod:`zbrl.evaluation.serve_access`); each request is a conversation of its own and nothing is
recorded. A request's ``temperature``, ``top_p``, ``max_tokens`` and ``stop`` apply (defaults:
``--temperature``, ``--max-tokens``); a prompt that does not fit the model's context is refused
(400 ``context_length_exceeded``)."""

from __future__ import annotations

import argparse
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from zbrl.config import RunConfig, load_config
from zbrl.config.environments import EpisodeLimits
from zbrl.rollout.backends.base import one_sample
from zbrl.rollout.endpoint.calls import serve_calls
from zbrl.rollout.endpoint.conversation import Renderer
from zbrl.rollout.endpoint.server import Endpoint, EndpointSettings


@dataclass
class Serving:
    """A running ``zbrl serve``: its endpoint and the thread that answers its calls."""

    endpoint: Endpoint
    stop_event: threading.Event
    thread: threading.Thread

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join()
        self.endpoint.stop()


def start_serving(
    cfg: RunConfig,
    model_dir: Path,
    settings: EndpointSettings,
    *,
    temperature: float,
    max_tokens: int,
) -> Serving:
    """Load ``model_dir`` with ``cfg``'s backend and serve it (in background threads)."""
    from zbrl.assembly.models import build_backend

    backend = build_backend(cfg, model_dir, model_dir)
    if settings.context_len is None:
        settings = replace(settings, context_len=context_len_of(cfg, backend))
    eos_ids = set(getattr(backend, "eos_ids", None) or {backend.tokenizer.eos_token_id})
    params = one_sample(temperature, max_tokens)
    endpoint = Endpoint(
        Renderer(backend.tokenizer, eos_ids), settings, model_dir.name, serve_params=params
    )
    endpoint.start()
    stop = threading.Event()
    thread = threading.Thread(
        target=serve_calls,
        args=(endpoint.queue, backend.generate, 0, stop),
        name="zbrl-serve",
        daemon=True,
    )
    thread.start()
    return Serving(endpoint, stop, thread)


def context_len_of(cfg: RunConfig, backend) -> int:
    """The context a request must fit: the backend's (``max_model_len`` or the model config's
    positions), else the recipe's ``environment.limits.max_total_tokens``."""
    if backend.context_len is not None:
        return backend.context_len
    limits = cfg.environment.limits if cfg.environment is not None else EpisodeLimits()
    return limits.max_total_tokens


def run_serve_command(args: argparse.Namespace) -> int:
    from zbrl.evaluation.serve_access import check_access, serve_api_key

    api_key = serve_api_key(args.api_key)
    warning = check_access(args.host, api_key, args.allow_anyone)  # before anything is bound
    if warning is not None:
        print(f"[zbrl] warning: {warning}", file=sys.stderr, flush=True)
    from zbrl.models.quiet import quiet_transformers

    quiet_transformers()
    from zbrl.assembly.input_checks import eval_model_dir

    cfg = load_config(args.recipe, [])
    model_dir = eval_model_dir(cfg, args.model, field="model")  # any form model.path takes
    serving = start_serving(
        cfg,
        model_dir,
        EndpointSettings(
            host=args.host,
            port=args.port,
            batch_window_s=args.batch_window,
            max_batch=args.max_batch,
            request_timeout_s=600.0,
            max_request_bytes=args.max_request_bytes,
            api_key=api_key,
        ),
        temperature=args.temperature,
        max_tokens=args.max_tokens or cfg.rollout.generation.max_new_tokens,
    )
    print(f"[zbrl] serving {args.model} at {serving.endpoint.base_url} (Ctrl-C stops)", flush=True)
    try:
        serving.thread.join()
    except KeyboardInterrupt:
        serving.stop()
    return 0
