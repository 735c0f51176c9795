"""image: build (or find, by content) the serving image and pin it by digest (local: the server's source tree)."""

from __future__ import annotations

from tasks.ledger.stage_results import ImageResult


def run(ctx) -> ImageResult:
    ref = ctx.backends.images.build(ctx.config.image, progress=ctx.say)
    return ImageResult(image_uri=ref.uri, image_digest=ref.digest, base_image=ref.base_image, files=ref.files,
                       source_sha256=ref.source_sha256)
