"""The run's reward function from ``RunConfig.reward``: the primary reward built from its typed
variant (every option of the variant reaches the reward), plus weighted extra rewards.

Also what the dataset needs from the reward: the answer field it scores against and its default
system prompt, both owned by the reward class.
"""

from __future__ import annotations

from typing import Any

from zbrl.assembly.embedded import check_embedded_reward_model, embedded_reward_model_dir
from zbrl.config import (
    EMBEDDED,
    CodeReward,
    ConfigError,
    HttpReward,
    LearnedRewardBase,
    LengthShapingOptions,
    LlmJudgeReward,
    MathRewardOptions,
    ReasoningGymReward,
    ReasoningGymSource,
    RewardModelReward,
    RunConfig,
    UserReward,
)
from zbrl.rewards import CombinedReward, LengthShaping, build_reward, build_user_reward
from zbrl.rewards.answers import ANSWER_SPECS, OPTIONAL_GT_ANSWER, AnswerSpec
from zbrl.rewards.base import RewardFunction
from zbrl.rewards.registry import lookup_reward


def build_reward_fn(cfg: RunConfig, *, scorer: Any = None) -> RewardFunction:
    """The primary reward with its options, plus weighted extra rewards.

    ``scorer``: for ``reward.type: reward_model``, the client of the run's reward workers (None:
    the model is loaded in this process). Raises a clear error for an import path that does not
    import, options a reward does not take, or an unknown extra reward, so ``zbrl validate`` and
    the start of ``zbrl train`` catch them.
    """
    rw = cfg.reward
    primary = _primary(cfg, scorer)
    if not rw.extra:
        return primary
    parts: list[tuple[RewardFunction, float]] = [(primary, 1.0)]
    parts += [(build_reward(e.type, **e.options), e.weight) for e in rw.extra]
    return CombinedReward(parts)


def check_reward(cfg: RunConfig) -> None:
    """Build the reward once, so that a reward that cannot be built (an unknown extra reward, an
    import path that does not import, options it does not take) fails before any work starts,
    as a :class:`~zbrl.config.ConfigError` naming ``reward``."""
    rw = cfg.reward
    try:
        _check_extra_models(rw.extra)
        if isinstance(rw, LearnedRewardBase):
            _check_learned(cfg)
            if rw.extra:
                build_reward_fn(cfg.model_copy(update={"reward": _verifiable_stand_in(rw)}))
        else:
            built = rw.model_copy(update={"extra": _built_extras(rw.extra)})
            build_reward_fn(cfg.model_copy(update={"reward": built}))
    except (ImportError, KeyError, TypeError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ConfigError(f"reward: {message}") from exc


def build_eval_reward_fn(cfg: RunConfig) -> RewardFunction:
    """What evaluations score with: a learned or remote reward's ``verifier`` when it names one
    (true accuracy), else the training reward."""
    rw = cfg.reward
    if isinstance(rw, LearnedRewardBase) and rw.verifier is not None:
        return build_reward(rw.verifier)
    return build_reward_fn(cfg)


def _verifiable_stand_in(rw: LearnedRewardBase) -> Any:
    from zbrl.config import ThinkAnswerTagsReward

    return ThinkAnswerTagsReward(extra=_built_extras(rw.extra))


MODEL_EXTRAS = ("reward_model",)
"""Extra rewards that load a model when built: the pre-flight checks their ``path`` and options
(:func:`_check_extra_models`) instead of loading it."""


def _built_extras(extra: list[Any]) -> list[Any]:
    """The extra rewards the pre-flight builds: all but those that load a model."""
    return [e for e in extra if e.type not in MODEL_EXTRAS]


def _check_extra_models(extra: list[Any]) -> None:
    """An extra reward model's options fit it and its ``path`` is a local model directory with
    a tokenizer (a RunError naming ``reward.extra[i].options.path`` otherwise), without loading
    it."""
    import inspect
    from pathlib import Path

    from zbrl.errors import RunError
    from zbrl.models.sources import check_model_dir, check_tokenizer_dir

    for i, e in enumerate(extra):
        if e.type not in MODEL_EXTRAS:
            continue
        signature = inspect.signature(lookup_reward(e.type))
        try:
            signature.bind(**e.options)
        except TypeError as exc:
            accepted = [p.name for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
            raise TypeError(
                f"extra[{i}]: reward {e.type!r} cannot take options {sorted(e.options)}: {exc}; "
                f"it accepts: {', '.join(accepted)}"
            ) from None
        for name in [n for n in ("path", "tokenizer_path") if e.options.get(n) is not None]:
            spec = e.options[name]
            field, directory = f"reward.extra[{i}].options.{name}", Path(str(spec)).expanduser()
            if not directory.exists():
                raise RunError(
                    f"{field}={spec!r} does not exist; an extra reward model loads from a local "
                    "model directory (config.json, weights and tokenizer files)"
                )
            if name == "path":
                check_model_dir(directory, field=field, spec=str(spec))
            if name == "tokenizer_path" or "tokenizer_path" not in e.options:
                check_tokenizer_dir(directory, field=field, spec=str(spec))


def _check_learned(cfg: RunConfig) -> None:
    """Pre-flight of a reward model, judge or service without loading a model: the model
    resolves to a directory with weights; the HTTP service answers (``check_at_start``)."""
    from zbrl.errors import RunError

    rw = cfg.reward
    if isinstance(rw, HttpReward):
        if rw.check_at_start:
            from zbrl.rewards.http import RemoteRewardError

            reward = _http(rw, None)
            try:
                reward.check()
            except RemoteRewardError as exc:
                raise RunError(f"reward.url: {exc}") from None
            finally:
                reward.close()
        return
    from zbrl.models.sources import check_model_dir

    assert isinstance(rw, (RewardModelReward, LlmJudgeReward))
    if rw.path == EMBEDDED:
        check_embedded_reward_model(cfg)
        return
    check_model_dir(_learned_dir(cfg, rw.path, "reward.path"), field="reward.path", spec=rw.path)
    if isinstance(rw, LlmJudgeReward):
        from zbrl.rewards.llm_judge import check_template, verdict_parser

        check_template(rw.template)
        verdict_parser(rw.parser)


def _learned_dir(cfg: RunConfig, spec: str, field: str) -> Any:
    from zbrl.models.sources import resolve

    if spec == EMBEDDED:
        return embedded_reward_model_dir(cfg, verbose=False)
    return resolve(spec, cfg.logging.cache_dir, field=field, verbose=False)


def _http(rw: HttpReward, verifier: RewardFunction | None) -> Any:
    from zbrl.rewards.http import RemoteHttpReward

    return RemoteHttpReward(
        rw.url,
        batch_size=rw.batch_size,
        max_concurrency=rw.max_concurrency,
        timeout_s=rw.timeout_s,
        backoff_s=rw.backoff_s,
        max_backoff_s=rw.max_backoff_s,
        headers=rw.headers,
        verifier=verifier,
    )


def learned_reward_placement(cfg: RunConfig) -> tuple[str, Any]:
    """(device, torch dtype) of a reward model or judge in a producer's (or the evaluator's)
    process: the producer's device (``training.device``; ``auto``: CUDA when there is one) in the
    inference dtype (``rollout.inference_dtype``), as the policy generates there."""
    from zbrl.assembly.models import device_of, inference_dtype

    return str(device_of(cfg)), inference_dtype(cfg)


def reward_model_scorer(cfg: RunConfig, *, device: str | None = None, dtype: Any = None) -> Any:
    """The configured reward model loaded in this process (a producer's, or a reward worker's):
    on ``device`` in ``dtype``, by default :func:`learned_reward_placement`'s."""
    from zbrl.rewards.reward_model import RewardModelScorer

    if device is None or dtype is None:
        here, inference = learned_reward_placement(cfg)
        device = device if device is not None else here
        dtype = dtype if dtype is not None else inference
    rw = cfg.reward
    assert isinstance(rw, RewardModelReward)
    tokenizer = rw.tokenizer_path
    return RewardModelScorer(
        _learned_dir(cfg, rw.path, "reward.path"),
        tokenizer_dir=_learned_dir(cfg, tokenizer, "reward.tokenizer_path") if tokenizer else None,
        batch_size=rw.batch_size,
        max_length=rw.max_length,
        normalize=rw.normalize,
        device=device,
        dtype=dtype,
    )


def _learned(cfg: RunConfig, scorer: Any) -> RewardFunction:
    rw = cfg.reward
    assert isinstance(rw, LearnedRewardBase)
    verifier = build_reward(rw.verifier) if rw.verifier is not None else None
    if isinstance(rw, HttpReward):
        return _http(rw, verifier)
    if isinstance(rw, RewardModelReward):
        from zbrl.rewards.reward_model import ClassifierReward

        return ClassifierReward(
            scorer if scorer is not None else reward_model_scorer(cfg),
            timeout_s=rw.timeout_s,
            verifier=verifier,
        )
    assert isinstance(rw, LlmJudgeReward)
    return _judge(cfg, rw, verifier)


def _judge(cfg: RunConfig, rw: LlmJudgeReward, verifier: RewardFunction | None) -> RewardFunction:
    """The judge on the producer's device in the inference dtype
    (:func:`learned_reward_placement`), generating through the transformers backend (also in a
    vLLM run: a second vLLM engine in the producer's process would take its own share of GPU
    memory beside the policy's engine; docs/rewards.md)."""
    from zbrl.assembly.models import load_policy, load_tokenizer
    from zbrl.rewards.llm_judge import JudgeReward
    from zbrl.rollout.backends.base import SamplingParams
    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    judge_dir = _learned_dir(cfg, rw.path, "reward.path")
    tokenizer = load_tokenizer(cfg.model_copy(update={"model": cfg.model.model_copy(
        update={"chat_template": None, "tokenizer_path": None})}), judge_dir)  # fmt: skip
    device, dtype = learned_reward_placement(cfg)
    backend = TransformersBackend(load_policy(cfg, judge_dir, dtype), tokenizer, device=device)
    sampling = SamplingParams(
        n=1, temperature=0.0, top_p=1.0, top_k=-1, max_new_tokens=rw.max_new_tokens,
        stop_strings=(),
    )  # fmt: skip
    return JudgeReward(
        backend, tokenizer, sampling, template=rw.template, parser=rw.parser,
        batch_size=rw.batch_size, timeout_s=rw.timeout_s, verifier=verifier,
    )  # fmt: skip


def _primary(cfg: RunConfig, scorer: Any = None) -> RewardFunction:
    rw = cfg.reward
    if isinstance(rw, LearnedRewardBase):
        return _learned(cfg, scorer)
    if isinstance(rw, UserReward):
        return build_user_reward(rw.type, rw.options, timeout_s=rw.timeout_s)
    shaping = length_shaping(cfg)
    if isinstance(rw, CodeReward):
        from zbrl.sandbox import SandboxLimits

        return build_reward(
            rw.type,
            correct_reward=rw.correct_reward,
            partial_credit=rw.partial_credit,
            limits=SandboxLimits(
                timeout_s=rw.sandbox.timeout_s,
                memory_mb=rw.sandbox.memory_mb,
                backend=rw.sandbox.backend,
            ),
            max_workers=rw.sandbox.max_workers,
            length_shaping=shaping,
        )
    options: dict[str, Any] = {
        "correct_reward": rw.correct_reward,
        "wrong_reward": rw.wrong_reward,
        "length_shaping": shaping,
        "timeout_s": rw.timeout_s,
    }
    if isinstance(rw, MathRewardOptions) and rw.format_tags is not None:
        options["tags"] = tuple(rw.format_tags)
    if isinstance(rw, ReasoningGymReward):
        options["extract"] = rw.extract
        source = cfg.data.source
        if isinstance(source, ReasoningGymSource):  # score with the tasks' own configs
            options["tasks"] = [t.model_dump() for t in source.tasks]
    return build_reward(rw.type, **options)


def length_shaping(cfg: RunConfig) -> LengthShaping | None:
    rw = cfg.reward
    if not isinstance(rw, LengthShapingOptions) or not rw.soft_overlong_punishment:
        return None
    return LengthShaping(
        max_new_tokens=cfg.rollout.generation.max_new_tokens,
        cache_length=cfg.cache_length,
        max_penalty=rw.overlong_penalty,
        truncated_value=rw.truncated_penalty,
    )


def _reward_class(cfg: RunConfig) -> Any:
    """The built-in reward class of the configured variant (None for a user reward); a learned
    or remote reward's verifier's (None without one)."""
    rw = cfg.reward
    if isinstance(rw, LearnedRewardBase):
        return lookup_reward(rw.verifier) if rw.verifier is not None else None
    return None if isinstance(rw, UserReward) else lookup_reward(rw.type)


def answer_spec(cfg: RunConfig) -> AnswerSpec:
    """The dataset field the configured reward scores against, its ``needed_by`` naming the
    reward (the loader's error for a line without it); :data:`OPTIONAL_GT_ANSWER` when no reward
    needs an answer (a learned or remote reward without a verifier, a user reward with
    ``answer_field: none``, an environment that scores its episodes itself): open-ended prompts
    load then. An extra reward that needs an answer needs it on every line too."""
    rw = cfg.reward
    env = cfg.environment
    if env is not None and not env.score_final_turn:
        spec, who = OPTIONAL_GT_ANSWER, None  # the environment's turn rewards are the score
    elif isinstance(rw, LearnedRewardBase):
        if rw.verifier is not None:
            spec = lookup_reward(rw.verifier).answer
            who = f"reward.verifier {rw.verifier!r} (the accuracy metrics and evaluations)"
        else:
            spec, who = OPTIONAL_GT_ANSWER, None
    elif isinstance(rw, UserReward):
        if rw.answer_field == "none":
            spec, who = OPTIONAL_GT_ANSWER, None
        else:
            spec, who = ANSWER_SPECS[rw.answer_field], f"the reward {rw.type!r}"
    else:
        spec, who = lookup_reward(rw.type).answer, f"the reward {rw.type!r}"
    if who is None:
        for extra in rw.extra:
            cls = _registered(extra.type)
            answer = getattr(cls, "answer", None)
            if isinstance(answer, AnswerSpec) and answer.required:
                spec, who = answer, f"the extra reward {extra.type!r}"
                break
    return spec.needed_by_reward(who) if who is not None else spec


def _registered(name: str) -> Any:
    """The registered reward class (or factory) of ``name``; None for an import path."""
    if ":" in name:
        return None
    try:
        return lookup_reward(name)
    except KeyError:
        return None


def default_system_prompt(cfg: RunConfig) -> str | None:
    """The configured reward's own system prompt (None for a user reward); for the
    ``reasoning_gym`` reward, the prompt of its ``extract`` format."""
    if isinstance(cfg.reward, ReasoningGymReward):
        from zbrl.rewards.extraction import EXTRACTION_PROMPTS

        return EXTRACTION_PROMPTS[cfg.reward.extract]
    cls = _reward_class(cfg)
    return cls.system_prompt if cls is not None else None
