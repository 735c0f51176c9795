"""Local hosting: endpoints are router processes and components are model-server processes.

Everything binds 127.0.0.1. Each endpoint's state (router pid/port, components with their
spec and copies' pids/ports/logs) lives in `state_dir/endpoints/<name>.json`, written
atomically, so a later command or a resumed pipeline finds and controls what is running.

Locks: each component has its own file lock, held for the whole of an operation on it (a deploy, a
scaling, a rolling update with its bakes, a rollback), so two writers on one component never
interleave while other components' operations go on beside it: one model's 30 s bake never delays
another's wake-up from zero. The endpoint's lock is only held for short read-modify-writes of what the
components share (the state file, the router's registration, the room claims of a shared endpoint,
`tasks.backends.local.room`), never across a bake or a copy's start. An operation writes back its own
component only (`commit`), so operations on two components never undo each other.

Dead copies: the router takes a copy that stops answering out of rotation and says so in
its `/ping`; `ensure_endpoint` (which every deploy, invoker and `shiplift endpoints heal` goes
through) replaces copies whose process died or that neither the router holds in rotation nor
answer `/ping`, so each component is back at its spec's copy count. Busy is not dead: a router
or copy answering 503 with `Retry-After` (its connections are full) is left running, and a
router that did die comes back on its port, so the endpoint's URL stays the same.

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
import fcntl
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.processes import pid_running
from tasks.errors import BadInput, CapacityError, Conflict, IntegrityError, NotFound, NotReady
from tasks.hashing import canonical_json, sha256_json
from tasks.atomic import write_json_atomic
from tasks.project import PROJECT_ROOT
from tasks.backends.interfaces import ComponentSpec, ScaleToZeroPlan
from tasks.backends.local.room import Claim, EndpointRoom, need_of, room_problem
from tasks.backends.local.router import EXIT_PORT_TAKEN, name_problem
from images.common.sagemaker_http import SERVING_ID_ENV, answered_busy

ENV_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
MAX_COPIES = 64
ADMIN_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 1.0
POLL_S = 0.05
LOG_TAIL_BYTES = 4096
HAVE_PROC = Path("/proc/self/stat").exists()  # Linux: pid start times guard against pid reuse
OWNER_ENV = "SHIPLIFT_ENDPOINT_OWNER"


def _check_env_name(name: str) -> str:
    if not name or name[0].isdigit() or set(name) - ENV_NAME_CHARS:
        raise ValueError(
            f"{name!r} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
        )
    return name


class ProcessSpec(BaseModel):
    """What one local inference component runs: a server command, its environment and copy count.

    `neutral` keeps the backend-neutral `tasks.backends.interfaces.ComponentSpec` it was made from (as
    JSON), so a later `describe` can say which image, artifact and container environment serve.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    copies: int = Field(ge=1, le=MAX_COPIES)
    port_env: str
    model_ref: dict[str, Any]
    neutral: dict[str, Any] | None = None

    @field_validator("command")
    @classmethod
    def _command_words(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("command[0] must name the program to run")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            _check_env_name(key)
        return value

    @field_validator("port_env")
    @classmethod
    def _port_env_name(cls, value: str) -> str:
        return _check_env_name(value)

    @model_validator(mode="after")
    def _port_env_free(self) -> ProcessSpec:
        if self.port_env in self.env:
            raise ValueError(
                f"env sets {self.port_env}, which is port_env: the port is chosen per copy; "
                "remove it from env"
            )
        try:
            canonical_json(self.model_ref)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model_ref must be plain JSON (no NaN, no objects): {exc}") from exc
        return self

    def sha256(self) -> str:
        """Content hash of the spec; equal hashes mean an identical component."""
        return sha256_json(self.model_dump(mode="json"))


def serving_env(spec: ProcessSpec) -> dict[str, str]:
    """The serving id a copy's server echoes with each answer (`ComponentSpec.serving_id` of the neutral spec it runs);
    none for a process spec made without one (tests' bare servers answer with their model's sha256 alone)."""
    if spec.neutral is None:
        return {}
    return {SERVING_ID_ENV: ComponentSpec.model_validate(spec.neutral).serving_id()}


class ProcessRef(BaseModel):
    """A process this backend started: pid plus its kernel start time (guards pid reuse)."""

    model_config = ConfigDict(extra="forbid")

    pid: int
    start_ticks: int | None
    log: str


class CopyRef(ProcessRef):
    """One model-server copy, the hash of the spec it runs (None: its component's spec) and the component it was
    started for (None: recorded before copies named it; any command may stop such a leftover)."""

    port: int
    url: str
    spec_sha256: str | None = None
    component: str | None = None


class RouterRef(ProcessRef):
    """The endpoint's router process: its invocation port and its control port (token in the ready file)."""

    port: int
    admin_port: int = 0


class ServerlessEmulation(BaseModel):
    """How the router emulates a serverless endpoint's component: a request that finds no copy waits up to `hold_s` for
    the one it starts, more than `max_concurrency` in flight are throttled, a `warm` one keeps its copy when idle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hold_s: float = Field(gt=0)
    max_concurrency: int = Field(ge=1)
    warm: bool = False


class ComponentState(BaseModel):
    """A component as persisted: its spec, the spec's hash and its serving copies; while a rolling
    update is in flight, `previous` is the spec being replaced and some copies still run it."""

    model_config = ConfigDict(extra="forbid")

    spec: ProcessSpec
    spec_sha256: str
    copies: list[CopyRef]
    previous: ProcessSpec | None = None
    scaling: ScaleToZeroPlan | None = None  # scales in to zero when idle, out on the first request (the router does)
    desired: int | None = None  # the copies scaling asked for last; None: the spec's count
    serverless: ServerlessEmulation | None = None  # with `scaling`: the router emulates a serverless endpoint

    def scaling_registration(self) -> dict[str, Any] | None:
        """What the router is told of the component's scaling (its admin PUT's `scale_to_zero`), or None."""
        if self.scaling is None:
            return None
        extra = self.serverless.model_dump() if self.serverless else {}
        return {"idle_s": float(self.scaling.idle_s), **extra}

    @property
    def wanted(self) -> int:
        """The copies the component should have now: what scaling asked for, else its spec's count."""
        return self.spec.copies if self.desired is None else self.desired

    def running(self, digest: str) -> list[CopyRef]:
        """The copies that run the spec with this hash."""
        return [c for c in self.copies if (c.spec_sha256 or self.spec_sha256) == digest]

    def not_running(self, digest: str) -> list[CopyRef]:
        """The copies that run any other spec."""
        return [c for c in self.copies if (c.spec_sha256 or self.spec_sha256) != digest]


class EndpointState(BaseModel):
    """The persisted state of one endpoint."""

    model_config = ConfigDict(extra="forbid")

    name: str
    router: RouterRef | None = None
    components: dict[str, ComponentState] = Field(default_factory=dict)
    pending: list[CopyRef] = Field(default_factory=list)
    retiring: list[CopyRef] = Field(default_factory=list)
    room: EndpointRoom | None = None  # a shared endpoint's instances; None: its copies are not counted
    claims: dict[str, Claim] = Field(default_factory=dict)  # by component: the peak of an operation in flight


class EndpointInfo(BaseModel):
    """Where an endpoint answers and whether this call created or restarted its router."""

    model_config = ConfigDict(frozen=True)

    name: str
    url: str
    port: int
    pid: int
    status: Literal["running", "created", "restarted"]


class ComponentInfo(BaseModel):
    """A component's serving copies after put_component; changed=False means it was a no-op."""

    model_config = ConfigDict(frozen=True)

    endpoint: str
    name: str
    spec_sha256: str
    copies: list[CopyRef]
    changed: bool


# -- processes --------------------------------------------------------------------------------
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


def _start_ticks(pid: int) -> int | None:
    stat = _proc_stat(pid) if HAVE_PROC else None
    return stat[1] if stat else None


def _alive(ref: ProcessRef) -> bool:
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


def _tagged_processes(owner: str) -> list[ProcessRef]:
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
            ticks = _start_ticks(pid)
            if ticks is not None:
                found.append(ProcessRef(pid=pid, start_ticks=ticks, log=""))
    return found


def _proc_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _environ(pid: int) -> list[bytes]:
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


def _stop(refs: list[ProcessRef], grace_s: float) -> None:
    """SIGTERM, wait up to grace_s, then SIGKILL; raise Conflict if any process survives."""
    live = [ref for ref in refs if _alive(ref)]
    for ref in live:
        _signal(ref, signal.SIGTERM)
    for sig, wait_s in ((signal.SIGKILL, grace_s), (None, 5.0)):
        deadline = time.monotonic() + wait_s
        while live and time.monotonic() < deadline:
            time.sleep(POLL_S)
            live = [ref for ref in live if _alive(ref)]
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


def _log_tail(path: str | Path) -> str:
    """The last few KiB of a log, for error messages."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - LOG_TAIL_BYTES))
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return text.strip() or "(log is empty)"


class Busy(http.client.HTTPException):
    """A server answered 503 with Retry-After: it is alive but full; ask again later, never replace it."""


class PortTaken(Exception):
    """The router could not listen on the port it was given."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _http(
    port: int,
    method: str,
    path: str,
    payload: Any = None,
    timeout: float = ADMIN_TIMEOUT_S,
    token: str | None = None,
) -> tuple[int, Any]:
    """One JSON request to 127.0.0.1:port (with a bearer token for a control port); raises
    OSError/HTTPException when unreachable, Busy when it answers that it is full."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = canonical_json(payload) if payload is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if answered_busy(response.status, response.headers):
            raise Busy(f"127.0.0.1:{port} answered 503 busy: {data[:300].decode('utf-8', errors='replace')}")
        try:
            return response.status, json.loads(data) if data else None
        except ValueError:
            return response.status, data.decode("utf-8", errors="replace")
    finally:
        conn.close()


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


def _router_copies(comp: ComponentState) -> list[dict[str, str]]:
    """A component's copies as the router registers them: URL and the spec each runs."""
    return [{"url": c.url, "spec_sha256": c.spec_sha256 or comp.spec_sha256} for c in comp.copies]


def _in_flight(state: EndpointState, component: str, *, pending: list[CopyRef] | None = None,
               retiring: list[CopyRef] | None = None) -> None:
    """Record the copies an operation on `component` is starting (`pending`) or retiring (`retiring`), in place of
    those it recorded before; each names the component, so only a command holding its lock stops a leftover."""
    for field, refs in (("pending", pending), ("retiring", retiring)):
        if refs is not None:
            tagged = [c.model_copy(update={"component": component}) for c in refs]
            setattr(state, field, [c for c in getattr(state, field) if c.component != component] + tagged)


def _merged(theirs: list[CopyRef], ours: list[CopyRef], component: str) -> list[CopyRef]:
    """The newest list on disk with `component`'s entries replaced by an operation's own."""
    return [c for c in theirs if c.component != component] + [c for c in ours if c.component == component]


def _held_beside(state: EndpointState, component: str, unit: str) -> float:
    """What the endpoint's other components hold of `unit`: each the largest of the copies it wants (scaling), the
    copies it runs (an update that stopped partway leaves more), each at its larger spec's need, and the claim of an
    operation in flight on it (a rolling update's extra batch, a new component's first copies)."""
    held = 0.0
    for name in (set(state.components) | set(state.claims)) - {component}:
        comp, claim = state.components.get(name), state.claims.get(name)
        held += max(_runs(comp, unit), claim.copies * claim.per_copy if claim is not None and claim.unit == unit else 0.0)
    return held


def _runs(comp: ComponentState | None, unit: str) -> float:
    """What a component's copies take of `unit`: the larger of the copies it wants and those it runs, each at the
    larger need of its spec and the spec it is leaving."""
    if comp is None:
        return 0.0
    needs = [need.per_copy for need in (need_of(spec.neutral) for spec in (comp.spec, comp.previous) if spec is not None)
             if need is not None and need.unit == unit]
    return max(comp.wanted, len(comp.copies)) * max(needs) if needs else 0.0


def _probe(port: int) -> tuple[int | None, bool]:
    """(status of GET /ping on a copy, whether it was a busy 503); (None, False) when it does not answer in time."""
    try:
        return _http(port, "GET", "/ping", timeout=PING_TIMEOUT_S)[0], False
    except Busy:
        return 503, True
    except (OSError, http.client.HTTPException):
        return None, False


def _ping(port: int) -> int | None:
    """Status of GET /ping on a copy, or None when it does not answer in time."""
    return _probe(port)[0]


def _answers(port: int) -> bool:
    """True when a copy's /ping says ready, or busy (full, yet alive): heal leaves it running."""
    status, busy = _probe(port)
    return status == 200 or busy


def check_name(kind: str, name: str) -> None:
    """Refuse an endpoint or component name the router could not serve (BadInput)."""
    problem = name_problem(name)
    if problem:
        raise BadInput(
            f"invalid {kind} name: {problem}", fix="use letters, digits and hyphens, ≤ 63 chars"
        )


# -- the backend -----------------------------------------------------------------------------
class ProcessSupervisor:
    """Endpoints and inference components as processes on 127.0.0.1, persisted under state_dir; rolling updates
    of a component (`tasks.backends.local.rollout`) drive its public process operations."""

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

    # -- public API ----------------------------------------------------------------------------
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
            _in_flight(state, component, pending=[], retiring=old)
            try:
                self.commit(state, component, register=True)
            except Exception:
                self._stop_copies(new)
                if current is None:
                    del state.components[component]
                else:
                    state.components[component] = current
                _in_flight(state, component, retiring=[])
                self.commit(state, component)
                raise
            self._stop_copies(old)
            _in_flight(state, component, retiring=[])
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
            live = [c for c in comp.copies if _alive(c)]
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
                                   _held_beside(fresh, component, need.unit))
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
                _stop([state.router], self.stop_grace_s)
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
                        "alive": _alive(c),
                        "ping": _ping(c.port),
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
                    answer = _http(state.router.port, "GET", "/ping", timeout=PING_TIMEOUT_S)[1]
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
        from tasks.backends.interfaces import ComponentSpec

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

    # -- state -------------------------------------------------------------------------------
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
            fresh.pending = _merged(fresh.pending, state.pending, component)
            fresh.retiring = _merged(fresh.retiring, state.retiring, component)
            fresh.claims.pop(component, None)
            if component in state.claims:
                fresh.claims[component] = state.claims[component]
            self._save(fresh)
            for field in ("router", "components", "pending", "retiring", "room", "claims"):
                setattr(state, field, getattr(fresh, field))
            if register and mine is not None:
                self._register(state, component)

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
                raise Conflict(f"{what} is being changed by another command (waited {self.lock_timeout_s:g}s for its lock)",
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
            _in_flight(state, component, pending=[], retiring=[])
            state.claims.pop(component, None)
            self._save(state)

    def _release_claim(self, endpoint: str, component: str) -> None:
        """End the component's room claim as its operation lets its lock go (nothing where the endpoint is gone)."""
        with self._lock(endpoint):
            state = self._load(endpoint)
            if state is not None and state.claims.pop(component, None) is not None:
                self._save(state)

    # -- router ------------------------------------------------------------------------------
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
                _stop([state.router], self.stop_grace_s)  # hung, or gone already
            for comp in state.components.values():
                comp.copies = [c for c in comp.copies if _alive(c)]
            state.router = self._start_router(name, port)
            self._save(state)
        self._sync_router(state)
        return state, status

    def _owner(self, name: str) -> str:
        return f"{self.state_dir.resolve()}::{name}"

    def _stop_untracked(self, state: EndpointState) -> None:
        """Stop this endpoint's processes that no record names: spawned, then killed before saved."""
        recorded = [*state.pending, *state.retiring]
        recorded += [c for comp in state.components.values() for c in comp.copies]
        if state.router is not None:
            recorded.append(state.router)
        known = {(ref.pid, ref.start_ticks) for ref in recorded}
        orphans = [
            ref
            for ref in _tagged_processes(self._owner(state.name))
            if (ref.pid, ref.start_ticks) not in known and (ref.pid, None) not in known
        ]
        _stop(orphans, self.stop_grace_s)

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
        if not _alive(state.router) or not state.router.admin_port:
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
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p
        )
        command = [
            sys.executable,
            "-m",
            "tasks.backends.local.router",
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
        ref = RouterRef(pid=proc.pid, start_ticks=_start_ticks(proc.pid), log=str(log), port=0)
        deadline = time.monotonic() + self.router_start_timeout_s
        while True:
            code = proc.poll()
            if code == EXIT_PORT_TAKEN and port:
                raise PortTaken(port)
            if code is not None:
                raise CapacityError(
                    f"router of endpoint {name} exited with code {code} while starting; "
                    f"log {log}:\n{_log_tail(log)}",
                    fix="read the log and fix the cause",
                )
            with contextlib.suppress(FileNotFoundError, ValueError):
                info = json.loads(ready.read_text(encoding="utf-8"))
                if info.get("pid") == proc.pid:
                    return ref.model_copy(update={"port": int(info["port"]), "admin_port": int(info["admin_port"])})
            if time.monotonic() > deadline:
                _stop([ref], self.stop_grace_s)
                raise NotReady(
                    f"router of endpoint {name} did not report ready within "
                    f"{self.router_start_timeout_s:g}s; log {log}:\n{_log_tail(log)}",
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
            return _http(state.router.admin_port, method, "/_shiplift/" + path, payload, timeout, token)
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
        payload: dict[str, Any] = {"copies": _router_copies(comp)}
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
            wanted = sorted((c["url"], c["spec_sha256"]) for c in _router_copies(comp))
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

    def _heal(self, name: str, component: str, ready_timeout_s: float) -> None:
        """Under the component's lock: bring it back to the copies it should have with fresh copies, in place of
        those whose process died or that the router holds out of rotation."""
        state = self._fresh(name)
        comp = state.components.get(component)
        if comp is None or comp.previous is not None:
            return  # gone, or an interrupted rolling update owns its copies until a rerun ends it
        registered = self._admin(state, "GET", "state")[1]["components"].get(component, {})
        in_rotation = {c["url"] for c in registered.get("copies", []) if c["healthy"]}
        keep = [c for c in comp.copies if _alive(c) and (c.url in in_rotation or _answers(c.port))]
        missing = comp.wanted - len(keep)
        if missing <= 0:
            return
        sys.stderr.write(
            f"endpoint {name}: component {component} has {len(keep)} of {comp.wanted} copies "
            f"in rotation; starting {missing}\n"
        )
        # the copies left out are dead or out of rotation: nothing to drain from them
        self.shift(state, component, comp.spec, missing, [c for c in comp.copies if c not in keep], (ready_timeout_s, 0.0))

    # -- traffic steps (healing here, rolling updates in tasks.backends.local.rollout) ---------
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
        _in_flight(state, component, pending=[], retiring=retire)
        self.commit(state, component, register=True)
        if drain_timeout_s > 0:
            self._drain(state, component, retire, drain_timeout_s)
        self._stop_copies(retire)
        _in_flight(state, component, retiring=[])
        self.commit(state, component)

    def forget_dead_copies(self, state: EndpointState, component: str) -> None:
        """Drop copies whose process died from the component (and the router), so a rollout's counts are real."""
        comp = state.components[component]
        alive = [c for c in comp.copies if _alive(c)]
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
                sys.stderr.write(f"endpoint {state.name}: {sorted(busy)} still busy after {timeout_s:g}s of draining; stopping them\n")
                return
            time.sleep(POLL_S)

    # -- copies ------------------------------------------------------------------------------
    def serves(self, current: ComponentState, digest: str, copies: int) -> bool:
        """True when the component runs this exact spec with every copy alive and answering."""
        return (
            current.spec_sha256 == digest
            and current.previous is None
            and len(current.running(digest)) == len(current.copies) == copies
            and all(_alive(c) and _ping(c.port) == 200 for c in current.copies)
        )

    def _stop_copies(self, copies: list[CopyRef]) -> None:
        _stop(list(copies), self.stop_grace_s)

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
                port = _free_port()
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
                    started.append(CopyRef(pid=proc.pid, start_ticks=_start_ticks(proc.pid), log=str(log), port=port,
                                           url=f"http://127.0.0.1:{port}", spec_sha256=spec.sha256(), component=component))
                    _in_flight(state, component, pending=started)
                    self.commit(state, component)
            self._wait_ready(component, procs, started, ready_timeout_s)
        except BaseException:
            self._stop_copies(started)
            _in_flight(state, component, pending=[])
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
                        f"log {copy.log}:\n{_log_tail(copy.log)}",
                        fix="fix the server command, environment or model so it starts (see log)",
                    )
                if _ping(copy.port) == 200:
                    waiting.discard(index)
            if waiting and time.monotonic() > deadline:
                index = min(waiting)
                copy = copies[index]
                raise NotReady(
                    f"copy {index} of component {component} (pid {copy.pid}) did not answer "
                    f"GET /ping with 200 within {ready_timeout_s:g}s; "
                    f"log {copy.log}:\n{_log_tail(copy.log)}",
                    fix="raise ready_timeout_s if the model loads slowly, else fix the log's cause",
                )
            if waiting:
                time.sleep(POLL_S * 2)
