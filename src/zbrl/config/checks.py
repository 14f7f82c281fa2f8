"""Cross-section checks of a RunConfig: each a small named function whose error says the fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from zbrl.config.algorithm import (
    CORRECTIONS_WITH_PROXIMAL,
    GROUP_ESTIMATORS,
    GaeAdvantage,
    GspoLoss,
    ReinforcePPAdvantage,
)
from zbrl.config.data import HELD_OUT, DataConfig, HfSource, ReasoningGymSource
from zbrl.config.environments import EndpointEnvironment
from zbrl.config.model import EMBEDDED
from zbrl.config.rewards import LengthShapingOptions
from zbrl.config.rollout import lora_mode

if TYPE_CHECKING:
    from zbrl.config.algorithm import AlgorithmConfig
    from zbrl.config.environments import EnvironmentConfig
    from zbrl.config.evaluation import EvalConfig
    from zbrl.config.launch import LaunchConfig
    from zbrl.config.model import ModelConfig
    from zbrl.config.rewards import RewardConfig
    from zbrl.config.rollout import RolloutConfig
    from zbrl.config.training import TrainingConfig
    from zbrl.config.transport import TransportConfig


class RunSections(Protocol):
    """What the checks read of a run's config: its sections. :class:`zbrl.config.run.RunConfig`
    is one (it runs :data:`RUN_CHECKS` when it is validated); typing the checks against this
    protocol keeps this module below ``config.run`` instead of in an import circle with it."""

    @property
    def model(self) -> ModelConfig: ...
    @property
    def data(self) -> DataConfig: ...
    @property
    def reward(self) -> RewardConfig: ...
    @property
    def rollout(self) -> RolloutConfig: ...
    @property
    def algorithm(self) -> AlgorithmConfig: ...
    @property
    def training(self) -> TrainingConfig: ...
    @property
    def transport(self) -> TransportConfig: ...
    @property
    def launch(self) -> LaunchConfig: ...
    @property
    def eval(self) -> EvalConfig: ...
    @property
    def environment(self) -> EnvironmentConfig | None: ...


def check_train_batching(cfg: RunSections) -> None:
    t = cfg.training
    minibatch = t.train_minibatch_size or t.train_batch_size
    if t.train_batch_size % minibatch:
        raise ValueError(
            f"training.train_batch_size ({t.train_batch_size}) is not divisible by "
            f"training.train_minibatch_size ({minibatch}); pick a minibatch size that divides it"
        )
    rows = minibatch * cfg.rollout.generation.num_generations
    if t.train_microbatch_size > rows:
        raise ValueError(
            f"training.train_microbatch_size ({t.train_microbatch_size}) exceeds the sequences "
            "of "
            f"one optimizer step ({minibatch} groups x G={cfg.rollout.generation.num_generations}"
            f" = {rows}); lower it to at most {rows}"
        )
    if rows % t.train_microbatch_size:
        raise ValueError(
            f"the sequences of one optimizer step ({minibatch} groups x "
            f"G={cfg.rollout.generation.num_generations} = {rows}) are not divisible by "
            f"training.train_microbatch_size ({t.train_microbatch_size}); "
            f"choose a divisor of {rows}"
        )
    consumers = cfg.launch.num_consumers
    context = getattr(t.engine, "context_parallel_size", 1)
    if context > 1 and consumers % context == 0:  # groups of `context` consumers share a slice
        slices = consumers // context
        if t.train_batch_size % slices:
            raise ValueError(
                f"training.train_batch_size ({t.train_batch_size}) is not divisible by the "
                f"{slices} data-parallel slices (launch.num_consumers={consumers} / "
                f"training.engine.context_parallel_size={context}); each slice trains an equal "
                f"part of every step's batch: pick a train_batch_size that is a multiple of "
                f"{slices}"
            )
    elif t.train_batch_size % consumers:
        raise ValueError(
            f"training.train_batch_size ({t.train_batch_size}) is not divisible by "
            f"launch.num_consumers ({consumers}); each consumer trains an equal slice of every "
            f"step's batch: pick a train_batch_size that is a multiple of {consumers}"
        )


def check_inference_batching(cfg: RunSections) -> None:
    r = cfg.rollout
    if r.inference_batch_size % r.inference_microbatch_size:
        raise ValueError(
            f"rollout.inference_batch_size ({r.inference_batch_size}) is not divisible by "
            f"rollout.inference_microbatch_size ({r.inference_microbatch_size}); "
            "choose a micro-batch size that divides it"
        )


def check_group_size(cfg: RunSections) -> None:
    g = cfg.rollout.generation.num_generations
    a = cfg.algorithm
    needs_group = a.advantage.type in GROUP_ESTIMATORS or (
        isinstance(a.advantage, ReinforcePPAdvantage) and a.advantage.group_baseline
    )
    if g < 2 and needs_group:
        raise ValueError(
            f"algorithm.advantage.type={a.advantage.type!r} compares completions within a group, "
            f"but rollout.generation.num_generations is {g}: every advantage would be 0. Set "
            "num_generations >= 2, or use algorithm.advantage={type: reinforce_pp, "
            "group_baseline: false}"
        )


def check_length_shaping(cfg: RunSections) -> None:
    rw = cfg.reward
    budget = cfg.rollout.generation.max_new_tokens
    if not isinstance(rw, LengthShapingOptions) or not rw.soft_overlong_punishment:
        return
    if rw.cache_length is not None and rw.cache_length >= budget:
        raise ValueError(
            f"reward.cache_length ({rw.cache_length}) must be smaller than "
            f"rollout.generation.max_new_tokens ({budget}); DAPO uses min(1024, max_new_tokens/4)"
        )
    floor = -rw.overlong_penalty
    if rw.truncated_penalty is not None and rw.truncated_penalty > floor:
        raise ValueError(
            f"reward.truncated_penalty ({rw.truncated_penalty}) would score a truncated response "
            f"better than one just under the limit (penalty {floor}); set it to at most {floor}"
        )


def check_topology(cfg: RunSections) -> None:
    la = cfg.launch
    backend = cfg.rollout.backend
    tp = backend.tensor_parallel_size if backend.capabilities.tensor_parallel else 1
    if tp > 1 and la.producer_num_gpus < tp:
        raise ValueError(
            f"rollout.backend.tensor_parallel_size ({tp}) needs as many GPUs per producer; "
            f"launch.producer_num_gpus is {la.producer_num_gpus}: raise it or set "
            "tensor_parallel_size=1"
        )


def check_model_len(cfg: RunSections) -> None:
    backend = cfg.rollout.backend
    budget = cfg.rollout.generation.max_new_tokens
    limit = backend.max_model_len if backend.capabilities.max_model_len else None
    if limit is not None and limit <= budget:
        raise ValueError(
            f"rollout.backend.max_model_len ({limit}) leaves no room for a prompt next to "
            f"rollout.generation.max_new_tokens ({budget}); raise it above the longest prompt "
            "plus max_new_tokens, or leave it null (the model's length)"
        )


def check_evaluator_placement(cfg: RunSections) -> None:
    backend = cfg.rollout.backend
    needs_gpu = backend.capabilities.needs_gpu_in_gpu_runs
    if needs_gpu and cfg.launch.producer_num_gpus > 0 and cfg.eval.sets:
        raise ValueError(
            f"rollout.backend.type={backend.type} on GPUs with eval.sets: the in-run evaluator is "
            "placed without a GPU, where this backend cannot start (vLLM's GPU build needs one); "
            "set eval.sets={} and evaluate "
            "saved checkpoints with `zbrl eval --model RUN_DIR/checkpoints/step-N`"
        )


def check_engine(cfg: RunSections) -> None:
    """The engine fits the number of consumers and their devices."""
    engine, consumers = cfg.training.engine, cfg.launch.num_consumers
    if engine.type == "single" and consumers > 1:
        raise ValueError(
            f"launch.num_consumers={consumers} needs a data-parallel engine; set "
            "training.engine=ddp (full replicas) or training.engine=fsdp2 (sharded), or "
            "launch.num_consumers=1"
        )
    if engine.type == "fsdp2" and consumers < 2 and not engine.cpu_offload:
        raise ValueError(
            "training.engine=fsdp2 shards the model over the consumers, but launch.num_consumers "
            "is 1: set launch.num_consumers >= 2, or use training.engine=single (one consumer "
            "with fsdp2 makes sense only with training.engine.cpu_offload=true, which keeps the "
            "weights, gradients and AdamW state in host memory)"
        )
    if engine.type == "fsdp2" and consumers % engine.context_parallel_size:
        raise ValueError(
            f"training.engine.context_parallel_size={engine.context_parallel_size} must divide "
            f"launch.num_consumers ({consumers}): each group of that many consumers shares one "
            "data-parallel slice of the batch; choose a divisor, or add consumers"
        )
    backend = getattr(engine, "backend", None)
    gpus = cfg.launch.consumer_num_gpus
    if backend == "nccl" and gpus <= 0:
        raise ValueError(
            f"training.engine.backend=nccl needs GPUs on the consumers, but "
            f"launch.consumer_num_gpus is {gpus}; set launch.consumer_num_gpus=1 on GPU "
            "machines, or training.engine.backend=gloo (or auto) on CPU"
        )
    if engine.type != "single" and gpus > 0 and gpus != 1:
        raise ValueError(
            f"a {engine.type} consumer drives exactly one GPU, but launch.consumer_num_gpus is "
            f"{gpus}; set launch.consumer_num_gpus=1 and one consumer per GPU "
            "(launch.num_consumers)"
        )
    if gpus > 0 and cfg.training.device == "cpu":
        raise ValueError(
            f"launch.consumer_num_gpus is {gpus} but training.device is cpu; set "
            "training.device=auto (or cuda), or launch.consumer_num_gpus=0"
        )


def check_lora(cfg: RunSections) -> None:
    """LoRA runs where its adapter-only weight sync and checkpoints are implemented."""
    if cfg.model.lora is None:
        return
    backend = cfg.rollout.backend
    most = backend.capabilities.max_served_lora_rank
    if most is not None and lora_mode(backend) == "adapters" and cfg.model.lora.rank > most:
        raise ValueError(
            f"model.lora.rank={cfg.model.lora.rank} with rollout.backend.type={backend.type}: it "
            f"serves LoRA adapters of rank {most} at most; lower model.lora.rank, or set "
            "rollout.backend.lora_mode=merged (the adapters merged into the base)"
        )
    if cfg.training.engine.type == "fsdp2":
        raise ValueError(
            "model.lora with training.engine=fsdp2 is not supported (the adapters and their "
            "optimizer state are small: sharding saves little); set training.engine=ddp for "
            "several consumers, or remove model.lora"
        )
    if cfg.algorithm.critic is not None:
        raise ValueError(
            "model.lora with algorithm.critic: the value model would be trained in full; "
            "remove model.lora, or use a critic-free estimator such as "
            "algorithm.advantage=grpo"
        )


def consumer_generation_refused(cfg: RunSections) -> str | None:
    """Why an idle consumer cannot generate in this run (None: it can). It generates on its own
    policy module: an fsdp2 consumer holds a shard of it (every forward would be a collective
    the ranks' differing generations could not pair up), and a LoRA policy is a peft wrapper
    the transformers backend does not decode."""
    if cfg.training.engine.type == "fsdp2":
        return "training.engine=fsdp2 shards the policy over the consumers"
    if cfg.model.lora is not None:
        return "model.lora trains adapters on a peft wrapper of the policy"
    return None


def check_consumers_generate(cfg: RunSections) -> None:
    """``rollout.consumers_generate=on`` where a consumer can generate (``auto`` turns itself off
    where it cannot)."""
    reason = consumer_generation_refused(cfg)
    if cfg.rollout.consumers_generate == "on" and reason is not None:
        raise ValueError(
            f"rollout.consumers_generate=on cannot run here: {reason}; set "
            "rollout.consumers_generate=auto (off where it cannot run) or off, or use "
            "training.engine=single or ddp without model.lora"
        )


def check_packing(cfg: RunSections) -> None:
    """The packed layout runs the policy (and reference) models on block-masked packed rows."""
    t = cfg.training
    if not t.packing:
        return
    if cfg.algorithm.critic is not None:
        raise ValueError(
            "training.packing with algorithm.critic: the value model takes full rows; set "
            "training.packing=false, or use a critic-free estimator such as "
            "algorithm.advantage=grpo"
        )
    context = getattr(t.engine, "context_parallel_size", 1)
    if context > 1:
        raise ValueError(
            f"training.packing with training.engine.context_parallel_size={context}: context "
            "parallelism splits full rows; set training.packing=false, or "
            "training.engine.context_parallel_size=1"
        )
    if not t.share_prompts:
        raise ValueError(
            "training.packing runs each prompt once with its responses (a shared prompt), but "
            "training.share_prompts is false; remove training.share_prompts=false, or set "
            "training.packing=false"
        )


def check_staleness_buffer(cfg: RunSections) -> None:
    cap = cfg.transport.buffer_capacity
    if cap is not None and cap < cfg.training.train_batch_size:
        raise ValueError(
            f"transport.buffer_capacity ({cap}) is smaller than training.train_batch_size "
            f"({cfg.training.train_batch_size}); the consumer could never fill a batch"
        )


def check_weight_sync(cfg: RunSections) -> None:
    sync = cfg.transport.weight_sync
    if sync.type != "broadcast":
        return
    la = cfg.launch
    nccl = sync.backend == "nccl" or (sync.backend == "auto" and la.consumer_num_gpus > 0)
    if nccl and (la.consumer_num_gpus <= 0 or la.producer_num_gpus <= 0):
        why = (
            "transport.weight_sync.backend=nccl"
            if sync.backend == "nccl"
            else "transport.weight_sync.backend=auto picks nccl (launch.consumer_num_gpus > 0)"
        )
        raise ValueError(
            f"{why}, but NCCL needs a GPU in every member of the group: "
            f"launch.consumer_num_gpus={la.consumer_num_gpus}, "
            f"launch.producer_num_gpus={la.producer_num_gpus}. Give both GPUs, or set "
            "transport.weight_sync.backend=gloo"
        )
    if sync.address is not None and la.ray_address is None and sync.address != "127.0.0.1":
        raise ValueError(
            f"transport.weight_sync.address={sync.address!r}: a local run (launch.ray_address "
            "unset) listens on 127.0.0.1 only; leave the address unset (or 127.0.0.1), or run "
            "on a cluster with launch.ray_address"
        )


def check_correction(cfg: RunSections) -> None:
    a = cfg.algorithm
    if a.correction == "none":
        return
    backend = cfg.rollout.backend
    if not backend.capabilities.behaviour_logprobs:
        raise ValueError(
            f"algorithm.correction={a.correction!r} needs the behaviour policy's log-probs, which "
            f"rollout.backend.type={backend.type!r} does not return; use a backend that does "
            "(transformers) or set algorithm.correction=none"
        )
    if a.correction_cap <= 1:
        raise ValueError(
            f"algorithm.correction_cap ({a.correction_cap}) must be > 1 for "
            f"algorithm.correction={a.correction!r}: a cap <= 1 truncates (or masks) every "
            "on-policy token; use e.g. 2 (or inf for no cap)"
        )
    if isinstance(a.policy_loss, GspoLoss) and a.correction in ("tis", "mis"):
        raise ValueError(
            f"algorithm.correction={a.correction!r} replaces the PPO clip by a truncated or "
            "masked ratio, but algorithm.policy_loss.type=gspo clips its own sequence ratio; "
            "use algorithm.correction=decoupled (or none) with gspo"
        )


def check_distill(cfg: RunSections) -> None:
    d = cfg.algorithm.distill
    if d is None:
        return
    backend = cfg.rollout.backend
    if not backend.capabilities.behaviour_logprobs:
        raise ValueError(
            "algorithm.distill compares the teacher's log-probs with the student's behaviour "
            f"log-probs, which rollout.backend.type={backend.type!r} does not return; use a "
            "backend that does (transformers) or remove algorithm.distill"
        )
    if isinstance(cfg.algorithm.advantage, GaeAdvantage):
        raise ValueError(
            "algorithm.distill with algorithm.advantage.type=gae: both set per-token "
            "advantages; use algorithm.advantage=grpo (or another group estimator) with "
            "distill.reward_coef to mix them"
        )
    env = cfg.environment
    if isinstance(env, EndpointEnvironment) and env.on_history_change == "segment":
        raise ValueError(
            "algorithm.distill with an endpoint environment's on_history_change=segment: the "
            "teacher scores an episode's first segment only, so a later segment would train "
            "without it; set environment.on_history_change=refuse or remove algorithm.distill"
        )
    if d.teacher == EMBEDDED and cfg.model.path != EMBEDDED:
        raise ValueError(
            "algorithm.distill.teacher=embedded is the embedded model trained further, which "
            "only the embedded student (model.path=embedded) shares a tokenizer with; give the "
            "teacher's model directory or Hub id"
        )


def check_exact_logprobs(cfg: RunSections) -> None:
    if not cfg.rollout.exact_logprobs:
        return
    backend, t = cfg.rollout.backend, cfg.training
    fix = "or set rollout.exact_logprobs=false"
    if not backend.capabilities.exact_logprobs:
        raise ValueError(
            f"rollout.exact_logprobs: rollout.backend.type={backend.type!r} samples in an engine "
            "whose forward pass is not the trainer's; use rollout.backend.type=transformers, "
            f"{fix} (docs/precision.md)"
        )
    wrong = []
    inference = cfg.rollout.inference_dtype or cfg.model.dtype
    if inference != "float32":
        wrong.append(
            "rollout.inference_dtype=float32 (the producer must hold the trainer's float32 "
            "weights; autocast gives both the same lower-precision products)"
        )
    if t.engine.type == "fsdp2":
        wrong.append("training.engine.type=single or ddp (FSDP2 computes in its own precision)")
    if cfg.model.lora is not None:
        wrong.append("no model.lora (the producer merges adapters into its weights)")
    if cfg.rollout.inflight_updates.enabled:
        wrong.append("rollout.inflight_updates.enabled=false (one version per sequence)")
    if wrong:
        raise ValueError(
            "rollout.exact_logprobs scores each group as the trainer's forward then runs it "
            f"(one group of full rows per pass, the same weights); set {', '.join(wrong)}, {fix}"
        )
    if t.packing:
        raise ValueError(
            "rollout.exact_logprobs trains one group of full rows per pass, so training.packing "
            f"would not apply; set training.packing=false, {fix}"
        )


def check_inflight_updates(cfg: RunSections) -> None:
    if not cfg.rollout.inflight_updates.enabled:
        return
    if cfg.environment is not None:
        raise ValueError(
            "rollout.inflight_updates.enabled=true with an environment: multi-turn episodes "
            "swap weights only between generation batches (docs/algorithms.md, In-flight "
            "weight updates); set rollout.inflight_updates.enabled=false, or remove "
            "environment for single-turn responses"
        )
    backend = cfg.rollout.backend
    if not backend.capabilities.inflight_updates:
        raise ValueError(
            f"rollout.inflight_updates.enabled=true, but rollout.backend.type={backend.type} "
            "cannot take new weights in the middle of a generation; set "
            "rollout.inflight_updates.enabled=false, or use a backend that can (transformers, vllm)"
        )


def check_proximal(cfg: RunSections) -> None:
    a = cfg.algorithm
    if a.proximal == "loglinear" and a.correction not in CORRECTIONS_WITH_PROXIMAL:
        raise ValueError(
            f"algorithm.proximal=loglinear only applies to algorithm.correction=decoupled (it "
            f"is {a.correction!r}); remove algorithm.proximal or set correction=decoupled"
        )


def check_critic(cfg: RunSections) -> None:
    a = cfg.algorithm
    gae = isinstance(a.advantage, GaeAdvantage)
    if gae and a.critic is None:
        raise ValueError(
            "algorithm.advantage.type=gae needs a value model, and algorithm.critic is not set; "
            "set algorithm.critic={} (or algorithm.preset=ppo), or choose a critic-free "
            "estimator such as algorithm.advantage=grpo"
        )
    if not gae and a.critic is not None:
        raise ValueError(
            f"algorithm.critic is set but algorithm.advantage.type={a.advantage.type!r} does "
            "not use values; set algorithm.advantage=gae or remove algorithm.critic"
        )
    if gae and a.advantage.kl_in_reward and a.beta <= 0:
        raise ValueError(
            "algorithm.advantage.kl_in_reward folds algorithm.beta x KL into the rewards, but "
            "algorithm.beta is 0; set algorithm.beta > 0 (e.g. 0.01) or kl_in_reward=false"
        )
    engine = cfg.training.engine.type
    if a.critic is not None and engine != "single":
        raise ValueError(
            f"algorithm.critic runs on the single-process training engine only, and "
            f"training.engine.type is {engine!r}; set training.engine=single and "
            "launch.num_consumers=1, or use a critic-free estimator such as "
            "algorithm.advantage=grpo"
        )


def check_step_start_pass(cfg: RunSections) -> None:
    """The decoupled correction's step-start pass runs on the single-process engine only (its
    forward passes are not paired up across data-parallel ranks yet)."""
    a = cfg.algorithm
    engine = cfg.training.engine.type
    if a.correction in CORRECTIONS_WITH_PROXIMAL and engine != "single":
        raise ValueError(
            f"algorithm.correction={a.correction} runs on the single-process training engine "
            f"only, and training.engine.type is {engine!r}; use algorithm.correction=tis or mis "
            "(no proximal pass) with data-parallel consumers, or training.engine=single"
        )


def check_embedded_task_with_user_model(cfg: RunSections) -> None:
    """A model of the user's is not trained or evaluated on the embedded synthetic task unless
    ``data.allow_embedded_task_with_user_model`` says so (the defaults would do it silently)."""
    data = cfg.data
    if cfg.model.path == EMBEDDED or data.allow_embedded_task_with_user_model:
        return
    model = f"model.path={cfg.model.path!r} is not the embedded model"
    opt_in = (
        "or set data.allow_embedded_task_with_user_model=true to use the arithmetic task anyway "
        "(for example with a checkpoint of an embedded run)"
    )
    if data.trains_on_embedded:
        raise ValueError(
            f"{model}, but data.train_path is {EMBEDDED!r} (zbrl's synthetic arithmetic task): "
            "set data.train_path to your conversation JSONL or Parquet file, or "
            "data.source to a Hugging Face or reasoning-gym source (docs/datasets.md); " + opt_in
        )
    embedded_sets = sorted(name for name, value in cfg.eval.sets.items() if value == EMBEDDED)
    if embedded_sets:
        sets = ", ".join(f"eval.sets.{name}" for name in embedded_sets)
        raise ValueError(
            f"{model}, but {sets} evaluates the embedded arithmetic task ({EMBEDDED!r}): name "
            f"your held-out file (eval.sets={{NAME: PATH}}, or {{NAME: "
            f"{HELD_OUT}}} with data.source) or set eval.sets={{}}; " + opt_in
        )


def check_eval_sources(cfg: RunSections) -> None:
    """Every eval set names data that exists for the chosen training source."""
    data = cfg.data
    for name, value in cfg.eval.sets.items():
        where = f"eval.sets.{name}={value!r}"
        if value == HELD_OUT:
            if data.source is None and not data.trains_on_embedded:
                raise ValueError(
                    f"{where}: data.train_path is a file, which has no held-out split; name an "
                    "eval file instead (eval.sets={NAME: PATH})"
                )
            if isinstance(data.source, HfSource) and data.source.eval_split is None:
                raise ValueError(
                    f"{where}: data.source has no eval_split; set data.source.eval_split to the "
                    "split to evaluate on (e.g. test)"
                )
        elif value == EMBEDDED and data.source is not None:
            raise ValueError(
                f"{where} evaluates the embedded arithmetic task while training on "
                f"data.source (type {data.source.type}); set eval.sets={{{name}: {HELD_OUT}}} "
                "for the source's held-out split, name an eval file, or set eval.sets={}"
            )


def check_reasoning_gym_reward(cfg: RunSections) -> None:
    """The reasoning_gym reward scores reasoning-gym problems only."""
    if cfg.reward.type != "reasoning_gym":
        return
    if not isinstance(cfg.data.source, ReasoningGymSource):
        raise ValueError(
            "reward.type=reasoning_gym scores with the task's own score_answer, which needs the "
            "problems of a reasoning-gym source; set data.source={type: reasoning_gym, tasks: "
            "[...]}, or use a math reward (last_number, boxed, think_answer_tags) for other data"
        )
    files = sorted(name for name, value in cfg.eval.sets.items() if value != HELD_OUT)
    if files:
        raise ValueError(
            f"reward.type=reasoning_gym can score only reasoning-gym problems, but eval set(s) "
            f"{', '.join(files)} are not; set them to {HELD_OUT} (the source's eval problems)"
        )


RUN_CHECKS: tuple[Callable[[RunSections], None], ...] = (
    check_train_batching,
    check_inference_batching,
    check_group_size,
    check_length_shaping,
    check_topology,
    check_engine,
    check_lora,
    check_consumers_generate,
    check_packing,
    check_model_len,
    check_evaluator_placement,
    check_staleness_buffer,
    check_weight_sync,
    check_correction,
    check_proximal,
    check_distill,
    check_exact_logprobs,
    check_inflight_updates,
    check_critic,
    check_step_start_pass,
    check_eval_sources,
    check_reasoning_gym_reward,
    check_embedded_task_with_user_model,
)
