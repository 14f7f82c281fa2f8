"""Agent episodes through the endpoint against the built-in tools environment, on the same task.

The tool demo's task (recipes/demo_tools.yaml) and the agent demo's (recipes/demo_agent.yaml) run
on the same warm-started embedded policy with the same transformers backend, in this process (no
Ray, no training): the built-in ``tools`` environment steps the calculator in the runner; the
agent (zbrl.embedded.calculator_agent) calls the endpoint over HTTP with the openai client and
runs the calculator itself. Prints episodes/s, model tokens/s and all tokens/s (model and
rendered after the prompt), and the held-out accuracy of the sampled episodes, side by side.

    python bench/agent_endpoint.py                # 64 held-out prompts x 8 samples, 3 repeats
    python bench/agent_endpoint.py --prompts 16 --repeats 1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from zbrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
RECIPES = {
    "built-in tools environment": REPO / "recipes" / "demo_tools.yaml",
    "agent through the endpoint": REPO / "recipes" / "demo_agent.yaml",
}


def measure(recipe: Path, n_prompts: int, batch: int, repeats: int) -> dict[str, float]:
    from zbrl.assembly.datasets import encode_prompts
    from zbrl.assembly.embedded import embedded_policy_dir, embedded_task_files
    from zbrl.assembly.environments import build_episode_runner
    from zbrl.assembly.models import build_backend
    from zbrl.assembly.rewards import build_eval_reward_fn
    from zbrl.assembly.settings import sampling_params

    cfg = load_config(str(recipe), ["logging.progress=false"])
    model_dir = embedded_policy_dir(cfg, verbose=False)
    _, heldout = embedded_task_files(cfg)
    backend = build_backend(cfg, model_dir, model_dir)
    prompts = encode_prompts(str(heldout), cfg, backend.tokenizer, limit=n_prompts)[0]
    runner = build_episode_runner(cfg, backend, cfg.rollout.generation.max_new_tokens)
    reward = build_eval_reward_fn(cfg)
    params = sampling_params(cfg)
    torch.manual_seed(0)
    runner.run(backend.generate, prompts[:batch], params)  # warm-up (endpoint start, caches)
    episodes = model_tokens = all_tokens = 0
    correct = 0.0
    started = time.perf_counter()
    for _ in range(repeats):
        for i in range(0, len(prompts), batch):
            chunk = prompts[i : i + batch]
            groups = runner.run(backend.generate, chunk, params)
            scored = runner.score(reward, [p.example for p in chunk], groups)
            for group, (_, results) in zip(groups, scored, strict=True):
                episodes += len(group)
                model_tokens += sum(int(c.loss_mask.sum()) for c in group)
                all_tokens += sum(int(c.token_ids.numel()) for c in group)
                correct += sum(r.ans_acc for r in results)
    wall = time.perf_counter() - started
    return {
        "episodes": episodes,
        "episodes/s": episodes / wall,
        "model tokens/s": model_tokens / wall,
        "tokens/s": all_tokens / wall,
        "accuracy": correct / episodes,
        "wall_s": wall,
    }


def table(rows: list[tuple[str, dict[str, float]]]) -> str:
    lines = [
        "| rollout | episodes | episodes/s | model tokens/s | tokens/s | accuracy | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['episodes']} | {r['episodes/s']:.1f} | {r['model tokens/s']:.0f} | "
            f"{r['tokens/s']:.0f} | {r['accuracy']:.3f} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64, help="held-out prompts")
    parser.add_argument("--batch", type=int, default=8, help="prompts per runner call")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the prompts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [
        (name, measure(recipe, args.prompts, args.batch, args.repeats))
        for name, recipe in RECIPES.items()
    ]
    print(table(rows))


if __name__ == "__main__":
    main()
