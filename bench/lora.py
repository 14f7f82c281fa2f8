"""LoRA against full fine-tuning: training memory and tokens/s, side by side in one process.

For each model size, two engines are built the way a run builds them
(:func:`zbrl.assembly.models.build_engine`, float32 master weights, AdamW): one trains every
weight, one trains ``model.lora`` adapters (rank ``--rank``, alpha ``2 * rank``, every linear
layer of each block) on the frozen base. Each optimizer step is one forward and backward pass of
a next-token loss on ``--batch`` random sequences of ``--seq`` tokens and one AdamW step; the two
engines take their steps alternately (``--repeats`` each, after one warm-up step) so a change in
the machine's load hits both alike. Reported per engine:

- memory: the bytes of the live parameters, gradients and AdamW state after a step (the training
  state that LoRA shrinks; activations, the same for both, are not counted), and the bytes one
  weight-sync version sends in bfloat16 (every weight, or the adapters);
- tokens/s: ``batch * seq`` over the median step's seconds.

The machine may be shared: compare the ratios, and read the load average printed with them.

Usage::

    python bench/lora.py                    # the embedded tiny model and a 4-layer 256-wide one
    python bench/lora.py --sizes 128x2 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from zbrl.assembly.models import build_engine
from zbrl.config import load_config
from zbrl.embedded.tiny_model import create_embedded_model
from zbrl.models.quiet import quiet_transformers


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def training_bytes(engine) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state) bytes of the engine's live tensors."""
    params = list(engine.policy.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    state = [v for s in engine.optimizer.state.values() for v in s.values()]
    return tensor_bytes(params), tensor_bytes(grads), tensor_bytes(state)


def sync_bytes(engine) -> int:
    """Bytes of one published version in bfloat16 (what a bf16 run sends)."""
    return sum(t.numel() * 2 for t in engine.full_state_dict().values())


def step(engine, ids_BT: torch.Tensor) -> float:
    """One optimizer step on a next-token loss; seconds."""
    start = time.perf_counter()
    engine.zero_grad()
    logits = engine.policy(input_ids=ids_BT).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids_BT[:, 1:].flatten())
    engine.backward(loss)
    engine.clip_and_step(1.0)
    return time.perf_counter() - start


def bench_size(hidden: int, layers: int, args, root: Path) -> list[dict]:
    model_dir = create_embedded_model(
        root / f"m{hidden}x{layers}", seed=0, hidden_size=hidden, num_layers=layers
    )
    common = ["training.device=cpu", "algorithm.lr=1e-4"]
    lora = [f"model.lora.rank={args.rank}", f"model.lora.alpha={2 * args.rank}"]
    engines = {
        "full": build_engine(load_config(None, common), model_dir, total_steps=100),
        "lora": build_engine(load_config(None, [*common, *lora]), model_dir, total_steps=100),
    }
    vocab = engines["full"].policy.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (args.batch, args.seq), generator=gen)
    times: dict[str, list[float]] = {name: [] for name in engines}
    for engine in engines.values():
        step(engine, ids)  # warm-up
    for _ in range(args.repeats):
        for name, engine in engines.items():
            times[name].append(step(engine, ids))
    rows = []
    for name, engine in engines.items():
        params, grads, optim = training_bytes(engine)
        trainable = sum(p.numel() for p in engine.policy.parameters() if p.requires_grad)
        total = sum(p.numel() for p in engine.policy.parameters())
        seconds = statistics.median(times[name])
        rows.append(
            {
                "model": f"{hidden}x{layers}",
                "mode": name if name == "full" else f"lora r{args.rank}",
                "params": total,
                "trainable": trainable,
                "param_mb": params / 2**20,
                "grad_mb": grads / 2**20,
                "optim_mb": optim / 2**20,
                "state_mb": (params + grads + optim) / 2**20,
                "sync_kb": sync_bytes(engine) / 2**10,
                "step_s": seconds,
                "tok_s": args.batch * args.seq / seconds,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["128x2", "256x4"], help="HIDDENxLAYERS")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: less noise)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quiet_transformers()
    torch.manual_seed(0)
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            hidden, layers = (int(x) for x in size.split("x"))
            rows.extend(bench_size(hidden, layers, args, Path(tmp)))
    load_after = os.getloadavg()
    head = (
        f"{'model':>7} {'mode':>8} {'params':>9} {'trained':>9} {'param MB':>8} {'grad MB':>8} "
        f"{'Adam MB':>8} {'state MB':>8} {'sync KB':>9} {'step s':>7} {'tok/s':>7}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['model']:>7} {r['mode']:>8} {r['params']:>9,} {r['trainable']:>9,} "
            f"{r['param_mb']:>8.2f} {r['grad_mb']:>8.2f} {r['optim_mb']:>8.2f} "
            f"{r['state_mb']:>8.2f} {r['sync_kb']:>9.1f} {r['step_s']:>7.3f} {r['tok_s']:>7.0f}"
        )
    print()
    for full, lora in zip(rows[::2], rows[1::2], strict=True):
        print(
            f"{full['model']}: LoRA/full  training state {lora['state_mb'] / full['state_mb']:.2f}x"
            f", sync bytes {lora['sync_kb'] / full['sync_kb']:.3f}x"
            f", tokens/s {lora['tok_s'] / full['tok_s']:.2f}x"
        )
    print(
        f"batch {args.batch} x {args.seq} tokens, {args.repeats} alternating steps each (medians), "
        f"{args.threads} torch thread(s); load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after (1-minute) on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
