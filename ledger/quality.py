"""Quality classes of a regenerated sample, their thresholds, and the gate that pauses a bad run.

The run this project exists for was once ruined at the source: 87% of ~914K samples
were ``<think></think> OK.``, a loss mask of 6 tokens, and nobody looked for days.
So every sample is classified when it is written (``classify_sample``, a pure
function of the output row, run by the worker before the shard is uploaded), its
class is stored in ``samples.quality``, and after every commit the gate
(``enforce_gate``) compares the share of each bad class with the run's limits and
pauses the run when one is exceeded. ``regen resume`` continues after a human looked
(``--force`` overrides the gate for the rest of the run). See docs/quality.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from ledger import transitions
from ledger.errors import ConfigError, RegenError, RunNotFound
from ledger.states import Quality

#: Worst first. Ties inside a turn and across turns resolve to the earliest here: a
#: stub that also has an empty thought is a stub (the disaster above), a loop that ran
#: into max_tokens is a loop (the cause, not the symptom).
SEVERITY: tuple[Quality, ...] = tuple(Quality)
CLASSES: tuple[str, ...] = tuple(q.value for q in SEVERITY)
BAD_CLASSES: tuple[str, ...] = tuple(c for c in CLASSES if c != Quality.OK.value)
_RANK = {q.value: n for n, q in enumerate(SEVERITY)}

#: Gate limits: share of classified samples (done + failed) above which the run pauses.
#: Keys name one class or several joined by "+" (their shares add up).
DEFAULT_GATE: dict[str, float] = {
    # The 87% disaster: 20% leaves room for datasets with a few legitimately terse answers.
    "stub_answer+empty_answer": 0.20,
    "empty_reasoning": 0.20,
    # Truncation is expected at small max_tokens; beyond 30% the limit is wrong for the data.
    "truncated_reasoning+truncated_answer": 0.30,
    "repetition_loop": 0.10,
    "bad_think_tags": 0.10,
    "invalid_tool_json": 0.10,
    # Calls to tools the sample never offered: the model invents tools (or the tools were
    # not passed to the template); the source has no result to splice after them.
    "unoffered_tool": 0.10,
    # A call followed by the source's result for other arguments (the model asked about Berlin, the
    # source's result is Oslo's): a context no deployment shows. Small wording changes in a search query
    # are common and harmless, so the limit is loose; a high share means the source's trajectories and
    # the target's part ways (--on-tool-mismatch stop ends such conversations at the call instead).
    "tool_args_differ": 0.30,
    # Failures are data problems (prompt too long, template errors): many means a wrong config.
    "failed": 0.25,
}


@dataclass(frozen=True)
class Thresholds:
    """Per-run classification thresholds and gate limits (``runs.quality_thresholds``).

    The column holds only what differs from these defaults (NULL = all defaults), so
    improving a default reaches every run that did not choose its own value.
    """

    #: An answer with no thought behind it and at most this many engine tokens (after
    #: ``</think>``; the template's blank line and the end-of-turn token count) is a stub.
    #: "OK." is 4 in Qwen3 (3 with thinking off) and 6 in the tiny test model.
    stub_answer_max_tokens: int = 6
    #: Window of the repetition detector, in token ids: long enough that natural
    #: phrases ("Let me check the") do not repeat verbatim by chance.
    repetition_ngram: int = 12
    #: Completions shorter than this are never called loops: short texts repeat a line legitimately.
    repetition_min_tokens: int = 200
    #: A completion is a loop when this share of its n-grams (over the whole completion, or
    #: over its second half, where loops that start late live) already occurred earlier.
    repetition_max_share: float = 0.5
    #: The gate judges a run only once this many samples are classified.
    gate_min_samples: int = 200
    #: Workers evaluate the gate of a run at most this often (seconds); 0 = after every commit.
    gate_interval_s: float = 15.0
    gate: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_GATE))
    #: Set by ``regen resume --force``: the gate still measures, never pauses this run again.
    gate_overridden: bool = False

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | None) -> Thresholds:
        """Defaults overlaid with a run's stored overrides; ``gate`` merges key by key (null drops a limit).

        Raises:
            ConfigError: an unknown key, a class name that does not exist, a value out of range.
        """
        value = dict(value or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"unknown quality threshold(s) {unknown}; known: {sorted(known)}")
        overrides = value.pop("gate", None) or {}
        if not isinstance(overrides, Mapping):
            raise ConfigError(f"quality threshold 'gate' must be an object of limits, got {overrides!r}")
        gate = dict(DEFAULT_GATE)
        for key, limit in overrides.items():
            if limit is None:
                gate.pop(key, None)
            else:
                gate[key] = limit
        try:
            thresholds = replace(cls(), gate=gate, **value)
        except TypeError as e:
            raise ConfigError(f"bad quality thresholds: {e}") from e
        thresholds.validate()
        return thresholds

    def validate(self) -> None:
        checks = [
            (isinstance(self.stub_answer_max_tokens, int) and self.stub_answer_max_tokens >= 0,
             "stub_answer_max_tokens must be an integer >= 0"),
            (isinstance(self.repetition_ngram, int) and self.repetition_ngram >= 2,
             "repetition_ngram must be an integer >= 2"),
            (isinstance(self.repetition_min_tokens, int) and self.repetition_min_tokens >= 0,
             "repetition_min_tokens must be an integer >= 0"),
            (_is_share(self.repetition_max_share), "repetition_max_share must be a number in [0, 1]"),
            (isinstance(self.gate_min_samples, int) and self.gate_min_samples >= 1,
             "gate_min_samples must be an integer >= 1"),
            (isinstance(self.gate_interval_s, (int, float)) and self.gate_interval_s >= 0,
             "gate_interval_s must be a number >= 0"),
            (isinstance(self.gate_overridden, bool), "gate_overridden must be true or false"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        for key, limit in self.gate.items():
            for name in key.split("+"):
                if name not in CLASSES or name == Quality.OK.value:
                    raise ConfigError(f"gate limit {key!r}: {name!r} is not a bad class; classes: {BAD_CLASSES}")
            if not _is_share(limit):
                raise ConfigError(f"gate limit {key!r} must be a share in [0, 1], got {limit!r}")

    def to_json(self) -> dict[str, Any]:
        """Only what differs from the defaults (what ``runs.quality_thresholds`` stores)."""
        default = Thresholds()
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)
                               if f.name != "gate" and getattr(self, f.name) != getattr(default, f.name)}
        gate = {k: v for k, v in self.gate.items() if DEFAULT_GATE.get(k) != v}
        gate.update({k: None for k in DEFAULT_GATE if k not in self.gate})
        if gate:
            out["gate"] = gate
        return out


def _is_share(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def worst(classes) -> str:
    """The most severe of ``classes`` (``ok`` for none)."""
    return min(classes, key=_RANK.__getitem__, default=Quality.OK.value)


# --- classification ---------------------------------------------------------------------------


def classify_sample(row: Mapping[str, Any], thresholds: Thresholds) -> tuple[str, list[dict[str, Any]]]:
    """The class of one output row (as ``worker/conversation/generation.py`` writes it) and one detail per event.

    Args:
        row: ``status``, ``thinking``, ``tools``, ``messages`` and ``events`` (each with
            ``completion_token_ids``, ``finish_reason``, ``truncated_in_reasoning``,
            ``think_tags_ok``, ``tool_call_errors``, ``answer_tokens``, ``message_index``).
        thresholds: The run's thresholds.

    Returns:
        ``(class, details)``: the worst turn's class, and for each event in order
        ``{"turn", "quality", "flags", "repetition_share"}`` where ``flags`` lists every
        class the turn matched, worst first (``[]`` for an ok turn).
    """
    if row.get("status") != "done":
        return Quality.FAILED.value, []
    events = row.get("events") or []
    if not events:
        # A done sample always has a generation; one without is not trainable data.
        return Quality.FAILED.value, []
    messages = row.get("messages") or []
    thinking = bool(row.get("thinking"))
    tools = row.get("tools")
    details = [classify_turn(event, _message_of(event, messages), thinking, thresholds, tools) for event in events]
    return worst(d["quality"] for d in details), details


def classify_turn(event: Mapping[str, Any], message: Mapping[str, Any], thinking: bool,
                  thresholds: Thresholds, tools: list | None = None) -> dict[str, Any]:
    """One generation event's class and every flag it raised (see ``classify_sample``)."""
    flags: list[str] = []
    completion = event.get("completion_token_ids") or []
    finish = event.get("finish_reason")
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    reasoning = message.get("reasoning_content")
    calls_tool = bool(message.get("tool_calls") or event.get("tool_call_errors") or event.get("is_tool_call"))
    cut_in_reasoning = thinking and bool(event.get("truncated_in_reasoning") or (
        finish != "stop" and not content.strip() and not calls_tool and (event.get("answer_tokens") or 0) == 0))

    if finish != "stop":
        flags.append(Quality.TRUNCATED_REASONING.value if cut_in_reasoning else Quality.TRUNCATED_ANSWER.value)
    elif not calls_tool:
        if not content.strip():
            flags.append(Quality.EMPTY_ANSWER.value)
        elif (not (reasoning or "").strip()
              and _answer_length(event, content, completion, thinking) <= thresholds.stub_answer_max_tokens):
            # Only without a thought: "B" after 2,000 tokens of reasoning is good training data.
            flags.append(Quality.STUB_ANSWER.value)
    if thinking and not cut_in_reasoning and not (reasoning or "").strip():
        flags.append(Quality.EMPTY_REASONING.value)
    if not event.get("think_tags_ok", True):
        flags.append(Quality.BAD_THINK_TAGS.value)
    if event.get("tool_call_errors"):
        flags.append(Quality.INVALID_TOOL_JSON.value)
    if unoffered_calls(message.get("tool_calls"), tools):
        flags.append(Quality.UNOFFERED_TOOL.value)
    if any(d.get("spliced", True) for d in event.get("tool_args_differ") or []):
        flags.append(Quality.TOOL_ARGS_DIFFER.value)
    share = repetition_share(completion, thresholds.repetition_ngram, thresholds.repetition_min_tokens)
    if share > thresholds.repetition_max_share:
        flags.append(Quality.REPETITION_LOOP.value)

    flags.sort(key=_RANK.__getitem__)
    return {"turn": event.get("turn"), "quality": flags[0] if flags else Quality.OK.value, "flags": flags,
            "repetition_share": round(share, 4)}


def _function_name(entry: object) -> str | None:
    """The name of a tool or a tool call: OpenAI's ``{"function": {"name"}}`` or a bare ``{"name"}``."""
    if not isinstance(entry, Mapping):
        return None
    function = entry.get("function") if isinstance(entry.get("function"), Mapping) else entry
    name = function.get("name")
    return name if isinstance(name, str) else None


def offered_tool_names(tools: list | None) -> set[str]:
    """Names of the tools a sample offers."""
    return {name for tool in tools or [] if (name := _function_name(tool)) is not None}


def unoffered_calls(tool_calls: list | None, tools: list | None) -> list[str]:
    """Names of the calls in ``tool_calls`` to tools ``tools`` does not offer (every call when it offers none)."""
    offered = offered_tool_names(tools)
    return [str(name) for call in tool_calls or [] if (name := _function_name(call)) not in offered]


def _message_of(event: Mapping[str, Any], messages: list) -> Mapping[str, Any]:
    index = event.get("message_index")
    if isinstance(index, int) and 0 <= index < len(messages) and isinstance(messages[index], Mapping):
        return messages[index]
    return {}


def _answer_length(event: Mapping[str, Any], content: str, completion: list, thinking: bool) -> int:
    """Engine tokens of the answer; without a ``</think>`` id known, the whole completion
    (thinking off) or the answer's words (thinking on) stand in for it."""
    answer_tokens = event.get("answer_tokens")
    if isinstance(answer_tokens, int):
        return answer_tokens
    return len(completion) if not thinking else len(content.split())


def repetition_share(token_ids: list[int], ngram: int, min_tokens: int) -> float:
    """Share of ``ngram``-grams that already occurred earlier in ``token_ids``.

    The larger of the share over the whole completion and over its second half (a
    loop that starts late fills the end). 0.0 for completions shorter than
    ``min_tokens``. Linear-ish: one vectorised rolling hash and two sorts (about
    3 ms for 32K ids), no Python loop over tokens.
    """
    length = len(token_ids)
    if length < max(min_tokens, 2 * ngram):
        return 0.0
    import numpy as np  # imported here: the producer's CLI starts without it

    ids = np.asarray(token_ids, dtype=np.uint64) + np.uint64(1)
    windows = length - ngram + 1
    hashes = np.zeros(windows, dtype=np.uint64)
    multiplier = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant; collisions are ~2^-64 per pair
    for k in range(ngram):
        hashes = hashes * multiplier + ids[k:k + windows]

    def distinct(values) -> int:
        ordered = np.sort(values)
        return 1 + int(np.count_nonzero(ordered[1:] != ordered[:-1])) if len(ordered) else 0

    half = windows // 2
    all_distinct = distinct(hashes)
    first_half_distinct = distinct(hashes[:half])
    whole = (windows - all_distinct) / windows
    # n-grams of the second half seen before = its size minus the new ones it brings.
    second = ((windows - half) - (all_distinct - first_half_distinct)) / (windows - half)
    return max(whole, second)


# --- the gate ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateDecision:
    pause: bool
    #: Why (for ``runs.status_reason`` and the CLI); says what was measured either way.
    reason: str
    #: Share of each class among the classified samples (``ok`` included).
    shares: dict[str, float]
    classified: int = 0
    #: The limit keys that are exceeded (empty when not pausing or not yet judged).
    exceeded: tuple[str, ...] = ()


class GateRefused(RegenError):
    """``regen resume`` without ``--force`` on a run the gate would pause again at once."""


def run_thresholds(session: Session, run_id: int) -> Thresholds:
    stored = session.execute(text("SELECT quality_thresholds FROM runs WHERE id = :run"), {"run": run_id}).scalar()
    return Thresholds.from_json(stored)


def quality_counts(session: Session, run_id: int) -> dict[str, int]:
    """Classified samples of a run by class, from the trigger-kept ``run_sample_counts`` (migration 0005).

    A few rows per run, whatever its size: the count over ``samples`` this replaced took
    0.2-0.5 s at 914K samples and tens of seconds at 100M, every gate interval, and its
    long snapshot held back the cleanup of every hot row meanwhile (issue 22). ``''`` is
    the table's "not classified" (a NULL ``samples.quality``).
    """
    rows = session.execute(text(
        "SELECT quality, sum(n) FROM run_sample_counts WHERE run_id = :run AND quality <> '' "
        "GROUP BY quality HAVING sum(n) <> 0"), {"run": run_id})
    return {q: int(n) for q, n in rows}


def judge(counts: Mapping[str, int], thresholds: Thresholds) -> GateDecision:
    """The gate's decision from class counts (pure: tested without a database)."""
    classified = sum(counts.values())
    shares = {c: (counts.get(c, 0) / classified if classified else 0.0) for c in CLASSES}
    if classified < thresholds.gate_min_samples:
        return GateDecision(False, f"{classified} of {thresholds.gate_min_samples} samples classified: "
                                   "too few to judge", shares, classified)
    exceeded = []
    for key, limit in sorted(thresholds.gate.items()):
        share = sum(shares.get(name, 0.0) for name in key.split("+"))
        if share > limit:
            exceeded.append((key, share, limit))
    if not exceeded:
        return GateDecision(False, f"every class within its limit ({classified} samples classified)", shares,
                            classified)
    what = "; ".join(f"{key} {share:.1%} > {limit:.0%}" for key, share, limit in exceeded)
    if thresholds.gate_overridden:
        return GateDecision(False, f"over the limit but overridden by regen resume --force: {what}", shares,
                            classified, tuple(k for k, _, _ in exceeded))
    return GateDecision(True, f"quality gate: {what} (of {classified} classified samples)", shares, classified,
                        tuple(k for k, _, _ in exceeded))


def evaluate_gate(session: Session, run_id: int) -> GateDecision:
    """Measure the run's classes against its limits (reads only; ``enforce_gate`` acts on it)."""
    return judge(quality_counts(session, run_id), run_thresholds(session, run_id))


def pause_run(session: Session, run_id: int, reason: str) -> bool:
    """Pause an active run with ``reason``; False if it was not active (finished, already paused)."""
    return transitions.pause_run(session, run_id, reason)


_CLAIM_GATE_CHECK = text(
    "UPDATE runs SET gate_checked_at = now() WHERE id = :run AND status = 'active' "
    "AND coalesce((quality_thresholds ->> 'gate_overridden')::boolean, false) = false "
    "AND (gate_checked_at IS NULL OR gate_checked_at <= now() - make_interval(secs => "
    "coalesce((quality_thresholds ->> 'gate_interval_s')::float, :default_interval))) RETURNING id")

def enforce_gate(sessions: sessionmaker[Session], run_id: int) -> GateDecision | None:
    """What a worker calls after each commit: evaluate the run's gate if due, pause the run if needed.

    At most one evaluation per run per ``gate_interval_s``, whichever worker gets there
    first (``runs.gate_checked_at``), so a farm of workers does not repeat the
    aggregate after every batch. Claim, evaluation and pause are three short
    transactions: the aggregate never holds the run's row lock that commits take.

    Returns:
        The decision, or None when not due, the run is not active, or the gate is overridden.
    """
    with sessions.begin() as session:
        due = session.execute(_CLAIM_GATE_CHECK, {"run": run_id,
                                                  "default_interval": Thresholds().gate_interval_s}).first()
    if due is None:
        return None
    with sessions() as session:
        decision = evaluate_gate(session, run_id)
    if decision.pause:
        reason = decision.reason + "; look with regen report, then regen resume (--force to continue despite the gate)"
        with sessions.begin() as session:
            # Re-checks the override: a `regen resume --force` may land between the evaluation and this.
            transitions.pause_run(session, run_id, reason, unless_overridden=True)
    return decision


@dataclass(frozen=True)
class ResumeResult:
    run: str
    #: The run's status after the call: active, or finished when nothing is left to run.
    status: str
    message: str
    decision: GateDecision


def resume_run(session: Session, run_name: str, force: bool) -> ResumeResult:
    """``regen resume``: reactivate a paused run (the caller then republishes its queued batches).

    Raises:
        RunNotFound: no such run.
        GateRefused: without ``force``, the gate would pause the run again at once.
    """
    # Not ledger/runs.py's find_run: that module reads Thresholds from this one.
    run = session.execute(text("SELECT id, status FROM runs WHERE name = :name FOR UPDATE"),
                          {"name": run_name}).first()
    if run is None:
        raise RunNotFound(run_name)
    decision = evaluate_gate(session, run.id)
    if run.status != "paused":
        return ResumeResult(run_name, run.status, f"run {run_name} is {run.status}, not paused: "
                                                     "nothing to resume", decision)
    if decision.pause and not force:
        raise GateRefused(f"run {run_name} would be paused again at once: {decision.reason}. Look at "
                          f"`regen report --run {run_name}`; continue anyway with `regen resume --run "
                          f"{run_name} --force`, or change the run's quality thresholds")
    # A run whose last batches committed while it was paused has nothing left to run: finished.
    status = transitions.unpause_run(session, run.id, override_gate=force).value
    message = f"run {run_name} is {status}"
    if force:
        message += "; the quality gate will not pause it again (overridden)"
    return ResumeResult(run_name, status, message, decision)
