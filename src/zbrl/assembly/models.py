"""Models and engines from a RunConfig: the policy, the tokenizer, the inference backend, the
training engine (policy, optional frozen reference, optimizer, LR schedule) and the trainer."""

from __future__ import annotations

from pathlib import Path

import torch

from zbrl.assembly.model_source import load_tokenizer
from zbrl.assembly.settings import device_of, inference_dtype_name, step_settings
from zbrl.config import RunConfig
from zbrl.errors import RunError


def compute_dtype(cfg: RunConfig) -> torch.dtype:
    """dtype of the training forward/backward passes and of the frozen reference
    (``model.dtype``); trained weights and optimizer state are float32 whatever it is."""
    return getattr(torch, cfg.model.dtype)


def inference_dtype(cfg: RunConfig) -> torch.dtype:
    """:func:`inference_dtype_name` as a torch dtype."""
    return getattr(torch, inference_dtype_name(cfg))


def load_policy(cfg: RunConfig, model_dir: Path, dtype: torch.dtype):
    """The causal LM in ``model_dir`` with its parameters in ``dtype``: float32 for a trained
    model (the master weights), :func:`compute_dtype` for the frozen reference,
    :func:`inference_dtype` for inference."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=dtype,
        trust_remote_code=cfg.model.trust_remote_code,
    )


def build_backend(cfg: RunConfig, model_dir: Path, tokenizer_dir: Path):
    """The inference backend of a producer or the evaluator, in the calling process. With
    ``model.lora``, or a LoRA checkpoint as ``model_dir``, it loads the frozen base and takes
    adapters (:func:`adapter_source`); a checkpoint's own adapters are loaded first."""
    from zbrl.models import lora

    adapter_dir, base_dir, spec = adapter_source(cfg, model_dir)
    if cfg.rollout.backend.type == "vllm":
        backend = build_vllm_backend(cfg, base_dir, tokenizer_dir, spec)
    else:
        from zbrl.rollout.backends.transformers.backend import TransformersBackend

        tokenizer = load_tokenizer(cfg, tokenizer_dir)
        model = load_policy(cfg, base_dir, inference_dtype(cfg))
        merger = None if spec is None else lora.AdapterMerger(model, lora.scale_of(spec))
        backend = TransformersBackend(
            model,
            tokenizer,
            device=device_of(cfg),
            merger=merger,
            fast_decode=cfg.rollout.backend.fast_decode,
        )
    if adapter_dir is not None:  # a LoRA checkpoint: its adapters, merged or served
        backend.load_weights(lora.load_adapter_tensors(adapter_dir))
    return backend


def adapter_source(cfg: RunConfig, model_dir: Path):
    """``(adapter_dir, base_dir, spec)``: the LoRA checkpoint ``model_dir`` is (else None), the
    base model to load (``model_dir`` itself without one), and the adapters' spec (a
    checkpoint's own, or ``model.lora``'s; None: full weights)."""
    from zbrl.models import lora

    if lora.is_adapter_dir(model_dir):
        base_dir = lora.base_dir_of(model_dir)
        config = lora.read_adapter_config(model_dir)
        return model_dir, base_dir, lora.AdapterSpec.from_adapter_config(config, str(base_dir))
    if cfg.model.lora is None:
        return None, model_dir, None
    spec = lora.AdapterSpec(
        rank=cfg.model.lora.rank,
        alpha=cfg.model.lora.alpha,
        target_modules=tuple(cfg.model.lora.target_modules),
        base_model=str(model_dir),
        use_rslora=False,
    )
    return None, model_dir, spec


def build_vllm_backend(cfg: RunConfig, base_dir: Path, tokenizer_dir: Path, spec):
    """The vLLM backend of :func:`build_backend` on the base model ``base_dir``. With adapters
    (``spec``), the engine serves each version through vLLM's LoRA support, or
    (``rollout.backend.lora_mode=merged``) reloads the base with them merged
    (:mod:`zbrl.rollout.backends.vllm.lora`)."""
    from zbrl.models import lora
    from zbrl.rollout.backends.vllm.backend import VllmBackend, VllmSettings
    from zbrl.rollout.backends.vllm.lora import MergedAdapters

    backend = cfg.rollout.backend
    settings = VllmSettings(
        dtype=inference_dtype_name(cfg),  # published weights are cast to it
        seed=torch.initial_seed() % 2**31,  # the process's seed (set per worker)
        max_model_len=backend.max_model_len,
        enforce_eager=backend.enforce_eager,
        gpu_memory_utilization=backend.gpu_memory_utilization,
        tensor_parallel_size=backend.tensor_parallel_size,
        cpu_kv_cache_gib=backend.cpu_kv_cache_gib,
        trust_remote_code=cfg.model.trust_remote_code,
        inflight_updates=cfg.rollout.inflight_updates.enabled,
    )
    lora_loader = spec
    if spec is not None and backend.lora_mode == "merged":
        base = load_policy(cfg, base_dir, inference_dtype(cfg))
        lora_loader = MergedAdapters(lora.AdapterMerger(base, lora.scale_of(spec)), spec)
    return VllmBackend(base_dir, tokenizer_dir, settings, lora=lora_loader)


def build_engine(
    cfg: RunConfig, model_dir: Path, total_steps: int, reference_dir: Path | None = None
):
    """The training engine of ``training.engine``: the policy from ``model_dir`` in float32 (the
    master weights; the engine computes in :func:`compute_dtype`), a frozen reference in the
    compute dtype when ``beta > 0`` (from ``reference_dir``, by default the same), AdamW and the
    LR schedule over ``total_steps`` train steps. ``ddp`` and ``fsdp2`` need this process to be
    in the consumers' group already (:func:`zbrl.training.distributed.join_group`).

    With ``model.lora`` the policy is the base with peft adapters (only they are trained and
    published); ``model_dir`` may then be a LoRA checkpoint, whose adapters are loaded onto the
    base it names."""
    from zbrl.training.engine.single import SingleProcessEngine, trainable_parameters

    device = device_of(cfg)
    dtype = compute_dtype(cfg)
    engine = cfg.training.engine
    # offloaded shards live on the CPU: FSDP2 moves one layer at a time to the device to shard it,
    # so the whole model never has to fit there
    placement = "cpu" if engine.type == "fsdp2" and engine.cpu_offload else device
    policy = load_trained_policy(cfg, model_dir).to(placement)
    reference = None
    if cfg.algorithm.beta > 0:
        if reference_dir is None:  # the policy's own weights (a LoRA checkpoint's base)
            reference_dir = base_dir_of_policy(model_dir)
        reference = load_policy(cfg, reference_dir, dtype).to(placement).eval()
        reference.requires_grad_(False)
    make_optimizer = optimizer_factory(cfg, total_steps)
    if engine.type == "ddp":
        from zbrl.training.engine.ddp import DdpEngine

        return DdpEngine(
            policy, make_optimizer, reference=reference, device=device, compute_dtype=dtype
        )
    if engine.type == "fsdp2":
        from zbrl.training.engine.fsdp2 import Fsdp2Engine

        return Fsdp2Engine(
            policy,
            make_optimizer,
            reference=reference,
            device=device,
            reshard_after_forward=engine.reshard_after_forward,
            compute_dtype=dtype,
            cpu_offload=engine.cpu_offload,
            context_parallel_size=engine.context_parallel_size,
        )
    optimizer, scheduler = make_optimizer(trainable_parameters(policy))
    critic, critic_optimizer = build_critic(cfg, model_dir, device)
    return SingleProcessEngine(
        policy,
        optimizer,
        scheduler,
        reference=reference,
        critic=critic,
        critic_optimizer=critic_optimizer,
        device=device,
        compute_dtype=dtype,
    )


def base_dir_of_policy(model_dir: Path) -> Path:
    """``model_dir``, or the base model of a LoRA checkpoint (whose adapters start at zero on a
    fresh engine: the base is the policy before training)."""
    from zbrl.models import lora

    return lora.base_dir_of(model_dir) if lora.is_adapter_dir(model_dir) else model_dir


def load_trained_policy(cfg: RunConfig, model_dir: Path):
    """The policy to train, float32 (the master weights): the model in ``model_dir``, or with
    ``model.lora`` its base with adapters (fresh, or those of the LoRA checkpoint ``model_dir``)
    and every base weight frozen."""
    from zbrl.models import lora
    from zbrl.training.engine.precision import MASTER_DTYPE

    adapter_dir = model_dir if lora.is_adapter_dir(model_dir) else None
    if adapter_dir is not None and cfg.model.lora is None:
        raise RunError(
            f"{model_dir} is a LoRA checkpoint (it holds adapters only), but model.lora is not "
            "set; resume it with the model.lora settings it was trained with"
        )
    base_dir = lora.base_dir_of(adapter_dir) if adapter_dir else model_dir
    policy = load_policy(cfg, base_dir, MASTER_DTYPE)
    if cfg.model.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
        if cfg.model.lora is not None:
            policy.enable_input_require_grads()  # frozen embeddings: checkpointed blocks need it
    if cfg.model.lora is None:
        return policy
    policy = lora.wrap(policy, cfg.model.lora)
    if adapter_dir is not None:
        lora.load_adapter_state(policy, lora.load_adapter_tensors(adapter_dir))
    return policy


def build_critic(cfg: RunConfig, model_dir: Path, device: torch.device):
    """PPO's value model (the policy's backbone and a zero-initialised scalar head, see
    :mod:`zbrl.models.value_model`) in float32 (master weights; the engine runs it in the compute
    dtype) and its AdamW, or (None, None) without ``algorithm.critic``."""
    critic_cfg = cfg.algorithm.critic
    if critic_cfg is None:
        return None, None
    from zbrl.models.value_model import ValueModel
    from zbrl.training.engine.precision import MASTER_DTYPE

    critic = ValueModel.from_pretrained(
        model_dir,
        dtype=MASTER_DTYPE,
        trust_remote_code=cfg.model.trust_remote_code,
    ).to(device)
    if cfg.model.gradient_checkpointing:
        critic.backbone.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(
        critic.parameters(),
        lr=critic_cfg.lr,
        weight_decay=critic_cfg.weight_decay,
        betas=cfg.algorithm.adam_betas,
    )
    return critic, optimizer


def optimizer_factory(cfg: RunConfig, total_steps: int):
    """``params -> (AdamW, LR schedule)`` of the configured algorithm, the schedule spanning the
    optimizer steps of ``total_steps`` train steps (engines call it after wrapping/sharding)."""
    from zbrl.training.schedule import lr_factor

    a = cfg.algorithm
    sched = a.lr_schedule
    optimizer_steps = (
        total_steps * (cfg.training.train_batch_size // cfg.minibatch_size) * a.ppo_epochs
    )

    def make(params):
        optimizer = torch.optim.AdamW(
            params, lr=a.lr, weight_decay=a.weight_decay, betas=a.adam_betas
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: lr_factor(
                step,
                warmup_steps=sched.warmup_steps,
                total_steps=optimizer_steps,
                decay=sched.decay,
                min_ratio=sched.min_lr_ratio,
            ),
        )
        return optimizer, scheduler

    return make


def build_trainer(
    cfg: RunConfig, model_dir: Path, tokenizer, total_steps: int, reference_dir: Path | None = None
):
    """The train step over the engine of :func:`build_engine`."""
    from zbrl.training.train_step import Trainer

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    engine = build_engine(cfg, model_dir, total_steps, reference_dir)
    return Trainer(engine, step_settings(cfg, pad_id))
