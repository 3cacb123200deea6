"""The demo's S3: a moto server that outlives the demo, and whose objects outlive the server.

The demo used to start moto for its own lifetime, in memory: the ``regen report`` and ``regen
export`` it printed then found no server (NoCredentialsError in a new shell, a dead endpoint in
the same one), and a rerun printed a new, empty endpoint (issue 59). Now:

* the server runs in a session of its own, so it keeps answering after the demo exits; where it
  listens is in ``<folder>/s3.json``, and the next demo (or ``source <folder>/demo.env``) uses it;
* moto's recorder appends every request to ``<folder>/s3-recording.jsonl``; a server started
  later (after a reboot, or ``stop_demo_s3``) replays the writes in it first, so the demo's
  objects are back, at the same bucket and keys, "started the same way next time".

Reads are dropped from the recording before a replay (they change nothing), so it grows with
what was written, not with what was read. It is the demo's store, not a production one: a
recording holds every object ever written, deleted ones too, until the folder is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from .s3 import MOTO_START_TIMEOUT_S, free_port

STATE_FILE = "s3.json"
RECORDING_FILE = "s3-recording.jsonl"
LOG_FILE = "s3.log"
#: Requests that change nothing: left out of the recording before it is replayed.
_READS = frozenset({"GET", "HEAD"})


def _answers(endpoint_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint_url}/moto-api/", timeout=2):
            return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _state(folder: Path) -> dict:
    try:
        return json.loads((folder / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _writes_only(recording: Path) -> int:
    """Keep the recording's writes (PUT, POST, DELETE) only, in order; return how many there are."""
    if not recording.exists():
        return 0
    kept = []
    with recording.open(encoding="utf-8") as f:
        for line in f:
            with contextlib.suppress(ValueError):
                if json.loads(line).get("method") not in _READS:
                    kept.append(line if line.endswith("\n") else line + "\n")
    tmp = recording.with_name(recording.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, recording)
    return len(kept)


def demo_s3(folder: Path) -> tuple[str, bool]:
    """The endpoint of the demo's S3 in ``folder``, started (and its recording replayed) if none answers.

    Returns:
        ``(endpoint_url, started)``: ``started`` is False when the server of an earlier demo answered.
    """
    folder.mkdir(parents=True, exist_ok=True)
    state = _state(folder)
    if state.get("endpoint_url") and _answers(state["endpoint_url"]):
        return state["endpoint_url"], False
    recording = folder / RECORDING_FILE
    writes = _writes_only(recording)
    # The same port as last time where it is free, so the printed commands of an earlier demo still work.
    port = state.get("port") or free_port()
    for _attempt in range(3):
        endpoint = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"MOTO_ENABLE_RECORDING": "True", "MOTO_RECORDER_FILEPATH": str(recording.resolve())})
        with open(folder / LOG_FILE, "ab") as log:
            # A session of its own and no parent-death signal: it outlives the demo, by design.
            process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                       start_new_session=True)
        deadline = time.monotonic() + MOTO_START_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None and not _answers(endpoint):
            time.sleep(0.1)
        if process.poll() is None and _answers(endpoint):
            break
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        port = free_port()  # taken meanwhile: another port
    else:
        raise RuntimeError(f"the demo's S3 (moto) did not start: see {folder / LOG_FILE}")
    if writes:
        request = urllib.request.Request(f"{endpoint}/moto-api/recorder/replay-recording", method="POST")
        with urllib.request.urlopen(request, timeout=600):
            pass
    (folder / STATE_FILE).write_text(json.dumps({"endpoint_url": endpoint, "port": port, "pid": process.pid}))
    return endpoint, True


def stop_demo_s3(folder: Path) -> None:
    """Stop the demo's S3 server of ``folder``, if it runs; its recording stays (the next start replays it)."""
    pid = _state(folder).get("pid")
    if not pid:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:  # our own child (a test): reaped
                return
        except ChildProcessError:  # another's: gone once it no longer answers signal 0, or a zombie
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            if _is_zombie(pid):  # exited; its parent (init, in a container maybe none) reaps it or not
                return
        time.sleep(0.1)


def _is_zombie(pid: int) -> bool:
    try:
        # /proc/PID/stat: "pid (comm) state ...": the state after the last ')'.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
