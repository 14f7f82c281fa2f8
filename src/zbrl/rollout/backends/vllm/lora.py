"""LoRA adapters on the vLLM backend (``model.lora`` with ``rollout.backend.type=vllm``).

Only the adapter tensors travel (by peft's names ``base_model.model.<module>.lora_A.weight`` /
``lora_B.weight``); the engine takes them one of two ways (``rollout.backend.lora_mode``):

- ``adapters`` (:class:`VllmAdapters`): the engine loads the frozen base and starts with vLLM's
  LoRA support on (:func:`engine_args`). Every version is written as a peft adapter directory
  (``adapter_config.json`` + ``adapter_model.safetensors``, :func:`write_adapter_dir`), loaded
  into the engine under a new LoRA id and used for every generation after it; the directory is
  deleted once vLLM has read it. A new id per version is what makes vLLM read the new tensors:
  it caches adapters by id. The previous version is then removed from the engine, so one version
  is held at a time. Before the first version arrives the engine serves the base, which is what
  adapters at their initial value (``B = 0``) compute. With in-flight updates
  (``rollout.inflight_updates``) every version is loaded under the same id instead, replacing
  the held tensors in place (``LoRARequest.load_inplace``), so that requests already running,
  which keep the id they started with, sample their next tokens from the new version. The prefix
  cache is cleared with each version (vLLM also keys cached blocks by the adapter's name and
  path, and each version's path is new).
- ``merged`` (:class:`MergedAdapters`): vLLM's LoRA support stays off. A transformers copy of the
  base in this process takes each version merged into it (:class:`zbrl.models.lora.
  AdapterMerger`, always from the unmerged base), and the engine reloads all its weights from
  that copy in place, as for a full-weight version (vLLM's in-place reload needs every weight:
  given only the adapted ones, it computes NaN).

Nothing here imports vLLM at module level: the directory writer is tested without it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from zbrl.models.lora import PREFIX, AdapterSpec, adapter_pairs

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""peft's file names (its tensor-name prefix is :data:`zbrl.models.lora.PREFIX`)."""

ENGINE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``max_lora_rank`` (vllm.config.lora.MaxLoRARanks)."""


def engine_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of ``rank``; ValueError
    above vLLM's largest."""
    for allowed in ENGINE_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(
        f"LoRA rank {rank} is above the largest vLLM serves ({ENGINE_RANKS[-1]}); lower "
        "model.lora.rank or use rollout.backend=transformers"
    )


def engine_args(spec: AdapterSpec) -> dict[str, Any]:
    """``vllm.LLM`` arguments that turn LoRA on for one adapter at a time (``max_cpu_loras``
    equals ``max_loras``: no older version stays cached)."""
    return {
        "enable_lora": True,
        "max_lora_rank": engine_rank(spec.rank),
        "max_loras": 1,
        "max_cpu_loras": 1,
    }


def adapter_config(spec: AdapterSpec) -> dict[str, Any]:
    """``adapter_config.json`` of a plain LoRA adapter as peft writes it (the fields peft and
    vLLM read)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": spec.base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "target_modules": (
            spec.target_modules
            if isinstance(spec.target_modules, str)
            else list(spec.target_modules)
        ),
        "bias": "none",
        "use_rslora": spec.use_rslora,
        "use_dora": False,
        "fan_in_fan_out": False,
        "inference_mode": True,
    }


def check_adapter_tensors(named_tensors: Mapping[str, torch.Tensor], spec: AdapterSpec) -> None:
    """ValueError unless every tensor is a LoRA ``A`` (``rank x in``) or ``B`` (``out x rank``)
    by peft's names, each ``A`` with its ``B``: what a LoRA run's consumer publishes."""
    pairs = adapter_pairs(named_tensors)  # peft's names, both halves of every adapter
    if not pairs:
        raise ValueError("no adapter tensors given")
    for module_name, (a, b) in pairs.items():
        for part, tensor, axis in (("A", a, 0), ("B", b, 1)):
            if tensor.dim() != 2 or tensor.shape[axis] != spec.rank:
                raise ValueError(
                    f"{PREFIX}{module_name}.lora_{part}.weight has shape {tuple(tensor.shape)}, "
                    f"not rank {spec.rank} (model.lora.rank of the run)"
                )


def write_adapter_dir(
    path: str | Path, named_tensors: Mapping[str, torch.Tensor], spec: AdapterSpec
) -> Path:
    """Write ``named_tensors`` (checked by :func:`check_adapter_tensors`) as the peft adapter
    directory ``path`` (created), tensors in the dtype they came in; returns ``path``."""
    from safetensors.torch import save_file

    check_adapter_tensors(named_tensors, spec)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in named_tensors.items()}
    save_file(tensors, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (path / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(spec), indent=2))
    return path


class VllmAdapters:
    """The adapter versions of one running engine (``llm``: a ``vllm.LLM`` started with
    :func:`engine_args`). :attr:`request` is the ``LoRARequest`` to generate with (None: the base,
    before any version)."""

    def __init__(self, llm: Any, spec: AdapterSpec, in_place: bool = False) -> None:
        """``in_place``: every version under one id, replacing the last in place (for in-flight
        updates: running requests follow it); else a new id per version."""
        self.llm = llm
        self.spec = spec
        self.in_place = in_place
        self.request: Any = None
        self._versions = 0

    def load(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Write the adapters to a temporary directory, load them into the engine under a new
        id (errors surface here, not in the next generation), delete the directory and make them
        :attr:`request`; the previous version leaves the engine. Returns None: nothing for the
        engine to reload.

        The directory goes as soon as vLLM has read it: the engine keeps the tensors in its LoRA
        cache (``max_cpu_loras=1``, the current version) and reads the path again only for an
        id it does not hold, so nothing is left on disk, even when the process is killed (Ray
        kills actors with SIGKILL: no clean-up would run)."""
        from vllm.lora.request import LoRARequest

        self._versions += 1
        replace = self.in_place and self.request is not None
        lora_id = 1 if self.in_place else self._versions
        engine = self.llm.llm_engine
        with tempfile.TemporaryDirectory(prefix="zbrl-lora-") as tmp:
            path = write_adapter_dir(Path(tmp) / f"v{self._versions}", named_tensors, self.spec)
            name = f"zbrl-adapter-{lora_id}"
            loaded = engine.add_lora(LoRARequest(name, lora_id, str(path), load_inplace=replace))
            if not loaded:
                raise RuntimeError(f"vLLM did not load the LoRA adapter written to {path}")
        old, self.request = self.request, LoRARequest(name, lora_id, str(path))
        if replace:
            return None
        if old is not None and old.lora_int_id in engine.list_loras():
            engine.remove_lora(old.lora_int_id)  # (max_cpu_loras=1 has usually evicted it)


class MergedAdapters:
    """``lora_mode: merged``: each version merged into ``merger``'s model (the base, in the
    engine's dtype, on CPU), whose full weights the engine then reloads. :attr:`request` is
    always None (the engine serves plain weights)."""

    request = None

    def __init__(self, merger: Any, spec: AdapterSpec) -> None:
        """``merger``: a :class:`zbrl.models.lora.AdapterMerger` over the base model."""
        self.merger = merger
        self.spec = spec

    def load(self, named_tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The full weights of the base with the adapters merged (names as in the model's
        ``state_dict``), for the engine's in-place reload."""
        check_adapter_tensors(named_tensors, self.spec)
        self.merger.apply(named_tensors)
        return self.merger.model.state_dict()
