"""`shiplift iam`: least-privilege IAM policies for the pipeline role, the SageMaker execution role and
the CodeBuild role of one aws config, scoped to its bucket prefix, repository, project and resource prefix.

`OPERATIONS` lists every AWS operation the aws backend can send, with the IAM action it needs and the
resource it touches, and `CHECKPOINT_OPERATIONS` what ledger checkpoints send to their bucket and secret
(configs with `backend.checkpoints`); the policies are generated from them, `iam_request` maps any
request (a dry-run line, a call the double saw) onto the (action, resource ARN) pairs IAM evaluates, and
the tests check both directions: each request is allowed, and nothing is granted on `*` unless the
action has no resource-level permissions (the List* calls, GetMetricData, GetAuthorizationToken).
"""

from __future__ import annotations

from typing import Any

from tasks.backends.aws.checkpoints import ARN_SUFFIX

# operation -> (IAM action, resource kind); kinds are resolved by `Scope.arn`
OPERATIONS: dict[tuple[str, str], tuple[str, str]] = {
    ("s3", "HeadBucket"): ("s3:ListBucket", "bucket"),
    ("s3", "ListObjectsV2"): ("s3:ListBucket", "bucket"),
    **{("s3", op): ("s3:PutObject", "object") for op in ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")},
    ("s3", "AbortMultipartUpload"): ("s3:AbortMultipartUpload", "object"),
    ("s3", "HeadObject"): ("s3:GetObject", "object"),
    ("s3", "GetObject"): ("s3:GetObject", "object"),
    ("ecr", "DescribeRepositories"): ("ecr:DescribeRepositories", "repository"),
    ("ecr", "DescribeImages"): ("ecr:DescribeImages", "repository"),
    **{("codebuild", op): (f"codebuild:{op}", "project")
       for op in ("BatchGetProjects", "CreateProject", "UpdateProject", "StartBuild", "BatchGetBuilds", "ListBuildsForProject")},
    **{("sagemaker", op): (f"sagemaker:{op}", kind) for op, kind in (
        ("CreateModel", "model"), ("DescribeModel", "model"), ("DeleteModel", "model"),
        ("CreateEndpointConfig", "endpoint-config"), ("DescribeEndpointConfig", "endpoint-config"),
        ("DeleteEndpointConfig", "endpoint-config"),
        ("CreateEndpoint", "endpoint"), ("DescribeEndpoint", "endpoint"), ("UpdateEndpoint", "endpoint"), ("DeleteEndpoint", "endpoint"),
        ("CreateInferenceComponent", "inference-component"), ("DescribeInferenceComponent", "inference-component"),
        ("UpdateInferenceComponent", "inference-component"), ("DeleteInferenceComponent", "inference-component"),
        ("AddTags", "tagged"), ("ListTags", "tagged"),
        ("ListModels", "*"), ("ListEndpointConfigs", "*"), ("ListEndpoints", "*"), ("ListInferenceComponents", "*"),
        ("CreateModelPackageGroup", "model-package-group"), ("DescribeModelPackageGroup", "model-package-group"),
        ("CreateModelPackage", "model-package"), ("DescribeModelPackage", "model-package"),
        ("UpdateModelPackage", "model-package"), ("ListModelPackages", "*"))},
    ("sagemaker-runtime", "InvokeEndpoint"): ("sagemaker:InvokeEndpoint", "endpoint"),
    ("sts", "GetCallerIdentity"): ("sts:GetCallerIdentity", "none"),
    ("cloudwatch", "GetMetricData"): ("cloudwatch:GetMetricData", "*"),
    ("cloudwatch", "DescribeAlarms"): ("cloudwatch:DescribeAlarms", "alarm"),
    ("cloudwatch", "ListTagsForResource"): ("cloudwatch:ListTagsForResource", "alarm"),
    ("cloudwatch", "DeleteAlarms"): ("cloudwatch:DeleteAlarms", "alarm"),
    ("cloudwatch", "PutMetricAlarm"): ("cloudwatch:PutMetricAlarm", "alarm"),
    ("cloudwatch", "PutMetricData"): ("cloudwatch:PutMetricData", "gate-metric"),
    ("application-autoscaling", "DescribeScalableTargets"): ("application-autoscaling:DescribeScalableTargets", "*"),
    ("application-autoscaling", "DescribeScalingPolicies"): ("application-autoscaling:DescribeScalingPolicies", "*"),
    ("application-autoscaling", "DeleteScalingPolicy"): ("application-autoscaling:DeleteScalingPolicy", "scalable-target"),
    ("application-autoscaling", "DeregisterScalableTarget"): ("application-autoscaling:DeregisterScalableTarget", "scalable-target"),
}
# What signing and verifying ledger checkpoints (tasks.backends.aws.checkpoints) sends to the checkpoint bucket, under its
# prefix, and to the key's secret: operation -> (IAM actions, resource kind). Each GetObject there names a VersionId
# (s3:GetObjectVersion, not s3:GetObject) and each PutObject sets a retention (s3:PutObjectRetention as well).
# Nothing deletes, and nothing may bypass a GOVERNANCE retention.
CHECKPOINT_OPERATIONS: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("s3", "HeadBucket"): (("s3:ListBucket",), "checkpoint-bucket"),
    ("s3", "GetObjectLockConfiguration"): (("s3:GetBucketObjectLockConfiguration",), "checkpoint-bucket"),
    ("s3", "ListObjectVersions"): (("s3:ListBucketVersions",), "checkpoint-bucket"),
    ("s3", "GetObject"): (("s3:GetObjectVersion",), "checkpoint-object"),
    ("s3", "PutObject"): (("s3:PutObject", "s3:PutObjectRetention"), "checkpoint-object"),
    ("secretsmanager", "GetSecretValue"): (("secretsmanager:GetSecretValue",), "checkpoint-key"),
}
# Actions AWS authorizes only on "*" (no resource-level permissions), per the Service Authorization Reference.
UNSCOPABLE = frozenset({
    "sagemaker:ListModels", "sagemaker:ListEndpointConfigs", "sagemaker:ListEndpoints", "sagemaker:ListInferenceComponents",
    "sagemaker:ListModelPackages",
    "cloudwatch:GetMetricData", "application-autoscaling:DescribeScalableTargets",
    "application-autoscaling:DescribeScalingPolicies", "ecr:GetAuthorizationToken", "cloudwatch:PutMetricData",
})
# a create with Tags also tags what it creates
ALSO_NEEDED = {"cloudwatch:PutMetricAlarm": ("cloudwatch:TagResource",), "sagemaker:CreateModelPackageGroup": ("sagemaker:AddTags",),
               "sagemaker:CreateModelPackage": ("sagemaker:AddTags",)}
# operation -> (IAM actions, resource kind), the shape of CHECKPOINT_OPERATIONS
NEEDED = {operation: ((action, *ALSO_NEEDED.get(action, ())), kind) for operation, (action, kind) in OPERATIONS.items()}
GATE_NAMESPACE = "shiplift/Rollout"  # where the online gate's verdict is published (tasks.backends.aws.hosting)
SAGEMAKER_KINDS = ("model", "endpoint-config", "endpoint", "inference-component")
SECRET_SUFFIX = "??????"  # Secrets Manager appends "-" and six random characters to a secret's name in its ARN


class Scope:
    """The ARNs one aws config may touch: its bucket prefix, repository, project, resource-prefix names, roles and
    (with `backend.checkpoints`) the checkpoint bucket's prefix and the signing key's secret."""

    def __init__(self, config):
        backend = config.backend
        self.region, self.account = backend.region, backend.account_id
        self.partition = "aws-cn" if self.region.startswith("cn-") else "aws-us-gov" if self.region.startswith("us-gov-") else "aws"
        self.bucket, self.key_prefix, self.backend = backend.bucket, backend.key_prefix, backend
        self.prefix, self.checkpoints = config.resource_prefix, backend.checkpoints

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

    def arns(self, kind: str) -> list[str]:
        """The resource ARNs (wildcards within shiplift's names) a policy statement grants on."""
        checkpoints = self.checkpoints
        return {
            "bucket": [f"arn:{self.partition}:s3:::{self.bucket}"],
            "object": [f"arn:{self.partition}:s3:::{self.bucket}/{self.key_prefix}/*"],
            "repository": [f"{self.base('ecr')}:repository/{self.backend.ecr_repository}"],
            "project": [f"{self.base('codebuild')}:project/{self.backend.codebuild_project}"],
            "tagged": [self.sagemaker(kind, f"{self.prefix}-*") for kind in SAGEMAKER_KINDS],
            "alarm": [f"{self.base('cloudwatch')}:alarm:{self.prefix}-*"],
            "scalable-target": [f"{self.base('application-autoscaling')}:scalable-target/*"],
            "*": ["*"],
            "gate-metric": ["*"],  # PutMetricData has no resources; the statement's condition names the namespace
            **({"checkpoint-bucket": [f"arn:{self.partition}:s3:::{checkpoints.bucket}"],
                "checkpoint-object": [f"arn:{self.partition}:s3:::{checkpoints.bucket}/{checkpoints.prefix}/*"],
                "checkpoint-key": [self.secret(checkpoints.key_ref)]} if checkpoints else {}),
        }.get(kind) or [self.sagemaker(kind, f"{self.prefix}-*")]

    def needs(self, service: str, operation: str, params: dict[str, Any]) -> tuple[tuple[str, ...], str]:
        """The IAM actions and resource kind of a request: `CHECKPOINT_OPERATIONS`'s for one to the checkpoint bucket
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
        if kind == "repository":
            return f"{self.base('ecr')}:repository/{params.get('repositoryName') or params['repositoryNames'][0]}"
        if kind == "project":
            project = params.get("name") or params.get("projectName") or (params.get("names") or params.get("ids"))[0]
            return f"{self.base('codebuild')}:project/{project.split(':')[0]}"
        if kind == "tagged":
            return params["ResourceArn"].lower() if "ResourceArn" in params else self.sagemaker("model", "?")
        if kind == "model-package-group":
            return self.sagemaker(kind, params["ModelPackageGroupName"])
        if kind == "model-package":  # a version's ARN is model-package/<group>/<version>
            named = params.get("ModelPackageArn") or params.get("ModelPackageName") or f"{params['ModelPackageGroupName']}/?"
            return named.lower() if named.startswith("arn:") else self.sagemaker(kind, named)
        if kind in SAGEMAKER_KINDS:
            field = {"model": "ModelName", "endpoint-config": "EndpointConfigName", "endpoint": "EndpointName",
                     "inference-component": "InferenceComponentName"}[kind]
            return self.sagemaker(kind, params[field])
        if kind == "alarm":
            name = params.get("AlarmName") or (params.get("AlarmNames") or [params.get("AlarmNamePrefix", "")])[0]
            return f"{self.base('cloudwatch')}:alarm:{name}"
        return "*"


def _statement(sid: str, actions: list[str], resources: list[str], condition: dict | None = None) -> dict:
    statement = {"Sid": sid, "Effect": "Allow", "Action": sorted(set(actions)), "Resource": resources}
    if condition:
        statement["Condition"] = condition
    return statement


def pipeline_policy(config) -> dict:
    """What the worker running the stages (CLI, Airflow, ECS task) needs, and nothing else."""
    scope = Scope(config)
    by_kind: dict[str, list[str]] = {}
    for actions, kind in [*NEEDED.values(), *(CHECKPOINT_OPERATIONS.values() if scope.checkpoints else ())]:
        if kind != "none":
            by_kind.setdefault(kind, []).extend(actions)
    statements = []
    for kind, actions in sorted(by_kind.items()):
        # scalable-target ARNs are random ids, so that statement covers the account's targets; the product only
        # touches targets of endpoints and components that carry shiplift's tag (SageMakerHosting._scaling)
        sid = "".join(part.title() for part in kind.replace("*", "unscopable").split("-"))
        condition = {"StringEquals": {"cloudwatch:namespace": GATE_NAMESPACE}} if kind == "gate-metric" else None
        statements.append(_statement(sid, actions, scope.arns(kind), condition))
    passed = [(config.backend.execution_role_arn, "sagemaker.amazonaws.com"), (config.backend.codebuild_role_arn, "codebuild.amazonaws.com")]
    for arn, service in passed:
        statements.append(_statement(f"PassRoleTo{service.split('.')[0].title()}", ["iam:PassRole"], [arn],
                                     {"StringEquals": {"iam:PassedToService": service}}))
    if config.backend.kms_key_id:  # SSE-KMS for artifacts and, with the same key, checkpoints
        statements.append(_statement("ArtifactKey", ["kms:GenerateDataKey", "kms:Decrypt"], [_kms_arn(scope, config.backend.kms_key_id)]))
    return {"Version": "2012-10-17", "Statement": statements}


def execution_role_policy(config) -> dict:
    """What SageMaker needs to run the release's containers: read artifacts, pull the image, write logs and metrics."""
    scope = Scope(config)
    statements = [
        _statement("ReadArtifacts", ["s3:GetObject"], [f"arn:{scope.partition}:s3:::{scope.bucket}/{scope.key_prefix}/artifacts/*"]),
        _statement("PullServingImage", ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
                   scope.arns("repository")),
        _statement("EcrLogin", ["ecr:GetAuthorizationToken"], ["*"]),
        _statement("EndpointLogs", ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                   [f"{scope.base('logs')}:log-group:/aws/sagemaker/Endpoints/{scope.prefix}-*",
                    f"{scope.base('logs')}:log-group:/aws/sagemaker/InferenceComponents/{scope.prefix}-*"]),
        _statement("EndpointMetrics", ["cloudwatch:PutMetricData"], ["*"],
                   {"StringEquals": {"cloudwatch:namespace": ["AWS/SageMaker", "/aws/sagemaker/Endpoints"]}}),
    ]
    if config.backend.kms_key_id:
        statements.append(_statement("ArtifactKey", ["kms:Decrypt"], [_kms_arn(scope, config.backend.kms_key_id)]))
    return {"Version": "2012-10-17", "Statement": statements}


def codebuild_role_policy(config) -> dict:
    """What the image build needs: read its source zip, write image-detail.json, push to the one repository, log."""
    scope = Scope(config)
    objects = f"arn:{scope.partition}:s3:::{scope.bucket}/{scope.key_prefix}"
    return {"Version": "2012-10-17", "Statement": [
        _statement("ReadSource", ["s3:GetObject", "s3:GetObjectVersion"], [f"{objects}/image-sources/*"]),
        _statement("WriteImageDetail", ["s3:PutObject"], [f"{objects}/image-builds/*"]),
        _statement("PushImage", ["ecr:BatchCheckLayerAvailability", "ecr:InitiateLayerUpload", "ecr:UploadLayerPart",
                                 "ecr:CompleteLayerUpload", "ecr:PutImage", "ecr:DescribeImages", "ecr:BatchGetImage"],
                   scope.arns("repository")),
        _statement("EcrLogin", ["ecr:GetAuthorizationToken"], ["*"]),
        _statement("BuildLogs", ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                   [f"{scope.base('logs')}:log-group:/aws/codebuild/{config.backend.codebuild_project}*"]),
        *([_statement("ArtifactKey", ["kms:Decrypt", "kms:GenerateDataKey"], [_kms_arn(scope, config.backend.kms_key_id)])]
          if config.backend.kms_key_id else []),
    ]}


def trust_policy(service: str) -> dict:
    """Who may assume the role: one AWS service."""
    return {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]}


def _kms_arn(scope: Scope, key: str) -> str:
    if key.startswith("arn:"):
        return key
    return f"{scope.base('kms')}:{key if key.startswith('alias/') else 'key/' + key}"


def policies(config) -> dict[str, dict]:
    """Every document `shiplift iam` writes, by file name."""
    return {
        "pipeline-policy.json": pipeline_policy(config),
        "sagemaker-execution-policy.json": execution_role_policy(config),
        "sagemaker-execution-trust.json": trust_policy("sagemaker.amazonaws.com"),
        "codebuild-policy.json": codebuild_role_policy(config),
        "codebuild-trust.json": trust_policy("codebuild.amazonaws.com"),
    }


def iam_request(scope: Scope, service: str, operation: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (IAM action, resource ARN) a request needs; none for calls that need no permission (GetCallerIdentity)."""
    actions, kind = scope.needs(service, operation, params)
    return [] if kind == "none" else [(action, scope.request_arn(kind, params)) for action in actions]
