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
from zbrl.config import HELD_OUT, RunConfig
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

    tokenizer: Any
    """The model directory's tokenizer, with ``model.chat_template`` applied when set."""
    sets: list[tuple[str, DatasetRef]]
    """Each ``--data`` set's name and what it reads (a file, or the source's held-out split)."""


def open_eval_inputs(cfg: RunConfig, model_dir: Path, data: list[tuple[str, str]]) -> EvalInputs:
    """Pre-flight of ``zbrl eval``, the first half of its build: the model directory holds a
    model and a tokenizer (loaded here, once), the backend's package is installed, the reward
    and the environment build (the chat template renders the environment's messages) and every
    ``--data`` file can be read."""
    from zbrl.assembly.environments import check_environment, check_episode_template
    from zbrl.assembly.model_source import load_tokenizer
    from zbrl.assembly.rewards import check_reward
    from zbrl.models import lora
    from zbrl.models.sources import check_model_dir, check_tokenizer_dir

    if lora.is_adapter_dir(model_dir):  # a LoRA checkpoint: its base + its adapters
        check_lora_checkpoint(model_dir)
    elif not model_dir.is_dir() or not (model_dir / "config.json").is_file():
        why = "no config.json" if model_dir.is_dir() else "it does not exist"
        raise RunError(
            f"--model {model_dir}: not a model directory ({why}); give a directory "
            "save_pretrained wrote, e.g. a checkpoint RUN_DIR/checkpoints/step-N"
        )
    else:
        check_model_dir(model_dir, field="--model", spec=str(model_dir))
    check_tokenizer_dir(model_dir, field="--model", spec=str(model_dir))
    check_backend_installed(cfg)
    check_reward(cfg)
    check_environment(cfg)
    for name, path in data:
        if path != HELD_OUT:
            check_readable_file(path, f"--data {name}")
    tokenizer = load_tokenizer(cfg, model_dir)  # every set is encoded before the model loads
    check_episode_template(cfg, tokenizer)
    return EvalInputs(tokenizer, [(name, eval_ref(cfg, path)) for name, path in data])


def check_lora_checkpoint(adapter_dir: Path) -> None:
    """``zbrl eval --model`` of a LoRA checkpoint: the base model it names is there. peft is not
    needed, and either backend takes it: the transformers backend merges the adapters itself
    (:class:`zbrl.models.lora.AdapterMerger`) and vLLM reads the adapter directory."""
    from zbrl.models import lora
    from zbrl.models.sources import check_model_dir

    base = lora.base_dir_of(adapter_dir)
    check_model_dir(base, field="--model", spec=f"{adapter_dir}'s base model {base}")
