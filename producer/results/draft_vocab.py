"""``--draft-vocab N``: the d2t/t2d vocabulary mapping of an EAGLE-3 drafter, from the export's counts.

The draft vocabulary is the N token ids counted most often under the loss mask on the
training side (ties: the lower id first); when fewer than N ids were seen, the lowest
unseen ids fill it up. Its ids, ascending, are draft ids 0..N-1, and

    d2t[draft_id] = target_id - draft_id      int64, shape [N]   (target = draft + d2t[draft])
    t2d[target_id] = target_id in the vocab    bool,  shape [V]   (V: the target's config.json vocab_size)

This is the rule of speculators' ``build_vocab_mappings_from_distribution``
(speculators 0.9.0, ``speculators/train/vocab_mapping.py``) and of SpecForge's
``process_token_dict_to_mappings`` (specforge 0.2.0, ``specforge/data/preprocessing.py``;
it breaks ties by the order it met the tokens, regen by id). Files, in ``OUT/vocab/``:

- ``vocab_mapping-N.pt``: ``torch.save({"d2t": d2t, "t2d": t2d})``, SpecForge's file
  (``model.vocab_mapping_path``; ``Eagle3DraftModel.load_vocab_mapping`` reads it);
- ``d2t-N.npy``, ``t2d-N.npy``: ``numpy.save`` of the same arrays, the names and dtypes
  speculators' ``train`` loads (``--d2t-path``/``--t2d-path``, or found in ``--data-path``).

V is the row count of the target's embedding (``vocab_size``, in ``text_config`` for
multimodal models), not the tokenizer's length: Qwen3 pads 151,669 tokens to 151,936.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ledger.errors import ConfigError

VOCAB_DIR = "vocab"


def check_can_write() -> None:
    """torch writes SpecForge's file: refuse before anything is exported when it is missing."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"--draft-vocab writes SpecForge's vocab_mapping .pt with torch, which does not import "
                          f"here ({e}): install torch (the CPU build is enough)") from e


def target_vocab_size(model: str, tokenizer_path: str | None) -> tuple[int, str]:
    """The target's vocabulary size from its ``config.json``, and the file it came from.

    Looked for beside ``tokenizer_path`` (a folder or a tokenizer.json), else in the run's
    model folder, else in the local Hugging Face cache (never downloaded).

    Raises:
        ConfigError: no config.json, or one without a vocab_size.
    """
    candidates: list[Path] = []
    location = tokenizer_path or model
    if location:
        path = Path(location).expanduser()
        candidates.append((path if path.is_dir() else path.parent) / "config.json")
    if not tokenizer_path and not Path(model).expanduser().exists():
        cached = _hub_cached_config(model)
        if cached is not None:
            candidates.append(cached)
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        tried = ", ".join(str(p) for p in candidates) or "nothing"
        raise ConfigError(f"--draft-vocab needs the target's vocab_size from its config.json (tried {tried}): "
                          "pass --tokenizer DIR, a folder holding the model's tokenizer.json and config.json")
    config = json.loads(found.read_text(encoding="utf-8"))
    text_config = config.get("text_config") or {}
    size = text_config.get("vocab_size") or config.get("vocab_size")
    if not isinstance(size, int) or size < 1:
        raise ConfigError(f"{found}: no vocab_size (nor text_config.vocab_size) to size t2d with")
    return size, str(found)


def _hub_cached_config(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id=repo_id, filename="config.json")
    except ValueError:
        return None
    return Path(found) if isinstance(found, str) else None


def check_size(draft_size: int, target_size: int) -> None:
    if not 1 <= draft_size < target_size:
        raise ConfigError(f"--draft-vocab {draft_size}: a draft vocabulary has at least 1 token and fewer than "
                          f"the target's {target_size}")


def select(ids: np.ndarray, counts: np.ndarray, draft_size: int) -> np.ndarray:
    """The draft vocabulary's target ids, ascending (see the module docstring for the rule)."""
    order = np.lexsort((ids, -counts))  # most counted first, the lower id on a tie
    chosen = ids[order[:draft_size]]
    missing = draft_size - len(chosen)
    if missing:
        unseen = np.setdiff1d(np.arange(draft_size, dtype=np.int64), chosen)
        chosen = np.concatenate([chosen, unseen[:missing]])
    return np.sort(chosen)


def write_mappings(out: Path, ids: np.ndarray, counts: np.ndarray, draft_size: int, target_size: int,
                   target_source: str) -> dict[str, Any]:
    """Write the mapping files into ``out/vocab``; return the manifest's ``draft_vocab`` entry.

    Raises:
        ConfigError: a counted token id is outside the target's vocabulary (wrong config.json).
    """
    import torch

    if len(ids) and ids[-1] >= target_size:
        raise ConfigError(f"token id {int(ids[-1])} was generated but the target's vocab_size is {target_size} "
                          f"({target_source}): that config.json is not the run's model")
    chosen = select(ids, counts, draft_size)
    d2t = chosen - np.arange(draft_size, dtype=np.int64)
    t2d = np.zeros(target_size, dtype=np.bool_)
    t2d[chosen] = True
    folder = out / VOCAB_DIR
    folder.mkdir()
    files = {"specforge": f"{VOCAB_DIR}/vocab_mapping-{draft_size}.pt",
             "speculators_d2t": f"{VOCAB_DIR}/d2t-{draft_size}.npy",
             "speculators_t2d": f"{VOCAB_DIR}/t2d-{draft_size}.npy"}
    torch.save({"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d)}, out / files["specforge"])
    np.save(out / files["speculators_d2t"], d2t)
    np.save(out / files["speculators_t2d"], t2d)
    total = int(counts.sum())
    covered = int(counts[np.isin(ids, chosen)].sum()) if len(ids) else 0
    return {"size": draft_size, "target_vocab_size": target_size, "target_vocab_from": target_source,
            "tokens_seen": len(ids), "filled_with_unseen": max(0, draft_size - len(ids)),
            "coverage": covered / total if total else 0.0,
            "rule": "the most counted training-side ids (ties: lower id), then the lowest unseen ids; ascending "
                    "ids are draft ids; d2t = target_id - draft_id (int64 [N]), t2d = in the vocab (bool [V])",
            "files": files}
