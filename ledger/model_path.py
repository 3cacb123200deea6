"""How a run names its model: one spelling on every side, so a worker recognises its own.

``regen submit --model ./models/q`` records an absolute path (workers run elsewhere);
``regen worker --model ./models/q`` must load and compare the same string, or every
batch of the run is refused as another model's.
"""

from __future__ import annotations

from pathlib import Path


def resolve_model(model: str) -> str:
    """A local model directory becomes an absolute path; a hub id stays as it is."""
    path = Path(model).expanduser()
    if path.exists():
        return str(path.resolve())
    return model
