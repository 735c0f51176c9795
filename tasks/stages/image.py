"""image: pin the serving image by digest (local: the server's own source tree)."""

from __future__ import annotations

from tasks.images import build_local_image


def run(ctx) -> dict:
    ref = build_local_image(ctx.config.image.kind, ctx.config.image.base_image)
    ctx.say(f"image: {ref.uri}")
    return {"image_uri": ref.uri, "image_digest": ref.digest, "base_image": ref.base_image, "files": ref.files}
