"""The processes the local backend starts, as the kernel sees them: whether one still runs (and is the one started,
not a reused pid), which ones carry an endpoint's owner tag, stopping them, and the tail of their logs.

Every process started for an endpoint leads its own session and carries `OWNER_ENV` in its environment, so one
killed between spawning and recording it is found by that tag and stopped too (Linux; without /proc, pids alone).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from shiplift.tasks.backends.local.endpoint_state import ProcessRef
from shiplift.tasks.errors import Conflict
from shiplift.tasks.processes import pid_running

POLL_S = 0.05
LOG_TAIL_BYTES = 4096
HAVE_PROC = Path("/proc/self/stat").exists()  # Linux: pid start times guard against pid reuse
OWNER_ENV = "SHIPLIFT_ENDPOINT_OWNER"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from /proc, or None when no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _reap(pid: int) -> None:
    """Collect the exit status of our own exited child so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (what tells it from a later process given its pid), None without it."""
    stat = _proc_stat(pid) if HAVE_PROC else None
    return stat[1] if stat else None


def still_running(ref: ProcessRef) -> bool:
    """True when the process still runs and is the one we started (not a reused pid)."""
    if not HAVE_PROC:
        _reap(ref.pid)
        return pid_running(ref.pid)
    stat = _proc_stat(ref.pid)
    if stat is None or (ref.start_ticks is not None and stat[1] != ref.start_ticks):
        return False
    if stat[0] == "Z":
        _reap(ref.pid)
        return False
    return True


def tagged_processes(owner: str) -> list[ProcessRef]:
    """Live session leaders whose environment carries OWNER_ENV=owner (none without /proc).

    Only leaders: every process this backend starts leads its own session, and a leader's
    children (in its process group) are stopped with it. A leader whose parent is tagged too is
    a server's own child in a session of its own (the dlc-chat image's llama_cpp.server inherits
    the tag): its parent stops it, so it is not one of this backend's processes.
    """
    if not HAVE_PROC:
        return []
    tag = f"{OWNER_ENV}={owner}".encode()
    tagged = {pid for pid in _proc_pids() if tag in _environ(pid)}
    found = []
    for pid in sorted(tagged):
        if _process_group(pid) == pid and _parent_pid(pid) not in tagged:
            ticks = process_start_ticks(pid)
            if ticks is not None:
                found.append(ProcessRef(pid=pid, start_ticks=ticks, log=""))
    return found


def _proc_pids() -> list[int]:
    """Every pid /proc lists now."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _environ(pid: int) -> list[bytes]:
    """The process's environment entries (`NAME=value`), none when it is gone or not readable."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _parent_pid(pid: int) -> int | None:
    """The parent's pid from /proc/<pid>/stat (field 4, after the parenthesised command name), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _process_group(pid: int) -> int | None:
    """The process's group id, None when it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _signal(ref: ProcessRef, sig: int) -> None:
    """Signal the process group we created with start_new_session (or just the pid)."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(ref.pid) == ref.pid:
            os.killpg(ref.pid, sig)
        else:
            os.kill(ref.pid, sig)


def stop_processes(refs: list[ProcessRef], grace_s: float) -> None:
    """SIGTERM, wait up to grace_s, then SIGKILL; raise Conflict if any process survives."""
    live = [ref for ref in refs if still_running(ref)]
    for ref in live:
        _signal(ref, signal.SIGTERM)
    for sig, wait_s in ((signal.SIGKILL, grace_s), (None, 5.0)):
        deadline = time.monotonic() + wait_s
        while live and time.monotonic() < deadline:
            time.sleep(POLL_S)
            live = [ref for ref in live if still_running(ref)]
        if not live:
            return
        if sig is not None:
            for ref in live:
                _signal(ref, sig)
    pids = ", ".join(str(ref.pid) for ref in live)
    raise Conflict(
        f"processes {pids} did not exit after SIGTERM and SIGKILL",
        fix=f"inspect them (ps -o pid,stat,cmd -p {pids}) and end them by hand",
    )


def log_tail(path: str | Path) -> str:
    """The last few KiB of a log, for error messages."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - LOG_TAIL_BYTES))
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return text.strip() or "(log is empty)"
