"""The embedded reward model: a tiny ``LlamaForSequenceClassification`` (one logit) over the
embedded tokenizer, saved like any user's reward model, so that
``AutoModelForSequenceClassification`` loads it back."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerBase

from zbrl.embedded.cached_build import CachedBuild
from zbrl.embedded.tiny_model import save_model_dir
from zbrl.embedded.tokenizer import EOS_TOKEN, ROLE_TOKENS


def build_tiny_reward_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
) -> LlamaForSequenceClassification:
    """A randomly initialised (seeded) one-logit sequence classifier sized for ``tokenizer``; it
    reads the logit at each sequence's last non-pad token."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=512,
        num_labels=1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForSequenceClassification(config)


def save_reward_model(
    model: LlamaForSequenceClassification, tokenizer: PreTrainedTokenizerBase, out_dir: Path
) -> Path:
    """``save_pretrained`` the classifier and its tokenizer into ``out_dir``."""
    return save_model_dir(model, tokenizer, out_dir)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# The embedded reward model, trained to predict correctness (cached like the warm start)

MARKER = "REWARD_MODEL_COMPLETE"
_CACHE = CachedBuild(MARKER, "reward model", ".rm-")
_CACHE_VERSION = 4
"""Bump when the training code changes in a way that changes its result."""


@dataclass(frozen=True)
class RewardModelSettings:
    """Everything that determines the embedded reward model (and hence its cache key)."""

    policy: str
    """The warm-started policy's directory name (it carries the warm start's own key)."""
    seed: int = 0
    n_prompts: int = 1500
    """Train-split problems whose sampled responses are the training pairs."""
    samples_per_prompt: int = 4
    """Responses sampled per problem (temperature 1.0, like the RL rollouts)."""
    steps: int = 600
    batch_size: int = 64
    lr: float = 5e-4
    eval_prompts: int = 200
    """Eval-split problems whose sampled responses measure the model on held-out pairs."""
    max_new_tokens: int = 32
    backbone_sft_steps: int | None = 1500
    """The verifier's LM (the classifier's transformer) comes from a longer supervised run of the
    same warm start (this many steps, no early stop; cached like the warm start): 1,500 steps
    answer 0.975 of held-out problems greedily, and a likelihood verifier on it is exploited less
    than one on 450 (docs/rewards.md); None: from the sampling policy itself."""
    objective: Literal["likelihood", "pointwise", "pairwise", "tokenwise"] = "likelihood"
    """``likelihood``: the backbone LM itself, frozen, scores each response token by its
    log-probability, and a two-feature head (the minimum and the mean over the response) is
    fitted to the 0/1 labels (:mod:`zbrl.rewards.likelihood_verifier`; ``steps``, ``batch_size``
    and ``lr`` are not used). The others train a sequence classifier on the backbone's
    transformer: ``pointwise``, a logistic loss on each response's 0/1 label; ``pairwise``, a
    Bradley-Terry loss on (correct, wrong) responses to the SAME problem, so that what makes a
    problem easy (no carry, say) cannot score by itself — only what separates right from wrong
    answers to one problem does; ``tokenwise``, the classifier's head is read at every response
    token and trained (logistic loss) to say whether the response so far is still on a right
    path (:func:`zbrl.embedded.reward_model_data.prefix_labels`), on the sampled responses plus
    ``references`` reference completions and their corruptions; the score read at the last
    token is the response's."""
    references: int = 3000
    """Train-split problems whose reference completion and ``corruptions`` corrupted copies
    (:mod:`zbrl.embedded.reward_model_data`) join the sampled responses (``tokenwise`` only)."""
    corruptions: int = 4
    """Corrupted completions per reference."""
    extra_layers: int = 2
    """Fresh transformer layers on top of the backbone's (the backbone's layers carry its
    next-token predictions; the new ones compare each token with them)."""
    counterfactuals: bool = False
    """Add, for every sampled response with an answer, two copies whose answer is replaced by the
    true sum and by a wrong one (labelled by the verifier like the rest): pairs that differ only
    in the answer, so the classifier must compare it with the question."""

    def key(self) -> str:
        blob = json.dumps({"v": _CACHE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def reward_model_dir(cache_dir: str | Path, policy_dir: str | Path, **settings: Any) -> Path:
    """Where :func:`ensure_reward_model` keeps the reward model trained on ``policy_dir``."""
    return Path(cache_dir) / f"rm-{RewardModelSettings(Path(policy_dir).name, **settings).key()}"


def ensure_reward_model(
    cache_dir: str | Path, policy_dir: str | Path, *, verbose: bool = True, **settings: Any
) -> Path:
    """The directory of a reward model that predicts whether a response of the warm-started
    policy in ``policy_dir`` is correct, training (and caching) it if needed.

    Responses are sampled from the policy at temperature 1.0 on train-split problems and labelled
    1/0 by the verifiable reward (``think_answer_tags``); the classifier starts from a longer
    supervised run's transformer (``backbone_sft_steps``; or the policy's own) with a fresh
    one-logit head and is trained with a logistic loss. Its accuracy
    and AUC on responses to eval-split problems are recorded in the marker file.
    """
    s = RewardModelSettings(Path(policy_dir).name, **settings)
    target = reward_model_dir(cache_dir, policy_dir, **settings)
    return _CACHE.ensure(
        target, lambda work: _build(s, Path(policy_dir), work, verbose=verbose), verbose
    )


def read_reward_model_summary(model_dir: str | Path) -> dict:
    """The settings and held-out figures recorded by :func:`ensure_reward_model`."""
    return _CACHE.summary(model_dir)


def labelled_pairs(
    policy: Any,
    tokenizer: Any,
    rows: list[dict],
    *,
    samples: int,
    max_new_tokens: int,
    counterfactuals: bool = False,
    seed: int = 0,
) -> tuple[list[str], list[float]]:
    """Rendered (prompt, sampled response) texts and their 0/1 verifiable-reward labels (with
    ``counterfactuals``, also the answer-swapped copies, see :class:`RewardModelSettings`)."""
    from zbrl.embedded.probes import generate_responses
    from zbrl.rewards.base import RewardContext
    from zbrl.rewards.reward_model import render_pair
    from zbrl.rewards.think_answer import ThinkAnswerReward

    repeated = [row for row in rows for _ in range(samples)]
    responses = generate_responses(
        policy, tokenizer, repeated, temperature=1.0, max_new_tokens=max_new_tokens
    )
    if counterfactuals:
        repeated, responses = _with_counterfactuals(repeated, responses, seed)
    ctx = RewardContext(response_tokens=1, max_new_tokens=max_new_tokens)
    verifier = ThinkAnswerReward()
    results = verifier.score_batch(responses, repeated, [ctx] * len(responses))
    labels = [1.0 if r.reward > 0.5 else 0.0 for r in results]
    texts = [
        render_pair(tokenizer, row["messages"], resp) for row, resp in zip(repeated, responses)
    ]
    return texts, labels


def _with_counterfactuals(
    rows: list[dict], responses: list[str], seed: int
) -> tuple[list[dict], list[str]]:
    import random
    import re

    rng = random.Random(seed)
    out_rows, out_responses = list(rows), list(responses)
    for row, response in zip(rows, responses):
        found = list(re.finditer(r"<answer>(.*?)</answer>", response, re.DOTALL))
        if not found:
            continue
        true = int(row["gt_answer"])
        wrong = true + rng.choice([-11, -10, -2, -1, 1, 2, 10, 11])
        span = found[-1].span(1)
        for value in (true, max(wrong, 0) if wrong != true else true + 1):
            out_rows.append(row)
            out_responses.append(response[: span[0]] + str(value) + response[span[1] :])
    return out_rows, out_responses


def same_problem_pairs(labels: list[float], samples: int) -> list[tuple[int, int]]:
    """(right, wrong) index pairs of responses to the same problem (``samples`` consecutive
    responses per problem)."""
    pairs = []
    for start in range(0, len(labels), samples):
        group = range(start, min(start + samples, len(labels)))
        right = [i for i in group if labels[i] == 1.0]
        wrong = [i for i in group if labels[i] == 0.0]
        pairs += [(r, w) for r in right for w in wrong]
    return pairs


def _encode(tokenizer: Any, texts: list[str], device: Any = "cpu") -> dict[str, torch.Tensor]:
    # as RewardModelScorer encodes them: right padding, no extra special tokens
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return {k: v.to(device) for k, v in enc.items()}


@torch.no_grad()
def _logits(model: Any, tokenizer: Any, texts: list[str], batch: int = 256) -> torch.Tensor:
    model.eval()
    device = next(model.parameters()).device
    out = [model(**_encode(tokenizer, texts[i : i + batch], device)).logits[:, 0].cpu()
           for i in range(0, len(texts), batch)]  # fmt: skip
    return torch.cat(out)


def held_out_figures(logits: torch.Tensor, labels: list[float]) -> dict[str, float]:
    """Accuracy (logit > 0), the positive rate, and AUC of scores against 0/1 labels."""
    y = torch.tensor(labels)
    pos, neg = logits[y == 1], logits[y == 0]
    auc = float("nan")
    if len(pos) and len(neg):
        auc = ((pos[:, None] > neg[None, :]).float().mean()).item()
    return {
        "pairs": len(labels),
        "positive_rate": round(y.mean().item(), 4),
        "accuracy": round(((logits > 0).float() == y).float().mean().item(), 4),
        "auc": round(auc, 4),
    }


def _backbone(s: RewardModelSettings, policy_dir: Path, policy: Any) -> Any:
    """The causal LM whose transformer the classifier starts from (see ``backbone_sft_steps``)."""
    if s.backbone_sft_steps is None:
        return policy
    from transformers import LlamaForCausalLM

    from zbrl.embedded.warm_start import (
        WarmStartSettings,
        ensure_warm_start,
        read_warm_start_summary,
    )
    from zbrl.embedded.warm_start_tasks import AdditionWarmStart

    warm = read_warm_start_summary(policy_dir)["settings"]
    keep = ("seed", "batch_size", "lr", "warmup_steps", "n_train", "hidden_size", "num_layers",
            "num_heads")  # fmt: skip
    task = AdditionWarmStart(warm["min_digits"], warm["max_digits"], eval_size=0)
    longer = ensure_warm_start(
        policy_dir.parent, task, WarmStartSettings(
            **{k: warm[k] for k in keep}, steps=s.backbone_sft_steps, stop_at_accuracy=None),
    )  # fmt: skip
    return LlamaForCausalLM.from_pretrained(longer, dtype=torch.float32)


def _build(s: RewardModelSettings, policy_dir: Path, out_dir: Path, *, verbose: bool) -> dict:
    from transformers import AutoTokenizer, LlamaForCausalLM

    from zbrl.embedded.addition_task import make_arithmetic_rows

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    policy = LlamaForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)
        train_rows = make_arithmetic_rows(s.n_prompts, seed=s.seed + 101, split="train")
        eval_rows = make_arithmetic_rows(s.eval_prompts, seed=s.seed + 202, split="eval")
        pairs = {"samples": s.samples_per_prompt, "max_new_tokens": s.max_new_tokens}
        texts, labels = labelled_pairs(
            policy, tokenizer, train_rows, counterfactuals=s.counterfactuals, seed=s.seed, **pairs
        )
        # held out: the policy's own sampled responses only, as RL will show them
        eval_texts, eval_labels = labelled_pairs(policy, tokenizer, eval_rows, **pairs)
    if verbose:
        rate = sum(labels) / len(labels)
        print(f"[zbrl] reward model: {len(texts)} sampled pairs, {rate:.2f} correct "
              f"({time.perf_counter() - started:.0f}s)", flush=True)  # fmt: skip
    tokenizer.padding_side = "right"
    if s.objective == "likelihood":
        model = _fit_likelihood_verifier(
            _backbone(s, policy_dir, policy), tokenizer, texts, labels, started, verbose
        )
    else:
        model = _classifier(s, policy_dir, policy, tokenizer)
        if s.objective == "tokenwise":
            _train_tokenwise(model, tokenizer, texts, labels, train_rows, s, started, verbose)
        else:
            _train_sequence(model, tokenizer, texts, labels, len(train_rows), s, started, verbose)
    eval_logits = _logits(model, tokenizer, eval_texts)
    figures = held_out_figures(eval_logits, eval_labels)
    eval_pairs = same_problem_pairs(eval_labels, s.samples_per_prompt)
    figures["same_problem_pairs"] = len(eval_pairs)
    figures["same_problem_pair_accuracy"] = round(
        sum(float(eval_logits[a] > eval_logits[b]) for a, b in eval_pairs)
        / max(1, len(eval_pairs)),
        4,
    )
    figures.update(_corruption_figures(model, tokenizer, eval_rows, s.seed))
    train_figures = held_out_figures(_logits(model, tokenizer, texts[:2000]), labels[:2000])
    save_reward_model(model.to("cpu"), tokenizer, out_dir)
    if verbose:
        print(f"[zbrl] reward model: held-out accuracy {figures['accuracy']:.3f} (positive rate "
              f"{figures['positive_rate']:.2f}), AUC {figures['auc']:.3f}, same-problem pairs "
              f"{figures['same_problem_pair_accuracy']:.3f}, reference above its corruptions "
              f"{figures['reference_over_corruption']:.3f} "
              f"({time.perf_counter() - started:.0f}s)", flush=True)  # fmt: skip
    return {
        "settings": asdict(s),
        "heldout": figures,
        "train": train_figures,
        "train_seconds": round(time.perf_counter() - started, 1),
    }


def _classifier(s: RewardModelSettings, policy_dir: Path, policy: Any, tokenizer: Any) -> Any:
    """The classifier the ``pointwise``, ``pairwise`` and ``tokenwise`` objectives train: the
    backbone's transformer (plus ``extra_layers`` fresh ones for ``tokenwise``), a fresh head."""
    c = policy.config
    extra = s.extra_layers if s.objective == "tokenwise" else 0
    model = build_tiny_reward_model(
        tokenizer, hidden_size=c.hidden_size, num_layers=c.num_hidden_layers + extra,
        num_heads=c.num_attention_heads, seed=s.seed,
    )  # fmt: skip
    backbone = _backbone(s, policy_dir, policy).model.state_dict()
    model.model.load_state_dict(backbone, strict=extra == 0)  # new layers stay fresh
    return model.to("cuda" if torch.cuda.is_available() else "cpu")  # sampled on the CPU


def _fit_likelihood_verifier(
    backbone: Any, tokenizer: Any, texts: list[str], labels: list[float], started: float,
    verbose: bool,
) -> Any:  # fmt: skip
    """The ``likelihood`` objective: the backbone LM, frozen, inside a
    :mod:`zbrl.rewards.likelihood_verifier` whose two-feature head is fitted by logistic
    regression on the sampled responses' labels."""
    from zbrl.rewards.likelihood_verifier import build_likelihood_verifier, fit_head

    assistant = tokenizer.convert_tokens_to_ids(ROLE_TOKENS["assistant"])
    verifier = build_likelihood_verifier(backbone, assistant)
    verifier.eval()
    with torch.no_grad():
        features_NF = torch.cat([
            verifier.features(**_encode(tokenizer, texts[i : i + 256]))
            for i in range(0, len(texts), 256)
        ])  # fmt: skip
    loss = fit_head(verifier, features_NF, torch.tensor(labels))
    if verbose:
        w, b = verifier.score.weight[0].tolist(), verifier.score.bias.item()
        print(f"[zbrl] reward model: likelihood head fitted on {len(texts)} responses, loss "
              f"{loss:.3f}, logit = {w[0]:.3f} * min + {w[1]:.3f} * mean + {b:.3f} "
              f"({time.perf_counter() - started:.0f}s)", flush=True)  # fmt: skip
    return verifier


def _train_sequence(
    model: Any, tokenizer: Any, texts: list[str], labels: list[float], n_rows: int,
    s: RewardModelSettings, started: float, verbose: bool,
) -> None:  # fmt: skip
    """The ``pointwise`` and ``pairwise`` objectives, on the score at each response's end."""
    generator = torch.Generator().manual_seed(s.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    device = next(model.parameters()).device
    y_all = torch.tensor(labels, device=device)
    sampled = n_rows * s.samples_per_prompt  # the sampled responses come first, in order
    pairs = same_problem_pairs(labels[:sampled], s.samples_per_prompt)
    if s.objective == "pairwise" and not pairs:
        raise ValueError("reward model: no problem has both a right and a wrong sampled answer")
    for step in range(s.steps):
        model.train()
        if s.objective == "pairwise":
            chosen = torch.randint(len(pairs), (s.batch_size // 2,), generator=generator).tolist()
            picks = [i for c in chosen for i in pairs[c]]
            logits = model(**_encode(tokenizer, [texts[i] for i in picks], device)).logits[:, 0]
            loss = -torch.nn.functional.logsigmoid(logits[0::2] - logits[1::2]).mean()
        else:
            picks = torch.randint(len(texts), (s.batch_size,), generator=generator).tolist()
            logits = model(**_encode(tokenizer, [texts[i] for i in picks], device)).logits[:, 0]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y_all[picks])
        _step(model, optimizer, loss)
        _progress(step, s.steps, loss, started, verbose)


def _train_tokenwise(
    model: Any, tokenizer: Any, texts: list[str], labels: list[float], train_rows: list[dict],
    s: RewardModelSettings, started: float, verbose: bool,
) -> None:  # fmt: skip
    """The ``tokenwise`` objective (see :class:`RewardModelSettings`)."""
    import random

    from zbrl.embedded.addition_task import make_arithmetic_rows, reference_completion
    from zbrl.embedded.reward_model_data import corruptions, first_deviation, is_right
    from zbrl.rewards.reward_model import render_pair

    rng = random.Random(s.seed)
    items: list[tuple[str, int, int | None, float]] = []  # text, response start, deviation, label

    def add(row: dict, response: str, label: float) -> None:
        text = render_pair(tokenizer, row["messages"], response)
        start = text.rindex(response)
        deviation = None if label == 1.0 else first_deviation(response, reference_completion(row))
        items.append((text, start, deviation, label))

    for row in make_arithmetic_rows(s.references, seed=s.seed + 303, split="train"):
        add(row, reference_completion(row), 1.0)
        for corrupted in corruptions(row, rng, s.corruptions):
            add(row, corrupted, 1.0 if is_right(corrupted, row["gt_answer"]) else 0.0)
    repeated = [row for row in train_rows for _ in range(s.samples_per_prompt)]
    responses = [_response_of(text) for text in texts[: len(repeated)]]
    for row, response, label in zip(repeated, responses, labels):
        add(row, response, label)
    if verbose:
        print(f"[zbrl] reward model: {len(items)} training responses with references and "
              f"corruptions ({time.perf_counter() - started:.0f}s)", flush=True)  # fmt: skip
    generator = torch.Generator().manual_seed(s.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    device = next(model.parameters()).device
    for step in range(s.steps):
        model.train()
        picks = torch.randint(len(items), (s.batch_size,), generator=generator).tolist()
        enc, y_BT, w_BT = _token_batch(tokenizer, [items[i] for i in picks], device)
        hidden_BTH = model.model(**enc).last_hidden_state
        logits_BT = model.score(hidden_BTH)[..., 0]
        bce_BT = torch.nn.functional.binary_cross_entropy_with_logits(
            logits_BT, y_BT, reduction="none"
        )
        loss = (bce_BT * w_BT).sum() / w_BT.sum()
        _step(model, optimizer, loss)
        _progress(step, s.steps, loss, started, verbose)


def _response_of(text: str) -> str:
    """The assistant's turn of a text rendered by ``render_pair`` with the embedded template."""
    return text.rsplit(ROLE_TOKENS["assistant"], 1)[1].removesuffix(EOS_TOKEN)


def _token_batch(
    tokenizer: Any, items: list[tuple[str, int, int | None, float]], device: Any
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    from zbrl.embedded.reward_model_data import prefix_labels

    enc = tokenizer(
        [it[0] for it in items], return_tensors="pt", padding=True, add_special_tokens=False,
        return_offsets_mapping=True,
    )  # fmt: skip
    offsets = enc.pop("offset_mapping").tolist()
    y_BT = torch.zeros(enc["input_ids"].shape)
    w_BT = torch.zeros(enc["input_ids"].shape)
    for b, (_, start, deviation, label) in enumerate(items):
        n = int(enc["attention_mask"][b].sum())
        ys, ws = prefix_labels(offsets[b][:n], start, deviation, label)
        y_BT[b, :n], w_BT[b, :n] = torch.tensor(ys), torch.tensor(ws)
    return {k: v.to(device) for k, v in enc.items()}, y_BT.to(device), w_BT.to(device)


def _step(model: Any, optimizer: Any, loss: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def _progress(step: int, steps: int, loss: torch.Tensor, started: float, verbose: bool) -> None:
    if verbose and ((step + 1) % max(1, steps // 6) == 0 or step + 1 == steps):
        print(f"[zbrl] reward model: step {step + 1}/{steps} loss {loss.item():.3f} "
              f"({time.perf_counter() - started:.0f}s)", flush=True)  # fmt: skip


def _corruption_figures(model: Any, tokenizer: Any, rows: list[dict], seed: int) -> dict:
    """How often the reference completion of a held-out problem scores above each of its
    corruptions (:mod:`zbrl.embedded.reward_model_data`; 6 per problem)."""
    import random

    from zbrl.embedded.addition_task import reference_completion
    from zbrl.embedded.reward_model_data import corruptions
    from zbrl.rewards.reward_model import render_pair

    rng = random.Random(seed + 1)
    good, bad = [], []
    for row in rows:
        reference = render_pair(tokenizer, row["messages"], reference_completion(row))
        for corrupted in corruptions(row, rng, 6):
            good.append(reference)
            bad.append(render_pair(tokenizer, row["messages"], corrupted))
    if not good:
        return {"reference_over_corruption": float("nan")}
    above = (_logits(model, tokenizer, good) > _logits(model, tokenizer, bad)).float().mean()
    return {"corruption_pairs": len(good), "reference_over_corruption": round(above.item(), 4)}
