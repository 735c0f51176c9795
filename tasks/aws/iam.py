"""`shiplift iam`: least-privilege IAM policies for the pipeline role, the SageMaker execution role and
the CodeBuild role of one aws config, scoped to its bucket prefix, repository, project and resource prefix.

`OPERATIONS` lists every AWS operation the aws backend can send, with the IAM action it needs and the
resource it touches; the policies are generated from it, `iam_request` maps any request (a dry-run
line, a call the double saw) onto (action, resource ARN), and the tests check both directions: each
request is allowed, and nothing is granted on `*` unless the action has no resource-level
permissions (the List* calls, GetMetricData, GetAuthorizationToken).
"""

from __future__ import annotations

from typing import Any

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
GATE_NAMESPACE = "shiplift/Rollout"  # where the online gate's verdict is published (tasks.aws.hosting)
SAGEMAKER_KINDS = ("model", "endpoint-config", "endpoint", "inference-component")


class Scope:
    """The ARNs one aws config may touch: its bucket prefix, repository, project, resource-prefix names and roles."""

    def __init__(self, config):
        backend = config.backend
        self.region, self.account = backend.region, backend.account_id
        self.partition = "aws-cn" if self.region.startswith("cn-") else "aws-us-gov" if self.region.startswith("us-gov-") else "aws"
        self.bucket, self.key_prefix, self.backend = backend.bucket, backend.key_prefix, backend
        self.prefix = config.resource_prefix

    def base(self, service: str) -> str:
        """`arn:<partition>:<service>:<region>:<account>`."""
        return f"arn:{self.partition}:{service}:{self.region}:{self.account}"

    def sagemaker(self, kind: str, name: str = "*") -> str:
        """A SageMaker resource ARN (SageMaker lower-cases names in ARNs)."""
        return f"{self.base('sagemaker')}:{kind}/{name.lower()}"

    def arns(self, kind: str) -> list[str]:
        """The resource ARNs (wildcards within shiplift's names) a policy statement grants on."""
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
        }.get(kind) or [self.sagemaker(kind, f"{self.prefix}-*")]

    def request_arn(self, service: str, operation: str, params: dict[str, Any]) -> str:
        """The ARN one concrete request touches (what IAM evaluates)."""
        kind = OPERATIONS[(service, operation)][1]
        if kind == "bucket":
            return f"arn:{self.partition}:s3:::{params['Bucket']}"
        if kind == "object":
            return f"arn:{self.partition}:s3:::{params['Bucket']}/{params['Key']}"
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
    for action, kind in OPERATIONS.values():
        if kind != "none":
            by_kind.setdefault(kind, []).extend((action, *ALSO_NEEDED.get(action, ())))
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
    if config.backend.kms_key_id:
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


def iam_request(scope: Scope, service: str, operation: str, params: dict[str, Any]) -> tuple[str, str] | None:
    """(IAM action, resource ARN) of a request; None for calls that need no permission (GetCallerIdentity)."""
    action, kind = OPERATIONS[(service, operation)]
    return None if kind == "none" else (action, scope.request_arn(service, operation, params))
