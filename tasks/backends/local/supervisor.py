"""Local hosting: endpoints are router processes and components are model-server processes.

Everything binds 127.0.0.1. Each endpoint's state (router pid/port, components with their
spec and copies' pids/ports/logs) lives in `state_dir/endpoints/<name>.json`, written
atomically, so a later command or a resumed pipeline finds and controls what is running.

`ProcessSupervisor` is the backend's public face: deploy, scale, describe and delete. It stands on layers, one
concern each (`tasks.backends.local.`…): `endpoint_state` (the persisted models), `endpoint_store` (state files and
the per-component locks), `supervised_router` (the router process, its control API, crash safety), `copy_lifecycle`
(starting, rotating, draining and healing copies), over `process_table` (processes as /proc sees them) and
`loopback_http` (requests to 127.0.0.1). Rolling updates are `rollout`; the router itself is `router`.
"""

from __future__ import annotations

import contextlib
import http.client
from typing import Any

from shiplift.tasks.backends.interfaces import ComponentSpec, ScaleToZeroPlan
from shiplift.tasks.backends.local.copy_lifecycle import CopyLifecycle
from shiplift.tasks.backends.local.endpoint_state import (
    MAX_COPIES,
    ComponentInfo,
    ComponentState,
    EndpointInfo,
    EndpointState,
    ProcessSpec,
    ServerlessEmulation,
    check_name,
    held_beside,
    record_in_flight,
)
from shiplift.tasks.backends.local.loopback_http import PING_TIMEOUT_S, Busy, ping_status, request_json
from shiplift.tasks.backends.local.process_table import still_running, stop_processes
from shiplift.tasks.backends.local.room import Claim, EndpointRoom, need_of, room_problem
from shiplift.tasks.errors import BadInput, CapacityError, Conflict, NotFound, NotReady


def _endpoint_status(router_alive: bool, components: dict[str, dict[str, int]]) -> str:
    """stopped (no router), unhealthy (a component with no copy in rotation), degraded (fewer than
    its spec asks for) or ok."""
    if not router_alive:
        return "stopped"
    if any(c["in_rotation"] == 0 < c["copies"] for c in components.values()):
        return "unhealthy"
    if any(c["in_rotation"] < c["copies"] for c in components.values()):
        return "degraded"
    return "ok"


class ProcessSupervisor(CopyLifecycle):
    """Endpoints and inference components as processes on 127.0.0.1, persisted under state_dir; rolling updates
    of a component (`tasks.backends.local.rollout`) drive its public process operations."""

    def ensure_endpoint(self, name: str, *, ready_timeout_s: float = 120) -> EndpointInfo:
        """Start the endpoint's router, or find it running, or restart it if it died; then replace
        every copy that died or that the router took out of rotation, in each component that no
        other command is changing (one that is, that command owns; it is not waited for)."""
        check_name("endpoint", name)
        with self._lock(name):
            state, status = self._ensure(name)
        tagged = {c.component for c in state.pending + state.retiring if c.component}
        for component in sorted(set(state.components) | tagged):
            with self._component_lock(name, component, wait=False) as got:
                if got == "acquired":
                    self._heal(name, component, ready_timeout_s)
        return self._info(state, status)

    def put_component(
        self, endpoint: str, component: str, spec: ProcessSpec, *, ready_timeout_s: float = 120
    ) -> ComponentInfo:
        """Run `spec.copies` copies of a component and switch the router to them all at once (CapacityError,
        changing nothing, where they and the old copies do not fit a shared endpoint beside the others')."""
        check_name("endpoint", endpoint)
        check_name("component", component)
        if not isinstance(spec, ProcessSpec):
            raise BadInput(
                f"spec must be a ProcessSpec, got {type(spec).__name__}",
                fix="build it with ProcessSpec(command=..., copies=..., ...)",
            )
        if not ready_timeout_s > 0:
            raise BadInput(
                f"ready_timeout_s must be > 0, got {ready_timeout_s}", fix="pass seconds > 0"
            )
        with self.component_locked(endpoint, component) as state:
            digest = spec.sha256()
            current = state.components.get(component)
            if current is not None and self.serves(current, digest, spec.copies):
                return ComponentInfo(
                    endpoint=endpoint,
                    name=component,
                    spec_sha256=digest,
                    copies=current.copies,
                    changed=False,
                )
            old = current.copies if current else []
            self.claim(state, component, spec, spec.copies + len(old))  # the new copies start beside the old
            new = self._start_copies(state, component, spec, ready_timeout_s)
            state.components[component] = ComponentState(spec=spec, spec_sha256=digest, copies=new,
                                                         scaling=current.scaling if current else None,
                                                         serverless=current.serverless if current else None)
            record_in_flight(state, component, pending=[], retiring=old)
            try:
                self.commit(state, component, register=True)
            except Exception:
                self._stop_copies(new)
                if current is None:
                    del state.components[component]
                else:
                    state.components[component] = current
                record_in_flight(state, component, retiring=[])
                self.commit(state, component)
                raise
            self._stop_copies(old)
            record_in_flight(state, component, retiring=[])
            self.commit(state, component)
        return ComponentInfo(
            endpoint=endpoint, name=component, spec_sha256=digest, copies=new, changed=True
        )

    def set_scaling(self, endpoint: str, component: str, plan: ScaleToZeroPlan,
                    serverless: ServerlessEmulation | None = None) -> bool:
        """Let the component scale in to zero after `plan.idle_s` idle and out on the first request; the router does
        both, through `tasks.backends.local.scaler` (as a serverless endpoint does, with `serverless`). False when it
        already scaled so."""
        with self.component_locked(endpoint, component) as state:
            comp = self._component(state, component)
            if comp.scaling == plan and comp.serverless == serverless:
                return False
            comp.scaling, comp.serverless = plan, serverless
            self.commit(state, component, register=True)
        return True

    def scale(self, endpoint: str, component: str, copies: int, *, ready_timeout_s: float = 120,
              drain_timeout_s: float = 30) -> bool:
        """Give the component `copies` copies now: start the missing ones (ready) or drain and stop the extra; False
        when it already has them. NotFound when the endpoint or component is gone, so a scaler that lost a race
        with a teardown starts nothing; NotReady while an interrupted rolling update owns the copies; CapacityError,
        changing nothing, where more copies do not fit a shared endpoint beside the other components'. It waits only
        for another operation on this component, never for another component's rollout."""
        if isinstance(copies, bool) or not isinstance(copies, int) or not 0 <= copies <= MAX_COPIES:
            raise BadInput(f"copies must be an integer 0..{MAX_COPIES}, got {copies!r}", fix="pass a copy count")
        check_name("endpoint", endpoint)
        with self.component_locked(endpoint, component, create=False) as state:
            comp = self._component(state, component)
            if comp.previous is not None:
                raise NotReady(f"component {component} is in a rolling update, which owns its copies",
                               fix="retry when the rollout has ended")
            if copies == 0 and comp.scaling is None:
                raise BadInput(f"component {component} does not scale to zero, so with no copy it could not answer "
                               "or start one", fix="set its scaling first (set_scaling), or keep a copy")
            live = [c for c in comp.copies if still_running(c)]
            if copies > len(live):
                self.claim(state, component, comp.spec, copies)
            comp.desired = copies
            if len(live) == len(comp.copies) == copies:
                self.commit(state, component)
                return False
            dead = [c for c in comp.copies if c not in live]
            if copies > len(live):
                self.shift(state, component, comp.spec, copies - len(live), dead, (ready_timeout_s, 0.0))
            else:
                self.shift(state, component, comp.spec, 0, dead + live[copies:], (ready_timeout_s, drain_timeout_s))
        return True

    def set_room(self, name: str, room: EndpointRoom | None) -> None:
        """Record the instances a shared endpoint stands for (None: an endpoint of one model, whose copies are not
        counted); every later start of copies on it is checked against them first (`claim`)."""
        check_name("endpoint", name)
        with self._lock(name):
            state = self._fresh(name)
            if state.room != room:
                state.room = room
                self._save(state)

    def claim(self, state: EndpointState, component: str, spec: ProcessSpec, copies: int) -> None:
        """Claim room on a shared endpoint for `copies` copies of `spec` at once (an operation's peak) until the
        component's lock is let go; CapacityError, changing nothing, where they do not fit beside what the other
        components hold, counted as SageMaker counts it (`tasks.backends.local.room`). Check and claim are one hold
        of the endpoint's lock, so two components' operations cannot both take the last room."""
        need = need_of(spec.neutral)
        with self._lock(state.name):
            fresh = self._fresh(state.name)
            if fresh.room is None or need is None:
                return
            problem = room_problem(fresh.room, state.name, component, copies, need,
                                   held_beside(fresh, component, need.unit))
            if problem is not None:
                raise CapacityError(f"{state.name}/{component} was not changed: {problem[0]}", fix=problem[1])
            state.claims[component] = Claim(copies=copies, unit=need.unit, per_copy=need.per_copy)
            self.commit(state, component)

    def _component(self, state: EndpointState, component: str) -> ComponentState:
        check_name("component", component)
        comp = state.components.get(component)
        if comp is None:
            raise NotFound(f"component {component} is not on endpoint {state.name}",
                           fix="deploy it first, or check the name")
        return comp

    def delete_component(self, endpoint: str, component: str) -> bool:
        """Stop a component's copies and remove it from the router; False if it did not exist."""
        check_name("endpoint", endpoint)
        check_name("component", component)
        with self._component_lock(endpoint, component):
            with self._lock(endpoint):
                state = self._load(endpoint)
                if state is None or component not in state.components:
                    return False
                health = "dead" if state.router is None else self._router_health(state)
                if health == "busy":
                    raise self._busy(state, f"component {component} was not deleted")
                if health == "ok":
                    status, body = self._admin(state, "DELETE", f"components/{component}")
                    if status not in (200, 404):
                        raise Conflict(
                            f"router refused to delete {component}: {status} {body}",
                            fix=f"check the router log {state.router.log}",
                        )
                removed = state.components.pop(component)
                self._save(state)
            self._stop_copies(removed.copies)
        return True

    def delete_endpoint(self, name: str) -> bool:
        """Stop the router and all copies, wait for their exit, drop the state; False if absent. It waits for every
        operation on the endpoint's components to end first (it takes each component's lock)."""
        check_name("endpoint", name)
        with contextlib.ExitStack() as held:
            for path in sorted((self.state_dir / "locks" / name).glob("*.lock")):
                held.enter_context(self._flock(path, f"component {path.stem} of endpoint {name}"))
            held.enter_context(self._lock(name))
            state = self._load(name)
            self._stop_untracked(state or EndpointState(name=name))
            if state is None:
                return False
            copies = state.pending + state.retiring
            for comp in state.components.values():
                copies.extend(comp.copies)
            if state.router is not None:
                with contextlib.suppress(OSError, http.client.HTTPException, NotReady):
                    if self._router_health(state) == "ok":  # busy or dead: stopped by signal below
                        self._admin(state, "POST", "shutdown")
                stop_processes([state.router], self.stop_grace_s)
            self._stop_copies(copies)
            self._state_path(name).unlink()
            self._ready_path(name).unlink(missing_ok=True)
        return True

    def describe_endpoint(self, name: str) -> dict[str, Any]:
        """Live view: is the router up, and per component its spec and each copy's /ping status and
        place in the router's rotation."""
        state = self._require(name)
        health = "dead" if state.router is None else self._router_health(state)
        router_alive = health != "dead"
        registered: dict[str, Any] = {}
        if health == "ok":  # a busy router answers, but not its state: rotation is then unknown (False)
            try:
                registered = self._admin(state, "GET", "state")[1]["components"]
            except NotReady as exc:  # it stopped (or got busy) between its health answer and this one: as
                router_alive = isinstance(exc.__cause__, Busy)  # `_router_health` counts it, dead unless busy
        components = {}
        for cname, comp in sorted(state.components.items()):
            urls = sorted(c.url for c in comp.copies)
            live = {c["url"]: c for c in registered.get(cname, {}).get("copies", [])}
            components[cname] = {
                "spec": comp.spec.model_dump(mode="json"),
                "spec_sha256": comp.spec_sha256,
                "wanted": comp.wanted,
                "scale_to_zero": comp.scaling.model_dump(mode="json") if comp.scaling else None,
                "serverless": comp.serverless.model_dump(mode="json") if comp.serverless else None,
                "registered": urls == sorted(live) and (bool(urls) or cname in registered),
                "copies": [
                    {
                        **c.model_dump(mode="json"),
                        "alive": still_running(c),
                        "ping": ping_status(c.port),
                        "in_rotation": live.get(c.url, {}).get("healthy", False),
                    }
                    for c in comp.copies
                ],
            }
        router = state.router.model_dump(mode="json") if state.router else None
        return {
            "name": name,
            "url": self._url(state),
            "router": {**(router or {}), "alive": router_alive, "busy": health == "busy"},
            "components": components,
        }

    def list_endpoints(self) -> list[dict[str, Any]]:
        """Every endpoint in the state folder: name, URL, router alive?, status (ok, degraded,
        unhealthy or stopped) and per component its copies in rotation out of its spec's count."""
        result = []
        for path in sorted((self.state_dir / "endpoints").glob("*.json")):
            state = self._load(path.stem)
            if state is None:
                continue
            router = "dead" if state.router is None else self._router_health(state)
            alive, health = router != "dead", {}
            if router == "ok":
                with contextlib.suppress(OSError, http.client.HTTPException):  # Busy included: rotation unknown
                    answer = request_json(state.router.port, "GET", "/ping", timeout=PING_TIMEOUT_S)[1]
                    health = answer.get("components", {}) if isinstance(answer, dict) else {}
            components = {
                cname: {"in_rotation": health.get(cname, {}).get("healthy", 0), "copies": comp.wanted}
                for cname, comp in sorted(state.components.items())
            }
            result.append(
                {
                    "name": state.name,
                    "url": self._url(state),
                    "router_alive": alive,
                    "status": "busy" if router == "busy" else _endpoint_status(alive, components),
                    "components": components,
                }
            )
        return result

    def spec_hashes_serving(self, endpoint: str, component: str, neutral_sha256: str) -> list[str]:
        """Hashes of the component's process specs (current, and previous mid-rollout) made from the neutral
        spec (`tasks.backends.interfaces.ComponentSpec`) with this hash."""
        comp = self._require(endpoint).components.get(component)
        if comp is None:
            return []
        specs = [comp.spec] + ([comp.previous] if comp.previous is not None else [])
        return [spec.sha256() for spec in specs
                if spec.neutral is not None and ComponentSpec.model_validate(spec.neutral).sha256() == neutral_sha256]

    def endpoint_url(self, name: str) -> str:
        """`http://127.0.0.1:PORT/endpoints/NAME`, the SageMaker-runtime-shaped invoke base."""
        return self._url(self._require(name))

    def metrics(self, name: str) -> dict[str, Any]:
        """The router's per-component counters (invocations, 4xx, 5xx, model errors, latency)."""
        state = self._require(name)
        health = "dead" if state.router is None else self._router_health(state)
        if health == "busy":
            raise self._busy(state, "its metrics were not read")
        if health == "dead":
            raise NotReady(
                f"the router of endpoint {name} is not running",
                fix=f"restart it with ensure_endpoint({name!r}) / shiplift endpoints start",
            )
        return self._admin(state, "GET", "metrics")[1]
