"""The serverless image-size refusal: `tasks.backends.placement.image_size_problem` alone, and the image stage that
raises it.

SageMaker Serverless Inference: "The maximum size of the container image you can use is 10 GB"
(https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html, Container support). ECR's
imageSizeInBytes, which the aws image builder reports as `ImageRef.size_bytes`, is the compressed size of the layers
(https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_ImageDetail.html).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from shiplift.tasks.backends.interfaces import ImageRef
from shiplift.tasks.backends.placement import (
    SERVERLESS_IMAGE_MAX_BYTES,
    InstanceTypePlacement,
    ServerlessPlacement,
    image_size_problem,
)
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.pipeline.stages import image as image_stage

SERVERLESS = ServerlessPlacement(kind="serverless", memory_size_mb=2048, max_concurrency=2, cold_starts=1,
                                 max_cold_start_p95_s=60)
INSTANCE = InstanceTypePlacement(kind="instance_type", instance_type="ml.m5.large")
DIGEST = "sha256:" + "a" * 64


def test_the_limit_is_the_larger_reading_of_10_gb():
    # serverless-endpoints.html says "10 GB" without saying decimal or binary; the refusal must be sure, so 10 GiB
    assert SERVERLESS_IMAGE_MAX_BYTES == 10 * 1024**3 == 10_737_418_240


def test_an_image_at_the_limit_is_taken():
    assert image_size_problem(SERVERLESS_IMAGE_MAX_BYTES, SERVERLESS) is None
    assert image_size_problem(0, SERVERLESS) is None


def test_an_image_just_over_the_limit_is_refused_naming_its_size_and_the_limit():
    problem = image_size_problem(SERVERLESS_IMAGE_MAX_BYTES + 1, SERVERLESS)
    assert problem is not None
    assert "10,737,418,241 bytes" in problem and "10,737,418,240 bytes (10 GiB)" in problem
    assert "https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html" in problem


def test_an_unknown_size_is_not_checked():
    assert image_size_problem(None, SERVERLESS) is None


def test_an_instance_placement_is_not_held_to_the_serverless_limit():
    assert image_size_problem(SERVERLESS_IMAGE_MAX_BYTES * 3, INSTANCE) is None


def test_a_local_image_has_no_size():
    """A local image is a server's source tree, not a container: no size to check."""
    from shiplift.tasks.backends.image_source import pin_image_source
    from shiplift.tasks.config import load_release_config

    config = load_release_config(Path(__file__).resolve().parents[2] / "configs" / "releases" / "gemma-decision.yaml")
    assert pin_image_source(config.image.kind, config.image.base_image).size_bytes is None


class Images:
    def __init__(self, size_bytes):
        self.size_bytes = size_bytes

    def build(self, image, *, progress):
        return ImageRef(name="encoder", uri=f"123456789012.dkr.ecr.us-east-1.amazonaws.com/shiplift/encoder@{DIGEST}",
                        digest=DIGEST, base_image="python@" + DIGEST, files=3, size_bytes=self.size_bytes)


def stage_ctx(size_bytes, placement):
    return SimpleNamespace(backends=SimpleNamespace(images=Images(size_bytes)),
                           config=SimpleNamespace(image=None, placement=placement), say=lambda message: None)


def test_the_image_stage_refuses_an_over_limit_image_on_a_serverless_placement_with_the_fix():
    with pytest.raises(ConfigError, match="placement is serverless") as refused:
        image_stage.run(stage_ctx(SERVERLESS_IMAGE_MAX_BYTES + 1, SERVERLESS))
    assert "smaller" in refused.value.fix and "placement.kind: instance_type or instance_pool" in refused.value.fix


@pytest.mark.parametrize("size_bytes, placement", [(SERVERLESS_IMAGE_MAX_BYTES, SERVERLESS), (None, SERVERLESS),
                                                   (SERVERLESS_IMAGE_MAX_BYTES + 1, INSTANCE)])
def test_the_image_stage_records_an_image_within_the_limit_or_of_unknown_size(size_bytes, placement):
    result = image_stage.run(stage_ctx(size_bytes, placement))
    assert result.image_digest == DIGEST and result.files == 3
