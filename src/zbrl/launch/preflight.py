"""Pre-flight: every check a run's start makes before it creates anything (no run dir, no Ray,
no worker, no model loaded for training). Each failure is a RunError (or ConfigError) that names
the field and the fix, which the command line prints as one ``error: ...`` line.

The config's own checks (zbrl.config.checks) ran when the config was loaded; these need the
machine or the network: whether optional packages are installed (vLLM for
``rollout.backend.type=vllm``, wandb and TensorBoard for their sinks), whether the reward builds,
whether the dataset files exist and can be read, whether ``launch.ray_address`` answers, whether
the broadcast address exists here, whether this machine has the GPUs NCCL needs, and whether the
model, tokenizer and chat template can be had (a Hub id or GGUF file is fetched here).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

from zbrl.assembly.model_source import check_model_source
from zbrl.assembly.settings import weight_sync_backend
from zbrl.config import EMBEDDED, HELD_OUT, RunConfig
from zbrl.config.transport import BroadcastSync
from zbrl.errors import RunError
from zbrl.transport.weight_sync.broadcast import check_bindable

CONNECT_TIMEOUT_S = 5.0

OPTIONAL_SINKS = (
    ("wandb", "wandb", "wandb"),
    ("tensorboard", "tensorboard", "tensorboard"),
)
"""``(logging field, package to import, pyproject extra that installs it)`` of each optional
metrics sink."""


def preflight(cfg: RunConfig) -> None:
    """Run every pre-flight check, cheapest first; the first failure raises."""
    from zbrl.assembly.rewards import check_reward

    check_optional_packages(cfg)
    check_reward(cfg)  # a reward that cannot be built (ConfigError naming ``reward``)
    check_data_files(cfg)
    check_ray_address(cfg)
    check_broadcast_address(cfg)
    check_nccl_gpus(cfg)
    check_model_source(cfg)  # model, tokenizer, chat template (a Hub id/GGUF is fetched here)


def check_optional_packages(cfg: RunConfig) -> None:
    """Packages outside zbrl's dependencies that the config asks for are installed."""
    from zbrl.assembly.models import check_backend_installed

    check_backend_installed(cfg)  # vLLM for rollout.backend.type=vllm
    for field, package, extra in OPTIONAL_SINKS:
        if getattr(cfg.logging, field) and importlib.util.find_spec(package) is None:
            raise RunError(
                f"logging.{field}=true, but the {package!r} package is not installed in this "
                f"environment ({sys.executable}): install zbrl's {extra!r} extra "
                f"(pip install 'zbrl[{extra}]', or pip install -e '.[{extra}]' in a checkout), "
                f"or set logging.{field}=false"
            )


def check_data_files(cfg: RunConfig) -> None:
    """The dataset files the run reads (``data.train_path``, file-valued ``eval.sets``) exist
    and can be read, and ``data.source`` can give data. Every line is validated later, still
    before the run directory, when the prompts are encoded."""
    from zbrl.assembly.datasets import check_data_source

    if cfg.data.source is None and not cfg.data.trains_on_embedded:
        check_readable_file(cfg.data.train_path, "data.train_path")
    for name, value in cfg.eval.sets.items():
        if value not in (EMBEDDED, HELD_OUT):
            check_readable_file(value, f"eval.sets.{name}")
    check_data_source(cfg)


def check_readable_file(path: str, field: str) -> None:
    """A RunError naming ``field`` unless ``path`` is a file this process can read."""
    p = Path(path).expanduser()
    where = f"{field}={path!r}"
    if not p.exists():
        relative = "" if p.is_absolute() else f" (relative to {Path.cwd()})"
        raise RunError(
            f"{where} does not exist{relative}; give the path of a conversation JSONL or "
            "Parquet file (docs/datasets.md)"
        )
    if p.is_dir():
        raise RunError(
            f"{where} is a directory; give a conversation JSONL or Parquet file, or for a "
            "Hugging Face dataset directory set data.source={type: hf, path: DIR}"
        )
    try:
        with p.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise RunError(f"{where} cannot be read ({exc.strerror}); fix its permissions") from None


def check_eval_inputs(cfg: RunConfig, model_dir: Path, data: list[tuple[str, str]]) -> None:
    """Pre-flight of ``zbrl eval``: the model directory holds a model and a tokenizer, the
    backend's package is installed, the reward builds and every ``--data`` file can be read."""
    from zbrl.assembly.models import check_backend_installed
    from zbrl.assembly.rewards import check_reward
    from zbrl.models.sources import check_model_dir, check_tokenizer_dir

    if not model_dir.is_dir() or not (model_dir / "config.json").is_file():
        why = "no config.json" if model_dir.is_dir() else "it does not exist"
        raise RunError(
            f"--model {model_dir}: not a model directory ({why}); give a directory "
            "save_pretrained wrote, e.g. a checkpoint RUN_DIR/checkpoints/step-N"
        )
    check_model_dir(model_dir, field="--model", spec=str(model_dir))
    check_tokenizer_dir(model_dir, field="--model", spec=str(model_dir))
    check_backend_installed(cfg)
    check_reward(cfg)
    for name, path in data:
        if path != HELD_OUT:
            check_readable_file(path, f"--data {name}")


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of ``HOST:PORT`` or ``ray://HOST:PORT``; None for ``auto`` and the like."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray_address(cfg: RunConfig) -> None:
    field, address = "launch.ray_address", cfg.launch.ray_address
    if address is None and os.environ.get("RAY_ADDRESS"):
        field, address = "RAY_ADDRESS (environment)", os.environ["RAY_ADDRESS"]
    if not address or address == "auto":
        return
    target = split_address(address)
    if target is None:
        raise RunError(
            f"{field}={address!r} is not HOST:PORT; give the address `ray start --head` printed "
            "(for example 10.0.0.1:6379), or unset it for a local run"
        )
    try:
        with socket.create_connection(target, timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise RunError(
            f"{field}={address!r} does not answer ({exc}); start the cluster's head there "
            f"(`ray start --head --node-ip-address={target[0]} --port={target[1]}`, see "
            "docs/scaling.md) or fix the address; unset it for a local run"
        ) from None


def check_broadcast_address(cfg: RunConfig) -> None:
    sync = cfg.transport.weight_sync
    if not isinstance(sync, BroadcastSync) or sync.address is None:
        return
    try:
        infos = socket.getaddrinfo(sync.address, None, socket.AF_INET)
    except OSError as exc:
        raise RunError(
            f"transport.weight_sync.address={sync.address!r} does not resolve ({exc}); give "
            "the IP address of the consumers' node, or unset it to use the node's Ray address"
        ) from None
    if cfg.launch.ray_address is None:  # a local run: the address must be one of this machine's
        try:
            check_bindable(infos[0][4][0])
        except ValueError as exc:
            raise RunError(f"{exc} (a local run uses 127.0.0.1)") from None


def check_nccl_gpus(cfg: RunConfig) -> None:
    if weight_sync_backend(cfg) != "nccl" or cfg.launch.ray_address is not None:
        return  # on a cluster the placement groups ask for the GPUs and fail if there are none
    import torch

    if not torch.cuda.is_available():
        raise RunError(
            "transport.weight_sync.backend resolves to nccl but this machine has no CUDA GPU "
            "(torch.cuda.is_available() is False); set transport.weight_sync.backend=gloo and "
            "launch.*_num_gpus=0, or run on a GPU machine or cluster"
        )
