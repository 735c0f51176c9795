"""The one-promotion-per-model lease (DESIGN §4): who may promote a model now, and whether a crashed run's lease
may be taken over.

A model's promotion lease records its holder's name (shown, never parsed), a random token, the host and pid of a
run's process (none for an orchestrator's lease, held by name across its steps) and when the holder last renewed it:
whether a crashed run's lease may be taken over is judged from those (`acquire_lease(stopped=...)`).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Protocol

import sqlalchemy as sa

from shiplift.tasks.errors import BadInput, LeaseHeld, LeaseLost
from shiplift.tasks.ledger.chain_records import require_text
from shiplift.tasks.ledger.timestamps import format_utc, parse_utc, utcnow

MAX_LEASE_TTL_S = 7 * 24 * 3600


class LeaseGiver(Protocol):
    """What a lease is given back to when its `with` block ends: the `Ledger` it was taken from."""

    def release_lease(self, model: str, holder: str, *, token: str | None = None) -> bool: ...


@dataclass(frozen=True)
class Lease:
    """The promotion lease on one model; leaving a `with` block releases it. `holder` is a name for people (an actor, an
    orchestrator's run) and is never parsed: a run's lease is its process's (`host`, `pid`) and is renewed and given
    back by its random `token`; an orchestrator's (no pid) is held by name across its steps' processes."""

    model: str
    holder: str
    release_id: str
    acquired_at: str
    expires_at: str
    renewed_at: str
    token: str | None = None  # None only on a lease taken before schema revision 0002
    host: str | None = None  # socket.gethostname() of the process holding a run's lease
    pid: int | None = None  # that process; None: an orchestrator's lease
    ledger: LeaseGiver | None = field(default=None, repr=False, compare=False)
    taken_over: tuple[str, str] | None = None  # (the stopped holder, why) when this lease was taken over from it

    def to_dict(self) -> dict[str, str | int | None]:
        """The lease as a JSON-able dict."""
        return {name: getattr(self, name) for name in LEASE_FIELDS}

    def describe(self) -> str:
        """Who holds it, for people: the holder's name, its process (a run's lease) and when it last renewed."""
        process = f", process {self.pid} on {self.host}" if self.pid is not None else ", held by name"
        return (f"{self.holder!r} (release {self.release_id!r}{process}; "
                f"renewed {self.renewed_at}, expires {self.expires_at})")

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.ledger is not None:
            self.ledger.release_lease(self.model, self.holder, token=self.token)


LEASE_FIELDS = ("model", "holder", "release_id", "acquired_at", "expires_at", "renewed_at", "token", "host", "pid")


class LeaseBook:
    """The leases table of one ledger, read and written under the ledger's writer lock for leases; the `Ledger`'s
    lease methods are these."""

    def __init__(self, ledger: LeaseGiver, leases: sa.Table,
                 write: Callable[[str], AbstractContextManager[sa.Connection]]):
        self._ledger = ledger
        self._leases = leases
        self._write = write

    @staticmethod
    def _check_lease_args(model: str, holder: str, release_id: str, ttl_s: float) -> None:
        """BadInput unless the names are plain text and `ttl_s` a number of seconds in (0, MAX_LEASE_TTL_S]."""
        for name, value in (("model", model), ("holder", holder), ("release_id", release_id)):
            require_text(name, value)
        if (
            isinstance(ttl_s, bool)
            or not isinstance(ttl_s, (int, float))
            or not math.isfinite(ttl_s)
            or not 0 < ttl_s <= MAX_LEASE_TTL_S
        ):
            raise BadInput(
                f"lease ttl_s must be a number in (0, {MAX_LEASE_TTL_S}], got {ttl_s!r}",
                fix="pass how long the lease lasts unless it is renewed, in seconds",
            )

    def _lease_of(self, conn: sa.Connection, model: str) -> Lease | None:
        """The lease row on `model` as a Lease (None: nobody has taken it, or it was given back)."""
        row = conn.execute(sa.select(self._leases).where(self._leases.c.model == model)).first()
        return None if row is None else Lease(ledger=self._ledger, **row._asdict())

    def acquire(self, model: str, holder: str, release_id: str, ttl_s: float, *,
                stopped: Callable[[Lease], str | None] | None = None, by_this_process: bool = False) -> Lease:
        """Take the promotion lease on `model`; LeaseHeld if another unexpired holder has it. `by_this_process`: the
        lease is this process's run's (host and pid recorded; renewed and given back with the returned lease's random
        token); otherwise an orchestrator's, held by `holder`'s name across its steps' processes. The same holder taking
        it again (the same process, or the same name) refreshes it. A holder of this same release that `stopped(lease)`
        says has stopped (a crashed run) is taken over at once; the Lease names it in `taken_over` for the caller to
        record. Another release's holder is never taken over."""
        self._check_lease_args(model, holder, release_id, ttl_s)
        host, pid = (socket.gethostname(), os.getpid()) if by_this_process else (None, None)
        taken_over = None
        with self._write("lease") as conn:
            now = utcnow()
            current = self._lease_of(conn, model)
            live = current is not None and parse_utc(current.expires_at) > now
            ours = (holder, release_id, host, pid)
            if live and (current.holder, current.release_id, current.host, current.pid) != ours:
                why = stopped(current) if stopped is not None and current.release_id == release_id else None
                if why is None:
                    same = (" (this same release, in another run that is still alive)"
                            if current.release_id == release_id else "")
                    raise LeaseHeld(
                        f"model {model!r} is being promoted by {current.describe()}{same}",
                        fix="wait for that run to finish or its lease to expire, then retry",
                    )
                taken_over, live = (current.holder, why), False
            values = {
                "holder": holder,
                "release_id": release_id,
                "acquired_at": current.acquired_at if live else format_utc(now),
                "expires_at": format_utc(now + timedelta(seconds=ttl_s)),
                "renewed_at": format_utc(now),
                "token": current.token if live else secrets.token_hex(16),
                "host": host,
                "pid": pid,
            }
            if current is None:
                conn.execute(self._leases.insert().values(model=model, **values))
            else:
                conn.execute(self._leases.update().where(self._leases.c.model == model).values(**values))
        return Lease(model=model, ledger=self._ledger, taken_over=taken_over, **values)

    def renew(self, model: str, holder: str, release_id: str, ttl_s: float, *, token: str | None = None) -> Lease:
        """Extend `holder`'s lease on `model` by `ttl_s` from now and stamp the renewal; a run's lease is matched by its
        `token`, an orchestrator's by its name. LeaseLost when the lease is not this holder's (another run took it over
        after it expired or its process stopped, or it was given back): such a run must not touch production."""
        self._check_lease_args(model, holder, release_id, ttl_s)
        with self._write("lease") as conn:
            now = utcnow()
            current = self._lease_of(conn, model)
            if current is None or not _held_by(current, holder, release_id, token):
                taken = (f"it is held by {current.describe()}" if current is not None
                         else "nobody holds it: it was given back")
                raise LeaseLost(
                    f"run {holder!r} lost the promotion lease on {model!r}: {taken}",
                    fix="this run stops before production; look at `shiplift ledger history` and rerun the release "
                        "once the other run has finished",
                )
            renewed = {"expires_at": format_utc(now + timedelta(seconds=ttl_s)), "renewed_at": format_utc(now)}
            conn.execute(self._leases.update().where(self._leases.c.model == model).values(**renewed))
        return replace(current, **renewed)

    def release(self, model: str, holder: str, *, token: str | None = None) -> bool:
        """Give back `holder`'s lease on `model` (a run's by its `token`, an orchestrator's by name); False if it no
        longer held it (expired and taken over)."""
        require_text("model", model)
        require_text("holder", holder)
        leases = self._leases
        owned = leases.c.token == token if token is not None else leases.c.pid.is_(None)
        with self._write("lease") as conn:
            result = conn.execute(leases.delete().where(leases.c.model == model, leases.c.holder == holder, owned))
        return result.rowcount == 1


def _held_by(lease: Lease, holder: str, release_id: str, token: str | None) -> bool:
    """Whether `lease` is the one `holder` took for `release_id`: a run's by its token, an orchestrator's by name."""
    owned = lease.token == token if token is not None else lease.pid is None
    return (lease.holder, lease.release_id) == (holder, release_id) and owned


@contextlib.contextmanager
def renewing(renew: Callable[[], object], *, every_s: float, say: Callable[[str], None],
             name: str) -> Iterator[None]:
    """Call `renew` every `every_s` seconds in a thread named `name` while the block runs, so a block longer than a
    lease's TTL keeps it. A failed renewal is said and tried again at the next tick (well inside the TTL); one that
    finds the lease lost (LeaseLost) is said and stops renewing: the holder learns it at its next own check."""
    stop = threading.Event()

    def keep_renewing() -> None:
        while not stop.wait(every_s):
            try:
                renew()
            except LeaseLost as exc:
                say(f"WARNING {exc}")
                return
            except Exception as exc:  # a ledger hiccup: the next renewal is well inside the TTL
                say(f"WARNING lease {name} not renewed this time ({exc}); trying again in {every_s:.0f}s")

    renewer = threading.Thread(target=keep_renewing, name=name, daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
