"""An image's source tree and the digest pinning rules (DESIGN §3, §6.1), shared by both image builders.

An image is built from its folder `images/<name>` plus the shared `images/common` every image copies in (the Docker
build context is `images/`). Its source digest is the sha256 of the sorted (path, file sha256) list plus the pinned
base image, so any change to the server or to the shared module changes the digest and therefore every name derived
from it. Locally that tree is the image itself (`tasks.backends.local.process_image`); on aws CodeBuild builds it and
the digest names the build (`tasks.backends.aws.image_builder`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from shiplift.tasks.backends.interfaces import IMAGE_BY_DIGEST, ImageRef
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.hashing import sha256_json, tree_listing
from shiplift.tasks.project import IMAGES_DIR

SHARED_DIRS = ("common",)  # folders under images/ that every image copies in
FROM_LINE = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)", re.I | re.M)
ARG_DEFAULT = re.compile(r"^\s*ARG\s+(\w+)=(\S+)", re.I | re.M)


def require_digest_pin(reference: str, *, where: str) -> str:
    """Refuse a mutable image reference (tag or bare name); return it unchanged when pinned."""
    if not IMAGE_BY_DIGEST.match(reference):
        raise ConfigError(
            f"{where}: image {reference!r} is not pinned by digest",
            fix="use repo@sha256:<64 hex> (resolve a tag to its digest first)",
        )
    return reference


def dockerfile_base_images(dockerfile: Path) -> list[str]:
    """The FROM references of a Dockerfile with ARG defaults substituted."""
    text = dockerfile.read_text(encoding="utf-8")
    defaults = dict(ARG_DEFAULT.findall(text))
    refs = []
    for raw in FROM_LINE.findall(text):
        refs.append(re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), m.group(0)), raw))
    return refs


def pin_image_source(name: str, base_image: str) -> ImageRef:
    """Pin the source tree of `images/<name>/` (as the local process image it is); every FROM in its Dockerfile must
    be a digest."""
    check_image_folder(name, base_image)
    listing = image_listing(name)
    digest = sha256_json({"base_image": base_image, "files": listing})
    return ImageRef(name=name, uri=f"local/{name}@sha256:{digest}", digest=f"sha256:{digest}", base_image=base_image,
                    files=len(listing), source_sha256=digest)


def check_image_folder(name: str, base_image: str) -> None:
    """The image folder, its Dockerfile's FROM lines and the shared folders are all in place and pinned."""
    image_dir = IMAGES_DIR / name
    dockerfile = image_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise ConfigError(f"image {name!r} has no Dockerfile at {dockerfile}", fix="use an image folder under images/")
    require_digest_pin(base_image, where="image.base_image")
    for ref in dockerfile_base_images(dockerfile):
        require_digest_pin(ref, where=str(dockerfile))
    for folder in SHARED_DIRS:
        if not (IMAGES_DIR / folder).is_dir():
            raise ConfigError(
                f"image {name!r} copies in images/{folder}, which is missing at {IMAGES_DIR / folder}",
                fix=f"restore images/{folder} from the repository",
            )


def image_listing(name: str) -> list[list[str]]:
    """Sorted [path under images/, sha256] of the image's own folder and the shared folders it copies in."""
    return sorted(
        [f"{folder}/{path}", digest]
        for folder in (name, *SHARED_DIRS)
        for path, digest in tree_listing(IMAGES_DIR / folder)
    )


def server_command(name: str) -> list[str]:
    """How the local backend runs an image: this interpreter on the image's own server.py."""
    return [sys.executable, str(IMAGES_DIR / name / "server.py")]
