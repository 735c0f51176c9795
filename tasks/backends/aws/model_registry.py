"""The SageMaker Model Registry as a view of the ledger (issue 10): every aws release is one model package
version in a model package group per model, its approval status following the gate decision and promotion.

The ledger stays the source of truth; the registry only mirrors it where SageMaker users look. A view is
derived from the model's ledger records alone (`release_view`), so syncing is idempotent and repairs any
earlier miss: names derive from content (the group is `<resource_prefix>-<model>`; a release's version is
found by its description, `shiplift release <release id> …`), a rerun finds what exists and never
registers a second version, and every update is a complete `UpdateModelPackage` (status, description and
all metadata; moto drops what is not passed, SageMaker merges metadata, so keys the view no longer holds
are removed by name).

Status mapping, from SageMaker's meaning of the statuses (Approved is what deployment automation such as a
SageMaker Projects pipeline deploys; PendingManualApproval awaits a decision; Rejected must not deploy):

- gate pass → `PendingManualApproval`: cleared by the gate but not yet promoted (promotion may be a later,
  manual `shiplift promote`); approving it here would let automation deploy what shiplift has not rolled out;
- gate fail or inconclusive → `Rejected` (inconclusive never promotes);
- promoted (also back to it by a rollback) → `Approved`: rolled out and verified serving;
- the rollout rolled back by an alarm → `Rejected`, the alarm in the approval description;
- superseded by a later promotion → stays `Approved` (it was, and remains, a valid rollback target), with
  `shiplift:superseded-by` naming the release that replaced it.

A config that requires an approval (`promotion.approval`, docs/approval.md) moves the version with the person's
decision, which is what the statuses mean in SageMaker (PendingManualApproval: waiting for a person's decision;
Approved: cleared for production; Rejected: must not deploy):

- approval requested → `PendingManualApproval`, the approval description naming who may decide until when, and how
  (here, or `shiplift approve`);
- approved → `Approved` at once, "approved by <who>: <why>; promotion follows" (shiplift promotes it right after; a
  promote that then fails leaves the decision standing, and a rerun promotes it); promoted → `Approved`, "promoted …";
- rejected → `Rejected` with who and why; timed out → `Rejected` with the timeout.

A decision made in the registry itself (Studio, or UpdateModelPackage by any principal) is followed, not trusted
(`decision_for`, called through `tasks.pipeline.approval.follow_registry`): it is honoured only on the version of a
release that awaits approval, made on the view of that release's request (the version's
`shiplift:ledger-record-sha256` is the request's record hash), and by a principal `approve` lists, as read back
from the version's LastModifiedBy (IamIdentity.Arn, else the Studio UserProfileArn or UserProfileName); the ledger
then records it (`decide`, with four eyes, the deadline and the champion check). A decision on any other version of
the group (one whose release does not await approval) is refused and that version put back to its view.

`shiplift:ledger-record-sha256` is the `record_hash` of the ledger record the status reflects, so an auditor
can check the view against the chain (`shiplift ledger verify`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shiplift.tasks.backends.aws.hosting_requests import tags
from shiplift.tasks.backends.aws.service_model import request_problems
from shiplift.tasks.backends.interfaces import ReleaseFacts
from shiplift.tasks.errors import BadInput, Conflict, NotFound
from shiplift.tasks.ledger.events import (
    APPROVAL,
    AWAITING_APPROVAL,
    PROMOTE,
    ROLLED_BACK,
    SUCCEEDED,
    TIMED_OUT,
    VALIDATE,
)
from shiplift.tasks.ledger.events import APPROVED as APPROVED_EVENT
from shiplift.tasks.ledger.events import REJECTED as REJECTED_EVENT
from shiplift.tasks.ledger.records import STAGE_OF, Approval, R, Stamp, is_promotion, promotion, stage_payload
from shiplift.tasks.ledger.stage_results import ImageResult, PackageResult, ValidateResult

APPROVAL_RECORDS = frozenset((APPROVAL, event)
                             for event in (AWAITING_APPROVAL, APPROVED_EVENT, REJECTED_EVENT, TIMED_OUT))
FOLLOWS = frozenset({(VALIDATE, SUCCEEDED), (PROMOTE, SUCCEEDED), (PROMOTE, ROLLED_BACK)}) | APPROVAL_RECORDS
PENDING, APPROVED, REJECTED = "PendingManualApproval", "Approved", "Rejected"
DESCRIPTION_PREFIX = "shiplift release "
CONTENT_TYPES = ["application/json"]
PAGE_SIZE = 100  # ListModelPackages' maximum
MAX_APPROVAL_DESCRIPTION = 1024  # UpdateModelPackage.ApprovalDescription's maximum in the botocore model
RECORD_SUFFIX_ROOM = 120  # " (ledger seq N, record sha256 <64 hex>)" that every description ends with


def group_name(config) -> str:
    """The model's group: `<resource_prefix>-<name>` (the config keeps its derived names within SageMaker's 63)."""
    return f"{config.resource_prefix}-{config.name}"


@dataclass(frozen=True)
class View:
    """What the registry should say of one release: its approval status, the approval description, all metadata."""

    release_id: str
    status: str
    description: str
    metadata: dict[str, str]


def _latest(records: list, wanted) -> Any:
    return next((r for r in reversed(records) if (r.stage, r.event) in wanted), None)


def _result(records: list, model: type[R]) -> R | None:
    """The release's latest succeeded result of the stage of `model`, typed; None before it succeeded."""
    record = _latest(records, {(STAGE_OF[model], SUCCEEDED)})
    return stage_payload(record, model) if record else None


def _quoted(text: str | None, seq: int, room: int) -> str:
    """A person's reason in the approval description, or, when it would not fit, where it is (never cut short)."""
    text = (text or "").strip()
    return text if len(text) <= room else f"({len(text)} characters, in full in ledger record seq {seq})"


def _decision_text(record, room: int = MAX_APPROVAL_DESCRIPTION - RECORD_SUFFIX_ROOM) -> tuple[str, str]:
    """(status, approval description) of an approval record."""
    approval = Approval.of(record)
    if record.event == AWAITING_APPROVAL:
        approvers = ", ".join(approval.approvers)
        head = f"gate pass: awaiting approval until {approval.deadline[:19]}Z by one of "
        tail = (f"; approve or reject this version (with a description), or "
                f"`shiplift approve {record.release_id} --reason TEXT`")
        if len(head) + len(approvers) + len(tail) > room:
            approvers = f"the {len(approval.approvers)} approvers of promotion.approval"
        return PENDING, head + approvers + tail
    if record.event == TIMED_OUT:
        return REJECTED, "approval timed out: " + _quoted(approval.reason, record.seq, room - 40)
    verb, status, after = (("approved", APPROVED, "; promotion follows") if record.event == APPROVED_EVENT
                           else ("rejected", REJECTED, "; the champion keeps serving"))
    head = f"{verb} by {approval.by}: "
    return status, head + _quoted(approval.reason, record.seq, room - len(head) - len(after)) + after


def _approval(record, records: list = ()) -> tuple[str, str]:
    """(status, approval description) of the record a view follows (`records`: the release's own)."""
    if record.stage == APPROVAL:
        return _decision_text(record)
    if record.stage == VALIDATE:
        gate = stage_payload(record, ValidateResult)
        if gate.decision == "pass":
            return PENDING, "gate pass: awaiting promotion"
        return REJECTED, f"gate {gate.decision}: " + ("; ".join(gate.not_passed or []) or "no check passed")
    promoted = promotion(record)
    if record.event == ROLLED_BACK:
        return REJECTED, f"rollout rolled back: {promoted.reason}; the champion serves again"
    if promoted.trigger == "rollback":
        return APPROVED, f"promoted again by a rollback from {promoted.rollback_from}: {promoted.rollback_reason}"
    reason = f": {promoted.reason}" if promoted.reason else ""
    approval = _latest(records, {(APPROVAL, APPROVED_EVENT)})
    approved = f", approved by {Approval.of(approval).by} (ledger seq {approval.seq})" if approval is not None else ""
    return APPROVED, f"promoted to {promoted.endpoint}/{promoted.component} ({promoted.strategy}){approved}{reason}"


def release_view(release_id: str, history: list) -> View | None:
    """The view of a release from its model's ledger records (oldest first): its latest record the view follows
    decides the status; a later promotion of another release marks a promoted one superseded. None before the gate
    has decided."""
    records = [r for r in history if r.release_id == release_id]
    record = _latest(records, FOLLOWS)
    if record is None:
        return None
    status, text = _approval(record, records)
    package, image = _result(records, PackageResult), _result(records, ImageResult)
    gate = _result(records, ValidateResult)
    metadata = {
        "shiplift:release-id": release_id,
        "shiplift:config-hash": Stamp.of(record).config_hash,
        "shiplift:artifact-sha256": package.artifact_sha256,
        "shiplift:image-digest": image.image_digest,
        "shiplift:ledger-record-sha256": record.record_hash,
        "shiplift:ledger-seq": str(record.seq),
        "shiplift:ledger-event": f"{record.stage}/{record.event}",
        "shiplift:gate-decision": gate.decision,
        **{f"shiplift:gate-{name}": str(value) for name, value in sorted((gate.metrics or {}).items())
           if value is not None},
    }
    if gate.champion_release:
        metadata["shiplift:gate-champion"] = gate.champion_release
    if is_promotion(record):
        later = next((r for r in history if r.seq > record.seq and is_promotion(r)
                      and r.release_id != release_id), None)
        if later is not None:
            metadata["shiplift:superseded-by"] = later.release_id
            metadata["shiplift:superseded-by-record-sha256"] = later.record_hash
    return View(release_id, status, f"{text} (ledger seq {record.seq}, record sha256 {record.record_hash})", metadata)


def previous_server(release_id: str, history: list) -> str | None:
    """The release that served before this release's latest promotion (the one it supersedes), if any."""
    record = _latest([r for r in history if r.release_id == release_id], FOLLOWS)
    if record is None or not is_promotion(record):
        return None
    before = [r for r in history if r.seq < record.seq and is_promotion(r)]
    return before[-1].release_id if before and before[-1].release_id != release_id else None


class SageMakerModelRegistry:
    """The aws backend's registry view: one model package group per model, one version per release."""

    follows = FOLLOWS

    def __init__(self, aws, backend):
        self.aws, self.backend = aws, backend

    def _sm(self, operation: str, **params) -> dict:
        return self.aws.call("sagemaker", operation, **params)

    # -- requests (pure; the dry run prints the same ones) ----------------------------------------
    def group_request(self, config) -> dict:
        """CreateModelPackageGroup of the model, tagged as shiplift's."""
        return {"ModelPackageGroupName": group_name(config),
                "ModelPackageGroupDescription": f"shiplift releases of model {config.name} "
                                                "(a view of the release ledger)",
                "Tags": tags(model=config.name)}

    @staticmethod
    def list_request(group: str) -> dict:
        return {"ModelPackageGroupName": group, "SortBy": "CreationTime", "SortOrder": "Descending",
                "MaxResults": PAGE_SIZE}

    def package_request(self, config, view: View, *, artifact_uri: str, image_uri: str,
                        gate_report: dict | None) -> dict:
        """CreateModelPackage of one release: pinned image and artifact, PendingManualApproval at first, the view's
        metadata, the gate report as ModelQuality statistics; ClientToken from the release, so a retried create is
        the same version."""
        placement = config.placement
        types = (sorted(p.instance_type for p in placement.pools) if placement.kind == "instance_pool"
                 else [] if placement.kind == "serverless" else [placement.instance_type])
        container = {"Image": image_uri, "ImageDigest": view.metadata["shiplift:image-digest"],
                     "ModelDataUrl": artifact_uri, "Environment": config.image.container_env()}
        request = {
            "ModelPackageGroupName": group_name(config),
            "ModelPackageDescription": f"{DESCRIPTION_PREFIX}{view.release_id} of model {config.name}: artifact sha256 "
                                       f"{view.metadata['shiplift:artifact-sha256']}, image {image_uri}",
            "InferenceSpecification": {"Containers": [container], "SupportedContentTypes": CONTENT_TYPES,
                                       "SupportedResponseMIMETypes": CONTENT_TYPES,
                                       **({"SupportedRealtimeInferenceInstanceTypes": types} if types else {})},
            "ModelApprovalStatus": PENDING,
            "CustomerMetadataProperties": dict(view.metadata),
            "ClientToken": view.metadata["shiplift:config-hash"][:36],
            "Tags": tags(release=view.release_id),
        }
        if gate_report and gate_report.get("uri", "").startswith("s3://"):
            request["ModelMetrics"] = {"ModelQuality": {"Statistics": {
                "ContentType": "application/json", "S3Uri": gate_report["uri"],
                "ContentDigest": f"sha256:{gate_report['sha256']}"}}}
        return request

    @staticmethod
    def update_request(arn: str, view: View, live_metadata: dict[str, str]) -> dict:
        """A complete UpdateModelPackage: status, description and every metadata key; keys the view dropped
        are removed."""
        request = {"ModelPackageArn": arn, "ModelApprovalStatus": view.status, "ApprovalDescription": view.description,
                   "CustomerMetadataProperties": dict(view.metadata)}
        stale = sorted(set(live_metadata) - set(view.metadata))
        if stale:
            request["CustomerMetadataPropertiesToRemove"] = stale
        return request

    def _checked(self, operation: str, request: dict, release_id: str) -> dict:
        """The request, or BadInput naming every field SageMaker would refuse (lengths, counts, patterns):
        never truncated."""
        problems = request_problems("sagemaker", operation, request)
        if problems:
            raise BadInput(f"the model registry view of {release_id} cannot be written, {operation} breaks "
                           f"SageMaker's limits: {'; '.join(problems)}",
                           fix="nothing was truncated and the ledger is unaffected: shorten the text it comes from (a "
                               "promotion or rollback reason; the ledger keeps it whole), then rerun the release to "
                               "repair the view")
        return request

    # -- sync --------------------------------------------------------------------------------
    def ensure_group(self, config) -> str:
        """The model's group, created (tagged) when absent; one created meanwhile by another worker is used."""
        request = self.group_request(config)
        try:
            self._sm("DescribeModelPackageGroup", ModelPackageGroupName=request["ModelPackageGroupName"])
        except NotFound:
            try:
                self._sm("CreateModelPackageGroup", **request)
            except Conflict:
                pass
        return request["ModelPackageGroupName"]

    def find(self, group: str, release_id: str) -> dict | None:
        """The group's version of a release (found by its description, newest first, then described), or None."""
        marker, params = f"{DESCRIPTION_PREFIX}{release_id} ", self.list_request(group)
        while True:
            page = self._sm("ListModelPackages", **params)
            for summary in page.get("ModelPackageSummaryList", []):
                if summary.get("ModelPackageDescription", "").startswith(marker):
                    return self._sm("DescribeModelPackage", ModelPackageName=summary["ModelPackageArn"])
            if not page.get("NextToken"):
                return None
            params["NextToken"] = page["NextToken"]

    def apply(self, arn: str, live: dict, view: View) -> bool:
        """One complete UpdateModelPackage when the live version is not the view; False when it already is."""
        metadata = live.get("CustomerMetadataProperties") or {}
        if (live.get("ModelApprovalStatus"), live.get("ApprovalDescription"), metadata) == (
                view.status, view.description, view.metadata):
            return False
        self._sm("UpdateModelPackage",
                 **self._checked("UpdateModelPackage", self.update_request(arn, view, metadata), view.release_id))
        return True

    def sync(self, release: ReleaseFacts) -> dict | None:
        """Make the release's version match its ledger records (registering it first), and mark the release it
        superseded; reads only when the registry already says what the ledger does. None before the gate decided."""
        history = list(release.history)
        view = release_view(release.release_id, history)
        if view is None:
            return None
        group = self.ensure_group(release.config)
        live = self.find(group, release.release_id)
        if live is None:
            request = self.package_request(release.config, view, artifact_uri=release.artifact_uri,
                                           image_uri=release.image_uri, gate_report=release.gate_report)
            arn = self._sm("CreateModelPackage",
                           **self._checked("CreateModelPackage", request, release.release_id))["ModelPackageArn"]
            live = {"ModelPackageArn": arn, "ModelApprovalStatus": PENDING, "CustomerMetadataProperties": view.metadata}
        changed = self.apply(live["ModelPackageArn"], live, view)
        superseded = previous_server(release.release_id, history)
        old = self.find(group, superseded) if superseded else None
        if old is not None:
            self.apply(old["ModelPackageArn"], old, release_view(superseded, history))
        return {"group": group, "model_package_arn": live["ModelPackageArn"], "status": view.status, "changed": changed,
                "superseded": superseded if old is not None else None}

    # -- decisions made in the registry (followed, never trusted) ------------------------------------------------
    @staticmethod
    def principals(live: dict) -> list[str]:
        """Who last changed a version, as DescribeModelPackage reads it back: LastModifiedBy's IamIdentity.Arn, then the
        Studio UserProfileArn and UserProfileName (UserContext:
        https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_UserContext.html; IamIdentity:
        https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_IamIdentity.html)."""
        by = live.get("LastModifiedBy") or {}
        found = [(by.get("IamIdentity") or {}).get("Arn"), by.get("UserProfileArn"), by.get("UserProfileName")]
        return [principal for principal in found if principal]

    def decision_for(self, release: ReleaseFacts, request) -> dict | None:
        """A decision made in the registry on the version of `release`, which awaits approval (`request`: its
        awaiting_approval record), for `tasks.pipeline.approval.follow_registry` to record: `approve`, the `actor`
        (the first principal that `approvers` lists, else the first read back) and the `reason` (the approval
        description given with it), or `refused` when it is not this release's version or was made on an older view
        than the request (stale). Decisions made meanwhile on other versions of the group, whose releases do not await
        approval, are refused and those versions put back to their views (`others`). None when nothing was decided in
        the registry."""
        group, history = group_name(release.config), list(release.history)
        others = self._refuse_elsewhere(group, release.release_id, history)
        live = self.find(group, release.release_id)
        status = (live or {}).get("ModelApprovalStatus")
        if live is None or status not in (APPROVED, REJECTED):
            return {"status": None, "others": others} if others else None
        metadata, principals = live.get("CustomerMetadataProperties") or {}, self.principals(live)
        approvers = list(Approval.of(request).approvers or [])
        actor = next((p for p in principals if p in approvers), principals[0] if principals else "(nobody named)")
        arn, version = live["ModelPackageArn"], live.get("ModelPackageVersion")
        view = release_view(release.release_id, history)
        given = (live.get("ApprovalDescription") or "").strip()
        given = "" if view is not None and given == view.description else given  # the view's own text: none given
        found = {"status": status, "approve": status == APPROVED, "actor": actor, "principals": principals,
                 "model_package_arn": arn, "version": version, "modified_at": str(live.get("LastModifiedTime")),
                 "reason": f"{status.lower()} in the SageMaker Model Registry ({arn}, version {version}): "
                           f"{given or 'no description given'}",
                 "refused": None, "others": others}
        if (metadata.get("shiplift:release-id"), metadata.get("shiplift:config-hash")) != (
                release.release_id, release.config.config_hash()):
            found["refused"] = (f"{arn} does not carry release {release.release_id}'s metadata "
                                f"(shiplift:release-id {metadata.get('shiplift:release-id')!r}): not this "
                                "release's version")
        elif not principals:
            found["refused"] = f"the registry does not say who set {arn} {status} (no LastModifiedBy)"
        elif metadata.get("shiplift:ledger-record-sha256") != request.record_hash:
            found["refused"] = (f"it was made on the view of ledger record seq {metadata.get('shiplift:ledger-seq')} "
                                f"({metadata.get('shiplift:ledger-event')}), not on the approval request (seq "
                                f"{request.seq}): a stale decision")
        return found

    def _refuse_elsewhere(self, group: str, release_id: str, history: list) -> list[dict]:
        """Versions of the group, other than `release_id`'s, whose status is not their view's while their release does
        not await approval (a decision made in Studio on the wrong version, or on one already decided): each put back
        to its view and reported with who changed it."""
        refused, params = [], self.list_request(group)
        while True:
            page = self._sm("ListModelPackages", **params)
            for summary in page.get("ModelPackageSummaryList", []):
                other = _release_of(summary.get("ModelPackageDescription", ""))
                if other in (None, release_id) or _awaits(history, other):
                    continue
                view = release_view(other, history)
                if view is None or summary.get("ModelApprovalStatus") == view.status:
                    continue
                live = self._sm("DescribeModelPackage", ModelPackageName=summary["ModelPackageArn"])
                by = self.principals(live)
                self.apply(live["ModelPackageArn"], live, view)
                refused.append({"release_id": other, "model_package_arn": live["ModelPackageArn"],
                                "status": live.get("ModelApprovalStatus"), "by": by[0] if by else None,
                                "refused": f"release {other} does not await approval; its version is put back to "
                                           f"{view.status}"})
            if not page.get("NextToken"):
                return refused
            params["NextToken"] = page["NextToken"]


def _release_of(description: str) -> str | None:
    """The release id a version's description names (`shiplift release <id> of model …`), or None."""
    if not description.startswith(DESCRIPTION_PREFIX):
        return None
    return description[len(DESCRIPTION_PREFIX):].split(" ", 1)[0] or None


def _awaits(history: list, release_id: str) -> bool:
    """Whether a release's records hold an approval request without a decision."""
    mine = [(r.stage, r.event) for r in history if r.release_id == release_id and r.stage == APPROVAL]
    return (APPROVAL, AWAITING_APPROVAL) in mine and not any(event in (APPROVED_EVENT, REJECTED_EVENT, TIMED_OUT)
                                                             for _, event in mine)
