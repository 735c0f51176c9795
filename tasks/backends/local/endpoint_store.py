"""Where the local backend keeps its endpoints: their state files (`state_dir/endpoints/<name>.json`, written
atomically) and their locks.

Locks: each component has its own file lock, held for the whole of an operation on it (a deploy, a
scaling, a rolling update with its bakes, a rollback), so two writers on one component never
interleave while other components' operations go on beside it: one model's 30 s bake never delays
another's wake-up from zero. The endpoint's lock is only held for short read-modify-writes of what the
components share (the state file, the router's registration, the room claims of a shared endpoint,
`tasks.backends.local.room`), never across a bake or a copy's start. An operation writes back its own
component only (`commit`, `tasks.backends.local.supervised_router`), so operations on two components never undo
each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from shiplift.tasks.atomic import write_json_atomic
from shiplift.tasks.backends.local.endpoint_state import (
    CopyRef,
    EndpointInfo,
    EndpointState,
    check_name,
    record_in_flight,
)
from shiplift.tasks.backends.local.process_table import POLL_S, stop_processes
from shiplift.tasks.errors import Conflict, IntegrityError, NotFound


class EndpointStore:
    """The state files and locks of the endpoints under `state_dir`, and stopping the copies they record."""

    def __init__(
        self,
        state_dir: str | Path,
        *,
        router_start_timeout_s: float = 20.0,
        stop_grace_s: float = 10.0,
        lock_timeout_s: float = 600.0,
    ):
        self.state_dir = Path(state_dir)
        self.router_start_timeout_s = router_start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.lock_timeout_s = lock_timeout_s
        self._held: dict[str, int] = {}  # lock file -> the thread holding it (a rollout's bake may invoke the endpoint)
        for sub in ("endpoints", "logs", "locks", "run"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)

    def _state_path(self, name: str) -> Path:
        return self.state_dir / "endpoints" / f"{name}.json"

    def _ready_path(self, name: str) -> Path:
        return self.state_dir / "run" / f"{name}.router.json"

    def _load(self, name: str) -> EndpointState | None:
        path = self._state_path(name)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            state = EndpointState.model_validate_json(raw)
        except ValidationError as exc:
            raise IntegrityError(
                f"endpoint state {path} is not valid: {exc}",
                fix="stop the processes it lists by hand, then delete the file",
            ) from exc
        if state.name != name:
            raise IntegrityError(
                f"endpoint state {path} names endpoint {state.name!r}, not {name!r}",
                fix="restore the right file or delete it",
            )
        return state

    def _save(self, state: EndpointState) -> None:
        """Write the endpoint's state atomically; only under the endpoint's lock, with the state loaded in that hold."""
        write_json_atomic(self._state_path(state.name), state.model_dump(mode="json"))

    def _fresh(self, name: str) -> EndpointState:
        """The endpoint's state as on disk now; NotFound where it was deleted (while an operation ran, say)."""
        state = self._load(name)
        if state is None:
            raise NotFound(f"endpoint {name} was deleted while it was being changed",
                           fix=f"deploy it again if it should exist (ensure_endpoint({name!r}))")
        return state

    def _require(self, name: str) -> EndpointState:
        check_name("endpoint", name)
        state = self._load(name)
        if state is None:
            raise NotFound(
                f"endpoint {name} does not exist under {self.state_dir}",
                fix=f"create it with ensure_endpoint({name!r}) or list endpoints",
            )
        return state

    def _url(self, state: EndpointState) -> str:
        port = state.router.port if state.router else 0
        return f"http://127.0.0.1:{port}/endpoints/{state.name}"

    def _info(self, state: EndpointState, status: str) -> EndpointInfo:
        assert state.router is not None
        return EndpointInfo(
            name=state.name,
            url=self._url(state),
            port=state.router.port,
            pid=state.router.pid,
            status=status,
        )

    def _owner(self, name: str) -> str:
        return f"{self.state_dir.resolve()}::{name}"

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[str]:
        """The endpoint's lock (`_flock`), for short read-modify-writes of what its components share."""
        with self._flock(self.state_dir / "locks" / f"{name}.lock", f"endpoint {name}") as got:
            yield got

    @contextlib.contextmanager
    def _component_lock(self, endpoint: str, component: str, *, wait: bool = True) -> Iterator[str]:
        """The component's lock (`_flock`). On taking it, what an earlier command on this component left when it died
        holding the lock is stopped and forgotten: copies it was starting or retiring, and its room claim."""
        path = self.state_dir / "locks" / endpoint / f"{component}.lock"
        path.parent.mkdir(exist_ok=True)
        with self._flock(path, f"component {component} of endpoint {endpoint}", wait=wait) as got:
            if got == "acquired":
                self._drop_leftovers(endpoint, component)
            yield got

    @contextlib.contextmanager
    def _flock(self, path: Path, what: str, *, wait: bool = True) -> Iterator[str]:
        """An exclusive file lock, waited for with a deadline (Conflict after `lock_timeout_s`); yields "acquired",
        "held" (this thread holds it already: re-entered, as a bake that invokes the endpoint does) or, without
        `wait`, "busy" when another command holds it."""
        key = str(path)
        if self._held.get(key) == threading.get_ident():
            yield "held"
            return
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            if not self._take(fd, wait):
                if not wait:
                    yield "busy"
                    return
                raise Conflict(f"{what} is being changed by another command (waited {self.lock_timeout_s:g}s for "
                               "its lock)",
                               fix="wait for the other command to finish, then retry")
            self._held[key] = threading.get_ident()
            try:
                yield "acquired"
            finally:
                del self._held[key]
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _take(self, fd: int, wait: bool) -> bool:
        """Lock the open lock file; False when another holds it past `lock_timeout_s` (at once without `wait`)."""
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if not wait or time.monotonic() > deadline:
                    return False
                time.sleep(POLL_S)

    def _drop_leftovers(self, endpoint: str, component: str) -> None:
        """Stop and forget the copies a dead command was starting or retiring for the component, and its claim."""
        with self._lock(endpoint):
            state = self._load(endpoint)
            if state is None:
                return
            left = [c for c in state.pending + state.retiring if c.component == component]
            if not left and component not in state.claims:
                return
            self._stop_copies(left)
            record_in_flight(state, component, pending=[], retiring=[])
            state.claims.pop(component, None)
            self._save(state)

    def _release_claim(self, endpoint: str, component: str) -> None:
        """End the component's room claim as its operation lets its lock go (nothing where the endpoint is gone)."""
        with self._lock(endpoint):
            state = self._load(endpoint)
            if state is not None and state.claims.pop(component, None) is not None:
                self._save(state)

    def _stop_copies(self, copies: list[CopyRef]) -> None:
        """Stop copies (SIGTERM, then SIGKILL after `stop_grace_s`)."""
        stop_processes(list(copies), self.stop_grace_s)
