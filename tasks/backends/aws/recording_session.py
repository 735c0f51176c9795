"""A recording, validating boto3 session for the dry run: its clients answer from a model of a fresh account and
send nothing.

`recording_session(plan, account)` is a boto3 Session with dummy credentials (so no credential chain is searched)
whose every call, as botocore receives it, is checked against the installed service model
(`service_model.validate_request`: maximum lengths, enums and patterns too), recorded in the `Plan` under its current
stage, and answered by `FreshAccount` through botocore's `before-call` event (as botocore's Stubber does), never by the
network. `FreshAccount` is a small explicit model of the config's account and region after the README's first-run
steps (its bucket, checkpoint bucket and ECR repository exist) where nothing of the release does: a describe of what
is not created answers the error the backend reads as "not found"; what is created is described back with what was
sent, in its terminal success state (InService, SUCCEEDED), so each wait ends at its first poll (a rolling update at
its second, so that its check of the alarms is seen). Values only AWS or a real build can know (UploadIds, ETags,
build ids, image digests) are deterministic placeholders, registered with the plan so the requests that carry them
say so.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import Any, Callable

from tasks.backends.aws.service_model import validate_request

BODY_SHOWN_BYTES = 1 << 20  # a larger body (a part of a multipart upload) is kept as its printed size only
THEN = datetime(2000, 1, 1, tzinfo=timezone.utc)  # every time the account answers
ANSWER = "shiplift_dry_run_answer"  # where the answer waits in botocore's request context, from parameter build to send


@dataclass
class Request:
    """One request the release would send; `placeholders` names the parameters holding a placeholder, and why."""

    stage: str
    service: str
    operation: str
    params: dict[str, Any]
    placeholders: dict[str, str] = field(default_factory=dict)
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The printed line: stage, service, operation, params (bodies as text or a size), placeholders, note."""
        line: dict[str, Any] = {"stage": self.stage, "service": self.service, "operation": self.operation,
                                "params": _printable(self.params)}
        if self.placeholders:
            line["placeholders"] = self.placeholders
        if self.note:
            line["note"] = self.note
        return line


def _printable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value[:BODY_SHOWN_BYTES]).decode("utf-8", errors="replace")
        return text if text.startswith("{") else f"<{len(value)} bytes>"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def placeholder_hex(what: str, release_id: str) -> str:
    """A deterministic sha256-shaped stand-in for a value only a real build or AWS can know."""
    return hashlib.sha256(f"shiplift-dry-run:{what}:{release_id}".encode()).hexdigest()


class Plan:
    """Collects validated requests and marks every parameter that carries a placeholder value."""

    def __init__(self):
        self.requests: list[Request] = []
        self.stage = "preflight"
        self.placeholders: dict[str, str] = {}  # placeholder text -> what it stands for

    def stand_in(self, value: str, what: str) -> str:
        """Register a placeholder value so every parameter holding it is marked (also in requests recorded before)."""
        self.placeholders[value] = what
        return value

    def add(self, service: str, operation: str, /, *, note: str | None = None, **params: Any) -> Request:
        """Validate and record one request (BadInput naming every problem when the service model refuses it)."""
        validate_request(service, operation, params)
        body = params.get("Body")
        if isinstance(body, (bytes, bytearray)) and len(body) > BODY_SHOWN_BYTES:
            params["Body"] = _printable(body)
        request = Request(self.stage, service, operation, params, note=note)
        self.requests.append(request)
        return request

    def marked(self) -> list[Request]:
        """Every request, each parameter holding a registered placeholder marked with what it stands for."""
        for request in self.requests:
            _mark(request.params, "", self.placeholders, request.placeholders)
        return self.requests


def _mark(value: Any, path: str, placeholders: dict[str, str], marked: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _mark(item, f"{path}.{key}" if path else key, placeholders, marked)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _mark(item, f"{path}[{index}]", placeholders, marked)
    elif isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        found = [what for stand_in, what in placeholders.items() if stand_in in text]
        if found:
            marked[path] = "; ".join(dict.fromkeys(found))


def recording_session(plan: Plan, account: "FreshAccount"):
    """A boto3 Session whose clients validate and record each call in `plan` and answer it from `account`."""
    import boto3
    import botocore.session
    from botocore.awsrequest import AWSResponse

    core = botocore.session.Session()  # reads no profile, config or credentials file of this machine (AWS_PROFILE, …)
    for name, value in (("profile", None), ("config_file", os.devnull), ("credentials_file", os.devnull)):
        core.get_component("config_store").set_config_variable(name, value)
    session = boto3.Session(botocore_session=core, aws_access_key_id="dry-run", aws_secret_access_key="dry-run",
                            region_name=account.region)

    def record(params: dict, model, context: dict, **_) -> None:
        service, operation = model.service_model.service_name, model.name
        # a copy: botocore's own handlers rewrite the params after this one (UploadPart's Body becomes a file)
        request = plan.add(service, operation, **copy.deepcopy(params))
        context[ANSWER] = answer = account.answer(service, operation, params)
        request.note = answer.note

    def respond(context: dict, **_) -> tuple:
        answer = context.pop(ANSWER)
        return AWSResponse(None, answer.status, {}, None), answer.parsed

    # the first event with the caller's params (botocore's own `before-parameter-build` handlers rewrite them), and the
    # last before the request would be signed and sent
    session.events.register("provide-client-params", record)
    session.events.register_first("before-call", respond)
    return session


@dataclass
class Answer:
    """What the account answers one call: botocore's parsed response, its HTTP status, and a note for the plan."""

    parsed: dict
    status: int = 200
    note: str | None = None


class Refusal(Exception):
    """An error answer, raised by botocore as the ClientError the service would send."""

    def __init__(self, code: str, message: str, status: int = 400, note: str | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status, self.note = code, message, status, note


# SageMaker hosting resources: the name parameter, the ARN's resource type, and how SageMaker names it when it finds none
HOSTING = {
    "Model": ("ModelName", "model", "model"),
    "EndpointConfig": ("EndpointConfigName", "endpoint-config", "endpoint configuration"),
    "Endpoint": ("EndpointName", "endpoint", "endpoint"),
    "InferenceComponent": ("InferenceComponentName", "inference-component", "inference component"),
}
LISTED = {  # what a List call's summary of each resource holds (SageMaker's *Summary shapes)
    "Model": ("ModelName", "ModelArn", "CreationTime"),
    "EndpointConfig": ("EndpointConfigName", "EndpointConfigArn", "CreationTime"),
    "InferenceComponent": ("InferenceComponentName", "InferenceComponentArn", "EndpointName", "EndpointArn", "VariantName",
                           "InferenceComponentStatus", "CreationTime", "LastModifiedTime"),
}
# the notes on the describes a wait polls (the account answers the end of the wait at once)
CREATED = "polled until InService (any other terminal status fails)"
UPDATED = "polled until InService; on the candidate's model is success, on the old one a failed promotion"
ROLLING = "polled until the update ends; meanwhile the alarms are read every rollout.alarms.check_interval_s"
ROLLED = "the update has ended: InService on the candidate's model is success, on the old one a rollback"
DELETED = "polled until it is gone"
COPIES = "polled until InService with the new copy count, desired and current"
RELEASED = ("polled until CurrentInstanceCount is 0: no component has a copy and MinInstanceCount is 0, so the endpoint "
            "gives back its instances (on AWS minutes after the last copy stops)")
BUILT = "polled until the build ends"


class FreshAccount:
    """The config's account and region as the README's first-run steps leave it: the artifact bucket, the checkpoint
    bucket (Object Lock on, its signing key's secret) and the ECR repository exist; nothing of the release does. It
    keeps what the release creates and describes it back as sent, in its terminal success state."""

    def __init__(self, backend, stand_in: Callable[[str, str], str], *, release_id: str):
        self.region, self.account_id = backend.region, backend.account_id
        self.partition = "aws-cn" if self.region.startswith("cn-") else "aws-us-gov" if self.region.startswith("us-gov-") else "aws"
        self.stand_in, self.release_id = stand_in, release_id
        self.buckets = {backend.bucket, *([backend.checkpoints.bucket] if backend.checkpoints else [])}
        self.objects: dict[tuple[str, str], dict] = {}  # (bucket, key) -> size, metadata, checksum, body
        self.uploads: dict[str, dict] = {}  # UploadId -> its metadata and parts (size, checksum) by number
        self.repositories = {backend.ecr_repository}
        self.images: dict[tuple[str, str], str] = {}  # (repository, tag) -> digest, pushed by a build
        self.published: dict[tuple[str, str, str], str] = {}  # (registry, repository, tag) -> digest, someone else's
        self.projects: dict[str, dict] = {}
        self.builds: dict[str, dict] = {}
        self.hosting: dict[str, dict[str, dict]] = {kind: {} for kind in HOSTING}
        self.tags: dict[str, list[dict]] = {}  # ARN -> tags
        self.polls: dict[tuple[str, str], list[tuple[dict, str]]] = {}  # what the next describes answer, and their note
        self.groups: dict[str, dict] = {}
        self.packages: dict[str, dict] = {}  # model package ARN -> description
        self.alarms: dict[str, dict] = {}
        self.targets: dict[tuple[str, str, str], dict] = {}  # (namespace, resource id, dimension) -> scalable target
        self.policies: dict[tuple[str, str, str, str], dict] = {}  # ... and policy name -> scaling policy
        self.handlers: dict[tuple[str, str], Callable[[dict], Any]] = {
            ("sts", "GetCallerIdentity"): self._caller,
            ("kms", "DescribeKey"): self._key,
            ("secretsmanager", "GetSecretValue"): self._secret,
            ("s3", "HeadBucket"): self._head_bucket,
            ("s3", "GetObjectLockConfiguration"): lambda params: {"ObjectLockConfiguration": {"ObjectLockEnabled": "Enabled"}},
            ("s3", "HeadObject"): self._head_object,
            ("s3", "GetObject"): self._get_object,
            ("s3", "PutObject"): self._put_object,
            ("s3", "CreateMultipartUpload"): self._create_upload,
            ("s3", "UploadPart"): self._upload_part,
            ("s3", "CompleteMultipartUpload"): self._complete_upload,
            ("s3", "ListObjectVersions"): self._versions,
            ("ecr", "DescribeRepositories"): self._repositories,
            ("ecr", "DescribeImages"): self._describe_images,
            ("ecr", "BatchGetImage"): self._published_image,
            ("codebuild", "ListBuildsForProject"): self._project_builds,
            ("codebuild", "BatchGetProjects"): self._get_projects,
            ("codebuild", "CreateProject"): self._create_project,
            ("codebuild", "StartBuild"): self._start_build,
            ("codebuild", "BatchGetBuilds"): self._get_builds,
            ("sagemaker", "ListTags"): lambda params: {"Tags": self.tags.get(params["ResourceArn"], [])},
            ("sagemaker", "UpdateInferenceComponent"): self._update_component,
            ("sagemaker", "UpdateEndpoint"): self._update_endpoint,
            ("sagemaker", "UpdateInferenceComponentRuntimeConfig"): self._component_copies,
            ("application-autoscaling", "DescribeScalableTargets"): self._scalable_targets,
            ("application-autoscaling", "RegisterScalableTarget"): self._register_target,
            ("application-autoscaling", "DeregisterScalableTarget"): self._deregister_target,
            ("application-autoscaling", "DescribeScalingPolicies"): self._scaling_policies,
            ("application-autoscaling", "PutScalingPolicy"): self._put_policy,
            ("application-autoscaling", "DeleteScalingPolicy"): self._delete_policy,
            ("sagemaker", "DescribeModelPackageGroup"): self._describe_group,
            ("sagemaker", "CreateModelPackageGroup"): self._create_group,
            ("sagemaker", "ListModelPackages"): self._list_packages,
            ("sagemaker", "CreateModelPackage"): self._create_package,
            ("sagemaker", "DescribeModelPackage"): lambda params: self._package(params["ModelPackageName"]),
            ("sagemaker", "UpdateModelPackage"): self._update_package,
            ("sagemaker-runtime", "InvokeEndpoint"): lambda params: {"Body": _body(b"{}"), "ContentType": "application/json"},
            ("cloudwatch", "PutMetricAlarm"): self._put_alarm,
            ("cloudwatch", "DescribeAlarms"): self._describe_alarms,
            ("cloudwatch", "PutMetricData"): lambda params: {},
            ("cloudwatch", "DeleteAlarms"): self._delete_alarms,
            **{("sagemaker", f"{verb}{kind}"): partial(handler, kind) for kind in HOSTING
               for verb, handler in (("Create", self._create), ("Describe", self._describe), ("Delete", self._delete))},
            **{("sagemaker", f"List{kind}s"): partial(self._list, kind) for kind in LISTED},
        }

    # -- the account's surface -----------------------------------------------------------------------------------
    def answer(self, service: str, operation: str, params: dict) -> Answer:
        """The account's answer to one call: a response, or the error the service sends."""
        handler = self.handlers.get((service, operation))
        if handler is None:
            raise NotImplementedError(f"the dry run's account does not model {service} {operation}: add it to "
                                      "tasks.backends.aws.recording_session.FreshAccount")
        try:
            result = handler(params)
        except Refusal as refused:
            return Answer({"Error": {"Code": refused.code, "Message": refused.message},
                           "ResponseMetadata": {"HTTPStatusCode": refused.status}}, refused.status, refused.note)
        return result if isinstance(result, Answer) else Answer(result)

    def seed(self, service: str, operation: str, params: dict) -> None:
        """Create something an earlier release left (the champion), settled, without it being a request of the plan."""
        self.answer(service, operation, params)
        self.polls.clear()

    def publish(self, registry: str, repository: str, tag: str, digest: str) -> None:
        """An image someone else publishes (the DLC) whose tag names `digest`."""
        self.published[(registry, repository, tag)] = digest

    def arn(self, service: str, resource: str) -> str:
        return f"arn:{self.partition}:{service}:{self.region}:{self.account_id}:{resource}"

    def placeholder(self, what: str) -> str:
        """A registered placeholder: 64 hex characters that stand for what only AWS knows."""
        return self.stand_in(placeholder_hex(what, self.release_id), what)

    # -- STS, KMS, Secrets Manager ------------------------------------------------------------------------------
    def _caller(self, params: dict) -> dict:
        return {"UserId": "AROADRYRUN:shiplift", "Account": self.account_id,
                "Arn": f"arn:{self.partition}:sts::{self.account_id}:assumed-role/dry-run/shiplift"}

    def _key(self, params: dict) -> dict:
        key_id = _uuid(self.placeholder(f"the id of the key {params['KeyId']} names"))
        return {"KeyMetadata": {"KeyId": key_id, "Arn": self.arn("kms", f"key/{key_id}"), "Enabled": True, "KeyState": "Enabled",
                                "KeyUsage": "ENCRYPT_DECRYPT", "KeySpec": "SYMMETRIC_DEFAULT"}}

    def _secret(self, params: dict) -> dict:
        """An Ed25519 key as PEM text, derived from the release id: it stands for the secret's key and never leaves the run."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

        key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(placeholder_hex("checkpoint key", self.release_id)))
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
        return {"ARN": self.arn("secretsmanager", f"secret:{params['SecretId']}-DryRun"), "Name": params["SecretId"],
                "SecretString": pem, "CreatedDate": THEN}

    # -- S3 ---------------------------------------------------------------------------------------------------------
    def _head_bucket(self, params: dict) -> dict:
        if params["Bucket"] not in self.buckets:
            raise Refusal("404", "Not Found", 404)
        return {"BucketRegion": self.region}

    def _head_object(self, params: dict) -> dict:
        found = self.objects.get((params["Bucket"], params["Key"]))
        if found is None:
            raise Refusal("404", "Not Found", 404)  # a HEAD answer has no body, so no error code but its status
        return {"ContentLength": found["size"], "Metadata": found["metadata"], "ChecksumSHA256": found["checksum"],
                "ETag": found["etag"], "LastModified": THEN}

    def _get_object(self, params: dict) -> dict:
        found = self.objects.get((params["Bucket"], params["Key"]))
        if found is None:
            raise Refusal("NoSuchKey", "The specified key does not exist.", 404)
        if found["body"] is None:
            raise NotImplementedError("the dry run's account keeps the bodies of single PutObjects only")
        return {"Body": _body(found["body"]), "ContentLength": found["size"], "Metadata": found["metadata"]}

    def _keep(self, params: dict, *, size: int, checksum: str, body: bytes | None, what: str) -> str:
        """Store an object (If-None-Match: an existing key is 412); its ETag, a placeholder."""
        where = (params["Bucket"], params["Key"])
        if where in self.objects and params.get("IfNoneMatch") == "*":
            raise Refusal("PreconditionFailed", "At least one of the pre-conditions you specified did not hold", 412)
        etag = self._etag(f"{what} of {params['Key']}")
        self.objects[where] = {"size": size, "metadata": params.get("Metadata", {}), "checksum": checksum, "etag": etag,
                               "body": body}
        return etag

    def _etag(self, what: str) -> str:
        return f'"{self.placeholder(f"the ETag S3 answers for {what}")[:32]}"'

    def _put_object(self, params: dict) -> dict:
        body = bytes(params.get("Body") or b"")
        checksum = params.get("ChecksumSHA256") or base64.b64encode(hashlib.sha256(body).digest()).decode()
        return {"ETag": self._keep(params, size=len(body), checksum=checksum, body=body, what="the object"),
                "ChecksumSHA256": checksum}

    def _create_upload(self, params: dict) -> dict:
        upload = self.placeholder(f"the UploadId S3 answers for {params['Key']}")
        self.uploads[upload] = {"metadata": params.get("Metadata", {}), "parts": {}}
        return {"Bucket": params["Bucket"], "Key": params["Key"], "UploadId": upload, "ChecksumAlgorithm": "SHA256"}

    def _upload_part(self, params: dict) -> dict:
        part = params["PartNumber"]
        self.uploads[params["UploadId"]]["parts"][part] = (len(params["Body"]), params["ChecksumSHA256"])
        return {"ETag": self._etag(f"part {part} of {params['Key']}"), "ChecksumSHA256": params["ChecksumSHA256"]}

    def _complete_upload(self, params: dict) -> dict:
        """The object of the parts; its checksum S3's composite: SHA-256 of the parts' SHA-256s, `-<parts>`."""
        upload = self.uploads.pop(params["UploadId"])
        parts = [upload["parts"][part["PartNumber"]] for part in params["MultipartUpload"]["Parts"]]
        digests = b"".join(base64.b64decode(checksum) for _, checksum in parts)
        checksum = f"{base64.b64encode(hashlib.sha256(digests).digest()).decode()}-{len(parts)}"
        etag = self._keep({**params, "Metadata": upload["metadata"]}, size=sum(size for size, _ in parts), checksum=checksum,
                          body=None, what="the upload")
        return {"Bucket": params["Bucket"], "Key": params["Key"], "ETag": etag, "ChecksumSHA256": checksum}

    def _versions(self, params: dict) -> dict:
        prefix = params.get("Prefix", "")
        return {"IsTruncated": False, "Versions": [
            {"Key": key, "VersionId": self.placeholder(f"the VersionId of {key}")[:32], "IsLatest": True,
             "LastModified": THEN, "Size": found["size"]}
            for (bucket, key), found in self.objects.items() if bucket == params["Bucket"] and key.startswith(prefix)]}

    # -- ECR and CodeBuild -----------------------------------------------------------------------------------------
    def _repositories(self, params: dict) -> dict:
        missing = [name for name in params["repositoryNames"] if name not in self.repositories]
        if missing:
            raise Refusal("RepositoryNotFoundException", f"The repository with name '{missing[0]}' does not exist in the "
                          f"registry with id '{self.account_id}'")
        return {"repositories": [{"repositoryName": name, "registryId": self.account_id, "imageTagMutability": "IMMUTABLE",
                                  "repositoryArn": self.arn("ecr", f"repository/{name}"), "createdAt": THEN}
                                 for name in params["repositoryNames"]]}

    def _describe_images(self, params: dict) -> dict:
        repository, details = params["repositoryName"], []
        for wanted in params["imageIds"]:
            found = [(tag, digest) for (repo, tag), digest in self.images.items() if repo == repository
                     and wanted.get("imageTag", tag) == tag and wanted.get("imageDigest", digest) == digest]
            if not found:
                raise Refusal("ImageNotFoundException", f"The image with imageId {wanted} does not exist within the "
                              f"repository with name '{repository}'")
            details += [{"registryId": self.account_id, "repositoryName": repository, "imageDigest": digest, "imageTags": [tag],
                         "imagePushedAt": THEN} for tag, digest in found]
        return {"imageDetails": details}

    def _published_image(self, params: dict) -> dict:
        registry, repository = params["registryId"], params["repositoryName"]
        images = [{"registryId": registry, "repositoryName": repository,
                   "imageId": {"imageDigest": self.published[(registry, repository, wanted["imageTag"])], "imageTag": wanted["imageTag"]},
                   "imageManifestMediaType": params["acceptedMediaTypes"][0]} for wanted in params["imageIds"]]
        return {"images": images, "failures": []}

    def _project_builds(self, params: dict) -> dict:
        name = params["projectName"]
        if name not in self.projects:
            raise Refusal("ResourceNotFoundException", f"The provided project name {name} does not exist")
        return {"ids": [build for build, found in reversed(self.builds.items()) if found["projectName"] == name]}

    def _get_projects(self, params: dict) -> dict:
        missing = [name for name in params["names"] if name not in self.projects]
        return {"projects": [self.projects[name] for name in params["names"] if name in self.projects],
                **({"projectsNotFound": missing} if missing else {})}  # a list of at least one

    def _create_project(self, params: dict) -> dict:
        self.projects[params["name"]] = project = {**params, "arn": self.arn("codebuild", f"project/{params['name']}"),
                                                  "created": THEN, "lastModified": THEN}
        return {"project": project}

    def _start_build(self, params: dict) -> dict:
        """The build as it ends: it pushed the image under IMAGE_TAG (a placeholder digest) and wrote image-detail.json
        where `artifactsOverride` says."""
        project = self.projects[params["projectName"]]
        variables = {v["name"]: v["value"] for v in params["environmentVariablesOverride"]}
        build_id = f"{project['name']}:{_uuid(self.placeholder('the id CodeBuild gives the build'))}"
        digest = "sha256:" + self.placeholder("ECR digest of the built image")
        self.images[(variables["ECR_REPOSITORY_URI"].split("/", 1)[1], variables["IMAGE_TAG"])] = digest
        artifacts = params["artifactsOverride"]
        detail = f'{{"ImageURI": "{variables["ECR_REPOSITORY_URI"]}@{digest}"}}'.encode()
        self.objects[(artifacts["location"], f"{artifacts['path']}/{artifacts['name']}/image-detail.json")] = {
            "size": len(detail), "metadata": {}, "checksum": "", "etag": '""', "body": detail}
        self.builds[build_id] = {"id": build_id, "projectName": project["name"], "buildStatus": "SUCCEEDED",
                                 "currentPhase": "COMPLETED", "startTime": THEN, "endTime": THEN, "buildComplete": True,
                                 "environment": {**project["environment"], "environmentVariables": params["environmentVariablesOverride"]}}
        self.polls[("build", build_id)] = [({}, BUILT)]
        return {"build": {**self.builds[build_id], "buildStatus": "IN_PROGRESS", "currentPhase": "SUBMITTED", "buildComplete": False}}

    def _get_builds(self, params: dict) -> Answer:
        notes = [note for build in params["ids"] for _, note in self.polls.pop(("build", build), [])]
        missing = [build for build in params["ids"] if build not in self.builds]
        return Answer({"builds": [self.builds[build] for build in params["ids"] if build in self.builds],
                       **({"buildsNotFound": missing} if missing else {})}, note=notes[0] if notes else None)

    # -- SageMaker hosting -----------------------------------------------------------------------------------------
    def _create(self, kind: str, params: dict) -> dict:
        key, resource, wording = HOSTING[kind]
        name = params[key]
        if name in self.hosting[kind]:
            raise Refusal("ValidationException", f'Cannot create already existing {wording} "{self.arn("sagemaker", f"{resource}/{name}")}".')
        arn = self.arn("sagemaker", f"{resource}/{name.lower()}")
        described = {**{k: v for k, v in params.items() if k != "Tags"}, f"{kind}Arn": arn, "CreationTime": THEN}
        if kind == "Endpoint":
            config = self.hosting["EndpointConfig"].get(params["EndpointConfigName"])
            if config is None:
                raise Refusal("ValidationException", f'Could not find endpoint configuration "{params["EndpointConfigName"]}".')
            described.update(EndpointStatus="InService", LastModifiedTime=THEN,
                             ProductionVariants=[_serving(variant) for variant in config["ProductionVariants"]])
        elif kind == "InferenceComponent":
            described.update(EndpointArn=self.hosting["Endpoint"][params["EndpointName"]]["EndpointArn"],
                             RuntimeConfig=_copies(params["RuntimeConfig"]["CopyCount"]), InferenceComponentStatus="InService",
                             LastModifiedTime=THEN)
        self.hosting[kind][name] = described
        self.tags[arn] = list(params.get("Tags", []))
        if kind in ("Endpoint", "InferenceComponent"):
            self.polls[(kind, name)] = [({}, CREATED)]
        return {f"{kind}Arn": arn}

    def _update_endpoint(self, params: dict) -> dict:
        """UpdateEndpoint: the endpoint serves the named config's variants (the dry run never waits, so at once)."""
        endpoint = self.hosting["Endpoint"].get(params["EndpointName"])
        config = self.hosting["EndpointConfig"].get(params["EndpointConfigName"])
        if endpoint is None:
            raise Refusal("ValidationException", f'Could not find endpoint "{params["EndpointName"]}".')
        if config is None:
            raise Refusal("ValidationException", f'Could not find endpoint configuration "{params["EndpointConfigName"]}".')
        endpoint.update(EndpointConfigName=params["EndpointConfigName"], EndpointStatus="InService", LastModifiedTime=THEN,
                        ProductionVariants=[_serving(variant) for variant in config["ProductionVariants"]])
        return {"EndpointArn": endpoint["EndpointArn"]}

    def _describe(self, kind: str, params: dict) -> Answer:
        key, _, wording = HOSTING[kind]
        name = params[key]
        waiting = self.polls.get((kind, name)) or [({}, None)]
        answered, note = waiting.pop(0)
        found = self.hosting[kind].get(name)
        if found is None:
            raise Refusal("ValidationException", f'Could not find {wording} "{name}".', note=note)
        return Answer({**found, **answered}, note=note)

    def _delete(self, kind: str, params: dict) -> dict:
        key, _, wording = HOSTING[kind]
        name = params[key]
        if self.hosting[kind].pop(name, None) is None:
            raise Refusal("ValidationException", f'Could not find {wording} "{name}".')
        if kind in ("Endpoint", "InferenceComponent"):
            self.polls[(kind, name)] = [({}, DELETED)]
        return {}

    def _list(self, kind: str, params: dict) -> dict:
        key = HOSTING[kind][0]
        found = [item for name, item in self.hosting[kind].items() if params.get("NameContains", "") in name
                 and params.get("EndpointNameEquals", item.get("EndpointName")) == item.get("EndpointName")]
        return {f"{kind}s": [{field: item[field] for field in LISTED[kind]} for item in sorted(found, key=lambda i: i[key])]}

    def _update_component(self, params: dict) -> dict:
        """The component on its new specification at once; a rolling update (DeploymentConfig) is seen Updating once."""
        name = params["InferenceComponentName"]
        found = self.hosting["InferenceComponent"].get(name)
        if found is None:
            raise Refusal("ValidationException", f'Could not find inference component "{name}".')
        found.update(Specification=params["Specification"], RuntimeConfig=_copies(params["RuntimeConfig"]["CopyCount"]),
                     LastModifiedTime=THEN)
        if "DeploymentConfig" in params:
            found["LastDeploymentConfig"] = params["DeploymentConfig"]
            self.polls[("InferenceComponent", name)] = [({"InferenceComponentStatus": "Updating"}, ROLLING), ({}, ROLLED)]
        else:
            self.polls[("InferenceComponent", name)] = [({}, UPDATED)]
        return {"InferenceComponentArn": found["InferenceComponentArn"]}

    def _component_copies(self, params: dict) -> dict:
        """UpdateInferenceComponentRuntimeConfig: the component at its new copy count, polled once."""
        name = params["InferenceComponentName"]
        found = self.hosting["InferenceComponent"].get(name)
        if found is None:
            raise Refusal("ValidationException", f'Could not find inference component "{name}".')
        found.update(RuntimeConfig=_copies(params["DesiredRuntimeConfig"]["CopyCount"]), LastModifiedTime=THEN)
        self.polls[("InferenceComponent", name)] = [({}, COPIES)]
        self._instances_follow_copies(found["EndpointName"])
        return {"InferenceComponentArn": found["InferenceComponentArn"]}

    def _instances_follow_copies(self, endpoint_name: str) -> None:
        """The endpoint's instances once a component's copies changed: none while no component on it has a copy and its
        variants' ManagedInstanceScaling may go to 0 (MinInstanceCount 0,
        https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html), else its config's."""
        endpoint = self.hosting["Endpoint"].get(endpoint_name)
        if endpoint is None:
            return
        variants = self.hosting["EndpointConfig"][endpoint["EndpointConfigName"]]["ProductionVariants"]
        idle = not any(component["RuntimeConfig"]["DesiredCopyCount"] for component in self.hosting["InferenceComponent"].values()
                       if component["EndpointName"] == endpoint_name)
        released = idle and all((variant.get("ManagedInstanceScaling") or {}).get("MinInstanceCount") == 0 for variant in variants)
        endpoint["ProductionVariants"] = [_serving(variant, released=released) for variant in variants]
        if released:
            self.polls[("Endpoint", endpoint_name)] = [({}, RELEASED)]

    # -- Application Auto Scaling ----------------------------------------------------------------------------------
    def _scalable_targets(self, params: dict) -> dict:
        return {"ScalableTargets": [target for (namespace, resource, dimension), target in self.targets.items()
                                    if namespace == params["ServiceNamespace"]
                                    and resource in params.get("ResourceIds", [resource])
                                    and params.get("ScalableDimension", dimension) == dimension]}

    def _register_target(self, params: dict) -> dict:
        """A new target (or the existing one with the capacities sent); its ARN carries an id only AWS chooses."""
        key = (params["ServiceNamespace"], params["ResourceId"], params["ScalableDimension"])
        target = self.targets.get(key) or {
            "ServiceNamespace": key[0], "ResourceId": key[1], "ScalableDimension": key[2], "CreationTime": THEN,
            "RoleARN": f"arn:{self.partition}:iam::{self.account_id}:role/aws-service-role/"
                       "sagemaker.application-autoscaling.amazonaws.com/AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint",
            "ScalableTargetARN": self.arn("application-autoscaling", "scalable-target/" + self.stand_in(
                placeholder_hex(what := f"the id Application Auto Scaling gives the scalable target of {key[1]}",
                                self.release_id)[:36], what))}
        target.update({k: params[k] for k in ("MinCapacity", "MaxCapacity") if k in params})
        self.targets[key] = target
        return {"ScalableTargetARN": target["ScalableTargetARN"]}

    def _deregister_target(self, params: dict) -> dict:
        key = (params["ServiceNamespace"], params["ResourceId"], params["ScalableDimension"])
        if self.targets.pop(key, None) is None:
            raise Refusal("ObjectNotFoundException", f"No scalable target registered for service namespace: {key[0]}, "
                          f"resource ID: {key[1]}, scalable dimension: {key[2]}")
        for policy in [policy for policy in self.policies if policy[:3] == key]:  # its policies go with it
            del self.policies[policy]
        return {}

    def _scaling_policies(self, params: dict) -> dict:
        return {"ScalingPolicies": [policy for (namespace, resource, dimension, name), policy in self.policies.items()
                                    if namespace == params["ServiceNamespace"]
                                    and params.get("ResourceId", resource) == resource
                                    and params.get("ScalableDimension", dimension) == dimension
                                    and name in params.get("PolicyNames", [name])]}

    def _put_policy(self, params: dict) -> dict:
        """A policy (replacing one of its name) on a registered target; its ARN carries an id only AWS chooses."""
        key = (params["ServiceNamespace"], params["ResourceId"], params["ScalableDimension"], params["PolicyName"])
        if key[:3] not in self.targets:
            raise Refusal("ObjectNotFoundException", f"No scalable target registered for service namespace: {key[0]}, "
                          f"resource ID: {key[1]}, scalable dimension: {key[2]}")
        what = f"the id Application Auto Scaling gives the policy {key[3]}"
        policy_id = self.stand_in(_uuid(placeholder_hex(what, self.release_id)), what)
        arn = (f"arn:{self.partition}:autoscaling:{self.region}:{self.account_id}:scalingPolicy:{policy_id}:"
               f"resource/{key[0]}/{key[1]}:policyName/{key[3]}")
        self.policies[key] = {**params, "PolicyARN": arn, "Alarms": [], "CreationTime": THEN}
        return {"PolicyARN": arn, "Alarms": []}

    def _delete_policy(self, params: dict) -> dict:
        key = (params["ServiceNamespace"], params["ResourceId"], params["ScalableDimension"], params["PolicyName"])
        if self.policies.pop(key, None) is None:
            raise Refusal("ObjectNotFoundException", f"No scaling policy found for service namespace: {key[0]}, resource ID: "
                          f"{key[1]}, scalable dimension: {key[2]}, policy name: {key[3]}")
        return {}

    # -- SageMaker Model Registry ----------------------------------------------------------------------------------
    def _describe_group(self, params: dict) -> dict:
        name = params["ModelPackageGroupName"]
        if name not in self.groups:
            raise Refusal("ValidationException", f"ModelPackageGroup {name} does not exist.")
        return self.groups[name]

    def _create_group(self, params: dict) -> dict:
        name = params["ModelPackageGroupName"]
        arn = self.arn("sagemaker", f"model-package-group/{name}")
        self.groups[name] = {"ModelPackageGroupName": name, "ModelPackageGroupArn": arn, "CreationTime": THEN, "CreatedBy": {},
                             "ModelPackageGroupStatus": "Completed", "ModelPackageGroupDescription": params.get("ModelPackageGroupDescription", "")}
        return {"ModelPackageGroupArn": arn}

    def _list_packages(self, params: dict) -> dict:
        summary = ("ModelPackageName", "ModelPackageGroupName", "ModelPackageVersion", "ModelPackageArn", "ModelPackageDescription",
                   "CreationTime", "ModelPackageStatus", "ModelApprovalStatus")
        return {"ModelPackageSummaryList": [{key: package[key] for key in summary if key in package}
                                            for package in reversed(self.packages.values())
                                            if package["ModelPackageGroupName"] == params["ModelPackageGroupName"]]}

    def _create_package(self, params: dict) -> dict:
        group = params["ModelPackageGroupName"]
        version = 1 + sum(package["ModelPackageGroupName"] == group for package in self.packages.values())
        arn = self.arn("sagemaker", f"model-package/{group}/{version}")
        self.packages[arn] = {**{k: v for k, v in params.items() if k not in ("Tags", "ClientToken")}, "ModelPackageName": group,
                              "ModelPackageVersion": version, "ModelPackageArn": arn, "CreationTime": THEN,
                              "ModelPackageStatus": "Completed", "ModelPackageStatusDetails": {"ValidationStatuses": []}}
        return {"ModelPackageArn": arn}

    def _package(self, arn: str) -> dict:
        if arn not in self.packages:
            raise Refusal("ValidationException", f"ModelPackage {arn} does not exist.")
        return self.packages[arn]

    def _update_package(self, params: dict) -> dict:
        package = self._package(params["ModelPackageArn"])
        metadata = {**package.get("CustomerMetadataProperties", {}), **params.get("CustomerMetadataProperties", {})}
        for stale in params.get("CustomerMetadataPropertiesToRemove", []):
            metadata.pop(stale, None)
        package.update({k: v for k, v in params.items() if k in ("ModelApprovalStatus", "ApprovalDescription")},
                       CustomerMetadataProperties=metadata, LastModifiedTime=THEN)
        return {"ModelPackageArn": params["ModelPackageArn"]}

    # -- CloudWatch ------------------------------------------------------------------------------------------------
    def _put_alarm(self, params: dict) -> dict:
        self.alarms[params["AlarmName"]] = params
        return {}

    def _delete_alarms(self, params: dict) -> dict:
        for name in params["AlarmNames"]:
            self.alarms.pop(name, None)
        return {}

    def _describe_alarms(self, params: dict) -> dict:
        """The named alarms as they were put (what a MetricAlarm holds of the request), in state OK."""
        from tasks.backends.aws.service_model import service_model

        members = service_model("cloudwatch").shape_for("MetricAlarm").members
        return {"MetricAlarms": [{**{k: v for k, v in self.alarms[name].items() if k in members},
                                  "AlarmArn": self.arn("cloudwatch", f"alarm:{name}"), "StateValue": "OK",
                                  "StateReason": "the dry run's alarms never fire"}
                                 for name in params.get("AlarmNames", []) if name in self.alarms]}


def _body(data: bytes):
    """A response body as botocore hands it over: a stream."""
    from botocore.response import StreamingBody

    return StreamingBody(io.BytesIO(data), len(data))


def _uuid(digits: str) -> str:
    return "-".join(digits[a:b] for a, b in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)))


def _copies(count: int) -> dict:
    return {"DesiredCopyCount": count, "CurrentCopyCount": count}


def _serving(variant: dict, *, released: bool = False) -> dict:
    """What DescribeEndpoint says of a config's variant once it serves: its instances, from the first pool by priority
    (none once `released`: the endpoint gave them back)."""
    if "ServerlessConfig" in variant:  # no instances (API_DescribeEndpoint: CurrentServerlessConfig instead)
        return {"VariantName": variant["VariantName"], "CurrentServerlessConfig": dict(variant["ServerlessConfig"]),
                "DesiredServerlessConfig": dict(variant["ServerlessConfig"])}
    count = 0 if released else variant.get("InitialInstanceCount", 1)
    serving = {"VariantName": variant["VariantName"], "CurrentInstanceCount": count, "DesiredInstanceCount": count}
    if variant.get("InstancePools"):
        first = min(variant["InstancePools"], key=lambda pool: pool["Priority"])
        serving["InstancePools"] = [{"InstanceType": pool["InstanceType"], "CurrentInstanceCount": count if pool is first else 0}
                                    for pool in variant["InstancePools"]]
    return serving
