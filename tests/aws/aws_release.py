"""A tiny release config for the aws backend against the AWS double, and the account it needs (bucket, ECR
repository)."""

from __future__ import annotations

from pathlib import Path

import yaml

ACCOUNT = "123456789012"
BUCKET = "shiplift-test-artifacts"
REPOSITORY = "shiplift/semif"
POOLS = [{"instance_type": "ml.g6e.xlarge", "priority": 1}, {"instance_type": "ml.g6.2xlarge", "priority": 2},
         {"instance_type": "ml.g5.2xlarge", "priority": 3}]


def prepare_account(double, *, tag_mutability: str = "IMMUTABLE") -> None:
    """What an operator creates once (README, On AWS): the artifact bucket and the image repository."""
    double.client("s3").create_bucket(Bucket=BUCKET)
    double.client("ecr").create_repository(repositoryName=REPOSITORY, imageTagMutability=tag_mutability)


def write_aws_config(tiny_release, folder: Path, state_dir: Path, *, name: str = "tiny-aws",
                     placement: dict | None = None, **changes) -> Path:
    """The tiny decision release (generated GGUF, 32 tasks) on the aws backend, polling fast, ledger in SQLite."""
    path = tiny_release.write_tiny_config(folder, state_dir, name=name, **changes)
    tree = yaml.safe_load(path.read_text())
    tree["backend"] = {
        "kind": "aws", "region": "us-east-1", "bucket": BUCKET, "key_prefix": "shiplift",
        "execution_role_arn": f"arn:aws:iam::{ACCOUNT}:role/shiplift-sagemaker-execution",
        "ecr_repository": REPOSITORY, "codebuild_project": "shiplift-semif-image",
        "codebuild_role_arn": f"arn:aws:iam::{ACCOUNT}:role/shiplift-codebuild",
        "ledger_url": f"sqlite:///{state_dir / 'ledger.db'}", "state_dir": str(state_dir), "poll_s": 0.05,
    }
    # one GPU per pool instance; managed scaling to 4 instances gives a 2-copy production room for its update (4 at
    # once)
    tree["placement"] = placement or {"kind": "instance_pool", "pools": POOLS, "provision_timeout_s": 600,
                                      "max_instance_count": 4,
                                      "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1"}
    tree["image"]["n_gpu_layers"] = -1  # a GPU image (the double runs the same server on the CPU)
    for dotted, value in changes.items():
        node = tree
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(tree))
    return path
