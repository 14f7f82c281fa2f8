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


def test_eval_cli_rejects_a_non_model_dir(tmp_path, task_files, capsys):
    rc = main(["eval", "--model", str(tmp_path), "--data", str(task_files[1])])
    assert rc == 1
    assert "not a model directory" in capsys.readouterr().err


def eval_rows(out_dir, name):
    return [json.loads(x) for x in (out_dir / f"{name}.jsonl").read_text().splitlines()]


@pytest.mark.slow  # builds the embedded warm start (~9 s on 2 cores)
def test_eval_cli_takes_the_embedded_model_and_dotted_overrides(
    run_cache, task_files, tmp_path, capsys
):
    from helpers.runs import WARM_START_STEPS

    rc = main(
        [
            "eval",
            "--model",
            "embedded",
            "--data",
            f"held_out={task_files[1]}",
            "--out",
            str(tmp_path),
            f"logging.cache_dir={run_cache}",
            f"model.warm_start.steps={WARM_START_STEPS}",
            "eval.max_prompts=3",
            "eval.num_samples=2",
            "eval.max_new_tokens=6",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rows = eval_rows(tmp_path, "held_out")
    assert len(rows) == 3 * 2  # the overrides' prompts x samples
    assert max(r["length"] for r in rows) <= 6
    # the embedded warm start was built into the overridden cache, and evaluated from there
    assert any(run_cache.rglob("config.json"))


def test_eval_cli_takes_a_gguf_file(tmp_path, task_files, capsys):
    from tiny_gguf import write_tiny_gguf

    source = tmp_path / "tiny.gguf"
    write_tiny_gguf(source)
    out = tmp_path / "out"
    argv = ["eval", "--model", str(source), "--data", f"h={task_files[1]}", "--out", str(out)]
    rc = main([*argv, "--n", "2", f"logging.cache_dir={tmp_path / 'cache'}", "eval.max_prompts=3"])
    assert rc == 0, capsys.readouterr().err
    assert len(eval_rows(out, "h")) == 3 * 2
    assert any((tmp_path / "cache" / "gguf").iterdir())  # converted once into the cache


def test_eval_cli_model_defaults_to_the_configs_model_path(tiny_model_dir, task_files, tmp_path):
    out = tmp_path / "out"
    argv = ["eval", "--data", f"h={task_files[1]}", "--out", str(out), "--n", "1"]
    user_model = [f"model.path={tiny_model_dir}", "data.allow_embedded_task_with_user_model=true"]
    assert main([*argv, *user_model, "eval.max_prompts=2"]) == 0
    assert len(eval_rows(out, "h")) == 2


def test_eval_cli_held_out_is_the_embedded_tasks_held_out_split(tiny_model_dir, tmp_path):
    """The default config trains on the embedded task: ``--data held_out`` evaluates that task's
    held-out file (written into the cache on first use), not its training file."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    argv = ["eval", "--model", str(tiny_model_dir), "--data", "held_out", "--out", str(out)]
    task = ["data.synthetic.num_train=6", "data.synthetic.num_eval=3", f"logging.cache_dir={cache}"]
    assert main([*argv, *task, "--n", "1", "--max-new-tokens", "4"]) == 0
    (held_out,) = cache.rglob("eval.jsonl")
    golds = [json.loads(line)["gt_answer"] for line in held_out.read_text().splitlines()]
    assert len(golds) == 3
    assert [r["gold"] for r in eval_rows(out, "held_out")] == golds


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", "/nowhere/model"], "--model='/nowhere/model' does not exist; give a local"),
        (
            ["model.path=/nowhere/model", "data.allow_embedded_task_with_user_model=true"],
            "model.path='/nowhere/model' does not exist",
        ),
        (["--model", "/nowhere/model.gguf"], "--model='/nowhere/model.gguf': no such GGUF file"),
    ],
)
def test_eval_cli_names_a_bad_model(argv, needle, task_files, capsys):
    assert main(["eval", "--data", str(task_files[1]), *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1
