"""deploy_candidate / teardown_candidate: a throw-away endpoint serving exactly the new artifact."""

from __future__ import annotations

from shiplift.tasks.backends.interfaces import ComponentSpec, DeployPoll
from shiplift.tasks.ledger.events import KEPT, SKIPPED
from shiplift.tasks.ledger.stage_results import DeployResult, TeardownResult
from shiplift.tasks.pipeline.stages.common import candidate_endpoint, component_spec, model_ref, require_served


def deploy(ctx) -> DeployResult:
    """Serve the artifact on the candidate endpoint and wait until it does (the CLI; under an orchestrator that defers
    the wait, what runs once `poll` said in service, finding the work done)."""
    name, spec = _candidate(ctx)
    ctx.say(f"deploy_candidate: endpoint {name} on {ctx.config.placement.kind}")
    live = ctx.backends.hosting.deploy(name, name, spec, ctx.config.placement, role="candidate", progress=ctx.say)
    require_served(live, spec, where=f"candidate {name}")
    return DeployResult(endpoint=name, component=name, placement=live.placement.model_dump(mode="json"),
                        model_ref=model_ref(ctx).model_dump())


def start(ctx) -> dict:
    """The deferred stage's start (the table's `defers`): create or find the candidate endpoint, and return at once."""
    name, spec = _candidate(ctx)
    ctx.say(f"deploy_candidate: starting endpoint {name} on {ctx.config.placement.kind}")
    ctx.backends.hosting.start_deploy(name, name, spec, ctx.config.placement, role="candidate", progress=ctx.say)
    return {"endpoint": name}


def poll(ctx) -> DeployPoll:
    """The deferred stage's poll: one look at the candidate `start` began; its failure is raised."""
    name, spec = _candidate(ctx)
    return ctx.backends.hosting.poll_deploy(name, name, spec, ctx.config.placement, role="candidate",
                                            progress=ctx.say)


def _candidate(ctx) -> tuple[str, ComponentSpec]:
    """The candidate's endpoint (and component) name and its one-copy spec."""
    return candidate_endpoint(ctx), component_spec(ctx, ctx.config, copies=1)


def teardown(ctx) -> TeardownResult:
    """Remove the candidate whatever happened (also after a crash mid-deploy); a release that has not
    finished redeploys it on resume."""
    if ctx.state.stage("deploy_candidate")["status"] in ("pending", "torn_down"):
        return TeardownResult(event=SKIPPED, reason="no candidate is deployed")
    name = candidate_endpoint(ctx)
    keep = ctx.state.keep_candidate
    if ctx.config.keep_candidate if keep is None else keep:
        ctx.say(f"teardown_candidate: keeping {name} as asked")
        return TeardownResult(event=KEPT, endpoint=name)
    removed = ctx.backends.hosting.delete_endpoint(name, progress=ctx.say)
    return TeardownResult(endpoint=name, removed=removed)
