"""Published images on AWS (`AdoptedImageConfig`, the llama.cpp DLC): no build and no upload; the tag is resolved to
the digest it names now with ECR `BatchGetImage` in the publisher's registry, before anything deploys it, and a config
that pins `image.digest` is refused when the tag has moved since. SageMaker then pulls `repository@sha256:…`, never
the tag (https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_BatchGetImage.html).
"""

from __future__ import annotations

import re

from shiplift.tasks.backends.aws.session import ACCESS_DENIED, error_code, partition
from shiplift.tasks.backends.interfaces import ImageRef, Progress
from shiplift.tasks.errors import ConfigError, IntegrityError, NotFound, NotReady

# Every manifest type, so that ECR returns the manifest as stored (a list or index too) and its digest is the one
# SageMaker pulls, not the digest of a manifest converted for the client.
ACCEPTED_MEDIA_TYPES = (
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def repository_uri(image, region: str) -> str:
    """`<publisher account>.dkr.ecr.<region>.amazonaws.com/<repository>`: the reference without its tag."""
    return image.reference(region).rsplit(":", 1)[0]


def repository_arn(image, region: str) -> str:
    """The publisher's repository as IAM names it (what the pipeline and execution roles are granted on)."""
    return f"arn:{partition(region)}:ecr:{region}:{image.registry_account(region)}:repository/{image.repository}"


def resolve_request(image, region: str) -> dict:
    """BatchGetImage of the tag in the publisher's registry (also printed by the dry run)."""
    return {"registryId": image.registry_account(region), "repositoryName": image.repository,
            "imageIds": [{"imageTag": image.tag}], "acceptedMediaTypes": list(ACCEPTED_MEDIA_TYPES)}


def resolve_published(aws, image, region: str, *, progress: Progress) -> ImageRef:
    """The published image pinned by the digest its tag names now; with `image.digest`, only if it is that one."""
    reference, arn = image.reference(region), repository_arn(image, region)
    try:
        answer = aws.call("ecr", "BatchGetImage", **resolve_request(image, region))
    except NotFound as exc:
        raise NotFound(f"{reference}: the registry {image.registry_account(region)} has no repository "
                       f"{image.repository} in {region} ({exc.problem})",
                       fix="deploy in a region where the image is published, or check the publisher's account "
                           f"for {region}") from exc
    except ConfigError as exc:
        code, _, status = error_code(exc.__cause__)
        if not {code, str(status)} & ACCESS_DENIED:  # no credentials, a wrong region: already said as it should be
            raise
        raise ConfigError(f"{reference}: the pipeline role may not read the published image ({exc.problem})",
                          fix=f"grant it ecr:BatchGetImage on {arn} (`shiplift iam` writes that statement)") from exc
    failures = answer.get("failures") or []
    images = answer.get("images") or []
    if not images:
        failure = failures[0] if failures else {}
        code, reason = failure.get("failureCode", "no image"), failure.get("failureReason", "ECR returned no image")
        if code == "ImageNotFound" or not failures:
            raise NotFound(f"{reference}: {image.repository} in {region} has no tag {image.tag} ({code}: {reason})",
                           fix=f"set image.tag to a tag the publisher has in {region}, or deploy in a region that "
                               "has it")
        raise NotReady(f"{reference}: ECR could not return the image ({code}: {reason})",
                       fix="retry; if it persists, the failure code above says why")
    digest = images[0].get("imageId", {}).get("imageDigest", "")
    if not DIGEST.match(digest):
        raise IntegrityError(f"{reference}: ECR answered the digest {digest!r}, not sha256:<64 lowercase hex>",
                             fix="nothing was deployed; retry, and report it if it persists")
    if image.digest and digest != image.digest:
        raise IntegrityError(f"{reference}: the tag moved: the config pins image.digest {image.digest}, "
                             f"ECR has {digest}",
                             fix=f"update image.digest to {digest} once the new image is reviewed, or remove "
                                 "image.digest to follow the tag (each release records the digest it resolved); "
                                 "nothing was deployed")
    uri = f"{repository_uri(image, region)}@{digest}"
    progress(f"image: {reference} is {uri}" + (" (the pinned image.digest)" if image.digest else ""))
    # size_bytes: BatchGetImage answers no imageSizeInBytes (an Image is its id and manifest, and an index or list
    # manifest names no layer sizes), so the size is unknown here
    return ImageRef(name=image.kind, uri=uri, digest=digest, base_image=reference, files=0, source_sha256=None,
                    size_bytes=None)
