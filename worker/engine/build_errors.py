"""Why an engine could not be built, and whether building it again could ever succeed.

A worker whose engine fails to build hands its batch back and exits (worker/process/runtime.py's
``EngineUnavailable``). Its launcher restarts it with a back-off, which is right for what may pass
(the card's memory still held by a dying process, a busy device, a hub that did not answer) and
useless for what cannot: the same engine args and the same files fail the same way at every start,
each after loading the model anew. Those stop the worker for good, in one line that names the reason
(docs/hybrid.md, "When the engine cannot be built"):

- **permanent**: what vLLM (or transformers, reading the model) raises while it builds its
  configuration, in the worker's own process, before any engine process starts: its config
  validation (``ValueError``, pydantic's ``ValidationError`` being one: "Chunked prefill is required
  for mamba cache mode 'align'", "Model architectures [...] are not supported"), an engine arg it
  does not know (``TypeError``), an assertion, a module it cannot import, a local model folder that
  does not exist.
- **transient**: the rest, today's back-off: running out of memory (``torch.OutOfMemoryError`` is a
  ``RuntimeError``), and every failure inside vLLM's engine processes, which reach the worker as
  "Engine core initialization failed" (a ``RuntimeError``) whatever their cause, so they cannot be
  told apart from here; a message that names memory, whatever its type.
"""

from __future__ import annotations

from pathlib import Path

#: The exit status of a worker process whose engine can never be built (sysexits' EX_CONFIG): its
#: launcher does not restart it (worker/process/launcher.py).
EXIT_ENGINE_NEVER_BUILDS = 78

#: Raised while vLLM builds its configuration from the engine args and the model's files.
PERMANENT_TYPES: tuple[type[BaseException], ...] = (ValueError, TypeError, AssertionError, ImportError,
                                                    NotImplementedError, FileNotFoundError, NotADirectoryError)
#: Words of a message that may pass on a retry, whatever the exception's type.
TRANSIENT_WORDS = ("out of memory", "memory", "busy", "timed out", "timeout", "temporarily")


def one_line(error: BaseException, *, limit: int = 400) -> str:
    """The error as one line: pydantic's first error message, else the message's first non-empty line."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            text = str(first.get("msg") or "")
        except Exception:  # noqa: BLE001 - not pydantic's shape after all; the message below says it
            text = ""
        if text:
            return _first_line(text, limit)
    return _first_line(str(error), limit) or type(error).__name__


def _first_line(text: str, limit: int) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return _clip(lines[0], limit) if lines else ""


def never_builds(error: BaseException, model: str) -> str | None:
    """The one-line reason ``model``'s engine can never be built, or None where a retry may succeed."""
    missing = _missing_local_folder(model)
    if missing is not None:
        return missing
    text = one_line(error)
    # The one line, not the whole message: pydantic's repeats the engine args (gpu_memory_utilization=...).
    if any(word in text.lower() for word in TRANSIENT_WORDS):
        return None
    if isinstance(error, PERMANENT_TYPES):
        return f"{type(error).__name__}: {text}"
    return None


def _missing_local_folder(model: str) -> str | None:
    """A model named by a path (absolute, or starting ``.`` or ``~``) that is not there: no retry brings it."""
    if not model.startswith(("/", ".", "~")):
        return None  # a hub id: the hub may answer next time
    if Path(model).expanduser().is_dir():
        return None
    return f"the model folder {model} does not exist on this node"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
