"""Serving images on AWS: CodeBuild builds `images/<kind>` and pushes it to ECR; shiplift pins the digest.

Idempotent by content: the image tag is derived from the same digest the local process image has
(every file of `images/<kind>` and `images/common`, plus the pinned base image), so an image
already in ECR under that tag is reused without a build. Otherwise the build context goes up as
a deterministic zip under its sha256, the CodeBuild project is created or brought in line, one
build runs (idempotency token = the tag) and is waited for with a deadline, its
`image-detail.json` is read, and the digest is confirmed with ECR `DescribeImages` in a
repository whose tags are IMMUTABLE. Anything but `repo@sha256:<64 lowercase hex>` is refused. The same answer's
`imageSizeInBytes` (the compressed size of the layers) becomes the ImageRef's `size_bytes`.
A published image (`AdoptedImageConfig`, the llama.cpp DLC) is not built: `tasks.backends.aws.published_images`
resolves its tag to a digest in the publisher's registry.
"""

from __future__ import annotations

import io
import json
import re
import time
import zipfile

from shiplift.tasks.backends.aws.base_images import docker_hub_note
from shiplift.tasks.backends.aws.published_images import resolve_published
from shiplift.tasks.backends.aws.service_model import request_applied
from shiplift.tasks.backends.image_source import SHARED_DIRS, pin_image_source
from shiplift.tasks.backends.interfaces import ImageRef, Progress
from shiplift.tasks.errors import ConfigError, IntegrityError, NotFound, NotReady
from shiplift.tasks.families.base import AdoptedImageConfig
from shiplift.tasks.hashing import sha256_bytes
from shiplift.tasks.project import IMAGES_DIR

BUILD_IMAGE = "aws/codebuild/standard:7.0"
COMPUTE_TYPE = "BUILD_GENERAL1_LARGE"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
TERMINAL_BUILD = {"SUCCEEDED", "FAILED", "FAULT", "STOPPED", "TIMED_OUT"}
DIGEST_URI = r"^{repo}@sha256:[0-9a-f]{{64}}$"


def source_zip(kind: str) -> bytes:
    """The Docker build context `images/` restricted to this image and the shared folders, byte for
    byte reproducible."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for folder in (kind, *SHARED_DIRS):
            for path in sorted((IMAGES_DIR / folder).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    info = zipfile.ZipInfo(path.relative_to(IMAGES_DIR).as_posix(), ZIP_TIME)
                    info.external_attr = 0o644 << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


def image_tag(kind: str, variant: str, local_digest: str) -> str:
    """Content-derived and never reused for other content (the repository's tags are immutable)."""
    return f"{kind}-{variant}-{local_digest.removeprefix('sha256:')[:32]}"


class CodeBuildImageBuilder:
    """The aws backend's image builder: one CodeBuild project per image, ECR with immutable tags."""

    def __init__(self, aws, backend, store, *, poll_s: float):
        self.aws, self.backend, self.store, self.poll_s = aws, backend, store, poll_s

    # -- requests (also printed by the dry run) -------------------------------------------------
    def repository_uri(self) -> str:
        """`<account>.dkr.ecr.<region>.amazonaws.com/<repository>`."""
        return f"{self.backend.account_id}.dkr.ecr.{self.backend.region}.amazonaws.com/{self.backend.ecr_repository}"

    def source_key(self, data: bytes) -> str:
        """Where the build context zip goes: content-addressed under the key prefix."""
        return f"{self.backend.key_prefix}/image-sources/sha256/{sha256_bytes(data)}/images.zip"

    def project_request(self) -> dict:
        """CreateProject/UpdateProject: S3 source, image-detail.json artifacts, privileged docker builds."""
        backend = self.backend
        request = {
            "name": backend.codebuild_project,
            "description": "shiplift serving images (images/<kind>/buildspec.yml); builds pushed to ECR by digest",
            "source": {"type": "S3", "location": f"{backend.bucket}/{backend.key_prefix}/image-sources/"},
            "artifacts": {"type": "S3", "location": backend.bucket, "path": f"{backend.key_prefix}/image-builds",
                          "packaging": "NONE", "namespaceType": "NONE"},
            "environment": {"type": "LINUX_CONTAINER", "image": BUILD_IMAGE, "computeType": COMPUTE_TYPE,
                            "privilegedMode": True, "environmentVariables": [
                                {"name": "ECR_REPOSITORY_URI", "value": self.repository_uri(), "type": "PLAINTEXT"}]},
            "serviceRole": backend.codebuild_role_arn,
            "timeoutInMinutes": -(-backend.build_timeout_s // 60),
            "tags": [{"key": "shiplift:managed", "value": "true"}],
        }
        if backend.kms_key_id:
            request["encryptionKey"] = backend.kms_key_id
        return request

    def build_request(self, kind: str, tag: str, variant: str, base_image: str, source_key: str) -> dict:
        """StartBuild of one image: its source zip, buildspec, tag, variant and base image; idempotent per tag."""
        backend = self.backend
        return {
            "projectName": backend.codebuild_project,
            "sourceTypeOverride": "S3",
            "sourceLocationOverride": f"{backend.bucket}/{source_key}",
            "buildspecOverride": f"{kind}/buildspec.yml",
            "artifactsOverride": {"type": "S3", "location": backend.bucket,
                                  "path": f"{backend.key_prefix}/image-builds/{tag}",
                                  "name": "image-detail", "packaging": "NONE", "namespaceType": "NONE"},
            "environmentVariablesOverride": [
                {"name": name, "value": value, "type": "PLAINTEXT"}
                for name, value in (("IMAGE_NAME", kind), ("IMAGE_TAG", tag), ("VARIANT", variant),
                                    ("ECR_REPOSITORY_URI", self.repository_uri()), ("BASE_IMAGE", base_image))
            ],
            "idempotencyToken": tag,
            "timeoutInMinutesOverride": -(-backend.build_timeout_s // 60),
        }

    def detail_key(self, tag: str) -> str:
        """Where the buildspec writes image-detail.json for a tag."""
        return f"{self.backend.key_prefix}/image-builds/{tag}/image-detail/image-detail.json"

    # -- the build ---------------------------------------------------------------------------
    def build(self, image, *, progress: Progress) -> ImageRef:
        """The image pinned by digest: found in ECR by its content tag, or built once with CodeBuild and confirmed; a
        published image resolved from its tag (no build, no upload)."""
        if isinstance(image, AdoptedImageConfig):
            return resolve_published(self.aws, image, self.backend.region, progress=progress)
        local = pin_image_source(image.kind, image.base_image)  # checks every pin; its digest names the content
        variant = "cuda" if image.on_gpu else "cpu"
        tag = image_tag(image.kind, variant, local.digest)
        self._check_repository()
        digest = self._digest_of_tag(tag)
        if digest is None:
            running = self._running_build(tag)
            if running:  # an earlier attempt started it (a crash, a deadline): wait for it, never build twice
                progress(f"image: build {running} of {tag} is already running; waiting for it")
            else:
                progress(f"image: no {self.backend.ecr_repository}:{tag} yet; building it with CodeBuild")
                hub = docker_hub_note(image.base_image)
                if hub:
                    progress(f"image: note: {hub}")
                data = source_zip(image.kind)
                key = self.source_key(data)
                self.store.put_bytes(data, key)
                self._ensure_project()
                request = self.build_request(image.kind, tag, variant, image.base_image, key)
                running = self.aws.call("codebuild", "StartBuild", **request)["build"]["id"]
            self._wait_build(running, tag, progress)
            digest = self._read_detail(tag)
        else:
            progress(f"image: {self.backend.ecr_repository}:{tag} exists; no build needed")
        uri = f"{self.repository_uri()}@{digest}"
        if not re.match(DIGEST_URI.format(repo=re.escape(self.repository_uri())), uri):
            raise IntegrityError(f"image {uri!r} is not {self.repository_uri()}@sha256:<64 lowercase hex>",
                                 fix="check the buildspec's image-detail.json")
        size = self._confirm(digest, tag)
        progress(f"image: {uri}" + (f" ({size / 1e9:.2f} GB compressed in ECR)" if size is not None else ""))
        return ImageRef(name=image.kind, uri=uri, digest=digest, base_image=image.base_image, files=local.files,
                        source_sha256=local.digest.removeprefix("sha256:"), size_bytes=size)

    def _check_repository(self) -> None:
        try:
            repository = self.aws.call("ecr", "DescribeRepositories",
                                       repositoryNames=[self.backend.ecr_repository])["repositories"][0]
        except NotFound as exc:
            raise ConfigError(f"ECR repository {self.backend.ecr_repository} does not exist in {self.backend.region}",
                              fix="create it with image tag immutability on (see the README, On AWS)") from exc
        if repository.get("imageTagMutability") != "IMMUTABLE":
            raise ConfigError(
                f"ECR repository {self.backend.ecr_repository} does not make every tag immutable "
                f"({repository.get('imageTagMutability')}): a tag could later name other content",
                fix=f"aws ecr put-image-tag-mutability --repository-name {self.backend.ecr_repository} "
                    "--image-tag-mutability IMMUTABLE",
            )

    def _digest_of_tag(self, tag: str) -> str | None:
        try:
            details = self.aws.call("ecr", "DescribeImages", repositoryName=self.backend.ecr_repository,
                                    imageIds=[{"imageTag": tag}])["imageDetails"]
        except NotFound:
            return None
        return details[0]["imageDigest"] if details else None

    def _ensure_project(self) -> None:
        request = self.project_request()
        found = self.aws.call("codebuild", "BatchGetProjects", names=[request["name"]])["projects"]
        if not found:
            self.aws.call("codebuild", "CreateProject", **request)
            return
        wanted = {k: v for k, v in request.items() if k != "tags"}
        if not request_applied(found[0], wanted):
            self.aws.call("codebuild", "UpdateProject", **wanted)

    def _running_build(self, tag: str) -> str | None:
        """The id of a build of this tag still in progress (the newest 100 builds of the project are looked at)."""
        try:
            ids = self.aws.call("codebuild", "ListBuildsForProject", projectName=self.backend.codebuild_project,
                                sortOrder="DESCENDING").get("ids", [])[:100]
        except NotFound:
            return None  # no project yet, so no build
        for build in self.aws.call("codebuild", "BatchGetBuilds", ids=ids)["builds"] if ids else []:
            variables = {v["name"]: v.get("value")
                         for v in build.get("environment", {}).get("environmentVariables", [])}
            if build.get("buildStatus") == "IN_PROGRESS" and variables.get("IMAGE_TAG") == tag:
                return build["id"]
        return None

    def _wait_build(self, build_id: str, tag: str, progress: Progress) -> None:
        """Poll the build until it ends (deadline `build_timeout_s`); a failed build is fine if the tag got
        pushed anyway."""
        deadline = time.monotonic() + self.backend.build_timeout_s
        phase = None
        while True:
            build = self.aws.call("codebuild", "BatchGetBuilds", ids=[build_id])["builds"][0]
            if build.get("currentPhase") != phase:
                phase = build.get("currentPhase")
                progress(f"image: build {build['id']} {phase}")
            if build["buildStatus"] in TERMINAL_BUILD:
                break
            if time.monotonic() > deadline:
                raise NotReady(f"image build {build['id']} still {build['buildStatus']} after "
                               f"{self.backend.build_timeout_s}s",
                               fix="raise backend.build_timeout_s, or look at the build's logs in CodeBuild")
            time.sleep(self.poll_s)
        if build["buildStatus"] != "SUCCEEDED" and self._digest_of_tag(tag) is None:
            why = "; ".join(f"{p.get('phaseType')}: {c.get('message')}" for p in build.get("phases", [])
                            for c in p.get("contexts", []) if c.get("message"))
            raise IntegrityError(f"image build {build['id']} ended {build['buildStatus']}: {why or 'no phase message'}",
                                 fix="read the build log in CodeBuild; nothing was pushed")

    def _read_detail(self, tag: str) -> str:
        try:
            detail = json.loads(self.store.read_bytes(self.detail_key(tag)))
        except (NotFound, ValueError) as exc:
            raise IntegrityError(f"the build of {tag} wrote no readable image-detail.json at {self.detail_key(tag)}",
                                 fix="check the buildspec's artifacts section") from exc
        uri = detail.get("ImageURI", "") if isinstance(detail, dict) else ""
        repo, _, digest = uri.partition("@")
        if repo != self.repository_uri() or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise IntegrityError(f"image-detail.json names {uri!r}, not {self.repository_uri()}@sha256:<64 hex>",
                                 fix="a mutable or foreign image reference is refused; fix the buildspec")
        return digest

    def _confirm(self, digest: str, tag: str) -> int | None:
        """The image is in ECR under `tag`; returns its `imageSizeInBytes` (compressed layers, None if ECR leaves it
        out: https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_ImageDetail.html)."""
        try:
            details = self.aws.call("ecr", "DescribeImages", repositoryName=self.backend.ecr_repository,
                                    imageIds=[{"imageDigest": digest}])["imageDetails"]
        except NotFound as exc:
            raise IntegrityError(f"ECR has no image {digest} in {self.backend.ecr_repository}",
                                 fix="the build reported a digest ECR does not know; rebuild") from exc
        if not details or tag not in details[0].get("imageTags", []):
            raise IntegrityError(f"ECR image {digest} does not carry the tag {tag}", fix="rebuild the image")
        size = details[0].get("imageSizeInBytes")
        return size if isinstance(size, int) and size >= 0 else None
