"""An offline tiny Qwen3 model: for the demo, the tests and smoke tests of a deployment.

Nothing here downloads anything. The tokenizer is a byte-level BPE trained in a
second on a synthetic corpus, the chat template is regen's own Qwen3-style
template (``worker/tiny/templates/qwen3_chat.jinja``), and the weights are either
random (``variant="random"``) or briefly trained on synthetic conversations so
the model thinks, calls tools and stops (``"trained"``, ``"stub"``; see
``worker/tiny/training.py``).

Every build is deterministic for a given seed: the same seed writes the same
files byte for byte, so a built directory can be cached by a content key.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import random
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from . import data as tiny_data
from .architecture import generation_config, model_config, random_model
from .data import IDENTIFIERS, WORDS

Variant = Literal["random", "trained", "stub"]
VARIANTS: tuple[str, ...] = ("random", "trained", "stub")

TEMPLATE_PATH = Path(__file__).parent / "templates" / "qwen3_chat.jinja"

#: Special tokens, as in Qwen3: they delimit turns and never appear in decoded text.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Format tokens: single ids (so parsers can work by id) that stay in decoded text,
#: as Qwen3 has them (``special=False``).
FORMAT_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

#: BPE vocabulary including the special tokens, before the format tokens are added.
#: 4 K keeps the embedding small while common words are single tokens.
BPE_VOCAB_SIZE = 4096 - len(FORMAT_TOKENS)
#: Synthetic documents the BPE learns from; more adds build time, not quality.
TOKENIZER_CORPUS_DOCS = 4000

#: Qwen2/Qwen3's pre-tokenizer split: one digit per token, and a word keeps one leading
#: non-letter, so ``get_stock_price`` is ``get``, ``_stock``, ``_price`` (tool names
#: then share few tokens with prose, which the tiny model learns faster).
PRE_TOKENIZER_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: A temporary build directory older than this (seconds) was left by a killed build.
STALE_BUILD_S = 24 * 3600

#: Recorded in the output so a directory can say what built it (and be reused).
MARKER_FILE = "regen_tiny_model.json"


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
    return " ".join(words).capitalize() + rng.choice(".....?!")


def _json_doc(rng: random.Random) -> str:
    doc: dict[str, object] = {}
    for _ in range(rng.randint(1, 4)):
        key = rng.choice(IDENTIFIERS)
        kind = rng.random()
        if kind < 0.4:
            doc[key] = rng.choice(WORDS) + " " + rng.choice(WORDS)
        elif kind < 0.7:
            doc[key] = rng.randint(0, 5000)
        elif kind < 0.85:
            doc[key] = round(rng.uniform(-100, 100), 2)
        else:
            doc[key] = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
    return json.dumps(doc)


def _code_doc(rng: random.Random) -> str:
    fn, arg, other = rng.choice(IDENTIFIERS), rng.choice(IDENTIFIERS), rng.choice(IDENTIFIERS)
    return (f"def {fn}({arg}, {other}=None):\n"
            f"    if {other} is None:\n        return {arg}\n"
            f"    for i in range(len({arg})):\n        {other}[i] = {arg}[i] + {rng.randint(1, 99)}\n"
            f"    return {{\"{arg}\": {other}}}\n")


def _conversation_text(example: tiny_data.Example) -> str:
    """The text of a synthetic conversation roughly as the template lays it out (no tokenizer needed)."""
    parts = [json.dumps(tool) for tool in example.tools or []]
    for message in example.messages:
        parts.append(f"{message['role']}\n{message.get('reasoning_content') or ''}\n\n{message['content']}")
        for call in message.get("tool_calls") or []:
            parts.append(json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]}))
    return "\n".join(parts)


def tokenizer_corpus(seed: int = 0, docs: int = TOKENIZER_CORPUS_DOCS) -> list[str]:
    """Synthetic documents to train the BPE on: prose, JSON, code and conversations.

    The conversations (tool schemas, calls) and the template's own text are in
    the corpus so that rendered prompts tokenize into few tokens: fewer tokens
    make the training of the tiny model faster.
    """
    rng = random.Random(seed)
    template = TEMPLATE_PATH.read_text()
    out = []
    for i in range(docs):
        kind = i % 4
        if kind == 0:
            out.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 5))))
        elif kind == 1:
            out.append(_json_doc(rng))
        elif kind == 2:
            out.append(_code_doc(rng))
        else:
            out.append(_conversation_text(tiny_data.synthetic_example(rng)))
    # The template's own literal text (tool instructions) once per hundred documents.
    out.extend([template] * (docs // 100))
    return out


def train_tokenizer(corpus: list[str], vocab_size: int = BPE_VOCAB_SIZE):
    """Train a byte-level BPE with Qwen3's special and format tokens; return a PreTrainedTokenizerFast.

    Args:
        corpus: documents to learn merges from.
        vocab_size: size of the BPE vocabulary including the special tokens; the
            format tokens (``<think>`` ...) are added after it.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    # normalized=False: matched on the raw text, so "<think>" is one id wherever it appears.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in FORMAT_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TEMPLATE_PATH.read_text(),
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )


def save_model_dir(out_dir: Path, model, tokenizer, marker: dict) -> None:
    """Write the model, tokenizer (template embedded in tokenizer_config.json) and marker."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = generation_config(tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    # save_jinja_files=False keeps the template inside tokenizer_config.json, where
    # every transformers and vLLM version looks for it.
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def build_key(variant: str, seed: int) -> str:
    """A content key: the builder's sources, the template, the parameters and the library versions.

    Any edit to the code or an upgrade of torch/transformers/tokenizers yields a
    new key, so a stale cached model is never reused.
    """
    # Versions from the package metadata: importing torch here would load OpenMP
    # before _passive_openmp_waits can configure it.
    versions = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "tokenizers")}
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in (here / "model.py", here / "architecture.py", here / "data.py", here / "training.py", TEMPLATE_PATH):
        if path.exists():
            digest.update(path.read_bytes())
    digest.update(json.dumps({"variant": variant, "seed": seed, **versions}, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path:
    """``$REGEN_CACHE_DIR/tiny-models``, else ``~/.cache/regen/tiny-models``."""
    root = os.environ.get("REGEN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "regen")
    return Path(root) / "tiny-models"


def holds_build(out: Path, key: str, *, force: bool) -> bool:
    """Whether ``out`` already holds the build ``key`` (to reuse); False when it is empty or may be replaced.

    Raises:
        FileExistsError: ``out`` holds something else: files no tiny build wrote (never deleted,
            even with force), or another build without ``force``.
    """
    if not (out.exists() and any(out.iterdir())):
        return False
    marker = _read_marker(out)
    if marker is None:
        raise FileExistsError(f"{out} is not empty and holds no tiny model; choose another directory")
    if marker.get("key") == key and not force:
        return True
    if not force:
        raise FileExistsError(f"{out} holds another tiny model build ({marker.get('family', 'qwen3')}, "
                              f"{marker.get('variant')}, seed {marker.get('seed')}); use force=True to replace it")
    return False


def _read_marker(path: Path) -> dict | None:
    try:
        return json.loads((path / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def _passive_openmp_waits():
    """Load torch with OpenMP threads that sleep, not spin, while they wait.

    On a shared machine spinning threads steal each other's cores: the training
    measured 16x slower. libgomp reads the setting once, when torch loads it, so
    the environment is restored at once and nothing started later inherits it.
    """
    if "torch" in sys.modules:
        yield
        return
    previous = os.environ.get("OMP_WAIT_POLICY")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch  # noqa: F401 (loaded here for the side effect above)
    finally:
        if previous is None:
            del os.environ["OMP_WAIT_POLICY"]
        else:
            os.environ["OMP_WAIT_POLICY"] = previous
    yield


def _build_into(tmp: Path, variant: str, seed: int, key: str) -> None:
    with _passive_openmp_waits():
        _build_files(tmp, variant, seed, key)


def _build_files(tmp: Path, variant: str, seed: int, key: str) -> None:
    tokenizer = train_tokenizer(tokenizer_corpus(seed))
    if variant == "random":
        model = random_model(model_config(tokenizer), seed)
    else:
        from . import training as tiny_training  # torch training code, only needed for these variants

        model = tiny_training.train_model(tokenizer, variant=variant, seed=seed)
    save_model_dir(tmp, model, tokenizer, {"variant": variant, "seed": seed, "key": key})


def _build_cache_entry(cached: Path, variant: str, seed: int, key: str) -> None:
    """Build into a temporary sibling of ``cached`` and rename it into place.

    A killed build leaves no half entry (only a temporary directory, removed by a
    later build once it is a day old). When two processes build the same entry at
    once, the first rename wins and the other's identical files are dropped.
    """
    cached.parent.mkdir(parents=True, exist_ok=True)
    for stale in cached.parent.glob(cached.name + ".*"):
        if time.time() - stale.stat().st_mtime > STALE_BUILD_S:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=cached.name + ".", dir=cached.parent))
    try:
        _build_into(tmp, variant, seed, key)
        try:
            os.replace(tmp, cached)
        except OSError:
            if (_read_marker(cached) or {}).get("key") == key:
                return  # another process won the race with the same files
            shutil.rmtree(cached, ignore_errors=True)  # an entry without a valid marker
            os.replace(tmp, cached)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def entry_lock(cached: Path):
    """Hold the machine-wide lock of the cache entry ``cached`` (an advisory lock on a file beside it).

    Two processes that want the same entry at once (two pytest-xdist workers, a worker and
    the demo) then build it once: the second waits, and finds it built. The lock is the
    kernel's, so a killed builder never leaves it held.
    """
    import fcntl

    cached.parent.mkdir(parents=True, exist_ok=True)
    with open(cached.parent / f".{cached.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_tiny_model(out_dir: str | os.PathLike, *, variant: Variant = "random", seed: int = 0,
                     force: bool = False, cache_dir: str | os.PathLike | None = None) -> Path:
    """Build the tiny Qwen3 model into ``out_dir``; loadable offline by transformers and vLLM.

    The model is built once per content key (sources + variant + seed + library
    versions) into the cache and copied from there, so the trained variants cost
    their training time once per machine.

    Args:
        out_dir: directory to write (created; must be empty or hold a tiny model).
        variant: ``"random"`` (random weights, seconds), ``"trained"`` (thinks,
            calls the offered tools, stops) or ``"stub"`` (always answers
            ``<think>\\n\\n</think>\\n\\nOK.``).
        seed: seeds the tokenizer corpus, the weights and the training data.
        force: replace a tiny model already in ``out_dir``, and rebuild the cached copy.
        cache_dir: where built models are kept; default ``default_cache_dir()``.

    Returns:
        The path of the model directory.

    Raises:
        ValueError: unknown variant.
        FileExistsError: ``out_dir`` holds something other than a tiny model, or
            another tiny model build and ``force`` is false.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny-model variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    out = Path(out_dir)
    key = build_key(variant, seed)
    if holds_build(out, key, force=force):
        return out

    cached = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cached = cached / f"{variant}-{seed}-{key}"
    if force or (_read_marker(cached) or {}).get("key") != key:
        with entry_lock(cached):
            if force:
                shutil.rmtree(cached, ignore_errors=True)
            if (_read_marker(cached) or {}).get("key") != key:  # or built meanwhile by the lock's last holder
                _build_cache_entry(cached, variant, seed, key)

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(cached, out)
    return out
