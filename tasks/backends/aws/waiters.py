"""Wait for SageMaker resources with the acceptors of `waiters.json` (waiters as data), on a deadline.

Each poll runs the waiter's Describe operation through `Aws.call`; an acceptor matches a JMESPath
`path` of the response or an `error` (the name of the domain error the call raised, e.g.
`NotFound`). The wait returns `(state, response)` at the first `success` or `failure` match, so the
caller can read `FailureReason` at once and raise the right domain error; it reports each status
change as progress, and raises NotReady with the last status seen when the deadline passes.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path

import jmespath

from shiplift.tasks.backends.interfaces import Progress
from shiplift.tasks.errors import NotReady, ShipliftError


@functools.lru_cache(maxsize=1)
def waiter_models() -> dict:
    """The waiter models of waiters.json, read once."""
    return json.loads(Path(__file__).with_name("waiters.json").read_text(encoding="utf-8"))["waiters"]


def _matches(acceptor: dict, response: dict | None, error: ShipliftError | None) -> bool:
    if acceptor["matcher"] == "error":
        return error is not None and acceptor["expected"] in {cls.__name__ for cls in type(error).__mro__}
    return response is not None and jmespath.search(acceptor["argument"], response) == acceptor["expected"]


def look(aws, name: str, params: dict) -> tuple[str | None, str, dict | None]:
    """One poll of waiter `name`: the acceptor's state (success, failure, or None while it goes on), the status it
    read (or the matched error's name) and the response; an error no acceptor matches is raised. What `wait_for`
    repeats, and what a deferred stage's poll runs once (docs/airflow.md)."""
    model = waiter_models()[name]
    status_path = next((a["argument"] for a in model["acceptors"] if a["matcher"] == "path"), None)
    response, error = None, None
    try:
        response = aws.call("sagemaker", model["operation"], **params)
    except ShipliftError as exc:
        error = exc
    state = next((a["state"] for a in model["acceptors"] if _matches(a, response, error)), None)
    if error is not None and state is None:
        raise error
    status = jmespath.search(status_path, response) if response is not None and status_path else type(error).__name__
    return state, status, response


def wait_for(aws, name: str, params: dict, *, deadline_s: float, poll_s: float, progress: Progress,
             what: str, on_poll: Callable[[dict], None] | None = None) -> tuple[str, dict | None]:
    """Poll until an acceptor of waiter `name` says success or failure; NotReady after `deadline_s`. `on_poll`
    sees each answer that is not terminal yet (a rolling update's bake runs there)."""
    deadline = time.monotonic() + deadline_s
    last_status = None
    while True:
        state, status, response = look(aws, name, params)
        if status != last_status:
            progress(f"{what}: {status}")
            last_status = status
        if state in ("success", "failure"):
            return state, response
        if on_poll is not None and response is not None:
            on_poll(response)
        if time.monotonic() + poll_s > deadline:
            raise NotReady(f"{what} is still {last_status} after {deadline_s:g}s",
                           fix="rerun the stage to keep waiting (it finds the resource by name), or raise the deadline")
        time.sleep(poll_s)
