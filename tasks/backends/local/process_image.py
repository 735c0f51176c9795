"""The local backend's serving images (DESIGN §3): an image is its server's source tree, run as a process.

`LocalImageBuilder` pins `images/<name>/` by the digest of its files (`tasks.backends.image_source`); a published image
(the llama.cpp DLC) is stood in for by its local folder, pinned the same way. The local hosting runs that folder's
`server.py` with this interpreter.
"""

from __future__ import annotations

import re

from shiplift.tasks.backends.image_source import image_listing, pin_image_source
from shiplift.tasks.backends.interfaces import ImageRef, Progress
from shiplift.tasks.errors import BadInput, ConfigError
from shiplift.tasks.families.base import AdoptedImageConfig
from shiplift.tasks.hashing import sha256_json
from shiplift.tasks.project import IMAGES_DIR


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
        if isinstance(image, AdoptedImageConfig):
            ref = adopt_local_image(image)
            progress(f"image: {ref.uri} (local stand-in of {ref.base_image}, {ref.files} files)")
        else:
            ref = pin_image_source(image.kind, image.base_image)
            progress(f"image: {ref.uri} ({ref.files} files)")
        return ref


def local_image_kind(image_uri: str) -> str:
    """The image folder a local process image runs (`local/<kind>@sha256:…`); BadInput for any other image."""
    match = re.match(r"^local/([a-z0-9_-]+)@sha256:[0-9a-f]{64}$", image_uri)
    if not match or not (IMAGES_DIR / match[1] / "server.py").is_file():
        raise BadInput(f"{image_uri!r} is not a local process image",
                       fix="the local backend runs images built by LocalImageBuilder")
    return match[1]


