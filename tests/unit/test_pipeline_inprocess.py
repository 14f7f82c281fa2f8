"""Producer, buffer, weight sync and consumer wired together in one process (no Ray)."""

import threading

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zbrl.assembly import datasets, rewards, settings, shared_settings
from zbrl.assembly.environments import build_episode_runner
from zbrl.config import load_config
from zbrl.rollout.backends.transformers.backend import TransformersBackend
from zbrl.rollout.producer import Producer
from zbrl.telemetry.spans import SpanRecorder
from zbrl.training.consumer import Consumer
from zbrl.training.engine.single import SingleProcessEngine
from zbrl.training.train_step import Trainer
from zbrl.transport.buffer import RolloutBuffer
from zbrl.transport.clients import BufferClient, WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.factory import build_publisher, build_receiver
from zbrl.transport.weight_sync.store import WeightStore

OVERRIDES = [
    "rollout.generation.max_new_tokens=12",
    "rollout.generation.num_generations=4",
    "rollout.inference_batch_size=2",
    "rollout.inference_microbatch_size=2",
    "training.train_batch_size=2",
    "training.train_microbatch_size=4",
    "algorithm.lr=1e-3",
]


def test_producer_and_consumer_train_together(tiny_model_dir, task_files, tmp_path):
    torch.manual_seed(0)
    cfg = load_config(None, [*OVERRIDES, "transport.max_staleness=1", "training.max_steps=3"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts, _ = datasets.encode_prompts(task_files[0], cfg, tokenizer)
    buffer = RolloutBuffer(shared_settings.buffer_settings(cfg))
    store = WeightStore()
    prec, crec = SpanRecorder("producer-0", "producer"), SpanRecorder("consumer-0", "consumer")
    sync = cfg.transport.weight_sync
    receiver = build_receiver(
        sync, WeightStoreClient(LocalHandle(store)), prec, initial_version=0, member="producer-0"
    )
    backend = TransformersBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
    producer = Producer(
        settings.producer_settings(cfg, 0),
        prompts,
        backend,
        rewards.build_reward_fn(cfg),
        BufferClient(LocalHandle(buffer)),
        receiver,
        prec,
        build_episode_runner(cfg, backend, cfg.rollout.generation.max_new_tokens),
    )
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    trainer = Trainer(
        SingleProcessEngine(policy, optimizer, scheduler),
        settings.step_settings(cfg, tokenizer.pad_token_id),
    )
    publisher = build_publisher(sync, WeightStoreClient(LocalHandle(store)), crec)
    steps = []
    consumer = Consumer(
        settings.consumer_settings(cfg, tmp_path),
        trainer,
        BufferClient(LocalHandle(buffer)),
        publisher,
        crec,
        tokenizer=tokenizer,
        on_step=lambda step, m: steps.append((step, m)),
    )
    thread = threading.Thread(target=producer.run)
    thread.start()
    result = consumer.run()
    thread.join(timeout=60)
    receiver.close()
    publisher.close()
    assert not thread.is_alive()
    assert result.steps == 3 and [s for s, _ in steps] == [1, 2, 3]
    assert all(m["staleness_max"] <= 1 for _, m in steps)
    assert all(torch.isfinite(torch.tensor(m["loss"])) for _, m in steps)
    after = policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert store.latest_version() == 3
    assert result.final_checkpoint == str(tmp_path / "checkpoints" / "step-3")
    saved = AutoModelForCausalLM.from_pretrained(result.final_checkpoint)
    assert torch.equal(
        saved.state_dict()["model.embed_tokens.weight"], after["model.embed_tokens.weight"]
    )
    names = {s["name"] for s in prec.drain()} | {s["name"] for s in crec.drain()}
    assert {"generate", "score", "push", "train_step", "wait_for_data"} <= names
