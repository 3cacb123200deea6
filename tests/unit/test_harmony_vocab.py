"""bench/gpu/harmony_vocab.py: the o200k_base.tiktoken that vLLM 0.26's openai-harmony reads offline."""

from __future__ import annotations

import base64
import hashlib
import lzma

import pytest


def test_the_rebuilt_vocabulary_is_byte_for_byte_the_published_file(tmp_path):
    from bench.gpu.harmony_vocab import O200K_SHA256, main

    out = tmp_path / "o200k_base.tiktoken.xz"
    assert main([str(out)]) == 0
    data = lzma.decompress(out.read_bytes())
    # openai-harmony refuses a file of any other hash (HashMismatch), so this is what makes it load.
    assert hashlib.sha256(data).hexdigest() == O200K_SHA256
    lines = data.splitlines()
    assert len(lines) == 199_998
    token, rank = lines[1000].split(b" ")
    assert int(rank) == 1000 and base64.b64decode(token)


def test_a_vocabulary_of_another_hash_is_refused(monkeypatch):
    import worker.tiny.harmony_model as harmony_model
    from bench.gpu import harmony_vocab

    real = harmony_model.harmony_ranks
    monkeypatch.setattr(harmony_model, "harmony_ranks", lambda: {**real(), b"\x00extra": 199_998})
    with pytest.raises(SystemExit, match="not the published"):
        harmony_vocab.o200k_base_file()
