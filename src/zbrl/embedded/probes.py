"""Quick accuracy checks of the embedded model on its tasks, used by the warm start (its probe and
held-out figures) and the embedded reward model's build (sampled answers).

These are self-contained sanity checks, not the project's reward functions (``zbrl.rewards``): the
answer must be in ``<answer>`` and equal ``gt_answer`` as a string. The addition task's checks
call ``generate`` on the model directly; the tool demo's run real episodes (with the calculator
in the ``tags`` format, the demo's setting) so that they measure what RL will see.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zbrl.embedded.addition_task import extract_answer

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

    from zbrl.rollout.episodes import EpisodeRunner

_FORMAT_RE = re.compile(r"<think>.*?</think><answer>.*?</answer>", re.DOTALL)
EPISODE_MAX_TURNS = 3
EPISODE_MAX_TOTAL_TOKENS = 64
EPISODE_TURN_TOKENS = 24


def generate_responses(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    *,
    temperature: float,
    max_new_tokens: int = 32,
    batch_size: int = 256,
) -> list[str]:
    """Decoded responses (special tokens dropped) for each row; ``temperature=0`` is greedy."""
    import torch

    was_training = model.training
    model.eval()
    responses: list[str] = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            prompts = [
                tokenizer.apply_chat_template(
                    r["messages"], add_generation_prompt=True, tokenize=False
                )
                for r in chunk
            ]
            enc = tokenizer(
                prompts,
                add_special_tokens=False,
                padding=True,
                padding_side="left",
                return_tensors="pt",
            )
            sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                **(sampling if temperature > 0 else {"do_sample": False}),
            )
            new_tokens = out[:, enc["input_ids"].shape[1] :]
            responses += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    model.train(was_training)
    return responses


def evaluate(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    *,
    temperature: float,
    max_new_tokens: int = 32,
    seed: int = 0,
) -> dict[str, float]:
    """Format accuracy and exact-match answer accuracy of single responses to ``rows``."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        responses = generate_responses(
            model, tokenizer, rows, temperature=temperature, max_new_tokens=max_new_tokens
        )
    fmt = [bool(_FORMAT_RE.fullmatch(r.strip())) for r in responses]
    ans = [extract_answer(r) == str(row["gt_answer"]) for r, row in zip(responses, rows)]
    n = max(1, len(rows))
    return {"format_acc": sum(fmt) / n, "answer_acc": sum(ans) / n}


def episode_runner(model: Any, tokenizer: Any, *, tools: bool) -> tuple[EpisodeRunner, Any]:
    """Episodes of the tool demo: the calculator in the tags format (its setting), up to
    :data:`EPISODE_MAX_TURNS` turns with ``tools``, one turn without; and the backend that
    generates them."""
    from zbrl.environments.tool_env import ToolEnvironment, ToolSettings
    from zbrl.environments.tools import Calculator
    from zbrl.rollout.backends.transformers.backend import TransformersBackend
    from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
    from zbrl.rollout.transcripts import ChatTranscript
    from zbrl.rollout.turns import TurnFormatter

    backend = TransformersBackend(model, tokenizer)
    env = ToolEnvironment(
        [Calculator()],
        ToolSettings(
            call_format="tags",
            on_error="reply",
            max_result_chars=100,
            tool_timeout_s=5.0,
            stop_after_call=False,
        ),
    )
    runner = EpisodeRunner(
        env,
        ChatTranscript(TurnFormatter(tokenizer, "user", eos_ids=backend.eos_ids)),
        EpisodeLimitSettings(
            max_turns=EPISODE_MAX_TURNS if tools else 1, max_total_tokens=EPISODE_MAX_TOTAL_TOKENS
        ),
    )
    return runner, backend


def episode_accuracy(
    model: Any, tokenizer: Any, rows: list[dict], *, tools: bool, temperature: float
) -> float:
    """Answer accuracy of ``rows`` as episodes (with the calculator when ``tools``)."""
    from zbrl.rollout.backends.base import one_sample
    from zbrl.types import EncodedPrompt

    runner, backend = episode_runner(model, tokenizer, tools=tools)
    params = one_sample(temperature, EPISODE_TURN_TOKENS)
    template = tokenizer.apply_chat_template
    prompts = [
        EncodedPrompt(str(i), token_ids(template(r["messages"], add_generation_prompt=True)), r)
        for i, r in enumerate(rows)
    ]
    correct = 0
    for start in range(0, len(prompts), 64):
        for prompt, (episode,) in zip(
            prompts[start : start + 64],
            runner.run(backend.generate, prompts[start : start + 64], params),
        ):
            correct += extract_answer(episode.text) == prompt.example["gt_answer"]
    return correct / max(1, len(rows))


def token_ids(value: Any) -> list[int]:
    """The ids of what ``apply_chat_template`` returned (a list, or a mapping with
    ``input_ids``)."""
    return list(value["input_ids"] if hasattr(value, "keys") else value)
