"""Write o200k_base.tiktoken, the vocabulary file that openai-harmony 0.0.8 (the GPU bundle's) reads.

vLLM 0.26's gpt-oss path uses the ``openai-harmony`` wheel, which downloads o200k_base.tiktoken from
openaipublic.blob.core.windows.net on first use, or reads it from the folder ``TIKTOKEN_ENCODINGS_BASE``
names, and checks its SHA-256 either way. The lent GPU machine has no network, so the Harmony fidelity
suite needs the file carried (issue 31, item 7). The CPU build's ``oss-harmony`` compiles the vocabulary
in; this rebuilds the file from it (each ordinary id's bytes, base64, then its rank: tiktoken's format)
and refuses to write anything whose hash is not the published one.

    .venv/bin/python -m bench.gpu.harmony_vocab .gpu-carry/o200k_base.tiktoken.xz
"""

from __future__ import annotations

import base64
import hashlib
import lzma
import sys
from pathlib import Path

#: The SHA-256 openai-harmony checks o200k_base.tiktoken against (its public_encodings.rs).
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def o200k_base_file() -> bytes:
    from worker.tiny.harmony_model import harmony_ranks

    ranks = sorted(harmony_ranks().items(), key=lambda item: item[1])
    data = b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n" for token, rank in ranks)
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_SHA256:
        raise SystemExit(f"rebuilt o200k_base.tiktoken has sha256 {digest}, not the published {O200K_SHA256}")
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith(".xz"):
        raise SystemExit("usage: python -m bench.gpu.harmony_vocab OUT.tiktoken.xz")
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(lzma.compress(o200k_base_file(), preset=9 | lzma.PRESET_EXTREME))
    print(f"{out}: {out.stat().st_size:,} B (o200k_base.tiktoken, sha256 {O200K_SHA256[:12]}..., xz)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
