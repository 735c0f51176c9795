"""The S3 artifact store against moto and the double: the multipart path (part checksums, the composite checksum,
progress, read-back) and conditional writes that race another writer (409, written again) or find the key (412)."""

from __future__ import annotations

import hashlib
import os

import pytest

from shiplift.tasks.backends.aws import artifact_store as store_module
from shiplift.tasks.backends.aws.artifact_store import S3ArtifactStore
from shiplift.tasks.backends.aws.session import Aws
from shiplift.tasks.errors import NotReady
from shiplift.tasks.hashing import sha256_file

MIB = 1024 * 1024


def test_a_large_file_goes_up_in_parts_and_is_read_back_verified(aws, aws_calls, tmp_path):
    aws.client("s3").create_bucket(Bucket="shiplift-parts")
    store = S3ArtifactStore(Aws(region="us-east-1"), bucket="shiplift-parts", prefix="shiplift", kms_key_id=None,
                            cache_dir=tmp_path / "cache", part_bytes=5 * MIB, single_put_max_bytes=MIB)
    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(11 * MIB))
    said: list[str] = []
    stored = store.put_file(source, name="model.gguf", progress=said.append)
    assert stored.sha256 == sha256_file(source) and stored.size == 11 * MIB
    operations = [operation for service, operation, _ in aws_calls if service == "s3"]
    assert operations == ["HeadObject", "CreateMultipartUpload", "UploadPart", "UploadPart", "UploadPart",
                          "CompleteMultipartUpload", "HeadObject"]
    assert all("ChecksumSHA256" in params for _, operation, params in aws_calls if operation == "UploadPart")
    assert [m for m in said if "part" in m][-1].endswith("part 3/3 (100%)")
    assert store.put_file(source, name="model.gguf") == stored, "the same content again is the stored artifact"
    assert [operation for _, operation, _ in aws_calls].count("CreateMultipartUpload") == 1
    copy = store.get(stored.uri)
    assert sha256_file(copy) == stored.sha256 and store.exists(stored.sha256)
    assert not store.exists("0" * 64)


@pytest.mark.parametrize("size, first_write", [
    (1024, ["PutObject"]),  # one conditional PutObject
    # completed conditionally
    (6 * MIB, ["CreateMultipartUpload", "UploadPart", "UploadPart", "CompleteMultipartUpload"]),
])
def test_a_conditional_write_racing_another_is_written_again_not_a_conflict(aws, aws_calls, tmp_path, monkeypatch,
                                                                           size, first_write):
    monkeypatch.setattr(store_module, "WRITE_RACE_BACKOFF_S", 0.01)
    aws.client("s3").create_bucket(Bucket="shiplift-race")
    store = S3ArtifactStore(Aws(region="us-east-1"), bucket="shiplift-race", prefix="shiplift", kms_key_id=None,
                            cache_dir=tmp_path / "cache", part_bytes=5 * MIB, single_put_max_bytes=MIB)
    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(size))
    aws.scenario(race_conditional_writes=1)  # S3 answers the first conditional write 409 ConditionalRequestConflict
    said: list[str] = []

    stored = store.put_file(source, name="model.gguf", progress=said.append)
    assert stored.sha256 == sha256_file(source) and stored.size == size
    aborted = ["AbortMultipartUpload"] if len(first_write) > 1 else []  # S3: a raced multipart upload starts over
    assert [op for service, op, _ in aws_calls if service == "s3"] == \
        ["HeadObject", *first_write, *aborted, "HeadObject", *first_write, "HeadObject"]
    assert any("409 ConditionalRequestConflict" in message and "writing again" in message for message in said)
    assert aws.scenario().race_conditional_writes == 0
    assert sha256_file(store.get(stored.uri)) == stored.sha256


def test_a_conditional_write_that_keeps_racing_is_not_ready_after_bounded_attempts(aws, aws_calls, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setattr(store_module, "WRITE_RACE_BACKOFF_S", 0.01)
    aws.client("s3").create_bucket(Bucket="shiplift-race")
    store = S3ArtifactStore(Aws(region="us-east-1"), bucket="shiplift-race", prefix="shiplift", kms_key_id=None,
                            cache_dir=tmp_path / "cache")
    source = tmp_path / "model.gguf"
    source.write_bytes(b"raced " * 100)
    aws.scenario(race_conditional_writes=10)

    with pytest.raises(NotReady) as caught:
        store.put_file(source, name="model.gguf")
    assert type(caught.value) is NotReady and caught.value.retryable, "retryable: the other writer finishes"
    assert (f"{store_module.WRITE_RACE_ATTEMPTS} conditional writes each raced another write of the key"
            in str(caught.value))
    assert "ConditionalRequestConflict" in str(caught.value) and "rerun the stage" in caught.value.fix
    assert [op for _, op, _ in aws_calls].count("PutObject") == store_module.WRITE_RACE_ATTEMPTS
    assert aws.scenario().race_conditional_writes == 10 - store_module.WRITE_RACE_ATTEMPTS
    assert aws.client("s3").list_objects_v2(Bucket="shiplift-race").get("KeyCount") == 0, "nothing was written"


def test_a_conditional_write_refused_because_the_key_exists_is_compared_not_retried(aws, aws_calls, tmp_path,
                                                                                    monkeypatch):
    aws.client("s3").create_bucket(Bucket="shiplift-race")
    store = S3ArtifactStore(Aws(region="us-east-1"), bucket="shiplift-race", prefix="shiplift", kms_key_id=None,
                            cache_dir=tmp_path / "cache")
    data = b"the same bytes" * 10
    key = f"shiplift/results/{hashlib.sha256(data).hexdigest()}.json"
    call = Aws.call

    def other_writer_first(self, service, operation, **params):  # the other writer's PutObject lands right before ours
        if operation == "PutObject":
            aws.client("s3").put_object(Bucket="shiplift-race", Key=key, Body=data,
                                        Metadata={"sha256": hashlib.sha256(data).hexdigest()})
        return call(self, service, operation, **params)

    monkeypatch.setattr(Aws, "call", other_writer_first)
    assert store.put_bytes(data, key) == f"s3://shiplift-race/{key}"
    assert [op for _, op, _ in aws_calls].count("PutObject") == 1, "412 PreconditionFailed: compared, not written again"
