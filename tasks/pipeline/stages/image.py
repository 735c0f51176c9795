"""image: build (or find, by content) the serving image and pin it by digest (local: the server's source tree).

A serverless placement takes a container image of at most 10 GB
(https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html, `SERVERLESS_IMAGE_MAX_BYTES`). Where the
backend knows the image's size (aws: ECR's `imageSizeInBytes`) and it is over that, the stage refuses with
ConfigError before it returns, so the ledger records no image and nothing is deployed. ECR's size is the COMPRESSED
size of the layers (https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_ImageDetail.html), so an image over
the limit compressed is surely refused; one under it compressed may still be over it uncompressed, and AWS then
refuses it at CreateEndpoint. An unknown size (local images, published images) is not checked.
"""

from __future__ import annotations

from shiplift.tasks.backends.placement import image_size_problem
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.ledger.stage_results import ImageResult


def run(ctx) -> ImageResult:
    ref = ctx.backends.images.build(ctx.config.image, progress=ctx.say)
    problem = image_size_problem(ref.size_bytes, ctx.config.placement)
    if problem:
        raise ConfigError(f"image: placement is serverless, but {problem}; {ref.uri} is not deployed",
                          fix="make the serving image smaller (a slimmer image.base_image, fewer packages in "
                              f"images/{ref.name}), or use an instance placement (placement.kind: instance_type or "
                              "instance_pool) instead")
    sized = {"size_bytes": ref.size_bytes} if ref.size_bytes is not None else {}
    return ImageResult(image_uri=ref.uri, image_digest=ref.digest, base_image=ref.base_image, files=ref.files,
                       source_sha256=ref.source_sha256, **sized)
