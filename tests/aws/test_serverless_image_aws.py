"""The serverless image-size refusal on the aws backend, against the AWS double: a serverless release whose image ECR
reports over 10 GB is refused at the image stage (ConfigError, nothing recorded as done, nothing deployed); one within
the limit passes.

What the tests rely on:
- SageMaker Serverless Inference takes a container image of at most 10 GB
  (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html, "Container support").
- ECR DescribeImages reports `imageSizeInBytes`, the size of the image in the repository: the layers as pushed
  (compressed), for a manifest list the largest manifest's
  (https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_ImageDetail.html). The double's simulated build
  pushes layers that sum to `image_bytes` and answers that sum, as a botocore `ImageDetail` (`ImageSizeInBytes`, long).
"""

from __future__ import annotations

import pytest
from botocore.validate import ParamValidator

from shiplift.tasks.backends.aws.service_model import service_model
from shiplift.tasks.backends.placement import SERVERLESS_IMAGE_MAX_BYTES
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.pipeline.release import begin_orchestrated, reopen_release, run_orchestrated_stage

QUIET = lambda message: None  # noqa: E731
# a CPU image (serverless has no GPUs), one cold start (the only sure one on SageMaker), no copies
SERVERLESS = {"kind": "serverless", "memory_size_mb": 6144, "max_concurrency": 2, "cold_starts": 1,
              "max_cold_start_p95_s": 120}
CHANGES = {"placement": SERVERLESS, "image__n_gpu_layers": 0, "rollout__copies": 1}


def opened(aws_release, tiny_release, tmp_path):
    path = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", **CHANGES)
    begun = begin_orchestrated(path, holder="test", progress=QUIET)

    def run(stage):
        return run_orchestrated_stage(begun["release_id"], stage, ledger_url=begun["ledger_url"], progress=QUIET)

    for stage in ("resolve", "build", "package"):
        run(stage)
    return begun, run


def ecr_detail(aws, aws_release) -> dict:
    """The one image in the repository as DescribeImages answers it, checked against botocore's output shape."""
    answer = aws.client("ecr").describe_images(repositoryName=aws_release.REPOSITORY)
    answer.pop("ResponseMetadata", None)
    shape = service_model("ecr").operation_model("DescribeImages").output_shape
    report = ParamValidator().validate(answer, shape)
    assert not report.has_errors(), report.generate_report()
    [detail] = answer["imageDetails"]
    return detail


def test_a_serverless_image_over_10_gb_in_ecr_is_refused_at_the_image_stage(aws, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    # one byte over 10 GiB compressed: over the page's "10 GB" read either way (serverless-endpoints.html)
    aws.scenario(image_bytes=SERVERLESS_IMAGE_MAX_BYTES + 1)
    begun, run = opened(aws_release, tiny_release, tmp_path)
    with pytest.raises(ConfigError, match="placement is serverless") as refused:
        run("image")
    assert f"{SERVERLESS_IMAGE_MAX_BYTES + 1:,} bytes" in refused.value.problem
    assert f"{SERVERLESS_IMAGE_MAX_BYTES:,} bytes (10 GiB)" in refused.value.problem
    assert "instance_type or instance_pool" in refused.value.fix
    # ECR said so (imageSizeInBytes: the compressed layers, API_ImageDetail.html)
    assert ecr_detail(aws, aws_release)["imageSizeInBytes"] > SERVERLESS_IMAGE_MAX_BYTES
    # bad input changes nothing: the ledger has no image and no deploy, and SageMaker got no request
    state = reopen_release(begun["release_id"], ledger_url=begun["ledger_url"], progress=QUIET).state
    assert state.stage("image")["status"] == "failed"
    assert state.stage("deploy_candidate")["status"] == "pending"
    assert [c.operation for c in aws.calls if c.mutating] == []


def test_a_serverless_image_within_10_gb_in_ecr_passes_the_image_stage(aws, aws_release, tiny_release, tmp_path):
    from shiplift.tasks.backends.registry import make_backends
    from shiplift.tasks.config import load_release_config

    aws_release.prepare_account(aws)
    # at the limit, 10 GiB compressed: not surely over "10 GB" (serverless-endpoints.html), so not refused here
    aws.scenario(image_bytes=SERVERLESS_IMAGE_MAX_BYTES)
    begun, run = opened(aws_release, tiny_release, tmp_path)
    result = run("image")
    detail = ecr_detail(aws, aws_release)
    assert detail["imageSizeInBytes"] == SERVERLESS_IMAGE_MAX_BYTES and result["image_digest"] == detail["imageDigest"]
    assert result["size_bytes"] == detail["imageSizeInBytes"], "the image stage records the size it checked"
    # the builder reports ECR's size (found by its content tag now, no second build)
    config = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state",
                                                              **CHANGES))
    ref = make_backends(config).images.build(config.image, progress=QUIET)
    assert (ref.digest, ref.size_bytes) == (detail["imageDigest"], SERVERLESS_IMAGE_MAX_BYTES)
