"""Serving images: the local "process image" and the digest pinning rules (DESIGN §3, §6.1).

Locally an image is the server's source tree: its folder `images/<name>` plus the shared
`images/common` every image copies in (the Docker build context is `images/`). Its digest is
the sha256 of the sorted (path, file sha256) list plus the pinned base image, so any change to
the server or to the shared module changes the digest and therefore every name derived from it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tasks.errors import BadInput, ConfigError
from tasks.hashing import sha256_json, tree_listing
from tasks.project import IMAGES_DIR
from tasks.backends.interfaces import IMAGE_BY_DIGEST, ImageRef, Progress

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


def build_local_image(name: str, base_image: str) -> ImageRef:
    """Pin the process image `images/<name>/`; every FROM in its Dockerfile must be a digest."""
    check_image_folder(name, base_image)
    listing = image_listing(name)
    digest = sha256_json({"base_image": base_image, "files": listing})
    return ImageRef(name=name, uri=f"local/{name}@sha256:{digest}", digest=f"sha256:{digest}", base_image=base_image,
                    files=len(listing), source_sha256=digest)


def adopt_local_image(image) -> ImageRef:
    """Pin the local stand-in `images/<kind>/` of a published image (`AdoptedImageConfig`): its digest covers the
    stand-in's files and the published reference it stands in for, which the ImageRef's `base_image` records."""
    if not (IMAGES_DIR / image.kind / "server.py").is_file():
        raise ConfigError(f"image {image.kind!r} has no local stand-in at {IMAGES_DIR / image.kind / 'server.py'}",
                          fix=f"restore images/{image.kind}/ from the repository")
    stands_in_for = f"{image.repository}:{image.tag}" + (f"@{image.digest}" if image.digest else "")
    listing = image_listing(image.kind)
    digest = sha256_json({"stands_in_for": stands_in_for, "files": listing})
    return ImageRef(name=image.kind, uri=f"local/{image.kind}@sha256:{digest}", digest=f"sha256:{digest}",
                    base_image=stands_in_for, files=len(listing), source_sha256=digest)


class LocalImageBuilder:
    """The local backend's image builder: the server source tree is the image (DESIGN §3); a published image's
    stand-in is pinned the same way."""

    def build(self, image, *, progress: Progress) -> ImageRef:
        from tasks.families.base import AdoptedImageConfig

        if isinstance(image, AdoptedImageConfig):
            ref = adopt_local_image(image)
            progress(f"image: {ref.uri} (local stand-in of {ref.base_image}, {ref.files} files)")
        else:
            ref = build_local_image(image.kind, image.base_image)
            progress(f"image: {ref.uri} ({ref.files} files)")
        return ref


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


def local_image_kind(image_uri: str) -> str:
    """The image folder a local process image runs (`local/<kind>@sha256:…`); BadInput for any other image."""
    match = re.match(r"^local/([a-z0-9_-]+)@sha256:[0-9a-f]{64}$", image_uri)
    if not match or not (IMAGES_DIR / match[1] / "server.py").is_file():
        raise BadInput(f"{image_uri!r} is not a local process image", fix="the local backend runs images built by LocalImageBuilder")
    return match[1]


def server_command(name: str) -> list[str]:
    """How the local backend runs an image: this interpreter on the image's own server.py."""
    return [sys.executable, str(IMAGES_DIR / name / "server.py")]
