"""The promotion lease is renewed while a stage runs, and promote is refused once it was lost (DESIGN §4, §12).

A stage may legitimately run longer than the lease's TTL (an 8 h rolling update against a 4 h lease): without renewal a
second run could take the model mid-stage and promote concurrently. Here the TTL is one second and a stage runs past
it while a second run tries to take the lease.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import LeaseHeld, LeaseLost
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline import release, table
from shiplift.tasks.pipeline.release import StageContext, holding_lease, run_stage
from shiplift.tasks.pipeline.table import LeasePolicy

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "releases" / "gemma-decision.yaml"
OTHER_RELEASE = "gemma-decision-000000000000"


class Backends:
    """What run_stage and the lease need of the backends: a ledger, no registry, a state dir."""

    def __init__(self, ledger: Ledger, state_dir: Path):
        self.ledger, self.registry, self.state_dir = ledger, None, state_dir


@pytest.fixture
def ctx(tmp_path) -> StageContext:
    config = load_release_config(CONFIG)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    rid = release.release_id_for(config)
    messages: list[str] = []
    context = StageContext(config=config, config_dir=CONFIG.parent, release_id=rid, state=ReleaseState(ledger, rid),
                           backends=Backends(ledger, tmp_path), actor="test", progress=messages.append)
    context.messages = messages
    yield context
    ledger.close()


def _wait_past(moment: float, deadline_s: float = 10.0) -> None:
    """Block until the wall clock is past `moment` (the scenario is time passing, not a handshake)."""
    limit = time.monotonic() + deadline_s
    while time.time() <= moment:
        assert time.monotonic() < limit, "the clock did not get there in time"
        time.sleep(0.02)


def _second_run_takes_the_lease_mid_stage(ctx, monkeypatch, *, renew_every_s: float):
    """Hold the lease with a 1 s TTL, run a stage for longer than that, and let a second run try to take the model."""
    monkeypatch.setattr(table, "LEASE", LeasePolicy(ttl_s=1.0, renew_every_s=renew_every_s))
    outcome = {}

    def long_stage(context) -> dict:
        _wait_past(taken + 1.5)  # the lease as first taken has expired by now
        try:
            context.backends.ledger.acquire_lease(context.config.name, "second-run", OTHER_RELEASE, 60)
            outcome["second"] = "took the lease"
        except LeaseHeld as exc:
            outcome["second"] = exc
        return {}

    with holding_lease(ctx, "first-run"):
        taken = time.time()
        run_stage(ctx, "promote", function=long_stage)
    return outcome["second"]


def test_a_stage_longer_than_the_lease_keeps_it_from_a_second_run(ctx, monkeypatch):
    second = _second_run_takes_the_lease_mid_stage(ctx, monkeypatch, renew_every_s=0.1)
    assert isinstance(second, LeaseHeld), second
    assert "'first-run'" in second.problem


def test_without_renewal_the_second_run_would_take_it(ctx, monkeypatch):
    """The control: the same scenario with renewals far apart lets the second run in (so the test above can fail)."""
    assert _second_run_takes_the_lease_mid_stage(ctx, monkeypatch, renew_every_s=3600) == "took the lease"


def test_renew_lease_extends_only_the_holders_own_lease(ctx):
    ledger, model = ctx.backends.ledger, ctx.config.name
    first = ledger.acquire_lease(model, "first-run", ctx.release_id, 1.0)
    renewed = ledger.renew_lease(model, "first-run", ctx.release_id, 3600)
    assert renewed.expires_at > first.expires_at and renewed.acquired_at == first.acquired_at
    with pytest.raises(LeaseLost, match="held by 'first-run'"):
        ledger.renew_lease(model, "another-run", ctx.release_id, 60)
    assert ledger.release_lease(model, "first-run")
    with pytest.raises(LeaseLost, match="nobody holds it"):
        ledger.renew_lease(model, "first-run", ctx.release_id, 60)


def test_promote_is_refused_once_the_lease_was_lost(ctx, monkeypatch):
    """The lease is lost while promote runs (given back, then taken by another run): the stage stops at
    `require_lease`, the last call before production changes, and the ledger records why."""
    monkeypatch.setattr(table, "LEASE", LeasePolicy(ttl_s=60, renew_every_s=3600))
    ledger, model = ctx.backends.ledger, ctx.config.name
    changed_production = []

    def promote(context) -> dict:
        ledger.release_lease(model, "first-run", token=context.lease_token)
        ledger.acquire_lease(model, "second-run", OTHER_RELEASE, 60)
        context.require_lease()
        changed_production.append(True)
        return {}

    with holding_lease(ctx, "first-run"), pytest.raises(LeaseLost, match="held by 'second-run'"):
        run_stage(ctx, "promote", function=promote)
    assert changed_production == []
    failed = ctx.state.records[-1]
    assert (failed.stage, failed.event, failed.payload["error_type"]) == ("promote", "failed", "LeaseLost")


def test_a_run_that_lost_its_lease_does_not_start_promote_but_still_tears_down(ctx, monkeypatch):
    monkeypatch.setattr(table, "LEASE", LeasePolicy(ttl_s=60, renew_every_s=3600))
    ledger, model = ctx.backends.ledger, ctx.config.name
    ran = []
    with holding_lease(ctx, "first-run"):
        ledger.release_lease(model, "first-run", token=ctx.lease_token)
        ledger.acquire_lease(model, "second-run", OTHER_RELEASE, 60)
        with pytest.raises(LeaseLost):
            run_stage(ctx, "promote", function=lambda context: ran.append("promote") or {})
        run_stage(ctx, "teardown_candidate", function=lambda context: ran.append("teardown") or {"removed": False})
    assert ran == ["teardown"]
    assert any("tearing down this release's own candidate anyway" in m for m in ctx.messages)


def test_the_promote_stage_checks_the_lease_before_it_touches_production(ctx, monkeypatch):
    """`tasks.pipeline.stages.promote.run` itself asks for the lease before any hosting call."""
    from shiplift.tasks.ledger.stage_results import BuildResult, ImageResult, Memory, PackageResult, ValidateResult
    from shiplift.tasks.pipeline.stages import promote

    memory = Memory(weights_mb=256, context_mb=128, runtime_mb=128, context_label="KV cache", total_mb=512)
    results = {"validate": ValidateResult.model_construct(decision="pass"),  # only what promote reads first
               "build": BuildResult.model_construct(memory=memory, model_sha256="a" * 64),
               "package": PackageResult(artifact_uri="file:///a/model.tar.gz", artifact_sha256="b" * 64, size_bytes=1),
               "image": ImageResult(image_uri="semif@sha256:" + "c" * 64, image_digest="sha256:" + "c" * 64,
                                    base_image="base@sha256:" + "d" * 64, files=1)}
    touched = []

    class Hosting:
        def __getattr__(self, name):
            touched.append(name)
            raise AssertionError(f"hosting.{name} called after the lease was lost")

    ctx.backends.hosting = Hosting()
    monkeypatch.setattr(ctx, "result", results.__getitem__)
    ctx.lease_holder = "first-run"  # a holder whose lease row does not exist
    with pytest.raises(LeaseLost, match="nobody holds it"):
        promote.run(ctx)
    assert touched == []
