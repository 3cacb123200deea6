"""Build the tiny model of any chat family (``build_tiny_model(..., family=...)``).

``qwen3`` is delegated to ``worker/tiny/model.py``, whose files are left as they
were so that its builds keep their cache key and bytes. The other families (see
``worker/tiny/families.py``) reuse its pieces (BPE settings, corpus generators, the
synthetic conversations of ``data.py``, the batching and loss of ``training.py``)
with their own tokens, template, config and a shorter training: CI builds every
model once per run, so each trained family builds in about a minute on 2 cores
(fewer steps than qwen3, and only conversations short enough to be cheap; the long
answer tail is qwen3's to teach).

Deterministic for a seed like the qwen3 build, and cached by ``build_key`` in the
same cache directory, as ``{family}-{variant}-{seed}-{key}``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import data as tiny_data
from . import model as qwen3_model
from .families import DEFAULT_FAMILY, Family, family_spec

log = logging.getLogger(__name__)

#: Synthetic documents the BPE learns from (as qwen3's; the BPE takes ~1.5 s).
TOKENIZER_CORPUS_DOCS = qwen3_model.TOKENIZER_CORPUS_DOCS
#: Vocabulary including every added token.
VOCAB_SIZE = 4096
#: Training conversations longer than this (tokens) are skipped: they cost steps and
#: teach length, not format.
MAX_EXAMPLE_TOKENS = 384
#: The cue of data.py's long answers (see ``family_example``).
DETAIL_CUE = next(cue for cue, _, stop_p in tiny_data.LENGTH_CUES if stop_p < tiny_data.DETAIL_STOP_P)


def tokenizer_corpus(family: Family, seed: int = 0, docs: int = TOKENIZER_CORPUS_DOCS) -> list[str]:
    """Prose, JSON, code and conversations (as qwen3's corpus), plus the family's template text."""
    rng = random.Random(seed)
    template = family.template_path.read_text()
    makers = (lambda: " ".join(qwen3_model._sentence(rng) for _ in range(rng.randint(1, 5))),
              lambda: qwen3_model._json_doc(rng), lambda: qwen3_model._code_doc(rng),
              lambda: qwen3_model._conversation_text(tiny_data.synthetic_example(rng)))
    out = [makers[i % 4]() for i in range(docs)]
    out.extend([template] * (docs // 100))
    return out


def train_tokenizer(family: Family, corpus: list[str]):
    """A byte-level BPE (qwen3's pre-tokenizer) with the family's special and format tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen3_model.PRE_TOKENIZER_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(family.format_tokens),
        special_tokens=list(family.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in family.special_tokens])
    # normalized=False: matched on the raw text, so each is one id wherever it appears.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.format_tokens])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=family.bos_token,
        eos_token=family.eos_token,
        pad_token=family.pad_token,
        chat_template=family.template_path.read_text(),
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )


def model_config(family: Family, tokenizer, *, hidden_size: int = 128, num_layers: int = 2, num_heads: int = 2,
                 num_kv_heads: int = 1, intermediate_size: int = 256):
    """The tiny Qwen3 decoder of worker/tiny/architecture.py, with the family's token ids; a hybrid family's
    (``architecture`` "qwen3_5") is worker/tiny/hybrid.py's Qwen3.5 decoder instead."""
    from transformers import Qwen3Config

    if family.architecture == "qwen3_5":
        from .hybrid import TRAINED_LAYER_TYPES, hybrid_config

        return hybrid_config(tokenizer, hidden_size=hidden_size, intermediate_size=intermediate_size,
                             layer_types=TRAINED_LAYER_TYPES, eos_token=family.eos_token, pad_token=family.pad_token)
    eos, pad = tokenizer.convert_tokens_to_ids([family.eos_token, family.pad_token])
    bos = tokenizer.convert_tokens_to_ids(family.bos_token) if family.bos_token else pad
    return Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=64, max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, dtype="bfloat16",
    )


def generation_config(family: Family, tokenizer):
    """Every stop token of the family ends generation; the family's usual sampling."""
    from transformers import GenerationConfig

    stops = tokenizer.convert_tokens_to_ids(list(family.stop_tokens))
    pad = tokenizer.convert_tokens_to_ids(family.pad_token)
    bos = tokenizer.convert_tokens_to_ids(family.bos_token) if family.bos_token else pad
    return GenerationConfig(bos_token_id=bos, eos_token_id=stops, pad_token_id=pad, do_sample=True,
                            **family.sampling)


# --- training data -----------------------------------------------------------------------------


def family_example(family: Family, rng: random.Random, *, stub: bool = False) -> tiny_data.Example:
    """One synthetic conversation (``data.synthetic_example``) as the family can render it.

    A family that always thinks gets only thinking examples (the others would teach
    empty thoughts under the same prompt); one that never thinks renders none. No
    "In detail," questions: their long lists rarely fit MAX_EXAMPLE_TOKENS, so the
    model would learn to start them and never to end them.
    """
    while True:
        example = tiny_data.synthetic_example(rng, stub=stub)
        if family.thinking == "always" and not example.enable_thinking:
            continue
        if any(m["role"] == "user" and m["content"].startswith(DETAIL_CUE) for m in example.messages):
            continue
        return tiny_data.normalised(example, family)


def completion_text(family: Family, tokenizer, example: tiny_data.Example) -> tuple[str, str]:
    """(generation prompt, completion) of an example's last turn, the completion with its end token.

    The completion is what the model must write after the prompt: the rendered
    conversation less the prompt, up to the turn's end token.
    """
    prompt = tokenizer.apply_chat_template(example.messages[:-1], tools=example.tools, tokenize=False,
                                           add_generation_prompt=True, enable_thinking=example.enable_thinking)
    full = tokenizer.apply_chat_template(example.messages, tools=example.tools, tokenize=False,
                                         enable_thinking=example.enable_thinking)
    if not full.startswith(prompt):
        raise ValueError(f"the {family.name} template does not extend the prompt with the last turn")
    completion = full[len(prompt):]
    end = family.turn_end(example.messages[-1])
    if family.template_ends_turn:
        completion = completion[: completion.rindex(end) + len(end)]
    else:
        completion += end
    return prompt, completion


def render_example(family: Family, tokenizer, example: tiny_data.Example) -> tuple[list[int], int]:
    """Token ids of the prompt then the completion (tokenized apart, as generated), and the prompt length."""
    prompt, completion = completion_text(family, tokenizer, example)
    prompt_enc, completion_enc = tokenizer.backend_tokenizer.encode_batch([prompt, completion],
                                                                         add_special_tokens=False)
    return prompt_enc.ids + completion_enc.ids, len(prompt_enc.ids)


def training_examples(family: Family, tokenizer, *, seed: int, tokens: int, stub: bool):
    """Rendered examples of at most MAX_EXAMPLE_TOKENS, about ``tokens`` in all."""
    rng = random.Random(seed)
    out, total = [], 0
    while total < tokens:
        ids, prompt_len = render_example(family, tokenizer, family_example(family, rng, stub=stub))
        if len(ids) <= MAX_EXAMPLE_TOKENS:
            out.append((ids, prompt_len))
            total += len(ids)
    return out


# --- training ----------------------------------------------------------------------------------

#: Training steps and padded tokens per step of the "trained" variant. qwen3 trains 600
#: steps of 3072 tokens (~2 min on 2 cores); a family's budget is about a minute with its
#: tokenizer, so fewer and smaller steps on shorter examples. Measured on held-out
#: prompts: 320 steps of 2048 left glm45 (two modes, thinking on and off) a third of its
#: thoughts unclosed; 440 of 1536 (as many tokens) closes nearly all.
TRAINED_STEPS = {"llama3": (640, 1536), "deepseek_r1": (440, 1536), "glm45": (440, 1536), "kimi_k2": (440, 1536),
                 "mistral": (640, 1536), "magistral": (640, 1536), "qwen36": (440, 1536)}


def _plan(family: Family, variant: str):
    from .training import TrainingPlan

    if variant == "stub":
        return TrainingPlan(steps=120, batch_tokens=2048)
    steps, batch_tokens = TRAINED_STEPS[family.name]
    return TrainingPlan(steps=steps, batch_tokens=batch_tokens, lr=6e-3, warmup_steps=20)


def train_model(family: Family, tokenizer, *, variant: str, seed: int = 0, plan=None):
    """Train a fresh tiny decoder on the family's synthetic conversations; return it in bfloat16.

    ``training.fit``, the loop qwen3's model trains with (loss on the last turn only, fixed
    steps and threads, so the same seed gives the same weights), on the family's data.
    """
    import torch

    from . import training as tiny_training

    plan = plan or _plan(family, variant)
    threads = torch.get_num_threads()
    torch.set_num_threads(tiny_training.TRAIN_THREADS)
    try:
        start = time.monotonic()
        rng = random.Random(seed)
        examples = training_examples(family, tokenizer, seed=seed, tokens=plan.steps * plan.batch_tokens,
                                     stub=variant == "stub")
        batches = tiny_training._batches(examples, plan.batch_tokens, rng)
        log.info("tiny %s model: %d examples in %d batches rendered in %.1f s", family.name, len(examples),
                 len(batches), time.monotonic() - start)
        config = model_config(family, tokenizer, hidden_size=plan.hidden_size, num_layers=plan.num_layers,
                              num_heads=plan.num_heads, num_kv_heads=plan.num_kv_heads,
                              intermediate_size=plan.intermediate_size)
        pad_id = tokenizer.convert_tokens_to_ids(family.pad_token)
        return tiny_training.fit(config, examples, batches, plan, pad_id=pad_id, seed=seed,
                                 label=f"tiny {family.name} model", start=start)
    finally:
        torch.set_num_threads(threads)


# --- build and cache ---------------------------------------------------------------------------


def build_key(family: str, variant: str, seed: int) -> str:
    """The content key of a build; for qwen3 exactly ``model.build_key`` (so its cache stays valid).

    For another family: the builder's sources (this file, families.py and the qwen3
    modules it reuses), the family's template, the parameters and the library versions.
    """
    if family == DEFAULT_FAMILY:
        return qwen3_model.build_key(variant, seed)
    spec = family_spec(family)
    versions = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "tokenizers")}
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for name in ("family_model.py", "families.py", "model.py", "architecture.py", "data.py", "training.py",
                 "hybrid.py"):
        digest.update((here / name).read_bytes())
    if family == "gpt_oss":  # Harmony's vocabulary and renderings (the wheel's version is in the key below)
        for path in (here / "harmony_model.py", here.parents[1] / "targets" / "harmony.py"):
            digest.update(path.read_bytes())
        from targets.harmony import harmony_library

        name, version = harmony_library()  # oss-harmony here and in CI, openai-harmony on the GPU's vLLM 0.26
        versions[name] = version
    digest.update(spec.template_path.read_bytes())
    digest.update(json.dumps({"family": family, "variant": variant, "seed": seed, **versions},
                             sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _build_files(spec: Family, tmp: Path, variant: str, seed: int, key: str) -> None:
    from .architecture import random_model

    if spec.name == "gpt_oss":
        from . import harmony_model

        marker = {"family": spec.name, "variant": variant, "seed": seed, "key": key}
        return harmony_model.build_files(spec, tmp, variant, seed, marker)
    tokenizer = train_tokenizer(spec, tokenizer_corpus(spec, seed))
    if variant == "random":
        model = random_model(model_config(spec, tokenizer), seed)  # a hybrid's config builds its own class
    else:
        model = train_model(spec, tokenizer, variant=variant, seed=seed)
    tmp.mkdir(parents=True, exist_ok=True)
    model.generation_config = generation_config(spec, tokenizer)
    model.save_pretrained(tmp, safe_serialization=True)
    # save_jinja_files=False keeps the template inside tokenizer_config.json, where
    # every transformers and vLLM version looks for it (and where family detection reads it).
    tokenizer.save_pretrained(tmp, save_jinja_files=False)
    marker = {"family": spec.name, "variant": variant, "seed": seed, "key": key}
    (tmp / qwen3_model.MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def _build_in_child(spec: Family, tmp: Path, variant: str, seed: int, key: str) -> None:
    """Build in a fresh Python whose OpenMP threads sleep while they wait.

    Once torch is loaded (a test session, a notebook) its OpenMP runtime has read
    OMP_WAIT_POLICY, and spinning threads made a 40 s build take 160-400 s on a
    shared 2-core machine. A child costs a few seconds of imports; the files are the same.
    """
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    args = json.dumps({"family": spec.name, "tmp": str(tmp), "variant": variant, "seed": seed, "key": key})
    code = ("import json, sys; from worker.tiny import family_model as m; a = json.loads(sys.argv[1]); "
            "m._build_files(m.family_spec(a['family']), m.Path(a['tmp']), a['variant'], a['seed'], a['key'])")
    subprocess.run([sys.executable, "-c", code, args], env=env, check=True)


def _build_cache_entry(spec: Family, cached: Path, variant: str, seed: int, key: str) -> None:
    """Build into a temporary sibling of ``cached`` and rename it into place (as model.py does)."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    for stale in cached.parent.glob(cached.name + ".*"):
        if time.time() - stale.stat().st_mtime > qwen3_model.STALE_BUILD_S:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=cached.name + ".", dir=cached.parent))
    try:
        if "torch" in sys.modules:
            _build_in_child(spec, tmp, variant, seed, key)
        else:
            with qwen3_model._passive_openmp_waits():
                _build_files(spec, tmp, variant, seed, key)
        try:
            os.replace(tmp, cached)
        except OSError:
            if (qwen3_model._read_marker(cached) or {}).get("key") == key:
                return  # another process won the race with the same files
            shutil.rmtree(cached, ignore_errors=True)
            os.replace(tmp, cached)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_tiny_model(out_dir: str | os.PathLike, *, variant: str = "random", seed: int = 0, force: bool = False,
                     cache_dir: str | os.PathLike | None = None, family: str = DEFAULT_FAMILY) -> Path:
    """Build the tiny model of ``family`` into ``out_dir``; loadable offline by transformers and vLLM.

    Args:
        out_dir: directory to write (created; must be empty or hold a tiny model).
        variant: ``"random"``, ``"trained"`` (follows the family's format: thinks where
            the family thinks, calls the offered tools, stops) or ``"stub"`` (always
            answers ``OK.``, with an empty thought where the family thinks).
        seed: seeds the tokenizer corpus, the weights and the training data.
        force: replace a tiny model already in ``out_dir``, and rebuild the cached copy.
        cache_dir: where built models are kept; default ``model.default_cache_dir()``.
        family: ``"qwen3"`` (``model.build_tiny_model``, unchanged), ``"llama3"``,
            ``"deepseek_r1"``, ``"glm45"``, ``"kimi_k2"``, ``"mistral"``, ``"magistral"`` or ``"gpt_oss"`` (see
            ``worker/tiny/families.py``).

    Raises:
        ValueError: unknown family or variant.
        FileExistsError: as ``model.build_tiny_model``.
    """
    spec = family_spec(family)
    if family == DEFAULT_FAMILY:
        return qwen3_model.build_tiny_model(out_dir, variant=variant, seed=seed, force=force,  # type: ignore[arg-type]
                                            cache_dir=cache_dir)
    if variant not in qwen3_model.VARIANTS:
        raise ValueError(f"unknown tiny-model variant {variant!r}; choose one of {', '.join(qwen3_model.VARIANTS)}")
    out = Path(out_dir)
    key = build_key(family, variant, seed)
    if qwen3_model.holds_build(out, key, force=force):
        return out
    cached = Path(cache_dir) if cache_dir is not None else qwen3_model.default_cache_dir()
    cached = cached / f"{family}-{variant}-{seed}-{key}"
    if force or (qwen3_model._read_marker(cached) or {}).get("key") != key:
        with qwen3_model.entry_lock(cached):  # one build per entry at a time on the machine
            if force:
                shutil.rmtree(cached, ignore_errors=True)
            if (qwen3_model._read_marker(cached) or {}).get("key") != key:
                _build_cache_entry(spec, cached, variant, seed, key)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(cached, out)
    return out
