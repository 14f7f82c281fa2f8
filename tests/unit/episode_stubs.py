"""A scripted backend for episode tests: the next model turn is a function of the context it is
given (decoded with the embedded tokenizer); every context it sees is recorded."""

import torch

from zbrl.embedded.tokenizer import build_tokenizer
from zbrl.rollout.backends.base import Completion
from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
from zbrl.rollout.transcripts import ChatTranscript
from zbrl.rollout.turns import TurnFormatter

TOKENIZER = build_tokenizer()
EOS = TOKENIZER.eos_token_id


class ScriptedBackend:
    """``script(context_text, sample_index) -> turn text``; the turn is its tokens plus EOS
    (cut at ``max_new_tokens``: then ``finish_reason`` is ``length``). Log-probs are distinct per
    call so that a test can tell where each came from."""

    def __init__(self, script, *, eos=True):
        self.script = script
        self.eos = eos
        self.tokenizer = TOKENIZER
        self.eos_ids = {EOS}
        self.contexts = []  # every context passed to generate, in order
        self.generated = []  # (context, sampled ids) in order

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            comps = []
            for j in range(params.n):
                context = list(p)
                self.contexts.append(context)
                text = self.script(TOKENIZER.decode(context, skip_special_tokens=False), j)
                ids = TOKENIZER.encode(text, add_special_tokens=False) + ([EOS] if self.eos else [])
                finish = "stop"
                if len(ids) > params.max_new_tokens:
                    ids, finish = ids[: params.max_new_tokens], "length"
                self.generated.append((context, ids))
                logprobs = -torch.arange(1, len(ids) + 1, dtype=torch.float32) / 100 - len(
                    self.generated
                )
                comps.append(
                    Completion(
                        torch.tensor(ids, dtype=torch.long),
                        logprobs,
                        TOKENIZER.decode(ids, skip_special_tokens=True),
                        finish,
                    )
                )
            out.append(comps)
        return out

    def load_weights(self, named_tensors):
        pass

    def release_memory(self):
        pass


def runner(backend, environment, *, max_turns=4, max_total_tokens=400, score_final_turn=True):
    return EpisodeRunner(
        environment,
        ChatTranscript(TurnFormatter(backend.tokenizer, "user", eos_ids=backend.eos_ids)),
        EpisodeLimitSettings(max_turns=max_turns, max_total_tokens=max_total_tokens),
        score_final_turn=score_final_turn,
    )


def encoded(question, uid="q:0", gt="0"):
    from zbrl.types import EncodedPrompt

    messages = [{"role": "user", "content": question}]
    ids = TOKENIZER.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return EncodedPrompt(uid, list(ids), {"messages": messages, "gt_answer": gt})


def calculator_script(context, sample):
    """Calls the calculator on the question's product until a result is in the context, then
    answers with it (sample 1 answers at once, wrongly)."""
    question = context.split("<|user|>")[1].split("<|end|>")[0]
    if sample == 1:
        return "<answer>1</answer>"
    results = context.split("<|user|>")[2:]
    if not results:
        return f"<calc>{question}</calc>"
    return f"<answer>{results[-1].split('<|end|>')[0]}</answer>"
