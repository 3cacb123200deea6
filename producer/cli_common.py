"""What the ``regen`` commands share: settings, the ledger for one command, the store, the run-config options.

Declared once so that ``regen submit`` and ``regen estimate`` take the same run
configuration (an estimate is only worth something for the config that will run),
and so that every command closes its database connections the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from ledger.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from ledger.objects import ObjectStore

    from .run_config import RunConfig

#: The exit status of a command refused by a RegenError (a bad config, an unknown run,
#: a refused resume): the same as click's usage errors, so scripts test one number.
ERROR_EXIT = 2

db_option = click.option("--database-url", envvar="DATABASE_URL", default=None,
                         help="postgresql://user@host:port/db (env DATABASE_URL)")
redis_option = click.option("--redis-url", envvar="REDIS_URL", default=None,
                            help="redis://host:port/db, the Celery broker (env REDIS_URL)")

#: The options that make a run's configuration (producer/run_config.py), besides --model.
_RUN_CONFIG_OPTIONS = (
    click.option("--max-tokens", type=int, default=2048, show_default=True),
    click.option("--temperature", type=float, default=None, help="default: the model's generation_config.json"),
    click.option("--top-p", type=float, default=None),
    click.option("--top-k", type=int, default=None),
    click.option("--seed", type=int, default=None, help="run seed; each generation's seed derives from it"),
    click.option("--thinking", type=click.Choice(["on", "off", "mix"]), default=None,
                 help="default: on where the model's template thinks, off where it never does"),
    click.option("--thinking-off-share", type=float, default=None, help="with --thinking mix: share of samples "
                 "generated without thinking (default 0.5)"),
    click.option("--reasoning-parser", default=None, help="vLLM's reasoning parser, as `vllm serve` names it "
                 "(qwen3, deepseek_r1, glm45, ...; none); default: read off the model's chat template"),
    click.option("--tool-parser", default=None, help="vLLM's tool-call parser, as `vllm serve` names it "
                 "(hermes, qwen3_coder, llama3_json, deepseek_v3, glm45, ...; none); default: from the template"),
    # Free text, checked by build_run_config: "none" gets Harmony's own reason, not click's list.
    click.option("--reasoning-effort", default=None, help="gpt-oss (Harmony) only: low, medium or high "
                 "(default medium); Harmony always reasons, so --thinking off is refused"),
    click.option("--preserve-thinking", type=click.Choice(["on", "off", "mix"]), default=None,
                 help="earlier assistant turns keep their (regenerated) thoughts, where the template has such a "
                 "keyword (Qwen3.6's preserve_thinking); default: the template's own default"),
    click.option("--preserve-thinking-share", type=float, default=None, help="with --preserve-thinking mix: share "
                 "of conversations rendered with earlier thoughts kept (default 0.5)"),
    click.option("--presence-penalty", type=float, default=None, help="vLLM's presence_penalty, over both "
                 "thinking modes' sampling (default: the mode's profile, else 0)"),
    click.option("--frequency-penalty", type=float, default=None, help="vLLM's frequency_penalty, as above"),
    click.option("--sampling-thinking", default=None, help="JSON object of sampling values for samples generated "
                 "with thinking, over the flags (default: generation_config.json for the mode it describes, "
                 "the model card's published values for the other)"),
    click.option("--sampling-no-thinking", default=None, help="JSON object of sampling values for samples "
                 "generated without thinking (--thinking off or mix), as above"),
    click.option("--stop-loops", type=click.Choice(["on", "off"]), default=None, help="abort a generation once "
                 "its recent tokens loop (the repetition_loop criterion, checked as it generates; its row is "
                 "classified repetition_loop); off: every generation runs to its budget (default on)"),
    click.option("--on-tool-mismatch", type=click.Choice(["splice", "stop"]), default=None,
                 help="a call whose arguments differ from the source call's: splice the source's result anyway "
                 "(the row is flagged tool_args_differ) or stop the conversation at that call (default splice)"),
    click.option("--mtp", default="auto", show_default=True, help="the model's own MTP head as speculative "
                 "decoding (lossless): off, on, or the tokens it drafts a step; auto: off for a run, measured both "
                 "ways by regen estimate, which says which is cheaper"),
)
RUN_CONFIG_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "thinking", "thinking_off_share",
                   "reasoning_parser", "tool_parser", "reasoning_effort", "preserve_thinking",
                   "preserve_thinking_share", "on_tool_mismatch", "mtp",
                   "presence_penalty", "frequency_penalty", "sampling_thinking", "sampling_no_thinking",
                   "stop_loops")


def run_config_options(command: Callable) -> Callable:
    """Add the run-config options to a command (they arrive as RUN_CONFIG_KEYS)."""
    for option in reversed(_RUN_CONFIG_OPTIONS):
        command = option(command)
    return command


def run_config_from(model: str, options: dict[str, Any]) -> RunConfig:
    """The run's configuration from a command's ``--model`` and run-config options."""
    from .run_config import build_run_config

    return build_run_config(model, **{key: options[key] for key in RUN_CONFIG_KEYS})


#: The settings the running command built last: where producer/cli_errors.py says a failure happened.
current_settings: Settings | None = None


def settings(database_url: str | None = None, redis_url: str | None = None) -> Settings:
    global current_settings
    current_settings = Settings.from_env(database_url=database_url, redis_url=redis_url)
    return current_settings


@contextlib.contextmanager
def ledger(settings: Settings) -> Iterator[sessionmaker[Session]]:
    """The ledger's sessions for one command; its connections are closed when the command ends."""
    from ledger.db import make_engine, make_sessionmaker

    engine = make_engine(settings)
    try:
        yield make_sessionmaker(engine)
    finally:
        engine.dispose()


def store(settings: Settings) -> ObjectStore:
    from ledger.objects import ObjectStore

    return ObjectStore.from_settings(settings)
