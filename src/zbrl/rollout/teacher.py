"""The distillation teacher on a producer: it scores every sampled response token.

A teacher is a causal LM run in-process with transformers, in the inference dtype, on the
producer's device. It reads each episode's whole sequence (prompt, then the response with any
environment messages) and returns its log-prob of every response token at temperature 1 (the
teacher's own distribution). Sequences go through it ``batch_size`` at a time, right-padded,
longest first; every call is counted. A call that raises fails the sequences it held: they get
no log-probs (None), and the producer marks their groups ``teacher_failed``, which the buffer
drops (never trained with a made-up log-prob).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeacherSettings:
    """Where the teacher is and how it runs (filled by ``zbrl.assembly.settings``)."""

    model_dir: str
    """A local model directory (resolved by the driver's pre-flight)."""
    dtype: str
    """The inference dtype (``rollout.inference_dtype``)."""
    device: str
    """The producer's device."""
    batch_size: int
    """Sequences per forward pass."""
    trust_remote_code: bool


@dataclass
class TeacherCounts:
    """What the teacher did on one producer."""

    calls: int = 0
    """Forward passes run."""
    sequences: int = 0
    """Sequences scored."""
    tokens: int = 0
    """Response tokens scored."""
    failed_calls: int = 0
    """Forward passes that raised (their sequences' groups are dropped)."""


class Teacher(Protocol):
    """What the producer asks of a teacher."""

    counts: TeacherCounts

    def score(self, sequences: list[tuple[list[int], torch.Tensor]]) -> list[torch.Tensor | None]:
        """Per (prompt ids, response ids [L]): float32 [L] log-probs, or None when its call
        failed."""
        ...


class TransformersTeacher:
    """A causal LM scoring sequences in batches (see the module docstring)."""

    def __init__(self, model: Any, *, device: torch.device, batch_size: int, pad_id: int) -> None:
        self.model = model.to(device).eval()
        self.device = device
        self.batch_size = batch_size
        self.pad_id = pad_id
        self.counts = TeacherCounts()

    def score(self, sequences: list[tuple[list[int], torch.Tensor]]) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = [None] * len(sequences)
        order = sorted(
            range(len(sequences)),
            key=lambda i: -(len(sequences[i][0]) + int(sequences[i][1].numel())),
        )
        for start in range(0, len(order), self.batch_size):
            picked = order[start : start + self.batch_size]
            self.counts.calls += 1
            try:
                scored = self._forward([sequences[i] for i in picked])
            except Exception as e:  # a failed call fails its sequences, never the producer
                self.counts.failed_calls += 1
                logger.warning("teacher call failed: %s: %s", type(e).__name__, e)
                continue
            for i, logp in zip(picked, scored, strict=True):
                out[i] = logp
                self.counts.sequences += 1
                self.counts.tokens += int(logp.numel())
        return out

    @torch.no_grad()
    def _forward(self, batch: list[tuple[list[int], torch.Tensor]]) -> list[torch.Tensor]:
        lengths = [len(p) + int(r.numel()) for p, r in batch]
        width = max(lengths)
        ids_BS = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention_BS = torch.zeros((len(batch), width), dtype=torch.long)
        for b, (prompt, response) in enumerate(batch):
            ids_BS[b, : lengths[b]] = torch.cat([torch.tensor(prompt, dtype=torch.long), response])
            attention_BS[b, : lengths[b]] = 1
        logits_BSV = self.model(
            input_ids=ids_BS.to(self.device), attention_mask=attention_BS.to(self.device)
        ).logits
        out = []
        for b, (prompt, response) in enumerate(batch):
            p, n = len(prompt), int(response.numel())
            logits_LV = logits_BSV[b, p - 1 : p - 1 + n].float()  # position t predicts t + 1
            logp_LV = torch.log_softmax(logits_LV, dim=-1)
            out.append(logp_LV.gather(-1, response.to(self.device).view(-1, 1)).view(-1).cpu())
        return out


def load_teacher(settings: TeacherSettings) -> TransformersTeacher:
    """The teacher of ``settings``, loaded in this process."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        settings.model_dir,
        dtype=getattr(torch, settings.dtype),
        trust_remote_code=settings.trust_remote_code,
    )
    tokenizer = AutoTokenizer.from_pretrained(settings.model_dir)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id or 0
    return TransformersTeacher(
        model, device=torch.device(settings.device), batch_size=settings.batch_size, pad_id=pad_id
    )
