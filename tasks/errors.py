"""One vocabulary of domain errors for every stage, backend and server.

Each error message names what was wrong and how to fix it; callers never need to parse
library exceptions. `retryable` tells orchestrators (Airflow retries, Step Functions Retry)
whether running the same step again can succeed.
"""

from __future__ import annotations


class ShipliftError(Exception):
    """Base of every error shiplift raises on purpose."""

    retryable = False

    def __init__(self, message: str, *, fix: str | None = None):
        self.problem = message
        self.fix = fix
        super().__init__(f"{message} — fix: {fix}" if fix else message)


class ConfigError(ShipliftError):
    """A configuration file, environment variable or flag is invalid."""


class BadInput(ShipliftError):
    """A file, request or argument is malformed (not a configuration)."""


class IntegrityError(ShipliftError):
    """Content does not match its pin: sha256 mismatch, tampered ledger, unsafe archive."""


class NotFound(ShipliftError):
    """A named resource (release, endpoint, artifact, record) does not exist."""


class Conflict(ShipliftError):
    """The resource exists with different content, or the operation races another one."""


class LeaseHeld(Conflict):
    """Another run holds the promotion lease for this model."""


class NotReady(ShipliftError):
    """A resource exists but is not yet usable (server loading, endpoint creating)."""

    retryable = True


class CapacityError(ShipliftError):
    """No capacity could be obtained (no free port, instance pool exhausted, overloaded)."""

    retryable = True


class GateFailed(ShipliftError):
    """A validation gate decided fail or inconclusive; the candidate is not promoted."""


class Throttled(NotReady):
    """AWS kept throttling after the bounded retries; running the step again later can succeed."""


class DeployFailed(ShipliftError):
    """A model or endpoint did not start (the backend's FailureReason is in the message); fix the cause, then rerun."""


class StepTimedOut(ShipliftError):
    """One attempt of a step ran past its timeout (the policy table's, lengthened by the config's deadlines); not
    retried, on any orchestrator: what made it slow would make the next attempt slow too."""


class LeaseLost(Conflict):
    """This run no longer holds the model's promotion lease (it expired and another run took it, or it was given
    back): it must not change production."""


def is_retryable(exc: BaseException) -> bool:
    """Whether running the same step again can succeed: only a ShipliftError that says so (a bug is not retried)."""
    return isinstance(exc, ShipliftError) and exc.retryable


def error_classes() -> tuple[type[ShipliftError], ...]:
    """Every domain error class, the base first (what orchestrators name in their retry rules)."""
    found: list[type[ShipliftError]] = [ShipliftError]
    for cls in found:
        found.extend(sub for sub in cls.__subclasses__() if sub not in found)
    return tuple(found)
