"""What a run starts from, prepared before its run directory is claimed: the model, tokenizer
and dataset locations (:mod:`zbrl.assembly.artifacts`), every prompt encoded (or found in the
prompt cache), the number of steps, and where the workers start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zbrl.config import RunConfig
from zbrl.errors import RunError
from zbrl.launch.cpu_features import slow_bf16_notice
from zbrl.launch.steps import planned_steps, steps_notice
from zbrl.training.checkpoint import Checkpoint

if TYPE_CHECKING:
    from zbrl.assembly.artifacts import Artifacts, RunSources
    from zbrl.launch.spawn import StartPoint
    from zbrl.types import EncodedPrompt


@dataclass(frozen=True)
class RunInputs:
    """What the workers start from, all prepared before the run directory is claimed."""

    artifacts: Artifacts
    """Model, tokenizer and dataset locations."""
    train_prompts: list[EncodedPrompt]
    """Every training prompt, encoded with the chat template."""
    eval_sets: dict[str, list[EncodedPrompt]]
    """Every eval set's prompts, encoded."""
    total_steps: int
    """Train steps the run will take."""
    start: StartPoint
    """Weights and version the workers start from."""
    buffer_state: dict[str, Any] | None
    """The rollout buffer's state to restore (a resumed run), else None."""
    resume: Checkpoint | None
    """The checkpoint a resumed run continues from, else None."""


def prepare_inputs(cfg: RunConfig, resume: Checkpoint | None, sources: RunSources) -> RunInputs:
    """The second half of the build: build or fetch the model, load and encode every dataset,
    count the steps, from what the pre-flight opened (``sources``,
    :func:`zbrl.launch.preflight.preflight`)."""
    from zbrl.assembly.artifacts import prepare_artifacts

    artifacts = prepare_artifacts(cfg, sources)  # transformers quietened where it is imported
    tokenizer = check_built_model(cfg, artifacts, sources.model.tokenizer)
    train_prompts, eval_sets = encode_datasets(cfg, artifacts, tokenizer)
    total_steps = planned_steps(cfg, len(train_prompts))
    for notice in (steps_notice(cfg, len(train_prompts)), slow_bf16_notice(cfg)):
        if notice is not None:
            print(notice, flush=True)
    start, buffer_state = start_point(artifacts, resume)
    return RunInputs(artifacts, train_prompts, eval_sets, total_steps, start, buffer_state, resume)


def check_built_model(cfg: RunConfig, artifacts: Artifacts, tokenizer: Any) -> Any:
    """The checks that need the model directory (the embedded model's exists only now): the
    chat template renders the environment's messages (``environment.message_role``, prefix
    preservation) and ``model.lora.target_modules`` match the model. Returns the tokenizer when
    it had to be loaded for them (else ``tokenizer``, possibly None: loaded when needed)."""
    if cfg.environment is not None:
        from zbrl.assembly.environments import check_episode_template

        if tokenizer is None:
            from zbrl.assembly.model_source import load_tokenizer

            tokenizer = load_tokenizer(cfg, artifacts.tokenizer_dir)
        check_episode_template(cfg, tokenizer)
    if cfg.model.lora is not None:
        from zbrl.models import lora

        base_dir = artifacts.model_dir
        if lora.is_adapter_dir(base_dir):  # a LoRA checkpoint as model.path
            base_dir = lora.base_dir_of(base_dir)
        lora.check_targets(base_dir, cfg.model.lora, trust_remote_code=cfg.model.trust_remote_code)
    return tokenizer


def start_point(
    artifacts: Artifacts, resume: Checkpoint | None
) -> tuple[StartPoint, dict[str, Any] | None]:
    """Where the workers start, and the buffer state to restore (None for a fresh run); a
    consumer restart starts the same way (:func:`zbrl.launch.spawn.checkpoint_start`)."""
    from zbrl.launch.spawn import checkpoint_start

    return checkpoint_start(artifacts, resume)


def encode_datasets(
    cfg: RunConfig, artifacts: Artifacts, opened_tokenizer: Any = None
) -> tuple[list[EncodedPrompt], dict[str, list[EncodedPrompt]]]:
    """Every prompt of the training set and of each eval set, encoded with the chat template; a
    RunError or DatasetError naming the set when one cannot be. Prompts encoded by an earlier
    start from the same files and settings come from the cache
    (:mod:`zbrl.assembly.prompt_cache`). ``opened_tokenizer``: the tokenizer the pre-flight
    loaded (None: loaded here on first use)."""
    from zbrl.assembly import prompt_cache

    key = prompt_cache.cache_key(cfg, artifacts)
    cached = prompt_cache.load(cfg, key) if key is not None else None
    # loaded on first use: not at all when every set is cached
    tokenizer: list[Any] = [] if opened_tokenizer is None else [opened_tokenizer]

    def encoded(ref: Any, limit: int | None, field: str, hit: Any) -> Any:
        if hit is not None:
            return hit
        if not tokenizer:
            from zbrl.assembly.model_source import load_tokenizer
            from zbrl.models.quiet import quiet_transformers

            quiet_transformers()
            tokenizer.append(load_tokenizer(cfg, artifacts.tokenizer_dir))
        return _encode(ref, cfg, tokenizer[0], limit, field)

    hits = cached or (None, {})
    train, stats = encoded(artifacts.train_path, cfg.data.max_prompts, "data.train_path", hits[0])
    print(
        f"[zbrl] train prompts: {len(train)} (dropped {stats['dropped']}, truncated "
        f"{stats['truncated']}, skipped lines {stats['skipped_lines']})",
        flush=True,
    )
    check_prompts_left(train, stats, "data.train_path", artifacts.train_path, cfg)
    evals, encoded_evals = {}, {}
    for name, ref in artifacts.eval_paths.items():
        field = f"eval.sets.{name}"
        hit = hits[1].get(name)
        encoded_evals[name] = encoded(ref, cfg.eval.max_prompts, field, hit)
        evals[name], eval_stats = encoded_evals[name]
        check_prompts_left(evals[name], eval_stats, field, ref, cfg)
    if key is not None and cached is None:
        prompt_cache.save(cfg, key, (train, stats), encoded_evals)
    return train, evals


def _encode(
    ref: Any, cfg: RunConfig, tokenizer: Any, limit: int | None, field: str
) -> tuple[list[EncodedPrompt], dict[str, Any]]:
    """:func:`encode_prompts`, with a chat template that rejects a prompt (a system message or a
    role it does not take) reported as the user's input, not as a traceback."""
    from jinja2 import TemplateError

    from zbrl.assembly.datasets import encode_prompts

    try:
        return encode_prompts(ref, cfg, tokenizer, limit=limit)
    except TemplateError as exc:
        raise RunError(
            f"{field}: the chat template rejects a prompt of {ref} ({type(exc).__name__}: "
            f"{exc}); if it takes no system message, set data.system_prompt='' (the reward's "
            "default system prompt is added otherwise), or give a template that takes these "
            "conversations (model.chat_template)"
        ) from None


def check_prompts_left(
    prompts: list[EncodedPrompt], stats: dict[str, Any], field: str, where: Any, cfg: RunConfig
) -> None:
    """A RunError when encoding left a set without prompts (a run would wait for them forever)."""
    if prompts:
        return
    dropped = stats["dropped"]
    why = (
        f"all {dropped} were longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens} "
        "with the chat template applied: raise it, or set data.overlong_prompt=left_truncate"
        if dropped
        else "it holds no prompts (an empty file, or every line skipped): give it some"
    )
    raise RunError(f"{field}: no prompts are left in {where}: {why}")
