"""Where a pinned base image (`image.base_image`, `repo@sha256:…`) is pulled from when CodeBuild builds the serving
image, and what that needs: Docker Hub (anonymous pulls are rate limited), ECR Public, or a private ECR registry
(the build logs in to the config's own registry only, so a base image there, such as an ECR pull-through cache of
Docker Hub, needs pull rights on its repository,
https://docs.aws.amazon.com/AmazonECR/latest/userguide/pull-through-cache.html)."""

from __future__ import annotations

import re
from typing import NamedTuple

PRIVATE_ECR = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
DOCKER_HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")


class BaseImage(NamedTuple):
    """A base image reference taken apart: registry host (docker.io for Docker Hub) and repository path."""

    registry: str
    repository: str

    @property
    def on_docker_hub(self) -> bool:
        return self.registry in DOCKER_HUB_HOSTS

    def private_ecr(self) -> tuple[str, str] | None:
        """(account, region) where the registry is a private ECR one."""
        found = PRIVATE_ECR.match(self.registry)
        return (found["account"], found["region"]) if found else None


def base_image(reference: str) -> BaseImage:
    """`python@sha256:…` → (docker.io, library/python); `public.ecr.aws/x/y@sha256:…` → (public.ecr.aws, x/y). The first
    path part names a registry only when it holds a dot or a colon, or is localhost (Docker's own rule)."""
    name = reference.split("@", 1)[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return BaseImage(first, rest)
    return BaseImage("docker.io", name if rest else f"library/{name}")


def base_image_problem(reference: str, *, account: str, region: str) -> str | None:
    """Why CodeBuild could not pull this base image, or None: the build logs in to the config's own ECR
    registry only."""
    image = base_image(reference)
    owner = image.private_ecr()
    if owner is None or owner == (account, region):
        return None
    return (f"image.base_image {reference} is in the private ECR registry {image.registry}, but the image build logs "
            f"in to {account}.dkr.ecr.{region}.amazonaws.com only; copy the image into that registry (or point an ECR "
            "pull-through cache rule there), or use a public registry such as public.ecr.aws")


def docker_hub_note(reference: str) -> str | None:
    """The warning a build from Docker Hub gets: CodeBuild's shared addresses meet its anonymous pull rate limit."""
    if not base_image(reference).on_docker_hub:
        return None
    return ("the base image comes from Docker Hub, whose anonymous pulls are rate limited per address (CodeBuild's are "
            "shared, so builds can fail with toomanyrequests): use the same image from ECR Public where it is "
            "mirrored, or an ECR pull-through cache in this registry (README, First run on AWS)")
