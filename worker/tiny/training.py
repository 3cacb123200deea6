"""Train the tiny model briefly on CPU so it follows Qwen3's output format.

Deterministic for a seed on a given machine and library versions: the data
comes from a seeded generator, the step count is fixed (never a wall-clock
budget) and torch runs with a fixed thread count, so the same seed gives the
same weights, and ``worker.tiny.model.build_key`` can cache the result.

Only the last assistant turn carries loss. Masking the prompt matters: when
thinking is off the prompt ends with an empty think block, and if the model
learned from those tokens it would also close its think block at once when
thinking is on.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass

from . import data as tiny_data
from .architecture import model_config

log = logging.getLogger(__name__)

#: Fixed so results do not depend on the machine's core count (and the brief: 2 cores).
TRAIN_THREADS = 2
#: Longer examples are cut (the model then learns only that the answer goes on).
#: The long tail of answers reaches ~1 K tokens; the cut keeps steps cheap.
MAX_SEQ_LEN = 768


@dataclass(frozen=True)
class TrainingPlan:
    """Model size and optimisation for one variant.

    Sizes: head_dim stays 64 (vLLM CPU). Two layers are enough to copy a tool
    name or city from the prompt (an induction head needs two).
    """

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 384
    #: Measured on held-out prompts: 500 steps leave ~15 % of tool calls wrong, 600 about 2 %.
    steps: int = 600
    #: Padded tokens per batch; batches group examples of similar length. Small
    #: batches and many steps learn more per second than the reverse here.
    batch_tokens: int = 3072
    #: High for a transformer, right for one this small and a budget this short.
    lr: float = 6e-3
    warmup_steps: int = 20


PLANS = {
    "trained": TrainingPlan(),
    # One fixed answer: 60 steps left ~1 in 4 answers malformed at temperature 0.8
    # (a stray "</think>" or a lone "."); 150 learn it.
    "stub": TrainingPlan(steps=150),
}


def _batches(examples: list[tuple[list[int], int]], batch_tokens: int, rng: random.Random):
    """Group examples of similar length into batches of about ``batch_tokens`` padded tokens."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    batches, current, longest = [], [], 0
    for i in order:
        length = len(examples[i][0])
        if current and max(longest, length) * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def _tensors(examples, indices, pad_id: int):
    import torch

    rows = [examples[i] for i in indices]
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (ids, prompt_len) in enumerate(rows):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        labels[r, prompt_len: len(ids)] = torch.tensor(ids[prompt_len:])
        mask[r, : len(ids)] = 1
    return input_ids, labels, mask


def _completion_loss(model, input_ids, labels, mask):
    """Next-token loss on the labelled positions only.

    The LM head is half the compute of a model this small; projecting only the
    positions that carry loss (the last turn, ~1/4 of the tokens) saves a third
    of each step.
    """
    import torch

    hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


def training_examples(tokenizer, *, seed: int, tokens: int, stub: bool) -> list[tuple[list[int], int]]:
    """Rendered examples (token ids, prompt length) cut to MAX_SEQ_LEN, about ``tokens`` in all."""
    rng = random.Random(seed)
    out, total = [], 0
    while total < tokens:
        ids, prompt_len = tiny_data.render_example(tokenizer, tiny_data.synthetic_example(rng, stub=stub))
        if prompt_len < MAX_SEQ_LEN - 8:
            out.append((ids[:MAX_SEQ_LEN], prompt_len))
            total += min(len(ids), MAX_SEQ_LEN)
    return out


def train_model(tokenizer, *, variant: str, seed: int = 0, plan: TrainingPlan | None = None):
    """Train a fresh tiny Qwen3 on synthetic conversations; return it in bfloat16.

    Args:
        tokenizer: the tiny tokenizer (with the chat template).
        variant: ``"trained"`` (thinks, answers, calls tools) or ``"stub"`` (always ``OK.``).
        seed: seeds the weights, the data and the batch order.
        plan: overrides the variant's default plan (tests, experiments).

    Returns:
        The trained Qwen3ForCausalLM, in eval mode and bfloat16 (what vLLM loads).
    """
    import torch

    plan = plan or PLANS[variant]
    threads = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        start = time.monotonic()
        rng = random.Random(seed)
        # One pass: each example is seen about once (padding makes a few batches repeat).
        examples = training_examples(tokenizer, seed=seed, tokens=plan.steps * plan.batch_tokens,
                                     stub=variant == "stub")
        batches = _batches(examples, plan.batch_tokens, rng)
        log.info("tiny model: %d examples in %d batches rendered in %.1f s", len(examples), len(batches),
                 time.monotonic() - start)

        config = model_config(tokenizer, hidden_size=plan.hidden_size, num_layers=plan.num_layers,
                              num_heads=plan.num_heads, num_kv_heads=plan.num_kv_heads,
                              intermediate_size=plan.intermediate_size)
        return fit(config, examples, batches, plan, pad_id=tokenizer.pad_token_id, seed=seed, label="tiny model",
                   start=start)
    finally:
        torch.set_num_threads(threads)


def fresh_model(config, plan: TrainingPlan, *, seed: int):
    """(model, optimizer, scheduler) every tiny model trains with: a seeded fresh decoder (Qwen3, or the hybrid) in fp32,
    AdamW, and a warm-up then cosine decay to a tenth of ``plan.lr`` over ``plan.steps``."""
    import torch

    from .architecture import decoder_class

    torch.manual_seed(seed)
    model = decoder_class(config)(config).float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=plan.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < plan.warmup_steps:
            return (step + 1) / plan.warmup_steps
        progress = (step - plan.warmup_steps) / max(1, plan.steps - plan.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)


def fit(config, examples: list[tuple[list[int], int]], batches: list[list[int]], plan: TrainingPlan, *,
        pad_id: int, seed: int, label: str, start: float):
    """The training loop every tiny model shares: a fresh Qwen3 decoder, loss on the last turn only.

    Fixed steps, warm-up then cosine decay, clipped gradients: the same seed and data give
    the same weights (the builds are cached by content). Returns the model in bfloat16, eval mode.
    """
    import torch

    model, optimizer, scheduler = fresh_model(config, plan, seed=seed)
    for step in range(plan.steps):
        input_ids, labels, mask = _tensors(examples, batches[step % len(batches)], pad_id)
        loss = _completion_loss(model, input_ids, labels, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == plan.steps - 1:
            log.info("%s: step %d/%d loss %.3f (%.0f s)", label, step, plan.steps, loss.item(),
                     time.monotonic() - start)
    return model.to(torch.bfloat16).eval()
