"""The supervisor's side of an endpoint's router process (`tasks.backends.local.router`): starting it (on the port it
had, so the endpoint's URL stays the same), telling whether it is ours and alive, busy or dead, its control API, and
keeping its registered components in step with the persisted ones.

Crash safety: copies being started are recorded as `pending` before anyone waits on them and
replaced copies as `retiring` before the router switches; the next command on the endpoint
stops whatever is left in either list, and re-syncs the router with the recorded components; each
copy in either list names its component, and only a command holding that component's lock stops it,
so a command never stops the copies another one is starting.
Every process started for an endpoint carries `SHIPLIFT_ENDPOINT_OWNER` in its environment, so
one killed between spawning and recording it is found by that tag and stopped too (Linux).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, Literal

from shiplift.tasks.backends.local.endpoint_state import (
    EndpointState,
    RouterRef,
    check_name,
    merge_in_flight,
    router_copies,
)
from shiplift.tasks.backends.local.endpoint_store import EndpointStore
from shiplift.tasks.backends.local.loopback_http import ADMIN_TIMEOUT_S, Busy, request_json
from shiplift.tasks.backends.local.process_table import (
    OWNER_ENV,
    POLL_S,
    log_tail,
    process_start_ticks,
    still_running,
    stop_processes,
    tagged_processes,
)
from shiplift.tasks.backends.local.router import EXIT_PORT_TAKEN
from shiplift.tasks.errors import CapacityError, Conflict, NotReady


class PortTaken(Exception):
    """The router could not listen on the port it was given."""


class SupervisedRouter(EndpointStore):
    """Endpoints whose router runs and serves exactly their persisted components; `commit` persists an operation's
    change to one component and, asked to, registers it with the router in the same hold of the endpoint's lock."""

    def commit(self, state: EndpointState, component: str, *, register: bool = False) -> None:
        """Persist an operation's changes to one component (its entry, the copies it is starting or retiring, its room
        claim) into the endpoint's newest state in one short hold of the endpoint's lock, and with `register` tell the
        router the component's copies in the same hold. The other components' entries come from disk (and refresh
        `state`), so operations on two components never undo each other. NotFound where the endpoint was deleted."""
        with self._lock(state.name):
            fresh = self._fresh(state.name)
            mine = state.components.get(component)
            if mine is None:
                fresh.components.pop(component, None)
            else:
                fresh.components[component] = mine
            fresh.pending = merge_in_flight(fresh.pending, state.pending, component)
            fresh.retiring = merge_in_flight(fresh.retiring, state.retiring, component)
            fresh.claims.pop(component, None)
            if component in state.claims:
                fresh.claims[component] = state.claims[component]
            self._save(fresh)
            for field in ("router", "components", "pending", "retiring", "room", "claims"):
                setattr(state, field, getattr(fresh, field))
            if register and mine is not None:
                self._register(state, component)

    @contextlib.contextmanager
    def component_locked(self, endpoint: str, component: str, *, create: bool = True) -> Iterator[EndpointState]:
        """Hold the component's lock, so its own operations serialise while other components' go on, with the router
        running (NotFound where the endpoint is absent, unless `create`), yielding the endpoint's state: the operation
        changes this component in it and `commit`s each change. Its room claim ends with the lock."""
        check_name("endpoint", endpoint)
        check_name("component", component)
        with self._component_lock(endpoint, component) as got:
            with self._lock(endpoint):
                if not create:
                    self._require(endpoint)
                state = self._ensure(endpoint)[0]
            try:
                yield state
            finally:
                if got == "acquired":
                    self._release_claim(endpoint, component)

    def _ensure(self, name: str) -> tuple[EndpointState, str]:
        """Under the endpoint's lock: stop unrecorded processes and leftovers that name no component (a component's
        own are stopped by the next command that takes its lock), make the router run, sync it with the state."""
        state = self._load(name) or EndpointState(name=name)
        self._stop_untracked(state)
        unnamed = [c for c in state.pending + state.retiring if c.component is None]
        if unnamed:
            self._stop_copies(unnamed)
            state.pending = [c for c in state.pending if c.component is not None]
            state.retiring = [c for c in state.retiring if c.component is not None]
            self._save(state)
        health = "dead" if state.router is None else self._router_health(state)
        if health == "busy":
            raise self._busy(state, "it was not changed")
        if health == "ok":
            status = "running"
        else:
            status = "created" if state.router is None else "restarted"
            port = 0
            if state.router is not None:
                port = state.router.port  # the endpoint's URL stays the same
                stop_processes([state.router], self.stop_grace_s)  # hung, or gone already
            for comp in state.components.values():
                comp.copies = [c for c in comp.copies if still_running(c)]
            state.router = self._start_router(name, port)
            self._save(state)
        self._sync_router(state)
        return state, status

    def _stop_untracked(self, state: EndpointState) -> None:
        """Stop this endpoint's processes that no record names: spawned, then killed before saved."""
        recorded = [*state.pending, *state.retiring]
        recorded += [c for comp in state.components.values() for c in comp.copies]
        if state.router is not None:
            recorded.append(state.router)
        known = {(ref.pid, ref.start_ticks) for ref in recorded}
        orphans = [
            ref
            for ref in tagged_processes(self._owner(state.name))
            if (ref.pid, ref.start_ticks) not in known and (ref.pid, None) not in known
        ]
        stop_processes(orphans, self.stop_grace_s)

    @staticmethod
    def _busy(state: EndpointState, what: str) -> NotReady:
        """The retryable error of a router that answers but is full (its control port mid-request): left running."""
        assert state.router is not None
        return NotReady(f"the router of endpoint {state.name} (pid {state.router.pid}) answers, but its control port "
                        f"{state.router.admin_port} is busy (503: every connection is mid-request); {what}, and the "
                        "router was left running",
                        fix=f"retry shortly; if it stays busy, see what holds its connections: "
                            f"ss -tnp 'sport = :{state.router.admin_port}'")

    def _router_health(self, state: EndpointState) -> Literal["ok", "busy", "dead"]:
        """ok: our router answers its control API; busy: it answers 503 busy; dead: gone, hung or not ours."""
        assert state.router is not None
        if not still_running(state.router) or not state.router.admin_port:
            return "dead"
        try:
            code, body = self._admin(state, "GET", "state", timeout=2.0)
        except NotReady as exc:  # busy: it answered 503 with Retry-After (`_admin` keeps that as the cause)
            return "busy" if isinstance(exc.__cause__, Busy) else "dead"
        ours = isinstance(body, dict) and body.get("name") == state.name and body.get("pid") == state.router.pid
        return "ok" if code == 200 and ours else "dead"

    def _start_router(self, name: str, port: int) -> RouterRef:
        """Start the router on `port` (0: any free one; a port taken meanwhile falls back to any)."""
        try:
            return self._spawn_router(name, port)
        except PortTaken:
            sys.stderr.write(f"endpoint {name}: port {port} is taken; the router listens on a new port\n")
            return self._spawn_router(name, 0)

    def _spawn_router(self, name: str, port: int) -> RouterRef:
        ready = self._ready_path(name)
        ready.unlink(missing_ok=True)
        log = self.state_dir / "logs" / name / "router.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, OWNER_ENV: self._owner(name)}
        command = [
            sys.executable,
            "-m",
            "shiplift.tasks.backends.local.router",
            "--name",
            name,
            "--port",
            str(port),
            "--state-file",
            str(ready),
            "--state-dir",
            str(self.state_dir),
        ]
        with open(log, "ab") as handle:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        ref = RouterRef(pid=proc.pid, start_ticks=process_start_ticks(proc.pid), log=str(log), port=0)
        deadline = time.monotonic() + self.router_start_timeout_s
        while True:
            code = proc.poll()
            if code == EXIT_PORT_TAKEN and port:
                raise PortTaken(port)
            if code is not None:
                raise CapacityError(
                    f"router of endpoint {name} exited with code {code} while starting; "
                    f"log {log}:\n{log_tail(log)}",
                    fix="read the log and fix the cause",
                )
            with contextlib.suppress(FileNotFoundError, ValueError):
                info = json.loads(ready.read_text(encoding="utf-8"))
                if info.get("pid") == proc.pid:
                    return ref.model_copy(update={"port": int(info["port"]), "admin_port": int(info["admin_port"])})
            if time.monotonic() > deadline:
                stop_processes([ref], self.stop_grace_s)
                raise NotReady(
                    f"router of endpoint {name} did not report ready within "
                    f"{self.router_start_timeout_s:g}s; log {log}:\n{log_tail(log)}",
                    fix="check the log; the machine may be overloaded",
                )
            time.sleep(POLL_S)

    def _admin(
        self, state: EndpointState, method: str, path: str, payload: Any = None, timeout: float = ADMIN_TIMEOUT_S
    ) -> tuple[int, Any]:
        """One request to the router's control port, with the token from its 0600 ready file."""
        assert state.router is not None
        try:
            info = json.loads(self._ready_path(state.name).read_text(encoding="utf-8"))
            token = str(info["admin_token"])
            return request_json(state.router.admin_port, method, "/_shiplift/" + path, payload, timeout, token)
        except Busy as exc:
            raise NotReady(
                f"router of endpoint {state.name} is busy on {method} {path}: {exc}",
                fix="retry shortly; the router was left running",
            ) from exc
        except (OSError, ValueError, KeyError, http.client.HTTPException) as exc:
            raise NotReady(
                f"router of endpoint {state.name} did not answer {method} {path}: {exc!r}",
                fix=f"run ensure_endpoint({state.name!r}); see {state.router.log}",
            ) from exc

    def _register(self, state: EndpointState, component: str) -> None:
        comp = state.components[component]
        payload: dict[str, Any] = {"copies": router_copies(comp)}
        if comp.scaling is not None:
            payload["scale_to_zero"] = comp.scaling_registration()
        status, body = self._admin(state, "PUT", f"components/{component}", payload)
        if status != 200:
            raise Conflict(
                f"router refused component {component}: {status} {body}",
                fix=f"check the router log {state.router.log if state.router else ''}",
            )

    def _sync_router(self, state: EndpointState) -> None:
        """Make the router serve exactly the persisted components' live copies."""
        registered = self._admin(state, "GET", "state")[1]["components"]
        for cname in sorted(set(registered) - set(state.components)):
            self._admin(state, "DELETE", f"components/{cname}")
        for cname, comp in sorted(state.components.items()):
            wanted = sorted((c["url"], c["spec_sha256"]) for c in router_copies(comp))
            live = sorted((c["url"], c["spec_sha256"]) for c in registered.get(cname, {}).get("copies", []))
            if comp.scaling is not None:  # registered even with no copy: the router answers and scales it
                told = (registered.get(cname) or {}).get("scale_to_zero") or {}
                registration = comp.scaling_registration()
                if wanted != live or any(told.get(key) != value for key, value in registration.items()):
                    self._register(state, cname)
            elif wanted and wanted != live:
                self._register(state, cname)
            elif not wanted and cname in registered:
                self._admin(state, "DELETE", f"components/{cname}")
