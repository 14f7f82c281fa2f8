"""How responses are scored: the primary reward is a discriminated union on ``type``; each
variant holds exactly the options its reward uses, so an option that does not apply is refused."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from zbrl.config.base import Section
from zbrl.config.plugin import check_import_path, plugin_union


class SandboxConfig(Section):
    """Limits of the local code sandbox used by the ``code`` reward."""

    timeout_s: float = Field(default=5.0, gt=0)
    """Wall-clock limit of one test case."""
    memory_mb: int = Field(default=512, ge=64)
    """Address-space limit of a candidate program, MiB (at least 64: the interpreter needs it)."""
    max_workers: int = Field(default=2, ge=1)
    """Candidate programs run in parallel."""
    backend: Literal["auto", "bwrap", "rlimits"] = "auto"
    """``bwrap``: namespaces (no network, read-only system, throwaway directory; an error when
    bubblewrap does not work here); ``rlimits``: resource limits and an audit hook only;
    ``auto``: bwrap when it works, else rlimits with a warning (docs/sandbox.md)."""


class ExtraReward(Section):
    """An additional reward combined with the primary one."""

    type: str
    """Registered reward name or ``package.module:function``."""
    weight: float = 1.0
    """Weight of this reward in the sum."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options passed to the reward's constructor (checked when the reward is built)."""


class RewardBase(Section):
    """What every reward variant has."""

    extra: list[ExtraReward] = Field(default_factory=list)
    """Further rewards added with weights: a registered reward (``think_answer_tags``, ``boxed``,
    ``last_number``, ``reasoning_gym``, ``code``, ``http``, ``reward_model`` from a local
    directory) with its constructor options, or a user function ``package.module:function``."""


class LengthShapingOptions(RewardBase):
    """DAPO's soft overlong punishment, for the rewards that apply it."""

    soft_overlong_punishment: bool = False
    """DAPO soft overlong punishment over the last ``cache_length`` tokens of the budget."""
    cache_length: int | None = Field(default=None, ge=1)
    """Length of the punishment zone; None means min(1024, max_new_tokens // 4)."""
    overlong_penalty: float = Field(default=1.0, ge=0)
    """Largest soft overlong penalty (reached at the generation limit)."""
    truncated_penalty: float | None = None
    """Penalty added to a truncated response when shaping is on; None means ``-overlong_penalty``.
    Must be <= -overlong_penalty so truncation never beats a response just under the limit."""


class AnswerScoreOptions(LengthShapingOptions):
    """Options shared by the rewards that score one extracted answer."""

    correct_reward: float = 1.0
    """Reward of a correct answer with valid format."""
    wrong_reward: float = 0.0
    """Reward of a wrong or unformatted answer."""
    timeout_s: float = Field(default=5.0, gt=0)
    """Deadline of one answer check (math_verify, or the task's scorer) in a killable worker.
    Past it math_verify gives no verdict and the normalised string match alone decides (a
    matching answer is still credited); a reasoning-gym scorer past it scores the answer wrong."""


class MathRewardOptions(AnswerScoreOptions):
    """Options shared by the tag-based math-answer rewards."""

    format_tags: list[str] | None = None
    """Tags the format check requires; None uses the reward type's own."""


class ThinkAnswerTagsReward(MathRewardOptions):
    """``<think>…</think><answer>…</answer>``, the answer compared with ``gt_answer``."""

    type: Literal["think_answer_tags"] = "think_answer_tags"
    """Reward discriminator."""


class BoxedReward(MathRewardOptions):
    """The last ``\\boxed{…}`` compared with ``gt_answer``."""

    type: Literal["boxed"] = "boxed"
    """Reward discriminator."""


class LastNumberReward(AnswerScoreOptions):
    """The last number in the response compared with ``gt_answer`` (math_verify)."""

    type: Literal["last_number"] = "last_number"
    """Reward discriminator."""


Extraction = Literal["full", "last_number", "answer_tags", "boxed"]
"""How the answer is taken from a response (``zbrl.rewards.extraction``)."""


class ReasoningGymReward(AnswerScoreOptions):
    """A reasoning-gym problem scored by its task's own ``score_answer`` (needs
    ``data.source.type: reasoning_gym``)."""

    type: Literal["reasoning_gym"] = "reasoning_gym"
    """Reward discriminator."""
    extract: Extraction = "answer_tags"
    """What of the response is the answer: ``full`` (the whole response, stripped),
    ``last_number``, ``answer_tags`` (the last ``<answer>…</answer>``) or ``boxed`` (the last
    ``\\boxed{}``). The default system prompt asks for that format."""


class CodeReward(LengthShapingOptions):
    """The last ```` ```python ```` block run against ``test_cases`` in the local sandbox."""

    type: Literal["code"] = "code"
    """Reward discriminator."""
    correct_reward: float = Field(default=1.0, ge=0)
    """Reward when every test passes (with valid format); 0 otherwise."""
    partial_credit: bool = False
    """Give ``correct_reward`` × the fraction of tests passed instead of all-or-nothing."""
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    """Code sandbox limits."""


Verifier = Literal["think_answer_tags", "boxed", "last_number"]
"""A verifiable reward that a learned or remote reward may name for accuracy metrics."""


class LearnedRewardBase(RewardBase):
    """What the rewards that are not checked against an answer share (reward model, LLM judge,
    HTTP service)."""

    verifier: Verifier | None = None
    """A verifiable reward (with its default options) that sets the accuracy metrics
    (``format_acc``, ``ans_acc``) of training rollouts and scores every evaluation, so that
    evaluations report true accuracy; the training reward stays this reward's score alone.
    None: accuracy is this reward's score clipped to [0, 1], and evaluations use it too."""

    REMOVED_FIELDS: ClassVar[dict[str, str]] = {
        "failure_reward": "a response whose reward failed (deadline missed, service or worker "
        "failed, verdict not parsed) is no longer given a reward: its group is dropped from the "
        "batch and counted (reward_failed); delete the field (docs/rewards.md, 'When a reward "
        "fails')"
    }
    """Fields this reward no longer has, with what to do instead (the config loader's message)."""


class RewardModelReward(LearnedRewardBase):
    """A sequence-classification model (``AutoModelForSequenceClassification``) that scores
    (prompt, response), in batches, in the producer or on reward workers placed by Ray."""

    type: Literal["reward_model"] = "reward_model"
    """Reward discriminator."""
    path: str
    """The reward model: a local model directory, a ``.gguf`` file, a pulled model's name or a
    Hugging Face Hub id (resolved as ``model.path`` is); ``embedded``: a tiny classifier trained
    (once, cached) on the embedded policy's sampled answers to the addition task
    (``zbrl.embedded.reward_model``)."""
    tokenizer_path: str | None = None
    """Its tokenizer, when not in ``path``'s directory."""
    batch_size: int = Field(default=16, ge=1)
    """(prompt, response) pairs per forward pass."""
    max_length: int = Field(default=512, ge=8)
    """Longest tokenized pair; longer pairs keep their end (the response)."""
    normalize: Literal["none", "sigmoid"] = "sigmoid"
    """``sigmoid``: the reward is sigmoid(logit) in (0, 1) (one-logit models) or the
    probability of the last label (several logits); ``none``: the raw last logit."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Deadline of scoring one batch of responses; past it the batch has no score and its groups
    are dropped (``reward_failed``)."""
    workers: int = Field(default=0, ge=0)
    """Reward-worker actors placed by Ray that the producers send their batches to; 0 scores
    inside each producer's own process."""
    worker_num_cpus: float = Field(default=1.0, ge=0)
    """CPUs reserved by each reward worker."""
    worker_num_gpus: float = Field(default=0.0, ge=0)
    """GPUs reserved by each reward worker (fractions share a GPU); the model goes on the GPU
    when this is above 0."""
    worker_max_restarts: int = Field(default=3, ge=0)
    """Ray restarts a reward worker whose process dies up to this many times (per worker);
    batches sent while it restarts have no score (their groups are dropped). A worker that dies
    past its budget ends the run with an error naming it."""


class LlmJudgeReward(LearnedRewardBase):
    """A generative judge: a causal LM asked, through a prompt template, to grade the response;
    the verdict is parsed from its answer."""

    type: Literal["llm_judge"] = "llm_judge"
    """Reward discriminator."""
    path: str
    """The judge, a causal LM with a chat template: a local model directory, a ``.gguf`` file, a
    pulled model's name or a Hugging Face Hub id (resolved as ``model.path`` is)."""
    template: str = (
        "Grade the answer to the question. Question: {prompt}\nAnswer: {response}\n"
        "Reply with a score between 0 and 1."
    )
    """The judge's user message; ``{prompt}``, ``{response}`` and ``{answer}`` (the row's
    ``gt_answer``, empty when absent) are filled in."""
    parser: str = "last_number"
    """How the verdict is read: ``last_number`` (the last number in the judge's reply, which must
    lie in [0, 1]) or a regular expression whose first group is that number."""
    max_new_tokens: int = Field(default=32, ge=1)
    """The judge's generation budget."""
    batch_size: int = Field(default=8, ge=1)
    """Responses judged per generate call."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Deadline of judging one batch of responses; past it the batch has no score and its groups
    are dropped (``reward_failed``)."""


class HttpReward(LearnedRewardBase):
    """A remote reward service: batches of (prompt, response) POSTed as JSON to ``url``."""

    type: Literal["http"] = "http"
    """Reward discriminator."""
    url: str
    """The service's endpoint (``http://`` or ``https://``); it receives ``{"items": [{"prompt",
    "response", "gt_answer", "fields"}, ...]}`` and answers ``{"rewards": [number, ...]}``."""
    batch_size: int = Field(default=32, ge=1)
    """Responses per request."""
    max_concurrency: int = Field(default=4, ge=1)
    """Requests in flight at once, per producer."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Deadline of scoring one batch of responses: a request that fails with a connection error,
    a timeout, HTTP 5xx or 429 is tried again until then; past it its responses have no score
    and their groups are dropped (``reward_failed``)."""
    backoff_s: float = Field(default=0.25, gt=0)
    """First retry's wait; each further retry waits twice as long, up to ``max_backoff_s``."""
    max_backoff_s: float = Field(default=4.0, gt=0)
    """Longest wait between two tries of a request."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra request headers (e.g. an ``Authorization`` header)."""
    check_at_start: bool = True
    """Pre-flight: one request with an empty batch must succeed before the run starts (a clear
    error naming the URL when the service is down)."""

    REMOVED_FIELDS: ClassVar[dict[str, str]] = {
        **LearnedRewardBase.REMOVED_FIELDS,
        "retries": "a failed request is tried again until the batch's deadline (reward.timeout_s), "
        "waiting from reward.backoff_s up to reward.max_backoff_s between tries; delete the "
        "field and set reward.timeout_s instead",
    }

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value


class UserReward(RewardBase):
    """A user reward ``fn(response, example, ctx, **options)`` (or a reward class) by import
    path."""

    type: str
    """``package.module:function`` (or ``package.module:RewardClass``)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options passed to the function on every call (or to the class)."""
    answer_field: Literal["gt_answer", "test_cases", "none"] = "gt_answer"
    """The dataset field the reward scores against (checked on every line when loading);
    ``none``: the reward needs no answer (open-ended prompts: lines without ``gt_answer`` load,
    and a line's ``gt_answer``, when it has one, still reaches the reward)."""
    timeout_s: float | None = Field(default=30.0, gt=0)
    """Deadline of one call: a call that takes longer scores as failed (reward 0, with a warning
    and the ``reward_timeouts`` metric); None runs it in-process without a deadline."""

    _check_type = field_validator("type")(classmethod(lambda cls, v: check_import_path(v)))


RewardConfig = plugin_union(
    ThinkAnswerTagsReward,
    BoxedReward,
    LastNumberReward,
    ReasoningGymReward,
    CodeReward,
    RewardModelReward,
    LlmJudgeReward,
    HttpReward,
    UserReward,
)
"""The primary reward: ``think_answer_tags``, ``boxed``, ``last_number``, ``reasoning_gym``,
``code``, ``reward_model``, ``llm_judge``, ``http`` or ``package.module:function``."""
