"""A run's configuration: model, effective sampling, thinking mode, the parsers of its output, and its hash.

Sampling defaults come from the model's ``generation_config.json`` (as vLLM and
transformers apply them) unless the run overrides them; the *effective* values are
stored in the run, so every worker and every retry samples exactly the same way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ledger.errors import ConfigError
from ledger.hashing import config_hash
from ledger.model_path import resolve_model
from targets import harmony
from targets.parser_choice import AUTO, ParserChoice, chat_template_of, choose_parsers
from targets.template_probe import THINKING_ARGS, TemplateFormat, probe_template, thinking_switch
from worker.engine.mtp import mtp_layers, parse_mtp, speculative_config  # pure: no vLLM import

from .sampling_profiles import PENALTY_KEYS, mode_profiles, parse_profile

#: vLLM's own defaults when neither the run nor generation_config.json sets a value.
ENGINE_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
SAMPLING_KEYS = tuple(ENGINE_DEFAULTS)
THINKING_MODES = ("on", "off", "mix")


def generation_defaults(model: str) -> dict:
    path = Path(model) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not readable JSON: {e}") from e
    return {k: data[k] for k in (*SAMPLING_KEYS, *PENALTY_KEYS) if k in data and data[k] is not None}


def model_fingerprint(model: str) -> dict:
    """Hashes of the files that define the model's behaviour, when the model is a local directory."""
    root = Path(model)
    out: dict[str, str] = {}
    for name in ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json",
                 "chat_template.jinja", "model.safetensors.index.json"):
        f = root / name
        if f.is_file():
            out[name] = hashlib.sha256(f.read_bytes()).hexdigest()
    if not (root / "model.safetensors.index.json").is_file() and (root / "model.safetensors").is_file():
        # A single-file checkpoint has no index; its size and mtime stand in for a full hash of GBs.
        st = (root / "model.safetensors").stat()
        out["model.safetensors"] = f"size={st.st_size}"
    return out


@dataclass(frozen=True)
class RunConfig:
    model: str
    max_tokens: int
    sampling: dict
    thinking: str = "on"
    thinking_off_share: float = 0.0
    seed: int = 0
    model_files: dict = field(default_factory=dict)
    #: vLLM's reasoning and tool parsers that read the output (targets/parser_choice.py); None: recorded without.
    parsers: ParserChoice | None = None
    #: The chat-template argument that switches thinking (``enable_thinking``, ``thinking``), found by
    #: rendering the template (targets/template_probe.py); "none": nothing switches it; AUTO: the workers'.
    thinking_arg: str = "enable_thinking"
    #: "harmony" for gpt-oss (rendered and read with Harmony, targets/harmony.py), else "jinja" (the template).
    chat_format: str = "jinja"
    #: Harmony's reasoning effort (its thinking switch); None for a Jinja run.
    reasoning_effort: str | None = None
    #: The date in a Harmony run's system message, fixed at submit (provenance; not hashed, so a run
    #: submitted again on another day resumes with the date it was created with).
    harmony_start_date: str | None = None
    #: The template keyword that keeps earlier turns' thoughts (Qwen3.6: ``preserve_thinking``), found by rendering
    #: (targets/template_probe.py), AUTO for the workers' template; None: the template has none, nothing recorded.
    history_arg: str | None = None
    #: ``--preserve-thinking``: on | off | mix (mix: ``preserve_thinking_share`` of the conversations, seeded).
    preserve_thinking: str | None = None
    preserve_thinking_share: float = 0.0
    #: ``--on-tool-mismatch``: "splice" a source result after a call with other arguments (flagged
    #: tool_args_differ), or "stop" the conversation at that call. Recorded only when "stop": a default
    #: run's record (and hash) is what it was.
    on_tool_mismatch: str = "splice"
    #: The sampling of a ``--thinking mix`` run's samples generated without thinking, where it differs from
    #: ``sampling`` (the thinking samples'): producer/sampling_profiles.py. None: one sampling for every sample.
    no_thinking_sampling: dict | None = None
    #: ``--stop-loops``: "on" aborts a generation once it meets the repetition criterion (worker/engine/
    #: loop_watch.py), "off" lets it run to its budget. Recorded only when off: a default run's hash is unchanged.
    stop_loops: str = "on"
    #: ``--mtp``: tokens the model's MTP head drafts a step (worker/engine/mtp.py), 0: off. Recorded only when on:
    #: a run without it keeps its record (and hash); with it a seed's draws differ, so its hash does too.
    mtp_tokens: int = 0

    def as_record(self) -> dict:
        """What goes into ``runs.sampling`` (and the output rows); the parsers are part of it and of the hash.

        A Harmony run also records ``chat_format`` and ``reasoning_effort`` (both change its prompts); a Jinja
        run records neither, so its hash is what it was before gpt-oss was a family.
        """
        harmony_keys = ({"chat_format": self.chat_format, "reasoning_effort": self.reasoning_effort}
                        if self.chat_format == harmony.HARMONY else {})
        # Only a template with a history keyword records it: every other run's record (and hash) is unchanged.
        history_keys = ({"history_arg": self.history_arg, "preserve_thinking": self.preserve_thinking,
                         "preserve_thinking_share": self.preserve_thinking_share}
                        if self.history_arg is not None else {})
        return {**self.sampling, "max_tokens": self.max_tokens, "seed": self.seed, "thinking": self.thinking,
                "thinking_off_share": self.thinking_off_share, "thinking_arg": self.thinking_arg,
                **(self.parsers.as_record() if self.parsers else {}), **harmony_keys, **history_keys,
                **({"on_tool_mismatch": self.on_tool_mismatch} if self.on_tool_mismatch != "splice" else {}),
                **({"sampling_no_thinking": self.no_thinking_sampling} if self.no_thinking_sampling else {}),
                **({"stop_loops": self.stop_loops} if self.stop_loops != "on" else {}),
                **({"mtp_tokens": self.mtp_tokens} if self.mtp_tokens else {})}

    def provenance(self) -> dict:
        """What the run was made from, as ``runs.provenance`` records it and every worker reads it: the model's
        files, how its parsers were chosen (named, or the template's), the chat-template argument that switches
        its thinking, and a Harmony run's system date (targets/harmony.py: without it no prompt renders).
        ``regen submit`` stores it; ``regen estimate`` hands the same to its probe."""
        out: dict = {"model_files": self.model_files, "thinking_arg": self.thinking_arg}
        if self.parsers is not None:
            out["parsers"] = {**self.parsers.as_record(), "chosen_by": self.parsers.chosen_by}
        if self.harmony_start_date is not None:
            out["harmony_start_date"] = self.harmony_start_date
        if self.history_arg is not None:
            out["history_arg"] = self.history_arg
            out["preserve_thinking"] = self.preserve_thinking
        if self.mtp_tokens:  # what every worker builds its engine with (worker/engine/mtp.py)
            out["mtp"] = {"tokens": self.mtp_tokens, "speculative_config": speculative_config(self.mtp_tokens)}
        return out

    @property
    def hash(self) -> str:
        # thinking_arg follows from the template, which model_files already hash: left out, so a run
        # recorded before it was found keeps its hash.
        record = {k: v for k, v in self.as_record().items() if k not in ("thinking_arg", "history_arg")}
        return config_hash({"model": self.model, "sampling": record, "model_files": self.model_files})


def build_run_config(model: str, *, max_tokens: int, temperature: float | None = None, top_p: float | None = None,
                     top_k: int | None = None, seed: int | None = None, thinking: str | None = None,
                     thinking_off_share: float | None = None, reasoning_parser: str | None = None,
                     tool_parser: str | None = None, reasoning_effort: str | None = None,
                     preserve_thinking: str | None = None, preserve_thinking_share: float | None = None,
                     on_tool_mismatch: str | None = None, mtp: str | int | None = None,
                     sampling_thinking: str | None = None, sampling_no_thinking: str | None = None,
                     presence_penalty: float | None = None, frequency_penalty: float | None = None,
                     stop_loops: str | None = None) -> RunConfig:
    if max_tokens <= 0:
        raise ConfigError("--max-tokens must be positive")
    if thinking is not None and thinking not in THINKING_MODES:
        raise ConfigError(f"--thinking must be one of {', '.join(THINKING_MODES)}")
    resolved = resolve_model(model)
    found = _probed(resolved)
    is_harmony = found is not None and found.chat_format == harmony.HARMONY
    if reasoning_effort is not None and not is_harmony and Path(resolved).is_dir():
        raise ConfigError(f"--reasoning-effort is Harmony's (gpt-oss) thinking switch; {resolved} is rendered with "
                          "its chat template: use --thinking")
    if is_harmony:
        parsers = _harmony_parsers(resolved, reasoning_parser, tool_parser, found)
    else:
        parsers = choose_parsers(resolved, reasoning=reasoning_parser, tool=tool_parser)
    template_format, thinking_arg = _template_format(resolved, parsers, found)
    thinking = _thinking_mode(resolved, thinking, template_format)
    share = mode_share(thinking, thinking_off_share, every="off", option="--thinking-off-share")
    flags = {key: value for key, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
                                          ("presence_penalty", presence_penalty),
                                          ("frequency_penalty", frequency_penalty)) if value is not None}
    own = {"on": parse_profile(sampling_thinking, "--sampling-thinking"),
           "off": parse_profile(sampling_no_thinking, "--sampling-no-thinking")}
    profiles = mode_profiles(ENGINE_DEFAULTS, generation_defaults(resolved),
                             family=template_format.family if template_format else None,
                             tool=template_format.tool if template_format else None,
                             thinking_kind=template_format.thinking if template_format else None,
                             flags=flags, own=own)
    # A run in one mode samples with that mode's profile; a mixed run records the other beside it.
    sampling = profiles["off" if thinking == "off" else "on"]
    no_thinking = profiles["off"] if thinking == "mix" and profiles["off"] != profiles["on"] else None
    harmony_keys: dict = {}
    if is_harmony:
        harmony_keys = {"chat_format": harmony.HARMONY, "reasoning_effort": harmony.checked_effort(reasoning_effort),
                        "harmony_start_date": harmony.start_date()}
    elif thinking_arg == AUTO:
        # The workers may find gpt-oss in the model they load: its date is fixed here, once.
        harmony_keys = {"harmony_start_date": harmony.start_date()}
    history_keys = _history_mode(resolved, template_format, thinking_arg, preserve_thinking, preserve_thinking_share)
    if on_tool_mismatch not in (None, "splice", "stop"):
        raise ConfigError("--on-tool-mismatch must be splice or stop")
    if stop_loops not in (None, "on", "off"):
        raise ConfigError("--stop-loops must be on or off")
    mtp_tokens = _mtp_tokens(resolved, mtp)
    return RunConfig(model=resolved, max_tokens=max_tokens, sampling=sampling, thinking=thinking,
                     thinking_off_share=share, seed=0 if seed is None else seed,
                     model_files=model_fingerprint(resolved), parsers=parsers, thinking_arg=thinking_arg,
                     on_tool_mismatch=on_tool_mismatch or "splice", mtp_tokens=mtp_tokens,
                     no_thinking_sampling=no_thinking, stop_loops=stop_loops or "on", **harmony_keys,
                     **history_keys)


def _mtp_tokens(model: str, asked: str | int | None) -> int:
    """``--mtp`` as the run records it: "auto" is off for a run (``regen estimate`` measures and advises;
    docs/estimate.md, "MTP"), a count is on, refused for a model without an MTP head."""
    tokens = parse_mtp(asked) or 0
    config = Path(model) / "config.json"
    if tokens and config.is_file() and mtp_layers(json.loads(config.read_text())) < 1:
        raise ConfigError(f"--mtp {tokens}: {model} declares no MTP layer (mtp_num_hidden_layers), so it has no "
                          "head to draft with")
    return tokens


def _history_mode(model: str, found: TemplateFormat | None, thinking_arg: str, asked: str | None,
                  share: float | None) -> dict:
    """``--preserve-thinking`` as asked, or the template's own default; refused where the template has no such
    keyword. A model not readable here (AUTO) records what was asked, for the keyword the workers' template has."""
    if asked is not None and asked not in THINKING_MODES:
        raise ConfigError(f"--preserve-thinking must be one of {', '.join(THINKING_MODES)}")
    if found is None or found.history_arg is None:
        if asked is None:
            return {}
        if thinking_arg != AUTO:
            raise ConfigError(f"--preserve-thinking {asked}: {model}'s chat template has no keyword that changes how "
                              "earlier assistant turns render (Qwen3.6's preserve_thinking); leave the option out")
        arg = AUTO
    else:
        arg = found.history_arg
    mode = asked or ("on" if found is not None and found.history_default else "off")
    kept = mode_share(mode, share, every="on", option="--preserve-thinking-share")
    return {"history_arg": arg, "preserve_thinking": mode, "preserve_thinking_share": kept}


def mode_share(mode: str, share: float | None, *, every: str, option: str) -> float:
    """The share of conversations a per-conversation switch (on/off/mix) applies to: 1 where ``mode`` is ``every``,
    0 for the other, ``share`` (default one half) for ``mix``; ``option`` names the share in the refusal."""
    if mode == "mix":
        share = 0.5 if share is None else share
    else:
        share = 1.0 if mode == every else 0.0
    if not 0.0 <= share <= 1.0:
        raise ConfigError(f"{option} must be between 0 and 1")
    return share


def _harmony_parsers(model: str, reasoning: str | None, tool: str | None, found: TemplateFormat) -> ParserChoice:
    """gpt-oss's parsers: vLLM reads it with Harmony whatever else is named, so only its own names are accepted."""
    own = (found.reasoning, found.tool)
    for name, mine, option in ((reasoning, own[0], "--reasoning-parser"), (tool, own[1], "--tool-parser")):
        if name not in (None, AUTO, mine):
            raise ConfigError(f"{option} {name!r}: {model} is gpt-oss, which vLLM reads with Harmony "
                              f"({own[0]} / {own[1]}); leave the option out or name {mine}")
    named = reasoning not in (None, AUTO) or tool not in (None, AUTO)
    by = "template: gpt_oss, rendered with Harmony" if chat_template_of(model) else "config: gpt_oss, rendered with Harmony"
    return ParserChoice(own[0], own[1], ("named and " if named else "") + by)


def _probed(model: str) -> TemplateFormat | None:
    """The family the model's template renders (gpt-oss also by its config.json); None for a hub id or no family."""
    if not Path(model).is_dir():
        return None
    template = chat_template_of(model)
    found = probe_template(template) if template else None
    if (found is None or found.chat_format != harmony.HARMONY) and harmony.is_gpt_oss_model(model):
        found = harmony.HARMONY_FORMAT  # vLLM serves a gpt_oss model with Harmony, whatever its template
    return found


def _template_format(model: str, parsers: ParserChoice,
                     found: TemplateFormat | None) -> tuple[TemplateFormat | None, str]:
    """What the model's template renders, and its thinking argument as recorded (AUTO: the workers find it).

    A template of no family regen knows (its parsers named) is rendered too: a thinking mode is accepted only
    where the template renders it. With an argument that changes its generation prompt, every mode is; without
    one, only the mode the named parsers read: on with a reasoning parser, off without one.
    """
    if not Path(model).is_dir():
        return None, AUTO
    template = chat_template_of(model)
    if found is not None:
        return found, found.thinking_arg or "none"
    arg = thinking_switch(template) if template else None
    if arg is not None:
        thinking = "switch"
    else:
        thinking = "always" if parsers.reasoning not in (None, AUTO) else "never"
    return TemplateFormat(family="unknown", reasoning=parsers.reasoning, tool=parsers.tool, thinking_arg=arg,
                          thinking=thinking), arg or "none"


def _thinking_mode(model: str, asked: str | None, found: TemplateFormat | None) -> str:
    """``--thinking`` as asked, or the template's default; a mode the template cannot render is refused."""
    if found is None:
        return asked or "on"
    if asked is None:
        return "off" if found.thinking == "never" else "on"
    if asked not in found.modes():
        if found.family == "unknown":
            how = (f"renders the same generation prompt with thinking on and off (no chat-template argument "
                   f"({', '.join(THINKING_ARGS)}) changes it), so only the mode its reasoning parser "
                   f"({found.reasoning or 'none'}) reads can run")
        else:
            how = {"always": "always thinks (its generation prompt opens a thought whatever is passed, or the "
                             "model opens it and no chat-template argument closes it)",
                   "never": "never thinks (no chat-template argument opens a thought)",
                   "effort": "is gpt-oss, rendered with Harmony, which always reasons (its switch is the effort: "
                             "--reasoning-effort low, medium or high)"}[found.thinking]
        raise ConfigError(f"--thinking {asked} cannot be rendered by {model}'s chat template: it {how}; "
                          f"choose --thinking {' or '.join(found.modes())}")
    return asked
