"""LoRA adapters (``model.lora``, the ``lora`` extra: peft) — training and receiving sides.

Training: :func:`wrap` puts peft adapters on the float32 base and freezes it; the engine trains,
publishes (:func:`adapter_state`) and checkpoints only the adapter tensors, named as peft saves
them (``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``). A LoRA checkpoint
(``step-N``) is a peft adapter directory: ``adapter_config.json`` (whose
``base_model_name_or_path`` is the base model's directory) and ``adapter_model.safetensors``.

Receiving: :class:`AdapterMerger` merges published adapters into a plain model (a producer's or
the evaluator's, in its inference dtype). It keeps an unmerged copy of every base weight it has
touched and always merges from that copy (``W = W_base + scale * B @ A``, in float32, then cast
to the model's dtype), so versions never compound: loading v1 then v2 gives exactly the
weights of loading v2 alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zbrl.errors import RunError

if TYPE_CHECKING:
    from zbrl.config.model import LoraConfig

ADAPTER_CONFIG = "adapter_config.json"
"""peft's adapter configuration file: its presence makes a directory a LoRA checkpoint."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""peft's adapter weights file."""
PREFIX = "base_model.model."
"""What peft's state-dict names put before the wrapped model's module names."""
INSTALL_HINT = "pip install 'zbrl[lora]' (or: pip install peft)"
"""How to get peft."""


def peft_available() -> bool:
    """Whether peft can be imported."""
    try:
        import peft  # noqa: F401
    except ImportError:
        return False
    return True


def wrap(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """``model`` (float32) with peft LoRA adapters on ``lora.target_modules``; every base weight
    frozen, only the adapters trainable. RunError naming ``model.lora.target_modules`` when none
    of them is in the model."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        linear = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m) is torch.nn.Linear}
        )
        raise RunError(
            f"model.lora.target_modules={list(lora.target_modules)} does not fit "
            f"{type(model).__name__} ({exc}); its linear layers are named {linear}"
        ) from None


def check_targets(model_dir: Path, lora: LoraConfig, *, trust_remote_code: bool = False) -> None:
    """Pre-flight of ``model.lora``: at least one of ``target_modules`` names a linear layer of
    the model in ``model_dir`` (as peft matches them: the module's name or its last
    component), checked on a skeleton built from ``config.json`` on the meta device (no weight is
    read). A RunError naming the field and the model's linear layers otherwise; without it, the
    consumers would fail after the run directory exists."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    targets = list(lora.target_modules)
    if any(n == t or n.endswith("." + t) for n in names for t in targets):
        return
    linear = sorted({n.rsplit(".", 1)[-1] for n in names})
    raise RunError(
        f"model.lora.target_modules={targets} matches no linear layer of "
        f"{type(model).__name__} ({model_dir}); its linear layers are named {linear}: set "
        "model.lora.target_modules to some of them"
    )


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors of a peft model by peft's names (shares storage with the model)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_adapter_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy adapter tensors (as :func:`adapter_state` names them) into a peft model; ValueError
    when a name is unknown or an adapter is left out."""
    from peft import set_peft_model_state_dict

    want = set(adapter_state(model))
    if set(state) != want:
        extra, missing = sorted(set(state) - want)[:3], sorted(want - set(state))[:3]
        raise ValueError(
            f"adapter tensors do not match the model's adapters (unknown: {extra}, missing: "
            f"{missing}); resume with the same model.lora settings"
        )
    result = set_peft_model_state_dict(model, dict(state))
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise ValueError(f"adapter tensors not loaded: {unexpected[:3]}")


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a peft adapter (a LoRA checkpoint) rather than full weights."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def read_adapter_config(adapter_dir: str | Path) -> dict[str, Any]:
    """``adapter_config.json`` of a LoRA checkpoint; RunError naming the file when unreadable."""
    path = Path(adapter_dir) / ADAPTER_CONFIG
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunError(f"cannot read the LoRA adapter config {path} ({exc})") from None


def base_dir_of(adapter_dir: str | Path) -> Path:
    """The base model directory a LoRA checkpoint was trained on (``base_model_name_or_path``);
    RunError saying how to fix it when it is not there."""
    config = read_adapter_config(adapter_dir)
    base = config.get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise RunError(
            f"the LoRA checkpoint {adapter_dir} was trained on the base model {base!r}, which is "
            f"not a directory here; edit base_model_name_or_path in {ADAPTER_CONFIG} to the base "
            "model's directory"
        )
    return Path(base)


@dataclass(frozen=True)
class AdapterSpec:
    """What a backend needs to know about the adapters besides their tensors: to merge them
    (:func:`scale_of`) or to serve them (:mod:`zbrl.rollout.backends.vllm.lora`)."""

    rank: int
    """``r`` of every adapter (``A`` is ``r x in``)."""
    alpha: float
    """``lora_alpha``: the update is ``alpha / rank * B @ A`` (``alpha / sqrt(rank)`` with
    rsLoRA)."""
    target_modules: tuple[str, ...] | str
    """Module names (last component) that carry adapters, or peft's regular expression over
    full module names (a checkpoint trained elsewhere may use one)."""
    base_model: str
    """The base model's directory (``base_model_name_or_path`` in the adapter config)."""
    use_rslora: bool
    """rsLoRA scaling (a checkpoint trained elsewhere may use it; zbrl's own runs do not)."""

    @classmethod
    def from_adapter_config(cls, config: Mapping[str, Any], base_model: str) -> AdapterSpec:
        """The spec of a peft adapter directory from its ``adapter_config.json`` contents."""
        targets = config["target_modules"]
        return cls(
            rank=int(config["r"]),
            alpha=float(config["lora_alpha"]),
            target_modules=targets if isinstance(targets, str) else tuple(targets),
            base_model=base_model,
            use_rslora=bool(config.get("use_rslora", False)),
        )


def scale_of(spec: AdapterSpec) -> float:
    """The adapters' scale: ``alpha / rank``, or ``alpha / sqrt(rank)`` with rsLoRA."""
    return spec.alpha / (math.sqrt(spec.rank) if spec.use_rslora else spec.rank)


def load_adapter_tensors(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of a LoRA checkpoint, by peft's names, as saved (float32)."""
    from safetensors.torch import load_file

    path = Path(adapter_dir) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise RunError(f"the LoRA checkpoint {adapter_dir} has no {ADAPTER_WEIGHTS}")
    return load_file(str(path))


class AdapterMerger:
    """Merges published adapter tensors into a plain model, from an unmerged copy of the base
    (see the module docstring). ``scale``: ``alpha / rank`` of the adapters it will be given."""

    def __init__(self, model: torch.nn.Module, scale: float) -> None:
        self.model = model
        self.scale = scale
        self._modules = dict(model.named_modules())
        self._base: dict[str, torch.Tensor] = {}  # module name -> its unmerged weight

    @property
    def base_bytes(self) -> int:
        """Memory held by the unmerged copies."""
        return sum(t.numel() * t.element_size() for t in self._base.values())

    @torch.no_grad()
    def apply(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Set every adapted weight to ``base + scale * B @ A`` for the given adapters (all of
        them: one published version); ValueError for a tensor that is not a LoRA ``A``/``B``
        of a linear layer of the model, or an ``A`` without its ``B``."""
        for module_name, (a, b) in adapter_pairs(named_tensors).items():
            weight = self._weight(module_name)
            base = self._base.setdefault(module_name, weight.detach().clone())
            delta = b.to(weight.device, torch.float32) @ a.to(weight.device, torch.float32)
            if delta.shape != weight.shape:
                raise ValueError(
                    f"adapter of {module_name} has shape {tuple(delta.shape)}, its weight "
                    f"{tuple(weight.shape)}"
                )
            weight.copy_((base.float() + self.scale * delta).to(weight.dtype))

    def _weight(self, module_name: str) -> torch.Tensor:
        module = self._modules.get(module_name)
        if not isinstance(module, torch.nn.Linear):
            raise ValueError(
                f"adapter for {module_name!r}, which is not a linear layer of "
                f"{type(self.model).__name__}"
            )
        return module.weight


def adapter_pairs(
    named_tensors: Mapping[str, torch.Tensor],
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module name: (A, B)}`` from peft's adapter names; ValueError for a tensor that is not
    an adapter's or an adapter without both halves."""
    found: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors.items():
        stem, dot, part = name.rpartition(".lora_")
        if not dot or part not in ("A.weight", "B.weight") or not stem.startswith(PREFIX):
            raise ValueError(
                f"{name!r} is not a LoRA adapter tensor (base_model.model.<module>.lora_A/B"
                ".weight); a LoRA receiver gets adapters only"
            )
        found.setdefault(stem[len(PREFIX) :], {})[part[0]] = tensor
    pairs = {}
    for module_name, parts in found.items():
        if set(parts) != {"A", "B"}:
            raise ValueError(f"adapter of {module_name!r} lacks lora_A or lora_B")
        pairs[module_name] = (parts["A"], parts["B"])
    return pairs
