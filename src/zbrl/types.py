"""Wire types that cross process boundaries (producer → buffer → consumer, consumer → producers).

Variable lengths stay variable: every completion keeps its own length; nothing here is padded.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the driver, the telemetry hub and the weight store
    import torch  # handle these types without importing torch (docs/performance.md, Start-up)


def _none() -> None:
    """The default of the optional per-token fields, as a factory: a plain default would be a
    class attribute, which would hide a packed field from ``__getattr__``."""
    return None


@dataclass
class EncodedPrompt:
    """A training prompt after the chat template: its token ids and the example it came from."""

    uid: str
    """Stable id of the dataset example (``file:line``)."""
    prompt_ids: list[int]
    """Prompt token ids with the generation prompt appended."""
    example: dict[str, Any]
    """The reward function's view of the example (``messages``, ``gt_answer`` / ``test_cases``,
    and ``fields``: the dataset row's other columns)."""


@dataclass
class Segment:
    """A later segment of an agent episode whose history changed (docs/agents.md, Changed
    histories): a sequence of its own, trained with its episode's advantage."""

    prompt_ids: list[int]
    """Its prompt: the request that started it, rendered afresh."""
    response_ids: torch.Tensor
    """int64 [L]: everything after the prompt (the model's tokens and rendered messages)."""
    behaviour_logprobs: torch.Tensor
    """float32 [L]: the sampled tokens' log-probs (0 on rendered tokens)."""
    loss_mask: torch.Tensor
    """bool [L]: True on the model's tokens."""
    token_versions: torch.Tensor
    """int64 [L]: the policy version that sampled each token."""


@dataclass
class RolloutGroup:
    """G completions of one prompt, scored, tagged with the policy version that generated them."""

    uid: str
    """Stable sample uid: the example uid plus epoch (``file:line@e0``)."""
    prompt_ids: list[int]
    """Prompt token ids (shared by the G completions)."""
    response_ids: list[torch.Tensor]
    """G int64 tensors, each [L_i]: the sampled tokens (EOS / stop string included)."""
    behaviour_logprobs: list[torch.Tensor]
    """G float32 tensors, each [L_i]: sampled tokens' log-probs at the sampling temperature."""
    rewards: list[float]
    format_acc: list[float]
    ans_acc: list[float]
    truncated: list[bool]
    """True where a completion hit ``max_new_tokens`` without EOS or a stop string."""
    policy_version: int
    """The oldest version of the weights that generated any token of the group (every token
    when ``token_versions`` is None): the staleness bound is checked against it."""
    temperature: float
    """Sampling temperature in force for this group (the trainer uses the same one)."""
    producer: int
    """Index of the producer that generated the group."""
    ticket: int = -1
    """Admission ticket granted by the buffer (orders consumption)."""
    response_texts: list[str] = field(default_factory=list)
    """Decoded completions (for rollout logs)."""
    created_at: float = 0.0
    """Wall time when the group was pushed."""
    reward_timeouts: int = 0
    """Responses whose reward call missed its deadline."""
    reward_failed: int = 0
    """Responses whose reward failed (no score: their ``rewards`` entry is NaN). The buffer
    never trains such a group: it drops it and counts it (``reward_failed`` in the metrics and
    the run summary)."""
    episode_failures: int = 0
    """Episodes that failed without a score (an agent's timeout, crash or malformed result); the
    buffer drops a group that has any, so no made-up score is trained."""
    failure: str | None = None
    """The group's first failure as ``kind: detail`` (an episode's, else a reward's: the
    ``reward_failed`` kind); None when nothing failed. Counted per kind by the buffer
    (:mod:`zbrl.transport.failure_log`)."""
    loss_masks: list[torch.Tensor] | None = field(default_factory=_none)
    """Multi-turn episodes: G bool tensors, each [L_i], True on the tokens the model generated
    (environment tokens are in ``response_ids`` but outside the loss); None: every response
    token is the model's."""
    episodes: list[list[dict[str, Any]]] | None = None
    """Multi-turn episodes: each completion's turns (role, token span, text, whether trained,
    the policy version of model turns, tool calls), for the rollout log."""
    env_counts: dict[str, float] = field(default_factory=dict)
    """Multi-turn episodes: events summed over the group (turns, tool calls, tool errors, turn
    and token limits), reported as ``env/<name>`` metrics."""
    teacher_logprobs: list[torch.Tensor] | None = field(default_factory=_none)
    """On-policy distillation (``algorithm.distill``): G float32 tensors, each [L_i], the
    teacher's log-prob of each sampled response token; None without a teacher."""
    teacher_failed: int = 0
    """Responses the teacher could not score (a failed teacher call); the buffer never trains
    such a group: it drops it and counts it (``teacher_failed``), as a failed reward's."""
    token_versions: list[torch.Tensor] | None = field(default_factory=_none)
    """G int64 tensors, each [L_i]: the policy version that sampled each response token
    (in-flight updates change it inside a response; never below ``policy_version``); None: every
    token has ``policy_version``. Read it through :meth:`versions`."""
    segments: list[list[Segment]] | None = field(default_factory=_none)
    """Agent episodes whose history changed: per completion, its later segments (the
    completion itself is the first); each is trained as a row of its own with the
    completion's advantage. None: no episode of the group has more than one segment."""

    @property
    def group_size(self) -> int:
        lengths = self._packed_lengths()
        return len(lengths) if lengths is not None else len(self.response_ids)

    def versions(self, g: int) -> torch.Tensor:
        """int64 [L_g]: the version of each token of completion ``g``."""
        import torch

        if self.token_versions is not None:
            return self.token_versions[g]
        return torch.full((int(self.response_ids[g].numel()),), self.policy_version)

    def __getstate__(self) -> dict[str, Any]:
        # One flat array per field instead of 2·G small tensors: pickling (Ray's wire format)
        # pays a fixed cost per tensor, which dominated the producer's push time for short
        # responses. NumPy arrays, so that a process can unpickle a group without torch.
        lengths = self.response_lengths  # every per-token field has the responses' lengths
        state = dict(self.__dict__)
        packed = state.pop(_PACKED_STATE, {})
        for key, dtype in PACKED_FIELDS.items():
            if key in packed:  # never unpacked here: passed on as it came
                state[key] = packed[key]
            elif state.get(key) is not None:
                state[key] = (_flat_array(state[key], dtype), lengths)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        packed = {}
        for key in PACKED_FIELDS:
            value = state.pop(key, None)  # optional fields unset (or absent from older pickles)
            if value is None:
                state[key] = None
            elif is_tensor(value[0]):  # a pickle of an older zbrl: flat tensors
                state[key] = _split(*value)
            else:
                packed[key] = value  # unpacked on first use (__getattr__)
        state.setdefault("episodes", None)
        state.setdefault("env_counts", {})
        state.setdefault("reward_failed", 0)
        state.setdefault("episode_failures", 0)
        state.setdefault("segments", None)
        state.setdefault("teacher_failed", 0)
        state.setdefault("failure", None)
        self.__dict__.update(state)
        if packed:
            self.__dict__[_PACKED_STATE] = packed

    def __getattr__(self, name: str) -> Any:
        # Reached only for attributes the instance lacks: a tensor field of an unpickled group
        # on its first use. The rollout buffer never uses them (it reads lengths, rewards and
        # tags), so its process takes, holds and passes on groups without importing torch.
        packed = self.__dict__.get(_PACKED_STATE)
        if packed is None or name not in packed:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = _split(*packed.pop(name))
        self.__dict__[name] = value
        return value

    @property
    def response_lengths(self) -> list[int]:
        lengths = self._packed_lengths()
        if lengths is not None:
            return list(lengths)
        return [int(t.numel()) for t in self.response_ids]

    def _packed_lengths(self) -> list[int] | None:
        """The responses' lengths while ``response_ids`` is still packed (None once unpacked,
        or for a group that was never pickled)."""
        packed = self.__dict__.get(_PACKED_STATE)
        if packed is None or "response_ids" not in packed:
            return None
        return packed["response_ids"][1]

    @property
    def mean_ans_acc(self) -> float:
        return sum(self.ans_acc) / max(1, len(self.ans_acc))


@dataclass
class TrainBatch:
    """The groups of one training step, as handed to a consumer."""

    groups: list[RolloutGroup]
    """Effective groups, in ticket order."""
    step: int
    """Index of the training step this batch feeds (the consumer's version before the step)."""
    raw_groups: int
    """Groups the buffer received for this batch, filtered ones included."""
    raw_metrics: dict[str, float]
    """Pre-filter reward / accuracy / length means over those raw groups."""
    partial: bool = False
    """True for the last batch of a run, smaller than ``train_batch_size``."""
    parked_producers: int = 0
    """Producers on the consumer's node that cannot run before the consumer's next version (see
    ``RolloutBuffer.take``): their cores are free for this step."""
    sample_utilization: float = 0.0
    """Samples trained so far over samples generated so far, this batch included (the buffer's
    counters when it popped the batch; saves the consumer a call per step)."""


@dataclass
class Reservation:
    """Admission granted to a producer: tickets for n groups and the weights they need."""

    tickets: list[int]
    """One ticket per group the producer may generate."""
    min_version: int
    """Generate these groups with weights of at least this version (staleness bound)."""


@dataclass
class WeightsMessage:
    """One published policy version (the payload is an object-store reference or a state dict)."""

    version: int
    published_at: float
    payload: Any


PACKED_FIELDS = {
    "response_ids": "int64",
    "behaviour_logprobs": "float32",
    "loss_masks": "bool",
    "token_versions": "int64",
    "teacher_logprobs": "float32",
}
"""A RolloutGroup's per-token fields and their dtypes: pickled as one flat NumPy array each and
the G lengths (:meth:`RolloutGroup.__getstate__`)."""
_PACKED_STATE = "_packed"
"""The instance attribute holding an unpickled group's fields that were not used yet."""


def _flat_array(tensors: list[torch.Tensor], dtype: str) -> Any:
    """``tensors`` (G 1-D tensors) as one flat NumPy array of ``dtype``."""
    import numpy as np

    if not tensors:
        return np.empty(0, dtype=dtype)
    import torch  # the tensors exist: torch is imported already

    flat = torch.cat([t.reshape(-1) for t in tensors]).to(device="cpu", dtype=getattr(torch, dtype))
    return flat.numpy()


def _split(flat: Any, lengths: list[int]) -> list[torch.Tensor]:
    """The G tensors back from a flat array (or a flat tensor, in older pickles)."""
    import torch

    if not is_tensor(flat):
        # a copy: an array Ray unpickled may be a read-only view of its object store
        flat = torch.from_numpy(flat.copy())
    return list(torch.split(flat, lengths)) if lengths else []


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor, asked without importing torch (a tensor means torch
    is imported already): for code that runs in processes without it."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)
