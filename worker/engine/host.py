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
import contextlib
import gc
import itertools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from ledger.errors import RegenError
from worker.conversation.dialogue import Generation
from worker.engine.admission import AdmissionGate, admission_level
from worker.engine.architecture_args import architecture_engine_args, read_model_config
from worker.engine.cache_plan import EngineCapacity, engine_capacity
from worker.engine.gpu_memory import Card, gpu_cards, memory_share
from worker.engine.kv_level import KV_ADMISSION_ENV, KvLevel, kv_admission_wanted
from worker.engine.kv_tier import check_host_memory, keep_generated_blocks
from worker.engine.loop import LoopHost
from worker.engine.loop_watch import LOOP_FINISH, LoopWatch, follow, stream_every
from worker.engine.occupancy import REPORT_S, OccupancySampler
from worker.engine.stats import SchedulerRecorder, attach, stats_wanted

log = logging.getLogger(__name__)

#: The vLLM releases regen supports: 0.26 (the whole system ran on CUDA H200s), 0.32
#: (the CPU build every test runs on) and 0.33, the newest (the names used here were
#: checked in its source). The differences between them are handled here (see
#: ``_unfinished_counter``); pyproject's ``gpu`` extra states the same range. Another
#: release is tried anyway, with a warning in the worker's log.
SUPPORTED_VLLM = ">=0.26,<0.34"

#: Settings regen adds on every platform. Prefix caching: a multi-turn conversation's
#: next turn repeats the previous prompt; stats off: they cost a log line per step.
COMMON_ENGINE_ARGS: dict[str, Any] = {"enable_prefix_caching": True, "disable_log_stats": True}

#: vLLM's CPU build: its offline defaults are sized for a big CPU node, and seeded
#: requests crash it when their prefill is chunked ("CPU Generator does not use
#: offset", vLLM CPU 0.32), and every regen request is seeded. Without chunking, one
#: step must fit a whole prompt, hence batched tokens >= max_model_len.
CPU_ENGINE_ARGS: dict[str, Any] = {"max_num_seqs": 256, "max_num_batched_tokens": 8192,
                                   "enable_chunked_prefill": False}


#: vLLM's GPU engines, on top of its own defaults. ``watermark``: the share of KV blocks a
#: waiting or preempted request must leave free to be admitted. vLLM's default, 0, admits
#: whenever the prompt fits; when the cache is the limit (long answers: the seed's regime)
#: every freed block is taken at once, the running requests then find none for their next
#: token, and the newest is preempted and recomputed, again and again: at 0 a 32B engine on
#: an H200 scheduled ~2 tokens for every token it output. At 1% it output 1.18x the tokens of
#: the defaults beside it in a steady-state run (1.66x in another, whose population may not
#: have been sustainable; docs/results/h200-gpu-steady-2026-12-03.txt). One value for every
#: workload, not one sized from it: where the cache is not the limit (short answers) the free
#: blocks never fall to 1%, so it acts only where the cache is the limit, which it finds itself.
GPU_ENGINE_ARGS: dict[str, Any] = {"watermark": 0.01}


#: Every engine arg regen may choose on a GPU: bench/gpu/throughput.py's bare phase (a) leaves them
#: all to vLLM, to show what regen's choices are worth.
REGEN_GPU_CHOICES = (*GPU_ENGINE_ARGS, "gpu_memory_utilization")


def engine_defaults(on_cpu: bool, *, cards: list[Card] | list[tuple[float, float]] | None = None) -> dict[str, Any]:
    """regen's engine settings under the user's ``--engine-arg``s.

    On GPUs regen sets no limits of its own: the engine is built as vLLM's offline
    ``LLM`` builds it (usage context LLM_CLASS), so vLLM sizes max_num_seqs and the
    batched tokens for the GPU it finds (1,024 and 16,384 on an H100/H200, 256 and
    8,192 on smaller cards). A fixed 256/8,192 cost an H200 19% (docs/performance.md).
    What it does set is ``GPU_ENGINE_ARGS``'s admission watermark and, on big cards that are
    empty when the engine starts (``cards``: (total MiB, used MiB) each, read by nvidia-smi
    when not given), a larger share of the card (worker/engine/gpu_memory.py).
    """
    if on_cpu:
        return {**COMMON_ENGINE_ARGS, **CPU_ENGINE_ARGS}
    return {**COMMON_ENGINE_ARGS, **GPU_ENGINE_ARGS, **memory_share(gpu_cards() if cards is None else cards)}


def chosen_engine_args(on_cpu: bool, user: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """What an engine is built with: regen's defaults, what ``model``'s architecture needs on this platform
    (worker/engine/architecture_args.py: a hybrid, a vision tower), the user's args over them, and a CPU tier
    the user asked for told to keep generated blocks too, not only prompts (worker/engine/kv_tier.py)."""
    needed = architecture_engine_args(read_model_config(model), on_cpu=on_cpu)
    return keep_generated_blocks({**engine_defaults(on_cpu), **needed, **user})


def expected_max_num_seqs(engine_args: dict[str, Any], *, cuda_visible: str | None = None) -> int:
    """The max_num_seqs the engine will be built with, known before it is (vLLM's rule).

    A worker sizes its Celery threads before its first batch names the model, so it
    cannot ask the engine yet. vLLM's offline defaults (``EngineArgs.get_batch_defaults``,
    0.26-0.32): 1,024 on GPUs of 70 GiB or more except the A100, else 256; its CPU build 256.
    """
    if "max_num_seqs" in engine_args:
        return int(engine_args["max_num_seqs"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") if cuda_visible is None else cuda_visible
    if not visible.strip():
        return int(CPU_ENGINE_ARGS["max_num_seqs"])
    cards = gpu_cards(visible.split(",")[0].strip())
    if not cards:
        return 256  # nvidia-smi cannot tell: vLLM's smaller default, held batches err low
    mib, name = cards[0].total_mib, cards[0].name
    big = float(mib) >= 160 * 1024 or (float(mib) >= 70 * 1024 and "a100" not in name.lower())
    return 1024 if big else 256


class EngineDead(RegenError):
    """The engine process died (OOM kill, CUDA error). The worker process must restart."""


@dataclass
class EngineHost(LoopHost):
    #: ``generate`` takes a ``loop_watch`` (worker/conversation/generation.py passes one only where this is true).
    watches_loops = True
    model: str
    engine_args: dict[str, Any] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _llm: Any = None
    tokenizer: Any = None
    max_model_len: int = 0
    #: What the engine was built with (vLLM's own default where regen sets none).
    max_num_seqs: int = 0
    engine_version: str = ""
    #: Conversations enter the engine through this gate (worker/engine/admission.py).
    admission: AdmissionGate | None = None
    _ids: itertools.count = field(default_factory=itertools.count)
    _tickets: itertools.count = field(default_factory=itertools.count)
    _count_unfinished: Any = None
    #: How full the engine is kept (worker/engine/occupancy.py): logged every minute, exported.
    occupancy: OccupancySampler | None = None
    #: The level the engine's KV cache holds, learned from the answers (worker/engine/kv_level.py).
    kv_level: KvLevel | None = None
    _logged_level: int = 0
    #: The engine args it was built with beyond vLLM's defaults: regen's (engine_defaults) and the user's.
    chosen_args: dict[str, Any] = field(default_factory=dict)
    #: Tokens the KV cache holds, as vLLM sized it (0 where it cannot say): its own "KV cache size", the
    #: sequences of max_model_len its blocks hold times that length (a hybrid's states take blocks too).
    kv_cache_tokens: int = 0
    #: The pool behind it (worker/engine/cache_plan.py): blocks, and sequences of max_model_len they hold.
    capacity: EngineCapacity = field(default_factory=EngineCapacity)

    def start(self) -> None:
        """Load the tokenizer and the engine (blocking; ~20 s for the tiny model on a CPU)."""
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        self._thread = self._start_loop("vllm-engine-loop")
        asyncio.run_coroutine_threadsafe(self._build(), self._loop).result()
        # Everything loaded so far (torch, vLLM, transformers, the tokenizer: ~650K objects) lives as
        # long as the process. Out of the collector's sight, a full collection no longer walks them:
        # it took 250 ms on an idle core here, and under a busy engine it stopped the event loop for
        # up to 1.9 s (worker/engine/occupancy.py's lag). vLLM freezes its own processes the same way.
        gc.collect()
        gc.freeze()
        # The cache's size is printed because it, not max_num_seqs, bounds a long-answer run (docs/performance.md,
        # "The seed's regime"); bench/gpu/throughput.py reads it back to bound each phase by its own cache.
        log.info("engine ready: %s (%s, max_model_len %d, max_num_seqs %d, KV cache %d tokens%s); settings chosen: %s",
                 self.model, self.engine_version, self.max_model_len, self.max_num_seqs, self.kv_cache_tokens,
                 self.capacity.note(), self.settings_note())

    async def _build(self) -> None:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        args = chosen_engine_args(current_platform.is_cpu(), self.engine_args, self.model)
        check_host_memory(args)
        self.chosen_args = {k: v for k, v in args.items() if k != "disable_log_stats"}
        if stats_wanted():
            args["disable_log_stats"] = False  # a diagnosis (worker/engine/stats.py), never the default
        # LLM_CLASS: vLLM's offline-batch defaults for this GPU (AsyncLLM's own context
        # would give 128 sequences and 2,048 batched tokens, sized for serving latency).
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=self.model, **args),
                                              usage_context=UsageContext.LLM_CLASS)
        self.max_model_len = self._llm.model_config.max_model_len
        self.max_num_seqs = int(self._llm.vllm_config.scheduler_config.max_num_seqs)
        self.admission = AdmissionGate(admission_level(self.max_num_seqs))
        self.capacity = engine_capacity(self._llm.vllm_config, self.max_model_len)
        self.kv_cache_tokens = self.capacity.tokens
        if kv_admission_wanted():  # worker/engine/kv_level.py: an A/B switch until the GPU shows a gain
            plan = self.capacity.plan  # a hybrid's level: its blocks' slots over footprints plus states
            self.kv_level = KvLevel(
                default_level=self.admission.level,
                kv_tokens=plan.token_slots(self.capacity.blocks) if plan else self.kv_cache_tokens,
                per_sequence_tokens=plan.state_tokens() if plan else 0.0)
        self._logged_level = self.admission.level
        self._count_unfinished = _unfinished_counter(self._llm)
        # The gate is read at each sample: a test may swap it (tests/integration/test_admission_engine.py).
        self.occupancy = OccupancySampler(
            self._count_unfinished, lambda: bool(self.admission and self.admission.has_waiting),
            self.max_num_seqs)
        asyncio.ensure_future(self.occupancy.run())  # cancelled with the loop's other tasks at shutdown
        if stats_wanted():
            recorder = attach(self._llm, SchedulerRecorder(
                admitted=lambda: self.admission.admitted_total if self.admission else 0))
            asyncio.ensure_future(recorder.run(REPORT_S))
        self.engine_version = f"vllm {vllm.__version__}"
        if not _supported(vllm.__version__):
            log.warning("vLLM %s is outside the releases regen supports (%s); it may work, untested",
                        vllm.__version__, SUPPORTED_VLLM)

    async def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any], *,
                       loop_watch: LoopWatch | None = None) -> Generation:
        """Generate one completion; runs on the engine loop. Cancelling it aborts the request.

        With ``loop_watch`` the completion's ids arrive every ``LOOP_STREAM_TOKENS`` (vLLM's per-request
        ``stream_interval``) and are fed to it; once it says the completion loops, the request is aborted and the
        ids so far come back with ``finish_reason`` ``LOOP_FINISH`` (worker/engine/loop_watch.py).
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        if loop_watch is None:
            params = SamplingParams(**sampling, output_kind=RequestOutputKind.FINAL_ONLY)
        else:
            params = SamplingParams(**sampling, output_kind=RequestOutputKind.DELTA, **stream_every(SamplingParams))
        request_id = f"r{os.getpid()}-{next(self._ids)}"
        budget = int(sampling.get("max_tokens") or max(1, self.max_model_len - len(prompt_token_ids)))
        self._asked(len(prompt_token_ids), budget)
        final, looped = None, False
        stream = self._llm.generate({"prompt_token_ids": prompt_token_ids}, params, request_id)
        try:
            if loop_watch is None:
                async for out in stream:
                    final = out
            else:
                final, token_ids, looped = await follow(stream, loop_watch)
        except EngineDeadError as e:
            raise EngineDead(str(e)) from e
        if final is None:
            raise EngineDead(f"engine returned no output for {request_id}")
        completion = final.outputs[0]
        if loop_watch is None:
            token_ids = list(completion.token_ids)
        if self.occupancy is not None:
            self.occupancy.ended(len(token_ids))
        self._ended(len(final.prompt_token_ids or prompt_token_ids), len(token_ids), budget)
        return Generation(
            prompt_token_ids=list(final.prompt_token_ids or prompt_token_ids),
            token_ids=token_ids,
            finish_reason=LOOP_FINISH if looped else completion.finish_reason or "abort",
            stop_reason=None if looped else completion.stop_reason,
        )

    def _asked(self, prompt_tokens: int, budget: int) -> None:
        """Learn from a request entering the engine; move the gate's level where the KV cache holds it."""
        if self.kv_level is None or self.admission is None:
            return
        self.kv_level.asked(prompt_tokens, budget)
        self._follow_level()

    def _ended(self, prompt_tokens: int, output_tokens: int, budget: int | None = None) -> None:
        """Learn from an ended generation; move the gate's level where the KV cache holds it."""
        if self.kv_level is None or self.admission is None:
            return
        self.kv_level.ended(prompt_tokens, output_tokens, budget)
        self._follow_level()

    def _follow_level(self) -> None:
        assert self.kv_level is not None and self.admission is not None
        level = self.kv_level.level()
        if level != self.admission.level:
            # Logged when it has moved by a tenth: the estimate drifts by one or two each generation.
            if abs(level - self._logged_level) * 10 >= self._logged_level:
                log.info("admission level %d -> %d: %s", self._logged_level, level, self.kv_level.describe())
                self._logged_level = level
            self.admission.set_level(level)
            if self.occupancy is not None:
                # Fewer than max_num_seqs in the engine is not "short" when the cache cannot hold more.
                self.occupancy.max_num_seqs = min(self.max_num_seqs, level)

    def settings_note(self) -> str:
        """What regen chose for this engine beyond vLLM's defaults, for the worker's log and the run's record."""
        level = self.admission.level if self.admission else 0
        chosen = ", ".join(f"{k}={v}" for k, v in sorted(self.chosen_args.items()))
        if self.kv_level is None:
            return (f"engine args {chosen or 'vLLM defaults'}; admitting {level} conversations at once "
                    f"(1.5 x max_num_seqs; {KV_ADMISSION_ENV}=1 sizes it to the KV cache)")
        return (f"engine args {chosen or 'vLLM defaults'}; admitting up to {level} conversations at once, sized to "
                f"{self.kv_level.fill:.0%} of the KV cache ({self.kv_level.kv_tokens:,} tokens) over the requests' "
                "budgets, then their answers (worker/engine/kv_level.py)")

    def settings(self) -> dict[str, Any]:
        """The engine's settings for the run's provenance: what regen and the user set, and what vLLM sized."""
        return {"args": dict(sorted(self.chosen_args.items())), "max_num_seqs": self.max_num_seqs,
                "max_model_len": self.max_model_len, **self.capacity.record(), "kv_cache_tokens": self.kv_cache_tokens,
                "admission_level": self.admission.level if self.admission else 0}

    @property
    def alive(self) -> bool:
        return self._llm is not None and not self._llm.errored

    def num_unfinished(self) -> int:
        """Requests the engine holds, running or waiting."""
        return self._count_unfinished() if self._llm is not None else 0

    async def abort_unstarted(self) -> int | None:
        """Drop every conversation not yet started: at the gate, and in vLLM's queue; runs on the engine loop.

        For the estimate's probe only (worker/engine/pilot.py), never a worker: at a run's
        end the work still waiting is done at the full engine's rate, which costs time and
        no loss, so the probe drops it and measures only the tail. First the batches waiting
        at the admission gate with nothing admitted are withdrawn (their waiters raise
        ``HandedBack``), so no slot freed below lets one in; then the requests vLLM holds
        that have not produced a token are aborted (each one's ``generate`` returns an empty
        generation ending "abort"). A preempted request has produced tokens and is kept.
        Returns how many conversations were dropped, or None where this vLLM's output
        processor does not say which requests have started (its request states and their
        ``is_prefilling``: 0.26-0.32); nothing is dropped then.
        """
        states = getattr(getattr(self._llm, "output_processor", None), "request_states", None)
        if not isinstance(states, dict):
            return None
        withdrawn = 0
        if self.admission is not None:
            before = self.admission.waiting
            self.admission.withdraw_unstarted(len(self.admission.unstarted()))
            withdrawn = before - self.admission.waiting
        unstarted = [rid for rid, state in states.items() if getattr(state, "is_prefilling", False)]
        if unstarted:
            await self._llm.abort(unstarted, internal=True)
        return withdrawn + len(unstarted)

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
            self._finish_tasks()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None

    def _finish_tasks(self, timeout_s: float = 10.0) -> None:
        """Cancel what still runs on the loop and let it unwind before the loop stops.

        vLLM's client cancels its output-queue task at shutdown but returns before the
        task has run its cancellation; a loop stopped then destroys it pending, and
        asyncio logs ``ERROR Task was destroyed but it is pending!`` at every clean exit.
        """
        async def finish() -> None:
            me = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not me]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout_s)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(finish(), self._loop).result(timeout=timeout_s + 5)


def _supported(version: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        # Local builds carry suffixes (0.26.0+cu130, 0.32.0+cpu): compare the release only.
        return Version(Version(version).base_version) in SpecifierSet(SUPPORTED_VLLM)
    except InvalidVersion:
        return False


def _unfinished_counter(llm: Any):
    """``AsyncLLM.get_num_unfinished_requests`` where it exists (0.27+); 0.26 has it
    only on the output processor, which keeps one state per unfinished request."""
    method = getattr(llm, "get_num_unfinished_requests", None)
    if method is not None:
        return method
    return llm.output_processor.get_num_unfinished_requests
