"""Multi-turn episodes: the environment the policy talks to between its turns
(docs/environments.md).

``environment`` is a plug-in union on ``type`` like the reward: the built-in ``tools`` environment
(the model calls tools, the results come back as the next message) or a user environment by
``package.module:Class``. Without an ``environment`` section a run is single-turn.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from zbrl.config.base import Section
from zbrl.config.plugin import as_plugin_dict, check_import_path, plugin_union


class EpisodeLimits(Section):
    """When an episode stops, whatever the environment says."""

    max_turns: int = Field(default=4, ge=1)
    """Model turns per episode at most; an episode whose last allowed turn still calls a tool
    ends there (counted in ``env/turn_limit``) and its final turn is scored as it is."""
    max_total_tokens: int = Field(default=1024, ge=2)
    """Tokens after the prompt at most (model and environment tokens together); a model turn is
    cut at the budget (the episode is then truncated, ``env/token_limit``) and an environment
    message that would not leave the model a token ends the episode."""
    tool_timeout_s: float = Field(default=5.0, gt=0)
    """Deadline of one tool call; past it the call is answered with an error
    (``env/tool_timeouts``)."""


class CalculatorTool(Section):
    """Arithmetic on numbers: ``+ - * / // % **`` and parentheses, evaluated without ``eval``."""

    type: Literal["calculator"] = "calculator"
    """Tool discriminator."""
    name: str = Field(default="calculator", min_length=1)
    """Name the model calls it by (``hermes``: ``{"name": ...}``; the argument is
    ``expression``)."""
    tag: str = Field(default="calc", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Tag of the ``tags`` format: ``<calc>12*34</calc>``."""
    description: str | None = Field(default=None, min_length=1)
    """What the model is told the tool does; None: the built-in description."""


class PythonTool(Section):
    """A Python program run in the code sandbox (zbrl.sandbox, docs/sandbox.md); its stdout
    (and the tail of its stderr on failure) is the result."""

    type: Literal["python"] = "python"
    """Tool discriminator."""
    name: str = Field(default="python", min_length=1)
    """Name the model calls it by (``hermes``: the argument is ``code``)."""
    tag: str = Field(default="python", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Tag of the ``tags`` format: ``<python>print(1)</python>``."""
    description: str | None = Field(default=None, min_length=1)
    """What the model is told the tool does; None: the built-in description."""
    memory_mb: int = Field(default=512, ge=64)
    """Address-space limit of the program."""
    backend: Literal["auto", "bwrap", "rlimits"] = "auto"
    """Sandbox backend (see ``reward.sandbox.backend``)."""


class UserTool(Section):
    """A tool class by import path: ``Class(**options)`` with ``name``, ``description``,
    ``parameters`` (the JSON schema of its arguments), ``tag``, ``argument`` and
    ``call(arguments: dict) -> str`` (docs/environments.md)."""

    type: str
    """``package.module:ToolClass``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options passed to the class."""
    description: str | None = Field(default=None, min_length=1)
    """What the model is told the tool does; None: the class's own ``description``."""

    _check_type = field_validator("type")(classmethod(lambda cls, v: check_import_path(v)))


ToolConfig = plugin_union(CalculatorTool, PythonTool, UserTool)
"""A tool: ``calculator``, ``python`` or ``package.module:ToolClass``."""


class EnvironmentBase(Section):
    """What every environment has."""

    limits: EpisodeLimits = Field(default_factory=EpisodeLimits)
    """Turn, token and tool-deadline limits."""
    message_role: str = Field(default="tool", min_length=1)
    """Chat role of the environment's messages, rendered through the model's chat template
    (``tool`` for templates that know it; ``user`` for the embedded model's)."""
    score_final_turn: bool = True
    """Score the last model turn with the run's ``reward`` (added to the environment's own turn
    rewards); False: the episode's reward is the environment's alone."""


class ToolsEnvironment(EnvironmentBase):
    """The model calls tools; each call's result is the next message; a turn without a call is
    the final answer (scored by the run's ``reward``)."""

    type: Literal["tools"] = "tools"
    """Environment discriminator."""
    tools: list[ToolConfig] = Field(default_factory=lambda: [CalculatorTool()], min_length=1)
    """The tools the model may call."""
    call_format: Literal["hermes", "tags"] = "hermes"
    """``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen, Hermes and
    most chat templates with tools); ``tags``: ``<TAG>argument</TAG>`` with each tool's ``tag``
    (models without a tool-call format, e.g. the embedded one)."""
    on_error: Literal["reply", "end"] = "reply"
    """A malformed call, an unknown tool or a failing tool: ``reply`` answers with an error
    message and the episode goes on; ``end`` ends the episode there. Both are counted."""
    max_result_chars: int = Field(default=1000, ge=16)
    """Longest tool result sent back; longer ones are cut with a note (``env/results_cut``)."""
    stop_after_call: bool = False
    """End a model turn as soon as it closes a call (the closing tag becomes a stop string);
    False: the turn ends at EOS as usual."""
    describe_tools: bool = True
    """Tell the model about its tools in every prompt: each tool's name, description and
    argument schema go to the chat template as ``tools=`` when it renders them (``hermes``
    only, e.g. Qwen2.5's template), else into a section of the system prompt that also shows
    the ``call_format`` (docs/environments.md, What the model is told). False: the prompts say
    nothing about the tools (the data or ``data.system_prompt`` must)."""

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_shorthand(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [as_plugin_dict(v, CalculatorTool) for v in value]
        return value


class UserEnvironment(EnvironmentBase):
    """An environment class by import path: ``Class(**options)`` with ``start(example)`` returning
    an episode whose ``step(model_text)`` gives the next message (docs/environments.md)."""

    type: str
    """``package.module:EnvironmentClass``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options passed to the class."""

    _check_type = field_validator("type")(classmethod(lambda cls, v: check_import_path(v)))


class AgentEndpoint(Section):
    """The OpenAI-compatible endpoint each producer (and the evaluator) serves to its agents
    (docs/agents.md)."""

    host: str = "127.0.0.1"
    """Interface to listen on (loopback unless the agents run elsewhere)."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port; 0 picks a free one (each producer and the evaluator listen on their own)."""
    batch_window_s: float = Field(default=0.02, ge=0)
    """Longest wait, after a backend batch's first call, for the other episodes' calls (a batch
    also closes as soon as every running episode has called)."""
    max_concurrency: int = Field(default=64, ge=1)
    """Calls per backend batch at most."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest a request waits for its completion (then it is answered 504)."""
    max_request_bytes: int = Field(default=4 * 2**20, ge=1024)
    """A request body larger than this is refused (413) before it is read."""


class EndpointEnvironment(EnvironmentBase):
    """What the environments that drive their episodes through the endpoint share (``agent`` and
    ``verifiers``, docs/agents.md)."""

    timeout_s: float = Field(default=300.0, gt=0)
    """Longest an episode may go without making a request or getting an answer (its agent
    hangs, or thinks too long between calls); past it a watchdog ends the episode, failed
    (``env/agent_timeouts``). Time a request waits for its answer does not count."""
    retries: int = Field(default=1, ge=0)
    """Times a failed episode (timeout, crash, malformed result, no call) is run again with a
    fresh agent before it counts as failed (``env/agent_retries``); a group with an episode that
    still fails is dropped whole."""
    endpoint: AgentEndpoint = Field(default_factory=AgentEndpoint)
    """Where and how the endpoint serves the agents."""
    embedded_tools: Literal["none", "calculator"] = "none"
    """On the embedded model: ``calculator`` takes the tool demo's task files and warm start
    (calculator traces in the ``tags`` format, ``<calc>…</calc>``), for an agent that calls a
    calculator that way; ``none``: the plain task's."""
    on_history_change: Literal["segment", "refuse"] = "segment"
    """A request whose history is not what the episode holds (a chat template that drops past
    reasoning, an agent that summarises or re-serialises its history): ``segment`` keeps what
    the episode generated so far as a trained segment and starts the next one from the request,
    rendered afresh (``env/segments``; every segment shares the episode's reward);
    ``refuse`` answers it 409 ``prefix_mismatch``."""


class AgentEnvironment(EndpointEnvironment):
    """A user's agent runs each episode against the endpoint (docs/agents.md): an async function
    ``run(client, example)`` given an ``openai.AsyncOpenAI`` client, or a program given
    ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``. What it returns is the episode's reward (a
    number) or its final answer (a string, scored by the run's ``reward``)."""

    type: Literal["agent"] = "agent"
    """Environment discriminator."""
    run: str | None = None
    """``package.module:function``: ``async def run(client, example) -> float | str``."""
    command: list[str] | None = None
    """A program (argv) run once per episode, the example as JSON on stdin; the last line of its
    stdout is its result as JSON (a number or a string)."""
    program_lifetime: Literal["episode", "run"] = "episode"
    """``episode``: ``command`` is started for each episode; ``run``: one process of it serves
    every episode of a producer, reading one line of JSON per episode on stdin (its key, the
    base URL, the example) and answering one line per episode on stdout (docs/agents.md)."""

    _check_run = field_validator("run")(
        classmethod(lambda cls, v: v if v is None else check_import_path(v))
    )

    @model_validator(mode="after")
    def _one_agent(self) -> AgentEnvironment:
        if (self.run is None) == (self.command is None):
            raise ValueError(
                "environment: an agent environment needs exactly one of `run` "
                "(package.module:function) or `command` (a program's argv)"
            )
        if self.program_lifetime == "run" and self.command is None:
            raise ValueError(
                "environment.program_lifetime: `run` is for an agent program (`command`); an "
                "agent function (`run`) already serves every episode in one process"
            )
        return self


class VerifiersEnvironment(EndpointEnvironment):
    """An environment of the ``verifiers`` package (``pip install 'zbrl[verifiers]'``,
    docs/agents.md): each sample becomes a task of its taskset, verifiers runs the episode
    through the endpoint and its task's rewards score it."""

    type: Literal["verifiers"] = "verifiers"
    """Environment discriminator."""
    taskset: str = Field(min_length=1)
    """The verifiers taskset: a module exporting its ``Taskset`` subclass in ``__all__``, by its
    name (installed or importable from the working directory; dotted names too) or by its
    ``.py`` file (e.g. next to the recipe, relative to the working directory)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Fields of the taskset's config (verifiers' ``TasksetConfig`` subclass)."""
    env: str = ""
    """The verifiers ``Env`` id; empty: the taskset's own, else verifiers' single-agent env."""
    harness: str = ""
    """The verifiers harness module (named as ``taskset`` is) that plays the policy; empty: the
    one the taskset bundles. It must call the model in process
    (``zbrl.rollout.agents.verifiers_harness.ChatHarness``): verifiers' program harnesses
    install their dependencies with ``uv`` from the network."""
    fields: dict[str, str] = Field(default_factory=lambda: {"answer": "gt_answer"})
    """Task data field <- dataset field: what each sample's task carries besides its prompt
    (the sample's ``messages``)."""


class OpenEnvEnvironment(EnvironmentBase):
    """An environment of the OpenEnv package (``pip install 'zbrl[openenv]'``,
    docs/environments.md): zbrl serves the OpenEnv ``Environment`` class on loopback in a
    subprocess of each producer (and of the evaluator), and each episode is one session of
    OpenEnv's own client: reset with the sample's fields, every model turn an action, every
    observation the next message, the observation's reward and ``done`` the turn's reward and
    the episode's end."""

    type: Literal["openenv"] = "openenv"
    """Environment discriminator."""
    server: str
    """``package.module:EnvironmentClass``: an OpenEnv ``Environment`` subclass, written as
    ``Environment[MyAction, MyObservation, MyState]`` (its action and observation classes are
    taken from there) with ``SUPPORTS_CONCURRENT_SESSIONS = True``; zbrl serves it with
    OpenEnv's ``create_fastapi_app`` (one session per running episode)."""
    reset_fields: dict[str, str] = Field(default_factory=dict)
    """Keyword argument of the environment's ``reset`` <- field of the sample (``gt_answer``,
    or ``fields.NAME`` for a data field); e.g. ``{target: gt_answer}``."""
    action_field: str = Field(default="message", min_length=1)
    """The action's field that receives the model's turn (its text)."""
    message_field: str = Field(default="message", min_length=1)
    """The observation's field whose text is the next message to the model (when ``render``
    is empty)."""
    render: str = ""
    """``package.module:function``, ``render(observation: dict) -> str``: the next message from
    a step's observation (its fields, as the client receives them); empty: the observation's
    ``message_field``."""
    max_sessions: int = Field(default=256, ge=1)
    """Sessions the server holds at once (OpenEnv's ``max_concurrent_envs``): at least the
    episodes a producer runs at a time (its prompts per batch times
    ``rollout.generation.num_generations``)."""
    start_timeout_s: float = Field(default=120.0, gt=0)
    """Longest wait for the server to answer after it is started."""
    step_timeout_s: float = Field(default=60.0, gt=0)
    """Longest wait for one reset or step; past it the episode fails (its group is dropped)."""
    score_final_turn: bool = False
    """Score the last model turn with the run's ``reward`` too (added to the environment's
    rewards); False (the default here): the episode's reward is the environment's alone."""

    @field_validator("server", "render")
    @classmethod
    def _import_paths(cls, value: str) -> str:
        return value if value == "" else check_import_path(value)


EnvironmentConfig = plugin_union(
    ToolsEnvironment, AgentEnvironment, VerifiersEnvironment, OpenEnvEnvironment, UserEnvironment
)
"""The environment of multi-turn episodes: ``tools``, ``agent``, ``verifiers``, ``openenv`` or
``package.module:Class``."""


def environment_shorthand(value: Any) -> Any:
    """``environment: tools`` means the default tools environment; None stays single-turn."""
    return None if value is None else as_plugin_dict(value, ToolsEnvironment)
