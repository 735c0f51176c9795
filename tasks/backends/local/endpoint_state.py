"""What the local backend persists of an endpoint (`state_dir/endpoints/<name>.json`): the process specs of its
components, the processes it started for them, the copies an operation is starting or retiring, its room claims.

The models' JSON is the state file's format, so a file written by an older command loads as long as they keep their
fields; the helpers here are the bookkeeping every operation on that state shares.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shiplift.images.common.sagemaker_http import SERVING_ID_ENV
from shiplift.tasks.backends.interfaces import ComponentSpec, ScaleToZeroPlan
from shiplift.tasks.backends.local.room import Claim, EndpointRoom, need_of
from shiplift.tasks.backends.local.router_model import name_problem
from shiplift.tasks.errors import BadInput
from shiplift.tasks.hashing import canonical_json, sha256_json

ENV_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
MAX_COPIES = 64


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


def check_name(kind: str, name: str) -> None:
    """Refuse an endpoint or component name the router could not serve (BadInput)."""
    problem = name_problem(name)
    if problem:
        raise BadInput(
            f"invalid {kind} name: {problem}", fix="use letters, digits and hyphens, ≤ 63 chars"
        )


def router_copies(comp: ComponentState) -> list[dict[str, str]]:
    """A component's copies as the router registers them: URL and the spec each runs."""
    return [{"url": c.url, "spec_sha256": c.spec_sha256 or comp.spec_sha256} for c in comp.copies]


def record_in_flight(state: EndpointState, component: str, *, pending: list[CopyRef] | None = None,
               retiring: list[CopyRef] | None = None) -> None:
    """Record the copies an operation on `component` is starting (`pending`) or retiring (`retiring`), in place of
    those it recorded before; each names the component, so only a command holding its lock stops a leftover."""
    for field, refs in (("pending", pending), ("retiring", retiring)):
        if refs is not None:
            tagged = [c.model_copy(update={"component": component}) for c in refs]
            setattr(state, field, [c for c in getattr(state, field) if c.component != component] + tagged)


def merge_in_flight(theirs: list[CopyRef], ours: list[CopyRef], component: str) -> list[CopyRef]:
    """The newest list on disk with `component`'s entries replaced by an operation's own."""
    return [c for c in theirs if c.component != component] + [c for c in ours if c.component == component]


def held_beside(state: EndpointState, component: str, unit: str) -> float:
    """What the endpoint's other components hold of `unit`: each the largest of the copies it wants (scaling), the
    copies it runs (an update that stopped partway leaves more), each at its larger spec's need, and the claim of an
    operation in flight on it (a rolling update's extra batch, a new component's first copies)."""
    held = 0.0
    for name in (set(state.components) | set(state.claims)) - {component}:
        comp, claim = state.components.get(name), state.claims.get(name)
        held += max(_runs(comp, unit), claim.copies * claim.per_copy if claim is not None
                    and claim.unit == unit else 0.0)
    return held


def _runs(comp: ComponentState | None, unit: str) -> float:
    """What a component's copies take of `unit`: the larger of the copies it wants and those it runs, each at the
    larger need of its spec and the spec it is leaving."""
    if comp is None:
        return 0.0
    needs = [need.per_copy
             for need in (need_of(spec.neutral) for spec in (comp.spec, comp.previous) if spec is not None)
             if need is not None and need.unit == unit]
    return max(comp.wanted, len(comp.copies)) * max(needs) if needs else 0.0
