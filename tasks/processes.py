"""Whether a process of this host still runs: the one check the lease takeover and the local supervisor share."""

from __future__ import annotations

import os


def pid_running(pid: int) -> bool:
    """True while a process with this pid exists and is not a zombie (on Linux, its /proc state); another user's
    process counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):  # no /proc (macOS), or it exited meanwhile
        return True
