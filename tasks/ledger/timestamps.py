"""The ledger's clock: UTC timestamps as records store them (`YYYY-MM-DDTHH:MM:SS.ffffffZ`, sortable as text).

`recorded_at` never goes backwards along the chain, because `served_at()` orders by it: a
writer whose clock reads up to MAX_CLOCK_SKEW_S earlier than the newest record (hosts drift)
records the newest record's time instead; a clock further behind is refused, naming both times.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

from shiplift.tasks.errors import BadInput, ConfigError, IntegrityError

MAX_CLOCK_SKEW_S = 5.0
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def utcnow() -> datetime:
    """The current time in UTC (the one clock records and leases read; tests replace it)."""
    return datetime.now(UTC)


def format_utc(moment: datetime) -> str:
    """`moment` in UTC as the ledger stores times."""
    return moment.astimezone(UTC).strftime(_TS_FORMAT)


def parse_utc(text: str) -> datetime:
    """A time the ledger stored, back as an aware datetime; ValueError for text that is not one."""
    return datetime.strptime(text, _TS_FORMAT).replace(tzinfo=UTC)


def recorded_at(head: sa.Row | None) -> str:
    """Now, or the head's time when this clock reads at most MAX_CLOCK_SKEW_S earlier; further back is refused."""
    now = format_utc(utcnow())
    if head is None or now >= head.recorded_at:
        return now
    try:
        behind_s = (parse_utc(head.recorded_at) - parse_utc(now)).total_seconds()
    except ValueError as error:
        raise IntegrityError(
            f"the newest record (seq {head.seq}) has recorded_at {head.recorded_at!r}, which is not a timestamp",
            fix="run `shiplift ledger verify`; the record was edited",
        ) from error
    if behind_s > MAX_CLOCK_SKEW_S:
        raise ConfigError(
            f"this host's clock reads {now}, {behind_s:.3f} s before the newest record "
            f"(seq {head.seq}, recorded at {head.recorded_at}); records must not go back in time",
            fix="correct the system clock (NTP), then retry",
        )
    return head.recorded_at


def moment_text(when: datetime | str) -> str:
    """A moment as the ledger writes `recorded_at` (UTC, sortable as text), to compare with records: BadInput for a time
    that is not ISO 8601 or has no timezone."""
    return as_utc_text(when)


def as_utc_text(when: datetime | str) -> str:
    """`when` (a datetime or ISO 8601 text, with a timezone) as the ledger stores times; BadInput otherwise."""
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError as error:
            raise BadInput(
                f"time {when!r} is not ISO 8601: {error}",
                fix="pass e.g. '2026-11-29T12:00:00Z'",
            ) from error
    if not isinstance(when, datetime):
        raise BadInput(f"time must be a datetime or ISO string, got {type(when).__name__}")
    if when.tzinfo is None:
        raise BadInput(
            f"time {when.isoformat()} has no timezone, so the moment is ambiguous",
            fix="pass a timezone-aware datetime or a string ending in Z or +00:00",
        )
    return format_utc(when)
