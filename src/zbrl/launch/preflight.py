"""Pre-flight: every check a run's start makes before it creates anything (no run dir, no Ray,
no worker, no model loaded for training), and the first half of its build: what it opens (the
dataset files, the model and tokenizer) it returns for the build to use. Each failure is a
RunError (or ConfigError) that names the field and the fix, which the command line prints as one
``error: ...`` line.

The config's own checks (zbrl.config.checks) ran when the config was loaded; these need the
machine or the network: whether optional packages are installed (vLLM for
``rollout.backend.type=vllm``, wandb and TensorBoard for their sinks), whether the reward and
the environment build, whether the dataset files exist and can be read, whether
``launch.ray_address`` answers, whether a local run's workers fit this machine (its GPUs, or
the CPUs and GPUs of a Ray this process already runs), whether the broadcast address exists
here, whether this machine has the GPUs NCCL needs, and whether the model, tokenizer and chat
template can be had (a Hub id or GGUF file is fetched here). What needs the built model (the
embedded one is built after these) is checked by :func:`zbrl.launch.inputs.prepare_inputs`,
still before the run directory: the chat template against the environment, the LoRA targets
against the model.
"""

from __future__ import annotations

import importlib.util
import math
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from zbrl.assembly.artifacts import RunSources
from zbrl.assembly.datasets import open_dataset_refs
from zbrl.assembly.input_checks import check_backend_installed
from zbrl.assembly.model_source import open_model_source
from zbrl.config import RunConfig
from zbrl.config.plugin import is_import_path
from zbrl.config.transport import BroadcastSync
from zbrl.errors import RunError

CONNECT_TIMEOUT_S = 5.0

OPTIONAL_SINKS = (
    ("wandb", "wandb", "wandb"),
    ("tensorboard", "tensorboard", "tensorboard"),
)
"""``(logging field, package to import, pyproject extra that installs it)`` of each optional
metrics sink."""

OPTIONAL_SOURCES = {
    "hf": ("datasets", "datasets"),
    "reasoning_gym": ("reasoning_gym", "reasoning-gym"),
}
"""``data.source.type`` (and ``reward.type``) -> (package to import, pyproject extra)."""


def preflight(cfg: RunConfig) -> RunSources:
    """Run every pre-flight check, cheapest first; the first failure raises. This is the first
    half of the run's build: the dataset files, the model and the tokenizer are opened here and
    returned, and the build (:func:`zbrl.assembly.artifacts.prepare_artifacts`) uses them
    instead of opening them again. For the embedded default these import neither torch nor Ray:
    the driver starts Ray right after them (docs/performance.md, Start-up)."""
    from zbrl.assembly.environments import check_environment
    from zbrl.assembly.rewards import check_reward

    check_optional_packages(cfg)
    check_reward(cfg)  # a reward that cannot be built (ConfigError naming ``reward``)
    check_environment(cfg)  # an environment or tool that does not import or build
    check_algorithm_imports(cfg)
    planned = check_memory_plan(cfg)  # False: the model's shape needs the model fetched first
    datasets = open_dataset_refs(cfg)  # the files exist and can be read; data.source gives data
    check_ray_address(cfg)
    check_local_resources(cfg)  # a local run's workers fit this machine's GPUs (and its Ray)
    check_broadcast_address(cfg)
    check_nccl_gpus(cfg)
    model = open_model_source(cfg)  # model, tokenizer, chat template (a Hub id/GGUF is fetched)
    if not planned:
        check_memory_plan(cfg, model.model_dir)
    return RunSources(model, datasets)


def check_optional_packages(cfg: RunConfig) -> None:
    """Packages outside zbrl's dependencies that the config asks for are installed."""
    check_backend_installed(cfg)  # vLLM for rollout.backend.type=vllm
    for field, package, extra in OPTIONAL_SINKS:
        if getattr(cfg.logging, field) and importlib.util.find_spec(package) is None:
            raise RunError(
                f"logging.{field}=true, but the {package!r} package is not installed in this "
                f"environment ({sys.executable}): install zbrl's {extra!r} extra "
                f"(pip install 'zbrl[{extra}]', or pip install -e '.[{extra}]' in a checkout), "
                f"or set logging.{field}=false"
            )
    needs = {
        "data.source.type": cfg.data.source.type if cfg.data.source is not None else None,
        "reward.type": cfg.reward.type,
    }
    for field, kind in needs.items():
        if kind in OPTIONAL_SOURCES and importlib.util.find_spec(OPTIONAL_SOURCES[kind][0]) is None:
            package, extra = OPTIONAL_SOURCES[kind]
            raise RunError(
                f"{field}={kind}, but the {package!r} package is not installed in this "
                f"environment ({sys.executable}): install zbrl's {extra!r} extra "
                f"(pip install 'zbrl[{extra}]', or pip install -e '.[{extra}]' in a checkout)"
            )


def check_algorithm_imports(cfg: RunConfig) -> None:
    """A user advantage estimator or policy loss given as ``package.module:function`` imports
    (the config checks only its form; without this it would fail at the first training step)."""
    for field, name in (
        ("algorithm.advantage.type", cfg.algorithm.advantage.type),
        ("algorithm.policy_loss.type", cfg.algorithm.policy_loss.type),
    ):
        if not is_import_path(name):
            continue
        from zbrl.algorithms.advantages import ADVANTAGE_ESTIMATORS
        from zbrl.algorithms.policy_loss import POLICY_LOSSES

        registry = POLICY_LOSSES if field.endswith("policy_loss.type") else ADVANTAGE_ESTIMATORS
        try:
            registry.get(name)
        except (ImportError, ValueError) as exc:
            raise RunError(f"{field}={name!r}: {exc}; fix the path or the module") from exc


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


@dataclass(frozen=True)
class WorkerAsk:
    """One kind of worker's reservation: ``count`` bundles of ``cpus`` and ``gpus`` each, and
    the config fields that set them (for the error message)."""

    fields: str
    """How the message names it, e.g. ``launch.num_producers=2 x launch.producer_num_gpus=1``
    (filled with the resource in question)."""
    count: int
    cpus: float
    gpus: float


def worker_asks(cfg: RunConfig) -> list[WorkerAsk]:
    """What the run's placement groups reserve (:func:`zbrl.launch.placement.reserve`):
    producers, consumers and reward workers (those that reserve anything)."""
    from zbrl.launch.placement import reward_worker_count, reward_worker_resources

    la = cfg.launch
    asks = [
        WorkerAsk(
            f"launch.num_producers={la.num_producers} x launch.producer_num_{{}}",
            la.num_producers,
            la.producer_num_cpus,
            la.producer_num_gpus,
        ),
        WorkerAsk(
            f"launch.num_consumers={la.num_consumers} x launch.consumer_num_{{}}",
            la.num_consumers,
            la.consumer_num_cpus,
            la.consumer_num_gpus,
        ),
    ]
    workers = reward_worker_count(cfg)
    if workers:
        cpus, gpus = reward_worker_resources(cfg)
        if cpus > 0 or gpus > 0:
            asks.append(
                WorkerAsk(f"reward.workers={workers} x reward.worker_num_{{}}", workers, cpus, gpus)
            )
    return asks


def gpus_needed(asks: list[WorkerAsk]) -> int:
    """The fewest GPUs that can hold every bundle: at least their sum, and a bundle of more than
    half a GPU shares its device with no other such bundle (Ray places a fractional GPU on one
    device). A lower bound, so that a machine it refuses is one no placement fits."""
    total = sum(a.count * a.gpus for a in asks)
    own_devices = sum(a.count * math.ceil(a.gpus) for a in asks if a.gpus > 0.5)
    return max(own_devices, math.ceil(total - 1e-9))


def check_local_resources(cfg: RunConfig) -> None:
    """A local run whose workers ask for more GPUs than this machine has (or, when this process
    already runs Ray, say a test session's, more CPUs or GPUs than that Ray has) is refused here,
    naming the fields; otherwise its placement would wait ``launch.placement_timeout_s`` and fail
    once the run has started. The local Ray a run starts is given the CPUs its workers reserve,
    so CPUs are not judged then; a cluster's resources are known only once Ray connects, where
    :func:`zbrl.launch.placement.reserve` checks them."""
    if cfg.launch.ray_address or os.environ.get("RAY_ADDRESS"):
        return
    asks = worker_asks(cfg)
    ray = sys.modules.get("ray")  # imported here only when this process runs Ray already
    if ray is not None and ray.is_initialized():
        have = ray.cluster_resources()
        check_fits(asks, "cpus", have.get("CPU", 0.0), "the Ray this process runs has")
        check_fits(asks, "gpus", have.get("GPU", 0.0), "the Ray this process runs has")
    elif any(a.gpus > 0 for a in asks):
        check_fits(asks, "gpus", float(local_gpu_count()), "this machine has")


def check_fits(asks: list[WorkerAsk], resource: str, have: float, where: str) -> None:
    """A RunError naming the fields when ``asks`` need more ``resource`` (``cpus`` or ``gpus``)
    than ``have``; ``where`` says whose resources they are."""
    needed = sum(a.count * a.cpus for a in asks) if resource == "cpus" else gpus_needed(asks)
    if needed <= have + 1e-9:
        return
    unit = resource[:-1].upper()
    asked = ", ".join(
        a.fields.format(f"{resource}={getattr(a, resource):g}")
        for a in asks
        if getattr(a, resource) > 0
    )
    raise RunError(
        f"the workers need {needed:g} {unit}{'' if needed == 1 else 's'} ({asked}) but {where} "
        f"{have:g}; "
        "lower those fields (launch.*_num_gpus=0 runs a worker on CPU) or the worker counts, or "
        "run on a cluster that has them (launch.ray_address, docs/scaling.md)"
    )


def local_gpu_count() -> int:
    """The CUDA GPUs this process sees (those a local Ray detects: CUDA_VISIBLE_DEVICES
    applies)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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
        from zbrl.transport.weight_sync.broadcast import check_bindable

        try:
            check_bindable(infos[0][4][0])
        except ValueError as exc:
            raise RunError(f"{exc} (a local run uses 127.0.0.1)") from None


def check_nccl_gpus(cfg: RunConfig) -> None:
    if not isinstance(cfg.transport.weight_sync, BroadcastSync):
        return  # the object store (and the CUDA handoff) need no collective backend
    from zbrl.assembly.shared_settings import weight_sync_backend

    if weight_sync_backend(cfg) != "nccl" or cfg.launch.ray_address is not None:
        return  # on a cluster the placement groups ask for the GPUs and fail if there are none
    import torch

    if not torch.cuda.is_available():
        raise RunError(
            "transport.weight_sync.backend resolves to nccl but this machine has no CUDA GPU "
            "(torch.cuda.is_available() is False); set transport.weight_sync.backend=gloo and "
            "launch.*_num_gpus=0, or run on a GPU machine or cluster"
        )


def visible_gpu_memory() -> int | None:
    """Bytes of memory of this machine's first visible CUDA GPU; None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def check_memory_plan(cfg: RunConfig, model_dir: Path | None = None) -> bool:
    """A GPU run (:func:`zbrl.planning.memory.consumer_on_gpu`, or producers with GPUs) whose
    memory plan does not fit this machine's GPU is refused, naming the changes that would fit
    (docs/memory.md). CPU runs, and runs on a cluster whose driver sees no GPU, are not judged.
    Returns False when the model's shape cannot be had before the model is fetched (then the
    pre-flight calls again with its directory)."""
    from zbrl.planning.memory import consumer_on_gpu

    if not consumer_on_gpu(cfg) and cfg.launch.producer_num_gpus <= 0:
        return True
    gpu_bytes = visible_gpu_memory()
    if gpu_bytes is None:
        return True  # a cluster's driver without a GPU: the workers' nodes are not known here
    from zbrl.planning.memory_command import fix_summary, plan_for, verdict
    from zbrl.planning.model_shape import ShapeUnknown, model_shape

    try:
        shape = model_shape(cfg, model_dir)
    except ShapeUnknown:
        if model_dir is None:
            return False
        raise
    plan = plan_for(cfg, gpu_bytes, shape)
    if not plan.fits():
        raise RunError(
            f"the memory plan does not fit this machine's GPUs ({verdict(plan, None)}); "
            f"{fix_summary(cfg, plan)} (`zbrl plan --memory RECIPE --gpu-gb "
            f"{gpu_bytes / 2**30:.0f}` prints the plan)"
        )
    return True
