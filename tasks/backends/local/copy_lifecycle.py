"""A component's model-server copies over their life: started (recorded as pending before anyone waits on them, then
waited on until `/ping` says 200), put in rotation, drained and stopped in one traffic step (`shift`), and healed.

Dead copies: the router takes a copy that stops answering out of rotation and says so in
its `/ping`; `ensure_endpoint` (which every deploy, invoker and `shiplift endpoints heal` goes
through) replaces copies whose process died or that neither the router holds in rotation nor
answer `/ping`, so each component is back at its spec's copy count. Busy is not dead: a router
or copy answering 503 with `Retry-After` (its connections are full) is left running, and a
router that did die comes back on its port, so the endpoint's URL stays the same.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid

from shiplift.tasks.backends.local.endpoint_state import (
    ComponentState,
    CopyRef,
    EndpointState,
    ProcessSpec,
    record_in_flight,
    serving_env,
)
from shiplift.tasks.backends.local.loopback_http import answers_ping, free_port, ping_status
from shiplift.tasks.backends.local.process_table import OWNER_ENV, POLL_S, log_tail, process_start_ticks, still_running
from shiplift.tasks.backends.local.supervised_router import SupervisedRouter
from shiplift.tasks.errors import BadInput, CapacityError, NotFound, NotReady


class CopyLifecycle(SupervisedRouter):
    """Starting, rotating, draining, stopping and healing a component's copies, each step persisted before it acts."""

    def _heal(self, name: str, component: str, ready_timeout_s: float) -> None:
        """Under the component's lock: bring it back to the copies it should have with fresh copies, in place of
        those whose process died or that the router holds out of rotation."""
        state = self._fresh(name)
        comp = state.components.get(component)
        if comp is None or comp.previous is not None:
            return  # gone, or an interrupted rolling update owns its copies until a rerun ends it
        registered = self._admin(state, "GET", "state")[1]["components"].get(component, {})
        in_rotation = {c["url"] for c in registered.get("copies", []) if c["healthy"]}
        keep = [c for c in comp.copies if still_running(c) and (c.url in in_rotation or answers_ping(c.port))]
        missing = comp.wanted - len(keep)
        if missing <= 0:
            return
        sys.stderr.write(
            f"endpoint {name}: component {component} has {len(keep)} of {comp.wanted} copies "
            f"in rotation; starting {missing}\n"
        )
        # the copies left out are dead or out of rotation: nothing to drain from them
        self.shift(state, component, comp.spec, missing, [c for c in comp.copies if c not in keep],
                   (ready_timeout_s, 0.0))

    def shift(
        self, state: EndpointState, component: str, spec: ProcessSpec, count: int, retire: list[CopyRef],
        timeouts: tuple[float, float],
    ) -> None:
        """One traffic step, under the component's lock: start `count` copies of `spec` (ready), put them in
        rotation without `retire`, let those drain (skipped with a drain timeout of 0), stop them; persisted
        before each change so a crash is cleaned up by the next command on the component."""
        ready_timeout_s, drain_timeout_s = timeouts
        comp = state.components[component]
        fresh = self._start_copies(state, component, spec, ready_timeout_s, count=count) if count else []
        comp.copies = [c for c in comp.copies if c not in retire] + fresh
        record_in_flight(state, component, pending=[], retiring=retire)
        self.commit(state, component, register=True)
        if drain_timeout_s > 0:
            self._drain(state, component, retire, drain_timeout_s)
        self._stop_copies(retire)
        record_in_flight(state, component, retiring=[])
        self.commit(state, component)

    def forget_dead_copies(self, state: EndpointState, component: str) -> None:
        """Drop copies whose process died from the component (and the router), so a rollout's counts are real."""
        comp = state.components[component]
        alive = [c for c in comp.copies if still_running(c)]
        if len(alive) == len(comp.copies):
            return
        sys.stderr.write(f"endpoint {state.name}: {len(comp.copies) - len(alive)} copies of {component} died; "
                         "the rollout replaces them\n")
        comp.copies = alive
        self.commit(state, component, register=bool(alive))

    def _drain(self, state: EndpointState, component: str, retired: list[CopyRef], timeout_s: float) -> None:
        """Wait until the router has no request in flight on the copies just taken out of rotation."""
        urls = {c.url for c in retired}
        deadline = time.monotonic() + timeout_s
        while urls:
            listed = self._admin(state, "GET", "state")[1]["components"].get(component, {})
            busy = {c["url"] for c in listed.get("draining", [])} & urls
            if not busy:
                return
            if time.monotonic() > deadline:
                sys.stderr.write(f"endpoint {state.name}: {sorted(busy)} still busy after {timeout_s:g}s of "
                                 "draining; stopping them\n")
                return
            time.sleep(POLL_S)

    def serves(self, current: ComponentState, digest: str, copies: int) -> bool:
        """True when the component runs this exact spec with every copy alive and answering."""
        return (
            current.spec_sha256 == digest
            and current.previous is None
            and len(current.running(digest)) == len(current.copies) == copies
            and all(still_running(c) and ping_status(c.port) == 200 for c in current.copies)
        )

    def _start_copies(
        self,
        state: EndpointState,
        component: str,
        spec: ProcessSpec,
        ready_timeout_s: float,
        *,
        count: int | None = None,
    ) -> list[CopyRef]:
        """Spawn `count` copies (the spec's count by default), each recorded as pending in the same short hold of the
        endpoint's lock that spawns it (so no other command's sweep takes it for a stray), then wait outside that
        lock for every /ping to say 200."""
        endpoint = state.name
        generation = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        log_dir = self.state_dir / "logs" / endpoint
        log_dir.mkdir(parents=True, exist_ok=True)
        procs: list[subprocess.Popen] = []
        started: list[CopyRef] = []
        try:
            for index in range(spec.copies if count is None else count):
                port = free_port()
                log = log_dir / f"{component}-{generation}-{index}.log"
                env = {**os.environ, **spec.env, spec.port_env: str(port), **serving_env(spec)}
                env[OWNER_ENV] = self._owner(endpoint)
                with self._lock(endpoint), open(log, "ab") as handle:
                    self._fresh(endpoint)  # deleted meanwhile: start nothing
                    try:
                        proc = subprocess.Popen(
                            spec.command,
                            stdin=subprocess.DEVNULL,
                            stdout=handle,
                            stderr=subprocess.STDOUT,
                            env=env,
                            start_new_session=True,
                        )
                    except (FileNotFoundError, PermissionError) as exc:
                        raise BadInput(
                            f"component {component}: cannot run {spec.command[0]!r}: {exc}",
                            fix="give an executable path or a program on PATH in command[0]",
                        ) from exc
                    except OSError as exc:
                        raise CapacityError(
                            f"component {component}: could not start a copy: {exc}",
                            fix="free memory/process slots and retry",
                        ) from exc
                    procs.append(proc)
                    started.append(CopyRef(pid=proc.pid, start_ticks=process_start_ticks(proc.pid), log=str(log),
                                           port=port, url=f"http://127.0.0.1:{port}", spec_sha256=spec.sha256(),
                                           component=component))
                    record_in_flight(state, component, pending=started)
                    self.commit(state, component)
            self._wait_ready(component, procs, started, ready_timeout_s)
        except BaseException:
            self._stop_copies(started)
            record_in_flight(state, component, pending=[])
            with contextlib.suppress(NotFound):  # the endpoint went meanwhile: nothing left to record
                self.commit(state, component)
            raise
        return started

    def _wait_ready(
        self,
        component: str,
        procs: list[subprocess.Popen],
        copies: list[CopyRef],
        ready_timeout_s: float,
    ) -> None:
        deadline = time.monotonic() + ready_timeout_s
        waiting = set(range(len(copies)))
        while waiting:
            for index in sorted(waiting):
                copy = copies[index]
                code = procs[index].poll()
                if code is not None:
                    raise CapacityError(
                        f"copy {index} of component {component} (pid {copy.pid}) exited with "
                        f"code {code} before GET /ping answered 200; "
                        f"log {copy.log}:\n{log_tail(copy.log)}",
                        fix="fix the server command, environment or model so it starts (see log)",
                    )
                if ping_status(copy.port) == 200:
                    waiting.discard(index)
            if waiting and time.monotonic() > deadline:
                index = min(waiting)
                copy = copies[index]
                raise NotReady(
                    f"copy {index} of component {component} (pid {copy.pid}) did not answer "
                    f"GET /ping with 200 within {ready_timeout_s:g}s; "
                    f"log {copy.log}:\n{log_tail(copy.log)}",
                    fix="raise ready_timeout_s if the model loads slowly, else fix the log's cause",
                )
            if waiting:
                time.sleep(POLL_S * 2)
