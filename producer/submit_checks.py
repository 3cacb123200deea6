"""What ``regen submit`` checks before it writes anything (issue 36, part 5).

A submit that fails half-way used to leave an ``active`` run with no batch, which then
refused the corrected submit under the same name ("exists with another configuration").
So every check that can be made up front is made here, before the run exists, cheapest
first:

1. the input paths exist and each file yields a first row (an empty file would make an empty run);
2. the output URL names a valid bucket;
3. the model: a local folder with ``config.json``, a tokenizer and a chat template, or a hub
   id whose files are in this machine's Hugging Face cache or answer from the hub (skipped
   for a ``--benchmark`` run, which a fake engine may serve without any model);
4. the ledger answers and is at this regen's migration;
5. the broker answers a PING;
6. the output prefix takes a write and a delete (a probe object, removed at once).

What still fails later (S3 or Redis gone between the checks and the writes) is handled by
producer/submit.py: a run created by the failed submit and given no batch is deleted again.

Every refusal is a ConfigError (or a ledger/broker/store error the CLI prints in one line)
naming what was checked, where, and what to do.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger import transitions
from ledger.errors import ConfigError, StoreError
from ledger.model_path import resolve_model
from ledger.models import Run
from ledger.object_keys import join_key, parse_s3_url
from ledger.objects import ObjectStore
from ledger.settings import Settings, redact
from targets.parser_choice import chat_template_of

from .clean import refuse_a_shared_prefix
from .dataset.readers import iter_file_rows, iter_input_paths
from .dataset.reasons import UNREADABLE_FILE
from .run_config import RunConfig

log = logging.getLogger(__name__)

#: Files of which one makes a tokenizer (transformers' fast and slow ones, tiktoken models).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json", "vocab.txt")
#: Attempts of the S3 probe: a down endpoint is told in seconds, not after the 8 tries a shard gets.
PROBE_S3_ATTEMPTS = 2
#: Seconds the broker has to answer the PING.
BROKER_TIMEOUT_S = 5.0


class BrokerUnreachable(ConfigError):
    """The broker (Redis) did not answer."""


def check_submit(settings: Settings, paths: Sequence[str], *, model: str, output_url: str, benchmark: bool,
                 store: ObjectStore | None = None) -> None:
    """Refuse a submit that cannot work before anything is written (the module docstring lists the checks).

    Raises:
        ConfigError: a path, the bucket, the model or the ledger's migration is refused.
        BrokerUnreachable: Redis does not answer.
        StoreError: the output prefix cannot be written (S3 down, no credentials, access denied).
        sqlalchemy.exc.OperationalError: the ledger does not answer.
    """
    check_inputs(paths)
    parse_s3_url(output_url)
    if not benchmark:
        check_model(model)
    check_ledger(settings)
    check_broker(settings.redis_url)
    check_output_writable(store or ObjectStore(max_attempts=PROBE_S3_ATTEMPTS), output_url)


def check_inputs(paths: Sequence[str]) -> None:
    """Every input path exists and every file it names yields a first row.

    A file that yields none (empty, ``[]``, unreadable from its start) would make a run with
    nothing in it, left active: refused here, before the run exists, with the reason and the fix.
    """
    for path in iter_input_paths(paths):
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from e
        why = first_row_problem(path)
        if why is not None:
            raise ConfigError(f"{path}: no rows can be read: {why}. {INPUT_FORMS_FIX}")


#: What to do about a file that yields no rows: the forms regen reads.
INPUT_FORMS_FIX = ("regen reads JSON lines (.jsonl, .json; .gz/.zst), a .json file that is one JSON array of "
                   "conversations, Parquet, and datasets.save_to_disk folders (docs/formats.md): check that this is "
                   "the file you meant, or leave it out")


def first_row_problem(path: Path) -> str | None:
    """Why the file yields no first row (None when it does): empty, or unreadable from its start."""
    rows = iter_file_rows(path, columns=())
    try:
        first = next(rows, None)
    finally:
        rows.close()
    if first is None:
        return "the file holds no rows (it is empty, or an empty JSON array or table)"
    if first.error is not None and first.error.reason == UNREADABLE_FILE:
        return f"{first.error.reason}: {first.error.detail}"
    return None


def check_model(model: str) -> None:
    """A local model folder with ``config.json``, a tokenizer and a chat template, or a hub id that has them."""
    resolved = resolve_model(model)
    path = Path(resolved)
    if path.is_dir():
        _check_model_folder(path, model)
    elif path.exists():
        raise ConfigError(f"--model {model}: not a folder (a model folder holds config.json, the tokenizer and "
                          "the weights)")
    elif _looks_like_path(model):
        raise ConfigError(f"--model {model}: no such folder on this machine; submit with the path of the model "
                          "folder the workers load (or a hub id, e.g. Qwen/Qwen3-8B)")
    elif _local_parent(model) is not None:
        raise ConfigError(_mistyped_folder(model, _local_parent(model)))
    else:
        _check_hub_model(model)


def _local_parent(model: str) -> Path | None:
    """The local folder that ``org/name``'s ``org`` names, if there is one: then the id was meant as a path."""
    head = model.split("/", 1)[0]
    return Path(head) if "/" in model and Path(head).is_dir() else None


def _mistyped_folder(model: str, parent: Path) -> str:
    import difflib

    name = model.split("/", 1)[1]
    folders = sorted(p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))
    close = difflib.get_close_matches(name, folders, n=3, cutoff=0.5)
    hint = (f"did you mean {' or '.join(f'{parent}/{c}' for c in close)}?" if close
            else f"{parent}/ holds {', '.join(folders[:8]) or 'no folder'}{' ...' if len(folders) > 8 else ''}")
    return (f"--model {model}: no such folder: {parent}/ is a folder here but holds no {name!r} ({hint}); "
            f"not looked up on the hub while ./{parent} is a folder here (submit from another folder for the "
            "hub model of that id)")


def _looks_like_path(model: str) -> bool:
    # A hub id is "name" or "org/name"; anything else given on a command line is meant as a path.
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or "\\" in model


def _check_model_folder(path: Path, given: str) -> None:
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / name).is_file() for name in TOKENIZER_FILES) and not any(path.glob("*.tiktoken")):
        missing.append(f"a tokenizer ({', '.join(TOKENIZER_FILES)})")
    if missing:
        raise ConfigError(f"--model {given}: the folder {path} lacks {' and '.join(missing)}: not a model folder")
    if not chat_template_of(path):
        raise ConfigError(f"--model {given}: {path} has no chat template (tokenizer_config.json's chat_template, "
                          "chat_template.jinja or chat_template.json); regen renders every conversation with the "
                          "model's own template: use the instruct/chat model's folder")


def _check_hub_model(repo_id: str) -> None:
    """The hub id's tokenizer config, from the local cache or the hub; it must carry a chat template."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError as e:
        raise ConfigError(f"--model {repo_id}: no folder of that name here, and huggingface_hub is not installed "
                          "to look it up on the hub: pass the model folder") from e
    config: str | None = None
    try:
        cached = try_to_load_from_cache(repo_id=repo_id, filename="tokenizer_config.json")
        config = cached if isinstance(cached, str) else None
    except ValueError as e:  # not a valid repo id
        raise ConfigError(f"--model {repo_id}: neither a folder on this machine nor a valid hub id ({e})") from e
    if config is None:
        offline = _hub_unreachable()
        if offline:
            # huggingface_hub would retry five times over ~24 s, then say "check your connection".
            raise ConfigError(f"--model {repo_id}: no folder of that name here, not in this machine's Hugging Face "
                              f"cache, and the hub cannot be asked ({offline}): pass the model folder's path "
                              f"(a typo?), or download it where the hub answers (`hf download {repo_id}`)")
        try:
            config = hf_hub_download(repo_id=repo_id, filename="tokenizer_config.json", etag_timeout=10)
        except Exception as e:  # noqa: BLE001 - unknown repo, gated, offline: all mean "cannot confirm it"
            raise ConfigError(f"--model {repo_id}: no folder of that name here and no tokenizer_config.json of "
                              f"that hub id could be had ({type(e).__name__}: {_whole_first_sentence(e)}); pass "
                              f"the model folder's path (a typo?), or download it first (`hf download {repo_id}`)"
                              ) from e
    if not chat_template_of(Path(config).parent):
        raise ConfigError(f"--model {repo_id}: its tokenizer_config.json has no chat template; regen renders "
                          "every conversation with the model's own template: use the instruct/chat model")


#: Seconds to connect to the hub before calling it unreachable (a DNS failure answers at once).
HUB_CONNECT_TIMEOUT_S = 3.0


def _hub_unreachable() -> str | None:
    """Why the hub cannot be asked (HF_HUB_OFFLINE, no DNS, no route), or None: one try, no retries."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return f"{host}:{port}: {e.strerror or type(e).__name__}"
    return None


def _whole_first_sentence(e: BaseException) -> str:
    """The error's first line, whole: a message cut mid-word ("try aga") reads as a bug."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def check_ledger(settings: Settings) -> None:
    """The ledger answers and is at this regen's migration (else: `regen db upgrade`)."""
    from ledger import migrate

    migrate.require_head(settings)


def check_broker(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=BROKER_TIMEOUT_S,
                                  socket_connect_timeout=BROKER_TIMEOUT_S)
    try:
        client.ping()
    except redis.RedisError as e:
        raise BrokerUnreachable(f"the broker at {redact(redis_url)} does not answer ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:160]}); check REDIS_URL (or --redis-url) and that "
                                "Redis runs") from e
    finally:
        client.close()


def check_output_writable(store: ObjectStore, output_url: str) -> None:
    """A probe object written under the output prefix and deleted again: the prefix is reachable and writable."""
    probe = join_key(output_url, f".regen-probe-{uuid.uuid4().hex}")
    body = json.dumps({"what": "regen submit's write check; deleted at once"}).encode()
    # The store's retry warnings are left out: the refusal below says it in one line.
    objects_log = logging.getLogger("ledger.objects")
    level = objects_log.level
    objects_log.setLevel(logging.ERROR)
    try:
        store.put(probe, body)
    except StoreError as e:
        raise StoreError(f"the output {output_url} cannot be written: {e}", transient=e.transient,
                         code=e.code) from e
    else:
        try:
            store.delete(probe)  # the object itself: delete_prefix(probe) took it as a folder and left it
        except StoreError as e:
            raise StoreError(f"the output {output_url} takes writes but refused the delete of {probe} ({e}); "
                             "regen clean and the probe need s3:DeleteObject", transient=e.transient,
                             code=e.code) from e
    finally:
        objects_log.setLevel(level)


def get_or_create_run(session: Session, name: str, config: RunConfig, *, output_url: str, queue: str,
                      batch_size: int, quality_thresholds: dict | None = None,
                      benchmark: bool = False) -> tuple[Run, bool]:
    run = session.scalar(select(Run).where(Run.name == name))
    if run is None:
        refuse_a_shared_prefix(session, name, output_url)
        run = transitions.new_run(session, name=name, model=config.model, sampling=config.as_record(),
                                  config_hash=config.hash, output_url=output_url.rstrip("/"), queue=queue,
                                  batch_size=batch_size, provenance=config.provenance(),
                                  quality_thresholds=quality_thresholds, benchmark=benchmark)
        return run, True
    if bool(run.benchmark) != benchmark:
        # Which engines may serve the run (a fake one serves benchmark runs only): fixed at creation.
        raise ConfigError(f"run {name!r} was created {'with' if run.benchmark else 'without'} --benchmark; "
                          "a run's benchmark mark never changes: choose a new run name")
    if run.config_hash != config.hash:
        diffs = []
        if run.model != config.model:
            diffs.append(f"model {run.model!r} != {config.model!r}")
        for key, value in config.as_record().items():
            if run.sampling.get(key) != value:
                diffs.append(f"{key} {run.sampling.get(key)!r} != {value!r}")
        if not diffs:
            diffs.append("the model's files changed since the run was created")
        raise ConfigError(f"run {name!r} exists with another configuration ({'; '.join(diffs)}); "
                          "a new model or sampling config is a new run: a new run name and an --output "
                          "prefix of its own")
    if run.output_url != output_url.rstrip("/"):
        raise ConfigError(f"run {name!r} writes to {run.output_url}, not {output_url}")
    if run.batch_size != batch_size:
        raise ConfigError(f"run {name!r} was created with --batch-size {run.batch_size}")
    if quality_thresholds is not None and quality_thresholds != run.quality_thresholds:
        # Thresholds judge outputs, they do not change them: not in the config hash, may change.
        run.quality_thresholds = quality_thresholds
    return run, False
