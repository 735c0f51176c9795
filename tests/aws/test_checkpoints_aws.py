"""Signed checkpoints on the aws backend, against moto: a key in Secrets Manager, checkpoints in an S3 bucket with
Object Lock. An aws release config checkpoints its ledger; a chain edited and rehashed, a truncated tail, a replaced
database, a forged checkpoint and one signed by another key are each named; S3 refuses to delete a locked checkpoint,
and a delete marker or an overwrite hides none; two writers racing for a position end in order; a missing secret, a
bucket without Object Lock and a key that is not Ed25519 are refused and nothing is written. With the public key in
the config, verification never reads the secret, and signing refuses a secret holding another key."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from botocore.exceptions import ClientError
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from shiplift.tasks.backends.aws.backend_config import AwsCheckpoints
from shiplift.tasks.backends.aws.checkpoint_store import S3CheckpointStore, SecretSigner, aws_checkpoint_parts
from shiplift.tasks.backends.aws.session import Aws
from shiplift.tasks.backends.registry import checkpoint_parts, make_backends
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError, IntegrityError
from shiplift.tasks.ledger.checkpoints import (
    PrivateKeySigner,
    check_proof,
    checkpoint,
    prove,
    serialise,
    verify_with_checkpoints,
)
from shiplift.tasks.ledger.store import Ledger
from tests.unit.conftest import Backend
from tests.unit.test_checkpoints import _rewrite
from tests.unit.test_ledger import _append

BUCKET = "shiplift-test-checkpoints"
SECRET = "shiplift/ledger-checkpoint-key"
PREFIX = "shiplift/ledger-checkpoints"
SETTINGS = AwsCheckpoints(key_ref=SECRET, bucket=BUCKET, retention_days=30)


def _pem(private) -> str:
    return private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()).decode()


def _public_pem(private) -> str:
    return private.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _prepare(double, *, lock: bool = True, secret: str | None = None) -> None:
    """What an operator creates once: the Object Lock bucket and the key secret (README, Ledger)."""
    double.client("s3").create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=lock)
    if secret is not None:
        double.client("secretsmanager").create_secret(Name=SECRET, SecretString=secret)


def _objects(double) -> list[dict]:
    return double.client("s3").list_object_versions(Bucket=BUCKET).get("Versions", [])


@pytest.fixture
def sqlite(tmp_path) -> Backend:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield Backend("sqlite", str(engine.url), None, engine)
    engine.dispose()


@pytest.fixture
def ledger(tmp_path, sqlite):
    opened = Ledger.for_sqlite(tmp_path / "ledger.db")
    yield opened
    opened.close()


@pytest.fixture
def parts(aws):
    """A prepared account and its (signer, store)."""
    _prepare(aws, secret=_pem(Ed25519PrivateKey.generate()))
    return aws_checkpoint_parts(Aws(region="us-east-1"), SETTINGS)


def _signed(ledger, parts, n: int = 4):
    for i in range(n):
        _append(ledger, n=i)
    signer, store = parts
    return checkpoint(ledger, store, signer)


def _problems(ledger, parts) -> list[str]:
    signer, store = parts
    verdict = verify_with_checkpoints(ledger, store, signer.public)
    assert verdict["ok"] is not bool(verdict["problems"])
    return verdict["problems"]


def test_an_aws_release_config_checkpoints_its_ledger_into_the_object_lock_bucket(aws, aws_release, tiny_release,
                                                                                  tmp_path):
    _prepare(aws, secret=_pem(Ed25519PrivateKey.generate()))
    aws_release.prepare_account(aws)
    path = aws_release.write_aws_config(tiny_release, tmp_path / "cfg", tmp_path / "state",
                                        backend__checkpoints={"key_ref": SECRET, "bucket": BUCKET,
                                                              "retention_days": 30})
    config = load_release_config(path)
    ledger = Ledger.for_sqlite(tmp_path / "state" / "ledger.db")
    backends = make_backends(config, ledger=ledger)
    signer, store = checkpoint_parts(config)
    assert backends.preflight()["checkpoint_key_id"] == signer.key_id, "preflight reads the key before a release opens"
    for i in range(3):
        _append(ledger, n=i)
    first = backends.checkpoint()  # what release.finish calls
    assert (first.seq, first.head_hash, first.key_id) == (3, ledger.history()[2].record_hash, signer.key_id)
    head = aws.client("s3").head_object(Bucket=BUCKET, Key=f"{PREFIX}/000000000001.json")
    assert head["ObjectLockMode"] == "COMPLIANCE"
    assert abs(head["ObjectLockRetainUntilDate"] - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=5)
    assert backends.checkpoint() == first and len(_objects(aws)) == 1, "nothing new: no second object"
    _append(ledger, release_id="rel-2", n=9)
    second = backends.checkpoint()
    verdict = verify_with_checkpoints(ledger, store, signer.public)
    assert verdict["ok"] and verdict["checkpoints"] == 2 and verdict["checked_against"] == second.to_dict()
    assert sorted(v["Key"] for v in _objects(aws)) == [f"{PREFIX}/000000000001.json", f"{PREFIX}/000000000002.json"]
    proof = prove(ledger, store, "rel-2", signer.public)
    assert [r["seq"] for r in proof["records"]] == [5] and check_proof(json.loads(json.dumps(proof)),
                                                                       signer.public) == []
    with pytest.raises(ConfigError, match="not a local key file"):
        checkpoint_parts(config, key_path=tmp_path / "key.pem")
    ledger.close()


def test_the_cli_verifies_checkpoints_and_reports_from_an_aws_config(aws, aws_release, tiny_release, tmp_path, capsys):
    from shiplift.tasks.cli.main import main

    _prepare(aws, secret=_pem(Ed25519PrivateKey.generate()))
    path = str(aws_release.write_aws_config(tiny_release, tmp_path / "cfg", tmp_path / "state",
                                            backend__checkpoints={"key_ref": SECRET, "bucket": BUCKET}))
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    with Ledger.for_sqlite(tmp_path / "state" / "ledger.db") as ledger:
        for i in range(3):
            _append(ledger, n=i)
        assert main(["ledger", "checkpoint", "--config", path,
                     "--json"]) == 0, "the ledger_url and checkpoints of the config"
        signed = json.loads(capsys.readouterr().out)
        assert signed["seq"] == 3 and len(_objects(aws)) == 1
        assert main(["ledger", "verify", "--config", path, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["checked_against"] == signed
        assert main(["ledger", "report", "--config", path, "--out", str(tmp_path / "report")]) == 0
        assert "extends the checkpoint of seq 3" in (tmp_path / "report" / "index.html").read_text()
        _rewrite(Backend("sqlite", "", None, engine), ledger, 2, {"n": "forged"})
    capsys.readouterr()
    assert main(["ledger", "verify", "--config", path]) == 3
    assert "the chain was rewritten" in capsys.readouterr().out
    assert main(["ledger", "verify", "--config", path, "--key", str(tmp_path / "key.pem")]) == 2
    assert "not a local key file" in capsys.readouterr().err
    engine.dispose()


def test_every_page_of_versions_is_read(ledger, parts, monkeypatch, aws_calls):
    first = _signed(ledger, parts)
    _append(ledger, n=8)
    second = checkpoint(ledger, parts[1], parts[0])
    send, before = Aws.call, len(aws_calls)
    monkeypatch.setattr(Aws, "call", lambda self, service, operation, **params: send(
        self, service, operation, **params, **({"MaxKeys": 1} if operation == "ListObjectVersions" else {})))
    assert [c for _, c, _ in parts[1].entries()] == [first, second]
    assert [operation for _, operation, _ in aws_calls[before:]].count("ListObjectVersions") == 2, "a page per version"


def test_a_chain_edited_and_rehashed_is_named(sqlite, ledger, parts):
    _signed(ledger, parts)
    _rewrite(sqlite, ledger, 2, {"n": 99, "accuracy": 1.0})
    assert ledger.verify().ok, "the rewritten chain is self-consistent"
    problems = _problems(ledger, parts)
    assert len(problems) == 2 and problems[0].startswith("record 4 hashes to")
    assert "the chain was rewritten" in problems[0]
    assert "the records were rewritten" in problems[1]


def test_a_truncated_tail_is_named(sqlite, ledger, parts):
    signed = _signed(ledger, parts)
    sqlite.raw("DELETE FROM {records} WHERE seq >= 3")
    assert _problems(ledger,
                     parts) == [(f"the checkpoint of {signed.signed_at} covers seq 4, but the ledger ends at seq 2: "
                                         "its newest records were deleted (or the database was replaced)")]


def test_a_replaced_database_is_named(tmp_path, ledger, parts):
    _signed(ledger, parts)
    other = Ledger.for_sqlite(tmp_path / "other.db")
    for i in range(6):
        other.append(release_id="rel-1", model="gemma", stage="build", event="started", payload={"n": i},
                     actor="mallory")
    assert any("the chain was rewritten (or the database was replaced)" in p for p in _problems(other, parts))
    other.close()


def test_a_forged_checkpoint_and_one_signed_by_another_key_put_into_the_bucket_are_named(aws, ledger, parts):
    signed = _signed(ledger, parts)
    s3 = aws.client("s3")
    forged = {**signed.to_dict(), "seq": 2}  # claims a shorter history with the real signature
    other = PrivateKeySigner(Ed25519PrivateKey.generate())
    foreign = {**signed.to_dict(), "key_id": other.key_id, "signature": other.sign(signed.body())}
    for position, body in ((2, json.dumps(forged)), (3, json.dumps(foreign)), (4, "not json")):
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{position:012d}.json", Body=body.encode())
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/latest.json", Body=json.dumps(signed.to_dict()).encode())
    problems = _problems(ledger, parts)
    assert any("000000000002.json?versionId=" in p and "(seq 2) has a signature that does not verify" in p
               and "forged" in p for p in problems), problems
    assert any("000000000003.json?versionId=" in p and f"names key {other.key_id}" in p and "signed by another key" in p
               for p in problems), problems
    assert any("000000000004.json?versionId=" in p and "is not a checkpoint" in p for p in problems), problems
    assert any("latest.json" in p and "shiplift did not write it" in p for p in problems), problems
    verdict = verify_with_checkpoints(ledger, parts[1], parts[0].public)
    assert verdict["checked_against"] == signed.to_dict(), "the genuine one still counts"


def test_s3_refuses_to_delete_a_locked_checkpoint_and_a_delete_marker_or_an_overwrite_hides_none(aws, sqlite, ledger,
                                                                                                 parts):
    signed = _signed(ledger, parts)
    s3, key = aws.client("s3"), f"{PREFIX}/000000000001.json"
    version = _objects(aws)[0]["VersionId"]
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.delete_object(Bucket=BUCKET, Key=key, VersionId=version)  # COMPLIANCE: nobody deletes it before the date
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.delete_object(Bucket=BUCKET, Key=key, VersionId=version, BypassGovernanceRetention=True)
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({**signed.to_dict(), "seq": 2}).encode())  # a new version
    s3.delete_object(Bucket=BUCKET, Key=key)  # a delete marker: a plain listing shows nothing any more
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX).get("KeyCount") == 0
    sqlite.raw("DELETE FROM {records} WHERE seq >= 3")
    problems = _problems(ledger, parts)
    assert any("covers seq 4, but the ledger ends at seq 2" in p
               for p in problems), "the hidden checkpoint still counts"
    assert any("(seq 2) has a signature that does not verify" in p for p in problems), "so does the overwrite"
    assert any(p.startswith(f"checkpoint s3://{BUCKET}/{key} was deleted at") and "delete marker" in p
               for p in problems)


def test_two_writers_racing_for_a_position_end_in_order(aws, ledger, parts, monkeypatch):
    signer, store = parts
    _signed(ledger, parts)
    _append(ledger, n=7)
    rival = S3CheckpointStore(Aws(region="us-east-1"), bucket=BUCKET, prefix=PREFIX, retention_days=1)
    append = store.append
    won: list = []

    def racing(signed):
        won.append(checkpoint(ledger, rival, signer))  # another worker signs the same head first
        append(signed)  # position 2 is taken now: Conflict

    monkeypatch.setattr(store, "append", racing)
    assert checkpoint(ledger, store, signer) == won[0], "the loser read again and found its head signed"
    assert len(_objects(aws)) == 2 and verify_with_checkpoints(ledger, store, signer.public)["ok"]


def test_a_missing_secret_or_bucket_a_bucket_without_object_lock_and_a_wrong_key_are_refused_writing_nothing(aws,
                                                                                                             ledger):
    region = Aws(region="us-east-1")
    with pytest.raises(ConfigError, match=f"bucket {BUCKET} does not exist.*--object-lock-enabled-for-bucket"):
        aws_checkpoint_parts(region, SETTINGS)
    _prepare(aws, lock=False)
    with pytest.raises(ConfigError, match="does not have Object Lock enabled.*put-object-lock-configuration"):
        aws_checkpoint_parts(region, SETTINGS)
    aws.client("s3").put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    aws.client("s3").put_object_lock_configuration(Bucket=BUCKET,
                                                   ObjectLockConfiguration={"ObjectLockEnabled": "Enabled"})
    with pytest.raises(ConfigError, match=f"secret {SECRET} does not exist.*shiplift does not create it.*"
                                          f"openssl genpkey -algorithm ed25519.*create-secret --name {SECRET} "):
        aws_checkpoint_parts(region, SETTINGS)
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:shiplift/other-AbCdEf"
    with pytest.raises(ConfigError, match="--name shiplift/other --secret-string"):
        SecretSigner(region, arn)
    aws.client("secretsmanager").create_secret(Name=SECRET, SecretString=_pem(rsa.generate_private_key(65537, 2048)))
    with pytest.raises(IntegrityError, match=f"secret {SECRET} holds a .*RSAPrivateKey, not an Ed25519 key"):
        aws_checkpoint_parts(region, SETTINGS)
    assert _objects(aws) == [] and aws.client("secretsmanager").list_secrets()["SecretList"][0]["Name"] == SECRET
    with pytest.raises(ValidationError, match="private_key"):
        AwsCheckpoints(key_ref=SECRET, bucket=BUCKET, private_key="-----BEGIN PRIVATE KEY-----")


def test_the_body_s3_stores_is_the_local_line(aws, ledger, parts):
    signed = _signed(ledger, parts)
    body = aws.client("s3").get_object(Bucket=BUCKET, Key=f"{PREFIX}/000000000001.json")["Body"].read().decode()
    assert body == serialise(signed), "one serialisation for both stores"


def _config_with_public_key(aws_release, tiny_release, tmp_path, public_key: str) -> str:
    return str(aws_release.write_aws_config(tiny_release, tmp_path / "cfg", tmp_path / "state",
                                            backend__checkpoints={"key_ref": SECRET, "bucket": BUCKET,
                                                                  "public_key": public_key}))


def _secret_reads(aws_calls) -> int:
    return [operation for _, operation, _ in aws_calls].count("GetSecretValue")


def test_with_a_public_key_verify_prove_check_proof_report_and_audit_never_read_the_secret(
        aws, aws_release, tiny_release, tmp_path, capsys, aws_calls):
    from shiplift.tasks.cli.main import main
    from shiplift.tasks.pipeline.audit import audit

    private = Ed25519PrivateKey.generate()
    _prepare(aws, secret=_pem(private))
    path = _config_with_public_key(aws_release, tiny_release, tmp_path, _public_pem(private))
    with Ledger.for_sqlite(tmp_path / "state" / "ledger.db") as ledger:
        for i in range(3):
            _append(ledger, n=i)
    assert main(["ledger", "checkpoint", "--config", path,
                 "--json"]) == 0 and _secret_reads(aws_calls) == 1, "signing reads it"
    signed = json.loads(capsys.readouterr().out)
    assert main(["ledger", "verify", "--config", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checked_against"] == signed
    proof = tmp_path / "proof.json"
    assert main(["ledger", "prove", "rel-1", "--config", path, "--out", str(proof)]) == 0
    assert main(["ledger", "check-proof", str(proof), "--config", path]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    assert main(["ledger", "report", "--config", path, "--out", str(tmp_path / "report")]) == 0
    assert audit(str(tmp_path / "state"), config=path)["checked_against"] == signed
    assert _secret_reads(aws_calls) == 1, "no verification path read the private key"


def test_a_secret_whose_key_is_not_the_configured_public_key_is_refused_at_signing_writing_nothing(
        aws, aws_release, tiny_release, tmp_path, capsys):
    from shiplift.tasks.cli.main import main

    swapped, configured = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    _prepare(aws, secret=_pem(swapped))
    path = _config_with_public_key(aws_release, tiny_release, tmp_path, _public_pem(configured))
    with Ledger.for_sqlite(tmp_path / "state" / "ledger.db") as ledger:
        _append(ledger)
        ids = PrivateKeySigner(swapped).key_id, PrivateKeySigner(configured).key_id
        assert main(["ledger", "checkpoint", "--config", path]) == 2
        assert (f"secret {SECRET} holds key {ids[0]}, but backend.checkpoints.public_key is key {ids[1]}"
                in capsys.readouterr().err)
        with pytest.raises(ConfigError, match="would verify for no auditor"):
            make_backends(load_release_config(path), ledger=ledger).checkpoint()  # what a release's end calls
    assert _objects(aws) == []


def test_a_public_key_that_is_not_an_ed25519_public_key_is_refused_at_config_load(aws_release, tiny_release, tmp_path):
    rsa_public = rsa.generate_private_key(65537, 2048).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    private = _pem(Ed25519PrivateKey.generate())
    for given, why in (("not a key", "not a PEM public key"), (rsa_public, "RSAPublicKey, not an Ed25519 public key"),
                       (private, "this is a private key")):
        with pytest.raises(ConfigError, match=f"backend.checkpoints.public_key: .*{why}") as refused:
            load_release_config(_config_with_public_key(aws_release, tiny_release, tmp_path, given))
        assert private.splitlines()[1] not in str(refused.value), "a pasted private key is never echoed"


def test_verifying_with_a_public_key_that_is_not_the_signers_names_the_checkpoints_as_signed_by_another_key(
        aws, ledger, parts):
    signed = _signed(ledger, parts)
    other = Ed25519PrivateKey.generate()
    settings = SETTINGS.model_copy(update={"public_key": _public_pem(other)})
    auditor, store = aws_checkpoint_parts(Aws(region="us-east-1"), settings, verify_only=True)
    assert auditor.key_id == PrivateKeySigner(other).key_id
    verdict = verify_with_checkpoints(ledger, store, auditor.public)
    assert not verdict["ok"] and verdict["problems"] == [
        f"checkpoint s3://{BUCKET}/{PREFIX}/000000000001.json?versionId={_objects(aws)[0]['VersionId']} (seq 4) names "
        f"key {signed.key_id}, not this ledger's key {auditor.key_id}: signed by another key"]
    proof = prove(ledger, parts[1], "rel-1", parts[0].public)
    assert "signed by another key" in check_proof(proof, auditor.public)[0]
    with pytest.raises(ConfigError, match="a public key only: it verifies checkpoints but cannot sign"):
        auditor.sign(signed.body())
