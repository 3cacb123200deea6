"""A fake engine: token ids at a set rate, for benchmarks and tests of the control plane. Never real data.

``python -m worker.process.consumer --fake-engine tok_s=10000,seqs=1024,mean=1500,sigma=1,gpus=1`` runs a
worker whose whole path is the real one (claim, input read from S3, heartbeats, upload,
commit, gate, reconciler, Redis acks) except the engine: no vLLM, no torch, no tokenizer.
Each conversation's answer is ``min(max_tokens, lognormal(mean, sigma))`` random token ids,
produced at ``tok_s / seqs`` tokens per second per sequence with at most ``seqs``
sequences at once, so a full engine makes ``tok_s`` output tokens/s. ``solo=K`` (default 1)
lets a sequence of an engine that is short of work go faster, as a real one does (a decode
step over fewer sequences is shorter): the engine's ``tok_s`` is shared by the sequences it
runs, each at most K times the full engine's per-sequence rate (a lone sequence on an H200
decodes ~10x faster than one of 1,024). ``gpus=N`` makes one
process stand for N engines' traffic (N x the sequences and the rate, so N x the batches
held, claimed and committed): a 2-core machine can then load the ledger like a farm.

It is a benchmark and test device, not a production mode, and it cannot touch a real run:

* it is used only when that option is given (an environment variable never selects it), and
  the worker logs a warning at start;
* it serves only runs submitted with ``regen submit --benchmark`` (``runs.benchmark``): the
  claim itself refuses it any other run's batch (ledger/transitions.py ``claim``), so no
  attempt is taken and no failure counted; the worker logs the refusal, counts it
  (``batches.fake_refusals``: ``regen status``, ``regen metrics``; the worker's own
  ``regen_worker_fake_refusals``) and hands the message back for a real worker;
  ``WorkerRuntime.engine_for`` refuses it a second time;
* every row it makes carries ``fake_engine`` (``FAKE_ENGINE_VERSION``), and the commit marks
  the batch ``fake`` from its rows; ``regen status`` and ``regen report`` show fake batches,
  and ``regen export`` never exports a fake row (it counts them in the manifest's ``left_out``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import random
from dataclasses import dataclass
from typing import Any

from ledger.errors import RegenError
from worker.engine.admission import AdmissionGate
from worker.engine.loop import LoopHost
from worker.measure import ledger_timing

log = logging.getLogger(__name__)

#: What a fake batch records as its engine (provenance and every row): never a vLLM version.
FAKE_ENGINE_VERSION = "regen-fake-engine (benchmark device: NOT generated data)"


class FakeEngineSpecError(RegenError):
    pass


@dataclass(frozen=True)
class FakeEngineSpec:
    #: Output tokens per second of one full engine (one GPU).
    tok_s: float = 10_000.0
    #: Sequences one engine runs at once (max_num_seqs).
    seqs: int = 1024
    #: Mean answer length in tokens, and the lognormal sigma of the lengths (long tail).
    mean: float = 1500.0
    sigma: float = 1.0
    #: Engines (GPUs) this process stands for.
    gpus: int = 1
    #: The most a sequence speeds up when the engine runs fewer than ``seqs`` (1: a fixed rate).
    solo: float = 1.0
    max_model_len: int = 1 << 20
    #: A test's poison: the engine dies (its loop stops, as a crashed vLLM's engine core) when a
    #: conversation whose messages contain this text starts. Empty: never.
    die_on: str = ""

    @classmethod
    def parse(cls, text: str) -> FakeEngineSpec:
        """``key=value,...`` with keys tok_s, seqs, mean, sigma, gpus, solo (any left out keeps its default)."""
        kinds = {"tok_s": float, "seqs": int, "mean": float, "sigma": float, "gpus": int, "max_model_len": int,
                 "solo": float, "die_on": str}
        values: dict[str, Any] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            key, sep, value = part.partition("=")
            if not sep or key not in kinds:
                raise FakeEngineSpecError(f"--fake-engine: {part!r} is not one of {', '.join(kinds)} as key=value")
            try:
                values[key] = kinds[key](value)
            except ValueError:
                raise FakeEngineSpecError(f"--fake-engine: {key}={value!r} is not a {kinds[key].__name__}") from None
        spec = cls(**values)
        if spec.tok_s <= 0 or spec.seqs < 1 or spec.mean <= 0 or spec.sigma < 0 or spec.gpus < 1 or spec.solo < 1:
            raise FakeEngineSpecError(f"--fake-engine: every value must be positive (solo at least 1): {text!r}")
        return spec

    @property
    def max_num_seqs(self) -> int:
        return self.seqs * self.gpus

    @property
    def seq_tok_s(self) -> float:
        return self.tok_s / self.seqs

    def length(self, rng: random.Random, budget: int) -> int:
        # Lognormal with the given mean: mu = ln(mean) - sigma^2 / 2.
        mu = math.log(self.mean) - self.sigma ** 2 / 2
        return max(1, min(budget, int(rng.lognormvariate(mu, self.sigma))))


class SharedDecode:
    """The engine's token rate shared by the sequences it runs (processor sharing), on its event loop.

    Every running sequence advances at ``rate(n)`` tokens/s, n the sequences running: a virtual
    clock ``v`` counts the tokens each has made since the start, and a sequence of ``tokens`` ends
    when ``v`` reaches ``v`` at its start plus ``tokens``. One timer, for the next end, re-armed
    whenever n changes; O(log n) per sequence.
    """

    def __init__(self, spec: FakeEngineSpec):
        self.total_tok_s = spec.tok_s * spec.gpus
        self.max_seq_tok_s = spec.seq_tok_s * spec.solo
        self.v = 0.0
        self.running = 0
        self._t = 0.0
        self._ends: list[tuple[float, int, asyncio.Future]] = []
        self._ids = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def _rate(self) -> float:
        return min(self.max_seq_tok_s, self.total_tok_s / max(1, self.running))

    def _advance(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        if self.running:
            self.v += self._rate() * (now - self._t)
        self._t = now

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        while self._ends and self._ends[0][2].done():
            heapq.heappop(self._ends)  # cancelled: already taken off ``running``
        if self._ends:
            self._timer = loop.call_later(max(0.0, (self._ends[0][0] - self.v) / self._rate()), self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._advance(loop)
        while self._ends and self._ends[0][0] <= self.v + 1e-9:
            _, _, future = heapq.heappop(self._ends)
            if not future.done():
                self.running -= 1
                future.set_result(None)
        self._arm(loop)

    def _cancelled(self, future: asyncio.Future) -> None:
        if future.cancelled():
            loop = asyncio.get_running_loop()
            self._advance(loop)
            self.running -= 1
            self._arm(loop)

    async def run(self, tokens: int) -> None:
        """Return once ``tokens`` tokens of this sequence are made."""
        loop = asyncio.get_running_loop()
        self._advance(loop)
        future = loop.create_future()
        future.add_done_callback(self._cancelled)
        self.running += 1
        heapq.heappush(self._ends, (self.v + tokens, next(self._ids), future))
        self._arm(loop)
        await future


class FakeEngineHost(LoopHost):
    """``EngineHost``'s interface as worker/batches/delivery.py and worker/conversation/generation.py use it."""

    fake = True

    def __init__(self, model: str, spec: FakeEngineSpec):
        self.model = model
        self.spec = spec
        self.max_model_len = spec.max_model_len
        self.max_num_seqs = spec.max_num_seqs
        self.engine_version = FAKE_ENGINE_VERSION
        # The gate admits exactly the engine's sequences: a fake has no waiting queue of its own to keep full.
        self.admission: AdmissionGate | None = None
        self.occupancy = None
        self.tokenizer = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tickets = itertools.count()
        self._rng = random.Random()
        self._decode = SharedDecode(spec)
        self.tokens_made = 0

    def start(self) -> None:
        self._start_loop("fake-engine-loop")

        async def make_gate() -> None:
            self.admission = AdmissionGate(self.max_num_seqs)

        asyncio.run_coroutine_threadsafe(make_gate(), self._loop).result()
        log.warning("FAKE ENGINE (benchmark/test device, not generated data): %s tok/s x %d GPUs, %d sequences, "
                    "lengths lognormal mean %s sigma %s, solo x%s", self.spec.tok_s, self.spec.gpus, self.max_num_seqs,
                    self.spec.mean, self.spec.sigma, self.spec.solo)

    @property
    def alive(self) -> bool:
        return self._loop is not None

    def num_unfinished(self) -> int:
        return self.admission.admitted if self.admission else 0

    async def die(self) -> None:
        """Stop the engine's loop, as a crashed engine core stops answering: nothing on it runs again."""
        log.error("FAKE ENGINE: dying on a poison prompt (die_on=%r)", self.spec.die_on)
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()
        await asyncio.Event().wait()  # never resumes: the loop has stopped

    async def answer(self, budget: int) -> list[int]:
        n = self.spec.length(self._rng, budget)
        await self._decode.run(n)
        self.tokens_made += n
        ledger_timing.record_sequence(n)  # a benchmark switch: bench/farm.py counts what ended in its window
        return [self._rng.randrange(10, 50_000) for _ in range(n)]

    def settings(self) -> dict:
        """The run's provenance of its engine: the fake's spec, never engine args a vLLM was built with."""
        from dataclasses import asdict

        return {"fake_engine": asdict(self.spec), "max_num_seqs": self.max_num_seqs}

    def shutdown(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


class FakeRenderer:
    """The renderer's two attributes the batch path reads; a fake has no chat template."""

    template_hash = "fake-engine"

    def __init__(self, max_model_len: int):
        self.max_model_len = max_model_len


async def fake_sample(engine: FakeEngineHost, sample: dict, run: dict) -> dict:
    """One output row as worker/conversation/generation.py writes it, with a single answer of fake token ids."""
    sampling = run["sampling"]
    budget = min(int(sampling["max_tokens"]), int(sample.get("max_tokens") or sampling["max_tokens"]))
    if engine.spec.die_on and any(engine.spec.die_on in str(m.get("content")) for m in sample["messages"]):
        await engine.die()
    ids = await engine.answer(budget)
    prompt = [1, 2, 3]
    finish = "length" if len(ids) >= budget else "stop"
    messages = [*sample["messages"], {"role": "assistant", "content": f"fake answer of {len(ids)} tokens"}]
    # The keys of worker/conversation/dialogue.py's events, "turn" included (export reads it).
    event = {"turn": 0, "message_index": len(messages) - 1, "prompt_token_ids": prompt, "completion_token_ids": ids,
             "loss_mask": [0] * len(prompt) + [1] * len(ids), "finish_reason": finish, "stop_reason": None,
             "truncated_in_reasoning": False, "think_tags_ok": True, "tool_call_errors": [],
             "answer_tokens": len(ids)}
    return {"run": run.get("name"), "sample_id": sample["sample_id"], "source": sample.get("source"),
            "input_messages": sample["messages"],
            "tools": sample.get("tools"), "thinking": False, "model": run["model"], "sampling": sampling,
            "provenance": run["provenance"], "parser": "fake-engine", "fake_engine": FAKE_ENGINE_VERSION,
            "status": "done", "error": None, "messages": messages, "events": [event], "finish_reason": finish,
            "stop_reason": None, "turns": 1, "tool_calls": 0,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "reasoning_tokens": 0,
                      "answer_tokens": len(ids)}}
