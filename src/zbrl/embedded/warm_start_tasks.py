"""The embedded tasks as the warm-start builder (:mod:`zbrl.embedded.warm_start`) sees them.

* :class:`AdditionWarmStart`: ``<think>`` column sums then ``<answer>`` (the demo's task,
  :mod:`zbrl.embedded.addition_task`), probed with plain greedy generation;
* :class:`MultiplicationWarmStart`: the tool demo's 3-digit products
  (:mod:`zbrl.embedded.multiplication_task`), with the calculator (``tools``) or without. Each
  training sequence is built the way an episode is: the prompt through the chat template, each
  assistant turn's text and EOS (in the loss), and the calculator's message as the episode runner
  appends it (:class:`~zbrl.rollout.turns.TurnFormatter`; outside the loss), so the warm start
  and RL train the same token sequences. Its probe runs real episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from zbrl.embedded import addition_task, multiplication_task
from zbrl.embedded.warm_start import TrainingSequence

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from zbrl.rollout.turns import TurnFormatter


@dataclass(frozen=True)
class AdditionWarmStart:
    """The addition task: ``min_digits``..``max_digits``-digit operands; ``eval_size`` held-out
    problems are scored at the end (greedy and sampled at temperature 1.0) and recorded in the
    marker (``0`` skips that; not part of the cache key)."""

    min_digits: int = 1
    max_digits: int = 2
    eval_size: int = 200
    prefix: str = "warm"
    cache_version: int = 2

    def fingerprint(self) -> dict[str, Any]:
        example = addition_task.reference_completion(addition_task.make_row(37, 48))
        return {"system_prompt": addition_task.SYSTEM_PROMPT, "example": example}

    def key_fields(self) -> dict[str, Any]:
        return {"min_digits": self.min_digits, "max_digits": self.max_digits}

    def rows(self, n: int, *, seed: int, split: Literal["train", "eval"]) -> list[dict]:
        return addition_task.make_arithmetic_rows(n, seed=seed, split=split, **self.key_fields())

    def sequences(
        self, tokenizer: PreTrainedTokenizerBase, rows: list[dict]
    ) -> list[TrainingSequence]:
        return [self.sequence(tokenizer, row) for row in rows]

    def sequence(self, tokenizer: PreTrainedTokenizerBase, row: dict) -> TrainingSequence:
        """The prompt, then the reference completion and its EOS, all in the loss."""
        prompt = tokenizer.apply_chat_template(
            row["messages"], add_generation_prompt=True, tokenize=False
        )
        answer = {"role": "assistant", "content": addition_task.reference_completion(row)}
        full = tokenizer.apply_chat_template([*row["messages"], answer], tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        if full_ids[: len(prompt_ids)] != prompt_ids:
            raise ValueError(
                "chat template: the generation prompt is not a prefix of the full chat"
            )
        response = full_ids[len(prompt_ids) :]
        return prompt_ids, response, [True] * len(response)

    def probe_accuracy(self, model: Any, tokenizer: Any, rows: list[dict]) -> float:
        from zbrl.embedded.probes import evaluate

        return evaluate(model, tokenizer, rows, temperature=0.0)["answer_acc"]

    def final_figures(
        self, model: Any, tokenizer: Any, seed: int, *, verbose: bool
    ) -> dict[str, Any]:
        if not self.eval_size:
            return {}
        from zbrl.embedded.probes import evaluate

        held_out = self.rows(self.eval_size, seed=seed, split="eval")
        figures = {
            "heldout_greedy": evaluate(model, tokenizer, held_out, temperature=0.0),
            "heldout_sampled_t1": evaluate(model, tokenizer, held_out, temperature=1.0, seed=seed),
        }
        if verbose:
            print(
                f"[zbrl] warm start: held-out answer accuracy greedy "
                f"{figures['heldout_greedy']['answer_acc']:.2f}, sampled (T=1) "
                f"{figures['heldout_sampled_t1']['answer_acc']:.2f}",
                flush=True,
            )
        return figures


@dataclass(frozen=True)
class MultiplicationWarmStart:
    """The tool demo's task, traced through the calculator when ``tools`` (else answered in one
    turn)."""

    tools: bool
    cache_version: int = 1

    @property
    def prefix(self) -> str:
        return f"warm-multiply-{'tools' if self.tools else 'plain'}"

    def fingerprint(self) -> dict[str, Any]:
        row = multiplication_task.make_row(347, 628, tools=True)
        return {
            "tools": multiplication_task.TOOLS_SYSTEM_PROMPT,
            "plain": multiplication_task.PLAIN_SYSTEM_PROMPT,
            "trace": multiplication_task.trace(row, tools=True),
        }

    def key_fields(self) -> dict[str, Any]:
        return {"tools": self.tools}

    def rows(self, n: int, *, seed: int, split: Literal["train", "eval"]) -> list[dict]:
        return multiplication_task.make_rows(n, seed=seed, split=split, tools=self.tools)

    def sequences(
        self, tokenizer: PreTrainedTokenizerBase, rows: list[dict]
    ) -> list[TrainingSequence]:
        from zbrl.rollout.turns import TurnFormatter

        formatter = TurnFormatter(tokenizer, "user", eos_ids={tokenizer.eos_token_id})
        return [episode_sequence(tokenizer, formatter, row, tools=self.tools) for row in rows]

    def probe_accuracy(self, model: Any, tokenizer: Any, rows: list[dict]) -> float:
        from zbrl.embedded.probes import episode_accuracy

        return episode_accuracy(model, tokenizer, rows, tools=self.tools, temperature=0.0)

    def final_figures(
        self, model: Any, tokenizer: Any, seed: int, *, verbose: bool
    ) -> dict[str, Any]:
        return {}


def episode_sequence(
    tokenizer: PreTrainedTokenizerBase, formatter: TurnFormatter, row: dict, *, tools: bool
) -> TrainingSequence:
    """The tool demo row's ideal episode: assistant turns (and their EOS) in the loss, the
    calculator's messages as the episode runner formats them (``formatter``) outside it."""
    from zbrl.embedded.probes import token_ids

    prompt = token_ids(tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True))
    ids: list[int] = []
    mask: list[bool] = []
    last_model: list[int] = []
    for role, content in multiplication_task.trace(row, tools=tools):
        if role == "assistant":
            turn = [*tokenizer.encode(content, add_special_tokens=False), tokenizer.eos_token_id]
            last_model = turn
            ids += turn
            mask += [True] * len(turn)
        else:
            env, _ = formatter.environment_ids(last_model, content)
            ids += env
            mask += [False] * len(env)
    return prompt, ids, mask
