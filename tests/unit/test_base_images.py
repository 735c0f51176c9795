"""Where CodeBuild pulls a base image from: Docker's own rule for the registry part of a reference, Docker Hub's rate
limit noted, a private ECR registry other than the config's refused."""

from __future__ import annotations

import pytest

from shiplift.tasks.backends.aws.base_images import base_image, base_image_problem, docker_hub_note

DIGEST = "@sha256:" + "ab" * 32


@pytest.mark.parametrize("reference, registry, repository", [
    ("python" + DIGEST, "docker.io", "library/python"),  # an official image: Docker Hub's library/
    ("nvidia/cuda" + DIGEST, "docker.io", "nvidia/cuda"),  # "nvidia" has no dot or colon: a Docker Hub namespace
    ("docker.io/nvidia/cuda" + DIGEST, "docker.io", "nvidia/cuda"),
    ("public.ecr.aws/deep-learning-containers/llama-cpp" + DIGEST, "public.ecr.aws",
     "deep-learning-containers/llama-cpp"),
    ("localhost/base" + DIGEST, "localhost", "base"),
    ("registry.example:5000/team/base" + DIGEST, "registry.example:5000", "team/base"),
    ("123456789012.dkr.ecr.eu-west-1.amazonaws.com/docker-hub/nvidia/cuda" + DIGEST,
     "123456789012.dkr.ecr.eu-west-1.amazonaws.com", "docker-hub/nvidia/cuda"),
])
def test_the_registry_of_a_reference_follows_dockers_rule(reference, registry, repository):
    assert base_image(reference) == (registry, repository)


def test_docker_hub_images_get_the_rate_limit_note_and_others_do_not():
    assert "rate limited" in docker_hub_note("nvidia/cuda" + DIGEST) and "ECR Public" in docker_hub_note("python"
                                                                                                         + DIGEST)
    assert docker_hub_note("public.ecr.aws/docker/library/python" + DIGEST) is None


def test_only_the_configs_own_private_registry_is_pullable():
    own = "123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub/python" + DIGEST
    assert base_image_problem(own, account="123456789012", region="us-east-1") is None
    assert base_image_problem("python" + DIGEST, account="123456789012", region="us-east-1") is None
    problem = base_image_problem(own, account="123456789012", region="eu-west-1")
    assert "logs in to 123456789012.dkr.ecr.eu-west-1.amazonaws.com only" in problem and "pull-through cache" in problem
