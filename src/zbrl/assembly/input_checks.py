"""What a start checks or opens before anything is created: whether the packages a config asks
for are installed, and the inputs of ``zbrl eval``, opened once (:func:`open_eval_inputs`). Each
failure is a RunError naming the field (or flag) and the fix. What training opens before its run
directory (model, tokenizer, dataset files) is kept in
:class:`zbrl.assembly.artifacts.RunSources`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbrl.assembly.datasets import DatasetRef, check_readable_file, eval_ref
from zbrl.config import EMBEDDED, HELD_OUT, RunConfig
from zbrl.errors import RunError


def check_backend_installed(cfg: RunConfig) -> None:
    """Pre-flight: a backend whose package is missing fails here, with the install command,
    before any worker starts (``zbrl train`` and ``zbrl eval`` call it first). The backend's
    module (which imports torch) is imported only when the config asks for it."""
    import sys

    if cfg.rollout.backend.type == "vllm":
        from zbrl.rollout.backends.vllm.backend import INSTALL_HINT, vllm_available

        if not vllm_available():
            raise RunError(
                f"rollout.backend.type=vllm, but vLLM is not installed in this environment "
                f"({sys.executable}): {INSTALL_HINT}"
            )
    if cfg.model.lora is not None:
        from zbrl.models import lora

        if not lora.peft_available():
            raise RunError(
                f"model.lora is set, but peft is not installed in this environment "
                f"({sys.executable}): {lora.INSTALL_HINT}"
            )


@dataclass(frozen=True)
class EvalInputs:
    """What ``zbrl eval``'s pre-flight opened, for the evaluation to use."""

    model_dir: Path
    """The local directory of the model evaluated (a checkpoint, a LoRA checkpoint, the
    embedded warm start, or what a Hub id, a GGUF file or a pulled name resolved to)."""
    tokenizer_dir: Path
    """The tokenizer's directory: ``model.tokenizer_path``'s when set, else ``model_dir``."""
    tokenizer: Any
    """The tokenizer, with ``model.chat_template`` applied when set."""
    sets: list[tuple[str, DatasetRef]]
    """Each ``--data`` set's name and what it reads (a file, or a held-out split:
    ``data.source``'s or the embedded task's)."""


def open_eval_inputs(
    cfg: RunConfig, model: str, data: list[tuple[str, str]], *, field: str = "--model"
) -> EvalInputs:
    """Pre-flight of ``zbrl eval``, the first half of its build: ``model`` (any form
    ``model.path`` takes, :func:`eval_model_dir`) resolves to a directory holding a model and a
    tokenizer (loaded here, once), the backend's package is installed, the reward builds and
    the environment builds (the chat template renders the environment's messages) and every
    ``--data`` file can be read. ``field``: how errors name ``model``."""
    from zbrl.assembly.environments import check_environment, check_episode_template
    from zbrl.assembly.model_source import load_tokenizer, user_tokenizer_dir
    from zbrl.assembly.rewards import check_reward
    from zbrl.models.sources import check_tokenizer_dir

    check_backend_installed(cfg)
    check_reward(cfg)
    check_environment(cfg)
    for name, path in data:
        if path not in (HELD_OUT, EMBEDDED):
            check_readable_file(path, f"--data {name}")
    sets = [(name, eval_ref(cfg, path)) for name, path in data]
    model_dir = eval_model_dir(cfg, model, field=field)
    tokenizer_dir = user_tokenizer_dir(cfg) or model_dir
    if cfg.model.tokenizer_path is None:
        check_tokenizer_dir(tokenizer_dir, field=field, spec=model)
    else:
        check_tokenizer_dir(
            tokenizer_dir, field="model.tokenizer_path", spec=cfg.model.tokenizer_path
        )
    tokenizer = load_tokenizer(cfg, tokenizer_dir)  # every set is encoded before the model loads
    check_episode_template(cfg, tokenizer)
    return EvalInputs(model_dir, tokenizer_dir, tokenizer, sets)


def eval_model_dir(cfg: RunConfig, model: str, *, field: str) -> Path:
    """The local model directory of ``zbrl eval``'s model: ``embedded`` (the warm-started
    embedded policy of the config's task, built once into ``logging.cache_dir``), a checkpoint
    or any Hugging Face model directory, a LoRA checkpoint (its base model checked), a ``.gguf``
    file (converted once), a pulled model's name or a Hub id (:mod:`zbrl.models.sources`). A
    RunError naming ``field`` and the fix when it is none of them."""
    from zbrl.assembly.embedded import embedded_policy_dir
    from zbrl.models import lora
    from zbrl.models.sources import check_model_dir, classify, resolve

    source = classify(model)
    if source.kind == "embedded":
        return embedded_policy_dir(cfg)
    model_dir = resolve(model, cfg.logging.cache_dir, field=field)
    if source.kind == "local" and lora.is_adapter_dir(model_dir):
        check_lora_checkpoint(model_dir)  # a LoRA checkpoint: its base + its adapters
    elif source.kind == "local" and not (model_dir / "config.json").is_file():
        raise RunError(
            f"{field} {model}: not a model directory (no config.json); give a directory "
            "save_pretrained wrote, e.g. a checkpoint RUN_DIR/checkpoints/step-N, a .gguf "
            "file, a Hub id (ORG/NAME), a pulled model's name or `embedded`"
        )
    else:
        check_model_dir(model_dir, field=field, spec=model)
    return model_dir


def check_lora_checkpoint(adapter_dir: Path) -> None:
    """``zbrl eval --model`` of a LoRA checkpoint: the base model it names is there. peft is not
    needed, and either backend takes it: the transformers backend merges the adapters itself
    (:class:`zbrl.models.lora.AdapterMerger`) and vLLM reads the adapter directory."""
    from zbrl.models import lora
    from zbrl.models.sources import check_model_dir

    base = lora.base_dir_of(adapter_dir)
    check_model_dir(base, field="--model", spec=f"{adapter_dir}'s base model {base}")
