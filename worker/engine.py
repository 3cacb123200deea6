"""One vLLM engine per worker process, kept full by every batch in flight.

The engine is vLLM's ``AsyncLLM`` living on a dedicated event-loop thread (an
AsyncLLM driven by ``asyncio.run`` from several task threads dies after the first
call: measured). Celery task threads hand their batch's coroutine to this loop with
``run_coroutine_threadsafe``; the conversations of every batch in flight then
share one continuously batched engine, so a batch boundary never drains it.

vLLM is imported only here (and lazily), so the control plane never needs it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: Engine settings that differ from vLLM's AsyncLLM defaults. AsyncLLM defaults to
#: max_num_seqs 128 and 2,048 batched tokens (unlike ``LLM``), which starves a
#: throughput job; these are the offline-batch values. Override with --engine-arg.
DEFAULT_ENGINE_ARGS: dict[str, Any] = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "enable_prefix_caching": True,
    "disable_log_stats": True,
}


class EngineDead(RuntimeError):
    """The engine process died (OOM kill, CUDA error). The worker process must restart."""


@dataclass
class EngineGeneration:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stop_reason: str | int | None = None


@dataclass
class EngineHost:
    model: str
    engine_args: dict[str, Any] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _llm: Any = None
    tokenizer: Any = None
    max_model_len: int = 0
    engine_version: str = ""
    _ids: itertools.count = field(default_factory=itertools.count)

    def start(self) -> None:
        """Load the tokenizer and the engine (blocking; ~20 s for the tiny model on a CPU)."""
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._build(), self._loop).result()
        log.info("engine ready: %s (max_model_len %d, %s)", self.model, self.max_model_len,
                 self.engine_version)

    async def _build(self) -> None:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        args = {**DEFAULT_ENGINE_ARGS, **self.engine_args}
        if current_platform.is_cpu():
            # vLLM's CPU build (0.32) kills the engine ("CPU Generator does not use offset") when
            # a seeded request's prompt is prefilled in chunks, and every regen request is seeded.
            args.setdefault("enable_chunked_prefill", False)
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=self.model, **args))
        self.max_model_len = self._llm.model_config.max_model_len
        self.engine_version = f"vllm {vllm.__version__}"

    def submit(self, coro: Coroutine) -> concurrent.futures.Future:
        """Run a coroutine on the engine loop; cancel the returned future to abort it."""
        if self._loop is None:
            raise RuntimeError("engine not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> EngineGeneration:
        """Generate one completion; runs on the engine loop. Cancelling it aborts the request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        params = SamplingParams(**sampling, output_kind=RequestOutputKind.FINAL_ONLY)
        request_id = f"r{os.getpid()}-{next(self._ids)}"
        final = None
        try:
            async for out in self._llm.generate({"prompt_token_ids": prompt_token_ids}, params, request_id):
                final = out
        except EngineDeadError as e:
            raise EngineDead(str(e)) from e
        if final is None:
            raise EngineDead(f"engine returned no output for {request_id}")
        completion = final.outputs[0]
        return EngineGeneration(
            prompt_token_ids=list(final.prompt_token_ids or prompt_token_ids),
            token_ids=list(completion.token_ids),
            text=completion.text,
            finish_reason=completion.finish_reason or "abort",
            stop_reason=completion.stop_reason,
        )

    @property
    def alive(self) -> bool:
        return self._llm is not None and not self._llm.errored

    def num_unfinished(self) -> int:
        return self._llm.get_num_unfinished_requests() if self._llm is not None else 0

    def _cancel_output_handler(self) -> None:
        """Stop vLLM's output handler before the engine core goes.

        AsyncLLM.shutdown stops the engine core first and cancels its output handler
        after, so the handler sees the core vanish and logs an EngineDeadError
        traceback at every clean exit: noise that reads like a crash in a worker log.
        """
        handler = getattr(self._llm, "output_handler", None)
        if handler is None or self._loop is None or handler.done():
            return

        async def cancel() -> None:
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await handler

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(timeout=10)

    def shutdown(self) -> None:
        if self._llm is not None:
            self._cancel_output_handler()
            try:
                self._llm.shutdown()
            except Exception:  # noqa: BLE001 - best effort at exit; the launcher reaps the group anyway
                log.exception("engine shutdown failed")
            self._llm = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None
