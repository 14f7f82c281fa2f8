"""What ``generate`` produced, as completions: the sampled tokens' log-probs and where each
response ends (shared by the one-call path of :mod:`.backend` and the chunks of :mod:`.inflight`).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from zbrl.rollout.backends.base import Completion


def sampled_logprobs(
    logits_LNV: torch.Tensor | None, tokens_NL: torch.Tensor, temperature: float
) -> torch.Tensor:
    """float32 [N, L]: the log-prob of each sampled token under ``logits / temperature``
    (zeros without logits)."""
    n, length = tokens_NL.shape
    if logits_LNV is None or length == 0:
        return torch.zeros((n, length), dtype=torch.float32)
    out = torch.empty((n, length), dtype=torch.float32)
    for t in range(length):  # one step at a time: never a float32 copy of [L, N, V]
        step = logits_LNV[t].float().cpu() / temperature
        out[:, t] = torch.log_softmax(step, dim=-1).gather(1, tokens_NL[:, t : t + 1]).squeeze(1)
    return out


class ResponseRule:
    """Where a response ``generate`` produced ends, and its text.

    A sequence's response ends at its first EOS (included) or, when a stop string ended it,
    where ``generate`` started padding it; tokens after that are dropped, never padded into the
    rollout.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_ids: set[int], pad_id: int) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.pad_id = pad_id

    def end(self, tokens: torch.Tensor, stop_strings: tuple[str, ...]) -> tuple[int, bool]:
        """(response length, ended by EOS or a stop string).

        ``generate`` pads a sequence once it finished; a pad token ends the response only where
        a stop string ends within the last token before it (``generate`` stops on a stop string
        that ends inside a token too: ``</ans`` in a ``</answer>`` token), so a pad token the
        model sampled is kept.
        """
        values = tokens.tolist()
        for i, tok in enumerate(values):
            if tok in self.eos_ids:
                return i + 1, True
            if (
                stop_strings
                and tok == self.pad_id
                and self.stop_in_last_token(values[:i], stop_strings)
            ):
                return i, True
        return len(values), self.stop_in_last_token(values, stop_strings)

    def stop_in_last_token(self, ids: list[int], stop_strings: tuple[str, ...]) -> bool:
        """Whether a stop string ends within the text of ``ids``' last token."""
        if not stop_strings or not ids:
            return False
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        last = len(self.tokenizer.decode(ids[-1:], skip_special_tokens=False))
        # a match ending in the last token starts at most len(stop) - 1 characters before it
        return any(
            stop in text[max(0, len(text) - last - len(stop) + 1) :] for stop in stop_strings
        )

    def completion(
        self,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        length: int,
        stopped: bool,
        versions: torch.Tensor | None = None,
    ) -> Completion:
        """The completion of the first ``length`` of ``tokens`` (``stopped``: EOS or a stop
        string ended it), with its log-probs and, in-flight, its per-token versions."""
        ids = tokens[:length].clone()
        text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)
        return Completion(
            ids,
            logprobs[:length].clone(),
            text,
            "stop" if stopped else "length",
            versions=None if versions is None else versions[:length].clone(),
        )
