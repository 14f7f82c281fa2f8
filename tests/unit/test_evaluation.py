import itertools
import json

import pytest
import torch
from role_settings import sampling_params, single_turn

from zbrl.cli import main
from zbrl.evaluation.evaluator import EvalSet, Evaluator, evaluate_set, ks_for, pass_at_k
from zbrl.rewards import build_reward
from zbrl.rollout.backends.base import Completion
from zbrl.types import EncodedPrompt


def brute_pass_at_k(outcomes, k):
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(outcomes, k))


def test_pass_at_k_needs_enough_samples():
    with pytest.raises(ValueError, match="at least 4 samples"):
        pass_at_k(2, 1, 4)


def test_ks_for():
    assert ks_for(1) == [1]
    assert ks_for(6) == [1, 2, 4, 6]


class ScriptedBackend:
    """Answers prompt i with the texts in ``answers[i]`` (one token per character, at most
    ``max_new_tokens`` of them, as a backend samples)."""

    def __init__(self, answers):
        self.answers = answers

    def generate(self, prompts, params):
        out = []
        for ids in prompts:
            texts = self.answers[ids[0]][: params.n]
            out.append(
                [
                    Completion(torch.ones(n, dtype=torch.long), torch.zeros(n), t, "stop")
                    for t in texts
                    for n in [min(len(t), params.max_new_tokens)]
                ]
            )
        return out

    def load_weights(self, named):
        pass

    def release_memory(self):
        pass


def make_prompts(golds):
    return [
        EncodedPrompt(
            f"set:{i}", [i], {"messages": [{"role": "user", "content": f"q{i}"}], "gt_answer": g}
        )
        for i, g in enumerate(golds)
    ]


def test_evaluate_set_accuracy_pass_at_k_and_records(tmp_path):
    ok = "<think>x</think><answer>{}</answer>"
    answers = {
        0: [ok.format(3), ok.format(4)],  # one of two right
        1: ["<answer>5</answer>", ok.format(9)],  # bad format but right (eval grants it)
    }
    prompts = make_prompts(["3", "5"])
    reward = build_reward("think_answer_tags")
    params = sampling_params(n=2, temperature=0.6, max_new_tokens=32)
    metrics, records = evaluate_set(
        ScriptedBackend(answers),
        single_turn(params),
        reward,
        EvalSet("toy", prompts),
        params,
        batch_size=1,
    )
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["format_acc"] == pytest.approx(0.75)
    assert metrics["pass@1"] == pytest.approx(0.5)
    assert metrics["pass@2"] == pytest.approx(1.0)
    assert [r["ans_valid"] for r in records] == [True, False, True, False]
    assert (
        records[0]["prompt"] == "q0" and records[0]["gold"] == "3" and records[0]["parsed"] == "3"
    )
    ev = Evaluator(
        ScriptedBackend(answers),
        single_turn(params),
        reward,
        [EvalSet("toy", prompts)],
        params,
        batch_size=2,
        out_dir=tmp_path,
    )
    results = ev.run(step=7)
    lines = (tmp_path / "7.jsonl").read_text().splitlines()
    assert results["toy"]["accuracy"] == pytest.approx(0.5)
    assert len(lines) == 4 and json.loads(lines[0])["step"] == 7


def test_eval_cli_on_a_saved_model(tiny_model_dir, task_files, tmp_path, capsys):
    rc = main(
        [
            "eval",
            "--model",
            str(tiny_model_dir),
            "--data",
            f"heldout={task_files[1]}",
            "--n",
            "2",
            "--max-prompts",
            "4",
            "--max-new-tokens",
            "8",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "heldout" in out and "pass@2" in out
    records = [json.loads(x) for x in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert len(records) == 8
    assert {
        "prompt",
        "response",
        "parsed",
        "gold",
        "format_valid",
        "ans_valid",
        "reward",
        "length",
    } <= set(records[0])


def test_eval_cli_rejects_a_non_model_dir(tmp_path, capsys):
    rc = main(["eval", "--model", str(tmp_path), "--data", "x.jsonl"])
    assert rc == 1
    assert "not a model directory" in capsys.readouterr().err
