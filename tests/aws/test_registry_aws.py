"""The SageMaker Model Registry as a view of the ledger: each aws release is one model package version (moto's
Model Registry behind the AWS double), its approval status following the gate and promotion, its metadata naming the
ledger record the status reflects; reruns never register twice, a failed view update leaves the ledger whole and a
rerun repairs it, and values over SageMaker's limits are refused, never truncated."""

from __future__ import annotations

import pytest

from shiplift.tasks.backends.aws.model_registry import (
    APPROVED,
    PENDING,
    REJECTED,
    SageMakerModelRegistry,
    View,
    release_view,
)
from shiplift.tasks.backends.aws.session import Aws
from shiplift.tasks.errors import BadInput
from shiplift.tasks.ledger.store import Ledger, Record
from shiplift.tasks.pipeline.promotion import rollback
from shiplift.tasks.pipeline.release import run_release

QUIET = lambda message: None  # noqa: E731
GROUP = "shiplift-tiny-aws"


def versions(double, group: str = GROUP) -> dict[str, dict]:
    """Every version of the group, described, by release id."""
    sm = double.client("sagemaker")
    summaries = sm.list_model_packages(ModelPackageGroupName=group, MaxResults=100)["ModelPackageSummaryList"]
    described = [sm.describe_model_package(ModelPackageName=s["ModelPackageArn"]) for s in summaries]
    return {d["CustomerMetadataProperties"]["shiplift:release-id"]: d for d in described}


def registry_calls(double, operation: str) -> list:
    return [call for call in double.calls if call.operation == operation]


def last_record(ledger: Ledger, release_id: str, stage: str) -> Record:
    return [r for r in ledger.release(release_id) if r.stage == stage][-1]


def test_a_promoted_release_is_an_approved_version_carrying_its_ledger_record_and_a_rerun_changes_nothing(
        aws, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    summary = run_release(config, progress=QUIET)
    assert summary["status"] == "promoted"
    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    promoted = last_record(ledger, summary["release_id"], "promote")

    group = aws.client("sagemaker").describe_model_package_group(ModelPackageGroupName=GROUP)
    assert group["ModelPackageGroupStatus"] == "Completed"
    [group] = registry_calls(aws, "CreateModelPackageGroup")
    assert group.params["Tags"][0] == {"Key": "shiplift:managed", "Value": "true"}
    [version] = versions(aws).values()
    metadata = version["CustomerMetadataProperties"]
    assert version["ModelApprovalStatus"] == APPROVED
    assert "promoted to shiplift-tiny-aws-prod/" in version["ApprovalDescription"]
    assert metadata["shiplift:ledger-record-sha256"] == promoted.record_hash
    assert metadata["shiplift:ledger-seq"] == str(promoted.seq)
    assert metadata["shiplift:ledger-event"] == "promote/succeeded" and metadata["shiplift:gate-decision"] == "pass"
    assert (metadata["shiplift:artifact-sha256"], metadata["shiplift:image-digest"]) == (
        summary["artifact_sha256"], summary["image_uri"].rsplit("@", 1)[1])
    assert metadata["shiplift:config-hash"] == promoted.payload["config_hash"]
    assert float(metadata["shiplift:gate-accuracy"]) == summary["metrics"]["accuracy"]
    [container] = version["InferenceSpecification"]["Containers"]
    assert container["Image"] == summary["image_uri"] and container["ImageDigest"] == metadata["shiplift:image-digest"]
    assert container["ModelDataUrl"].startswith("s3://shiplift-test-artifacts/")
    assert summary["artifact_sha256"] in container["ModelDataUrl"]
    statistics = version["ModelMetrics"]["ModelQuality"]["Statistics"]
    assert statistics["S3Uri"].endswith("/gate-report.json") and statistics["ContentDigest"].startswith("sha256:")
    created = registry_calls(aws, "CreateModelPackage")
    assert len(created) == 1, "registered pending, before promotion"
    assert created[0].params["ModelApprovalStatus"] == PENDING, "registered pending, before promotion"
    updates = [c.params for c in registry_calls(aws, "UpdateModelPackage")]
    assert [u["ModelApprovalStatus"] for u in updates] == [PENDING, APPROVED], "the gate's view, then the promotion's"
    assert all(set(u) >= {"ModelApprovalStatus", "ApprovalDescription", "CustomerMetadataProperties"}
               for u in updates), "complete"

    before = len(aws.calls)
    assert run_release(config, progress=QUIET) == summary
    rerun = [c.operation for c in aws.calls[before:]]
    assert rerun and not [op for op in rerun
                          if op.startswith(("Create", "Update"))], "the rerun read the view and found it right"


@pytest.mark.slow  # ~22 s: make test-slow; make test keeps the rerun that changes nothing (the first test of this file)
def test_a_failed_view_update_leaves_the_ledger_whole_and_a_rerun_repairs_it(aws, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    aws.scenario(throttle={"UpdateModelPackage": 100})  # past botocore's bounded retries, at the gate and the promotion
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    said: list[str] = []
    summary = run_release(config, progress=said.append)
    assert summary["status"] == "promoted", "a view that could not be written does not fail the release"
    assert any("WARNING model registry not updated" in line and "rerun the release" in line for line in said)
    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    assert ledger.verify().ok and ledger.served_at("tiny-aws",
                                                   "2100-01-01T00:00:00Z").release_id == summary["release_id"]
    [stale] = versions(aws).values()
    assert stale["ModelApprovalStatus"] == PENDING, "registered, but the status could not follow"

    aws.scenario(throttle={})
    run_release(config, progress=QUIET)
    [repaired] = versions(aws).values()
    assert repaired["ModelApprovalStatus"] == APPROVED
    assert repaired["CustomerMetadataProperties"]["shiplift:ledger-record-sha256"] == last_record(
        ledger, summary["release_id"], "promote").record_hash
    assert len(registry_calls(aws, "CreateModelPackage")) == 1, "found, not registered again"


def test_a_failed_gate_is_a_rejected_version(aws, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state",
                                          validation__thresholds={"min_accuracy": 1.0, "max_ece": 1.0,
                                                                  "min_validity": 1.0})
    summary = run_release(config, progress=QUIET)
    assert summary["status"] == "rejected"
    [version] = versions(aws).values()
    assert version["ModelApprovalStatus"] == REJECTED and version["ApprovalDescription"].startswith("gate fail: "
                                                                                                    "accuracy")
    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    assert version["CustomerMetadataProperties"]["shiplift:ledger-record-sha256"] == last_record(
        ledger, summary["release_id"], "validate").record_hash


# ~18 s: make test-slow; the view's rules are tested in make test by the test after it, without a release
@pytest.mark.slow
def test_a_later_promotion_supersedes_and_a_rollback_restores(aws, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    first = run_release(config, progress=QUIET)
    second = run_release(config, overrides=("calibration.fit_temperature=true",), progress=QUIET)
    assert (first["status"], second["status"]) == ("promoted", "promoted")
    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    seen = versions(aws)
    assert [seen[r]["ModelApprovalStatus"] for r in (first["release_id"], second["release_id"])] == [APPROVED, APPROVED]
    old = seen[first["release_id"]]["CustomerMetadataProperties"]
    assert old["shiplift:superseded-by"] == second["release_id"]
    assert old["shiplift:superseded-by-record-sha256"] == last_record(ledger, second["release_id"],
                                                                      "promote").record_hash
    assert "shiplift:superseded-by" not in seen[second["release_id"]]["CustomerMetadataProperties"]

    rollback(tmp_path / "state", "tiny-aws", first["release_id"], reason="the temperature fit hurt calibration",
             actor="pytest", ledger_url=f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    seen = versions(aws)
    restored = seen[first["release_id"]]
    assert restored["ModelApprovalStatus"] == APPROVED
    assert "shiplift:superseded-by" not in restored["CustomerMetadataProperties"]
    assert "rollback from " + second["release_id"] in restored["ApprovalDescription"]
    assert restored["CustomerMetadataProperties"]["shiplift:ledger-record-sha256"] == last_record(
        ledger, first["release_id"], "promote").record_hash
    assert seen[second["release_id"]]["CustomerMetadataProperties"]["shiplift:superseded-by"] == first["release_id"]
    assert len(registry_calls(aws, "CreateModelPackage")) == 2, "one version per release"
    assert registry_calls(aws, "UpdateModelPackage")[-2].params.get("CustomerMetadataPropertiesToRemove") == [
        "shiplift:superseded-by", "shiplift:superseded-by-record-sha256"], "dropped keys are removed by name"


def record(seq: int, release_id: str, stage: str, event: str = "succeeded", **payload) -> Record:
    return Record(seq=seq, record_hash=f"{seq:064x}", prev_hash="0" * 64, release_id=release_id, model="m", stage=stage,
                  event=event, actor="pytest", recorded_at="", payload={"config_hash": "c" * 64, **payload})


def built(release_id: str, start: int) -> list[Record]:
    return [record(start, release_id, "package", artifact_sha256="a" * 64), record(start + 1, release_id, "image",
                                                                                  image_digest="sha256:" + "d" * 64)]


def test_the_view_follows_the_gate_the_promotion_and_a_rollout_rolled_back():
    gate = {"metrics": {"accuracy": 0.5, "ece": None}, "not_passed": []}
    history = [*built("a", 1), record(3, "a", "validate", decision="pass", **gate)]
    assert release_view("a", history[:2]) is None, "nothing before the gate decided"
    pending = release_view("a", history)
    assert (pending.status, pending.metadata["shiplift:ledger-record-sha256"]) == (PENDING, f"{3:064x}")
    assert pending.metadata["shiplift:gate-accuracy"] == "0.5" and "shiplift:gate-ece" not in pending.metadata
    failed = [*built("b", 1),
              record(3, "b", "validate", decision="inconclusive", metrics={}, not_passed=["n 10 (needs >= 30)"])]
    assert release_view("b", failed).status == REJECTED, "inconclusive never promotes"
    rolled = [*history, record(4, "a", "promote", "rolled_back", reason="alarm x-error-rate fired")]
    assert (release_view("a", rolled).status, release_view("a", rolled).description.split(" (ledger")[0]) == (
        REJECTED, "rollout rolled back: alarm x-error-rate fired; the champion serves again")


def test_values_over_sagemakers_limits_are_refused_before_anything_is_sent(aws):
    registry = SageMakerModelRegistry(Aws(region="us-east-1"), None)
    arn = "arn:aws:sagemaker:us-east-1:123456789012:model-package/shiplift-tiny-aws/1"
    metadata = {"shiplift:release-id": "tiny-aws-0123456789ab"}
    cases = {
        "ApprovalDescription: 1100 characters, at most 1024": View("r", APPROVED, "x" * 1100, metadata),
        "['shiplift:release-id']: 300 characters, at most 256": View("r", APPROVED, "ok",
                                                                     {"shiplift:release-id": "r" * 300}),
        "CustomerMetadataProperties: 51 entries, at most 50": View("r", APPROVED, "ok",
                                                                   {f"k{i}": "v" for i in range(51)}),
        "does not match the pattern": View("r", APPROVED, "ok", {"shiplift:reason": "an alarm, with a comma"}),
    }
    for problem, view in cases.items():
        with pytest.raises(BadInput, match="nothing was truncated") as refused:
            registry.apply(arn, {}, view)
        assert "model registry view of r cannot be written" in str(refused.value), problem
        assert problem in str(refused.value), problem
    assert registry_calls(aws, "UpdateModelPackage") == []
