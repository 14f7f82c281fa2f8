"""``zbrl serve MODEL``: the endpoint of agent episodes (:mod:`zbrl.rollout.endpoint`) over a
checkpoint or any model directory, to talk to a trained model or evaluate it with outside tools
that speak the OpenAI API (docs/agents.md). Any API key is accepted; each request is a
conversation of its own and nothing is recorded. A request's ``temperature``, ``top_p``,
``max_tokens`` and ``stop`` apply (defaults: ``--temperature``, ``--max-tokens``)."""

from __future__ import annotations

import argparse
import threading
from dataclasses import dataclass
from pathlib import Path

from zbrl.config import RunConfig, load_config
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


def run_serve_command(args: argparse.Namespace) -> int:
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
