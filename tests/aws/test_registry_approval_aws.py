"""Approval in the SageMaker Model Registry (issue 21): the version of a release that requires an approval waits as
PendingManualApproval with the request, moves to Approved or Rejected with the decision, and a decision made in the
registry itself (Studio, or UpdateModelPackage by any principal) is followed, never trusted: honoured and recorded
with the principal read back from the registry when that principal is an approver and the decision is on the
awaiting release's own version and request; refused, and the version put back to the ledger's view, otherwise.

Against the AWS double (moto's Model Registry behind it). The AWS pages each behaviour follows:
- statuses: ModelApprovalStatus Approved | Rejected | PendingManualApproval ("waiting for manual approval"),
  https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ModelPackageSummary.html;
- a decision is an UpdateModelPackage with ModelApprovalStatus and ApprovalDescription (at most 1024 characters),
  CustomerMetadataProperties kept unless removed by name,
  https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_UpdateModelPackage.html (Studio updates a version the
  same way: https://docs.aws.amazon.com/sagemaker/latest/dg/model-registry-staging-construct-update-studio.html);
- who made it: DescribeModelPackage's LastModifiedBy, a UserContext whose IamIdentity (Arn, PrincipalId) is kept for
  model packages, and UserProfileArn/UserProfileName for a Studio user,
  https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_UserContext.html,
  https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_IamIdentity.html. The double names the caller by its
  access key (`Scenario.principals`), as SageMaker names the caller of the request.
"""

from __future__ import annotations

from datetime import timedelta

import boto3
import pytest

from shiplift.tasks.backends.aws.model_registry import APPROVED, PENDING, REJECTED
from shiplift.tasks.ledger.events import APPROVAL, AWAITING_APPROVAL
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.orchestrators.task_token import follow_registry_approval
from shiplift.tasks.pipeline import approval
from shiplift.tasks.pipeline.release import run_release

QUIET = lambda message: None  # noqa: E731
GROUP = "shiplift-tiny-aws"
BOB = "arn:aws:sts::123456789012:assumed-role/ReleaseApprover/bob"
MALLORY = "arn:aws:sts::123456789012:assumed-role/DataScientist/mallory"
PRINCIPALS = {
    "AKIABOBEXAMPLE00001": {"IamIdentity": {"Arn": BOB, "PrincipalId": "AROAEXAMPLEBOB:bob"}},
    "AKIAMALLORYEXAMPL01": {"IamIdentity": {"Arn": MALLORY, "PrincipalId": "AROAEXAMPLEMAL:mallory"}},
    "AKIAALICESTUDIO0001": {"UserProfileArn": "arn:aws:sagemaker:us-east-1:123456789012:user-profile/d-abc123/alice",
                            "UserProfileName": "alice", "DomainId": "d-abc123"},
}
RULE = {"required": True, "approvers": [BOB, "alice"], "timeout_s": 3600}


def versions(double) -> dict[str, dict]:
    sm = double.client("sagemaker")
    summaries = sm.list_model_packages(ModelPackageGroupName=GROUP, MaxResults=100)["ModelPackageSummaryList"]
    described = [sm.describe_model_package(ModelPackageName=s["ModelPackageArn"]) for s in summaries]
    return {d["CustomerMetadataProperties"]["shiplift:release-id"]: d for d in described}


def as_principal(double, access_key: str):
    """A SageMaker client with another caller's credentials (Studio, or a script with its own role)."""
    return boto3.client("sagemaker", endpoint_url=double.url, region_name="us-east-1", aws_access_key_id=access_key,
                        aws_secret_access_key="not-checked")


def decide_in_registry(double, access_key: str, arn: str, status: str, description: str | None = None) -> None:
    request = {"ModelPackageArn": arn, "ModelApprovalStatus": status}
    if description is not None:
        request["ApprovalDescription"] = description
    as_principal(double, access_key).update_model_package(**request)


def follow(state, release_id: str) -> dict:
    """What the release runs where it checks for a decision: follow the registry's, then continue the release."""
    return follow_registry_approval(release_id, ledger_url=f"sqlite:///{state / 'ledger.db'}", state_dir=state,
                                    progress=QUIET)


def ledger_of(state) -> Ledger:
    return Ledger(f"sqlite:///{state / 'ledger.db'}")


@pytest.fixture
def waiting(aws, aws_release, tiny_release, tmp_path, monkeypatch):
    """An aws release requiring an approval, run until it waits (opened by carol)."""
    monkeypatch.setenv("SHIPLIFT_ACTOR", "carol")
    aws_release.prepare_account(aws)
    aws.scenario(principals=PRINCIPALS)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state",
                                          promotion__approval=RULE)
    summary = run_release(config, progress=QUIET)
    assert summary["status"] == AWAITING_APPROVAL
    return {"config": config, "state": tmp_path / "state", "release_id": summary["release_id"]}


def test_an_awaiting_version_is_pending_with_the_request_and_a_studio_approval_by_an_approver_promotes(aws, waiting):
    state, rid = waiting["state"], waiting["release_id"]
    ledger = ledger_of(state)
    [request] = [r for r in ledger.release(rid) if (r.stage, r.event) == (APPROVAL, AWAITING_APPROVAL)]
    version = versions(aws)[rid]
    # PendingManualApproval: waiting for a person (API_ModelPackageSummary); the request says who, until when and how
    assert version["ModelApprovalStatus"] == PENDING
    assert version["ApprovalDescription"].startswith("gate pass: awaiting approval until "
                                                     f"{request.payload['deadline'][:19]}Z by one of {BOB}, alice; "
                                                     "approve or reject this version")
    metadata = version["CustomerMetadataProperties"]
    assert metadata["shiplift:ledger-event"] == "approval/awaiting_approval"
    assert metadata["shiplift:ledger-record-sha256"] == request.record_hash

    # bob approves the version with UpdateModelPackage (API_UpdateModelPackage), metadata untouched
    decide_in_registry(aws, "AKIABOBEXAMPLE00001", version["ModelPackageArn"], APPROVED,
                       "gate report read; ECE within budget")
    described = aws.client("sagemaker").describe_model_package(ModelPackageName=version["ModelPackageArn"])
    assert described["LastModifiedBy"]["IamIdentity"]["Arn"] == BOB, \
        "the double names the caller as SageMaker does (API_UserContext)"
    followed = follow(state, rid)
    found = followed["registry"]
    assert found["decision"]["decision"] == "approved" and found["actor"] == BOB and found["refused"] is None
    assert followed["summary"]["status"] == "promoted"
    [decision] = [r for r in ledger.release(rid) if (r.stage, r.event) == (APPROVAL, "approved")]
    assert decision.payload["by"] == BOB, "recorded with the principal read back from the registry"
    assert decision.payload["reason"] == (f"approved in the SageMaker Model Registry ({version['ModelPackageArn']}, "
                                          f"version {version['ModelPackageVersion']}): gate report read; ECE within "
                                          "budget")
    assert decision.payload["requested_seq"] == request.seq
    promoted = versions(aws)[rid]
    assert promoted["ModelApprovalStatus"] == APPROVED
    assert f"approved by {BOB} (ledger seq {decision.seq})" in promoted["ApprovalDescription"]
    assert promoted["CustomerMetadataProperties"]["shiplift:ledger-event"] == "promote/succeeded"
    assert ledger.verify().ok

    # a second follow finds nothing to decide: the release no longer awaits approval
    again = follow(state, rid)
    assert again["registry"] is None and again["summary"]["status"] == "promoted"
    assert [r.event for r in ledger.release(rid) if r.stage == APPROVAL] == [AWAITING_APPROVAL, "approved"]


def test_a_principal_who_is_not_an_approver_is_refused_and_a_studio_rejection_by_one_ends_the_release(aws, waiting):
    state, rid = waiting["state"], waiting["release_id"]
    ledger = ledger_of(state)
    arn = versions(aws)[rid]["ModelPackageArn"]
    request_view = versions(aws)[rid]["ApprovalDescription"]
    size = len(ledger.history())
    decide_in_registry(aws, "AKIAMALLORYEXAMPL01", arn, APPROVED, "ship it")
    refused = follow(state, rid)["registry"]
    assert refused["actor"] == MALLORY and "is not an approver" in refused["refused"]
    assert len(ledger.history()) == size, "nothing recorded"
    back = versions(aws)[rid]
    assert (back["ModelApprovalStatus"], back["ApprovalDescription"]) == (PENDING, request_view), "put back to the view"

    # a Studio user (UserProfileName, no IamIdentity) who is an approver rejects, with a reason
    decide_in_registry(aws, "AKIAALICESTUDIO0001", arn, REJECTED, "latency too close to the bound")
    rejected = follow(state, rid)
    assert rejected["registry"]["actor"] == "alice" and rejected["summary"]["status"] == "rejected"
    [decision] = [r for r in ledger.release(rid) if (r.stage, r.event) == (APPROVAL, "rejected")]
    assert decision.payload["by"] == "alice" and decision.payload["reason"].endswith(": latency too close to the bound")
    version = versions(aws)[rid]
    assert version["ModelApprovalStatus"] == REJECTED
    assert version["ApprovalDescription"].startswith("rejected by alice: rejected in the SageMaker Model Registry")
    assert ledger.served_at("tiny-aws", "2100-01-01T00:00:00Z") is None, "nothing reached production"


def test_an_approval_without_a_description_or_after_the_deadline(aws, waiting, monkeypatch):
    state, rid = waiting["state"], waiting["release_id"]
    ledger = ledger_of(state)
    arn = versions(aws)[rid]["ModelPackageArn"]
    real_now = approval._now
    monkeypatch.setattr(approval, "_now", lambda: real_now() + timedelta(seconds=RULE["timeout_s"] + 1))
    decide_in_registry(aws, "AKIABOBEXAMPLE00001", arn, APPROVED)
    size = len(ledger.history())
    late = follow(state, rid)["registry"]
    assert "timed out" in late["refused"] and len(ledger.history()) == size
    assert versions(aws)[rid]["ModelApprovalStatus"] == PENDING
    monkeypatch.setattr(approval, "_now", real_now)
    decide_in_registry(aws, "AKIABOBEXAMPLE00001", arn, APPROVED)
    assert follow(state, rid)["summary"]["status"] == "promoted"
    [decision] = [r for r in ledger.release(rid) if (r.stage, r.event) == (APPROVAL, "approved")]
    assert decision.payload["reason"].endswith(": no description given")


@pytest.mark.slow  # ~34 s on the double: make test-slow; tests/unit/test_approval.py keeps stale approvals refused
def test_a_stale_approval_and_one_on_another_version_are_refused(aws, aws_release, tiny_release, tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPLIFT_ACTOR", "carol")
    aws_release.prepare_account(aws)
    aws.scenario(principals=PRINCIPALS)
    state = tmp_path / "state"
    failed = aws_release.write_aws_config(tiny_release, tmp_path / "failed", state,
                                          validation__thresholds={"min_accuracy": 1.0, "max_ece": 1.0,
                                                                  "min_validity": 1.0})
    gated_out = run_release(failed, progress=QUIET)
    assert gated_out["status"] == "rejected"

    # the version's view of the request could not be written (throttled): it still shows the gate's view
    aws.scenario(throttle={"UpdateModelPackage": 100})
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", state, promotion__approval=RULE)
    waiting = run_release(config, progress=QUIET)
    assert waiting["status"] == AWAITING_APPROVAL
    aws.scenario(throttle={})
    seen = versions(aws)
    stale = seen[waiting["release_id"]]
    assert stale["CustomerMetadataProperties"]["shiplift:ledger-event"] == "validate/succeeded"

    ledger = ledger_of(state)
    size = len(ledger.history())
    decide_in_registry(aws, "AKIABOBEXAMPLE00001", stale["ModelPackageArn"], APPROVED, "looks fine")
    # and someone approves the gate-rejected release's version, which awaits nothing
    decide_in_registry(aws, "AKIABOBEXAMPLE00001", seen[gated_out["release_id"]]["ModelPackageArn"], APPROVED,
                       "wrong row")
    rid = waiting["release_id"]
    found = follow(state, rid)["registry"]
    assert "a stale decision" in found["refused"] and "validate/succeeded" in found["refused"]
    [other] = found["others"]
    assert (other["release_id"], other["status"], other["by"]) == (gated_out["release_id"], APPROVED, BOB)
    assert len(ledger.history()) == size, "nothing recorded"
    repaired = versions(aws)
    assert repaired[gated_out["release_id"]]["ModelApprovalStatus"] == REJECTED, "the other version is put back"
    fresh = repaired[waiting["release_id"]]
    assert (fresh["ModelApprovalStatus"], fresh["CustomerMetadataProperties"]["shiplift:ledger-event"]) == (
        PENDING, "approval/awaiting_approval"), "and this one shows the request now"

    # approved on the request's own view, it is honoured
    decide_in_registry(aws, "AKIABOBEXAMPLE00001", fresh["ModelPackageArn"], APPROVED, "read the report this time")
    assert follow(state, rid)["summary"]["status"] == "promoted"
