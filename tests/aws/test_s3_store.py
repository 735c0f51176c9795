"""The S3 artifact store's multipart path against moto: part checksums, the composite checksum, progress, read-back."""

from __future__ import annotations

import os

from tasks.backends.aws.session import Aws
from tasks.backends.aws.store import S3ArtifactStore
from tasks.hashing import sha256_file

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
