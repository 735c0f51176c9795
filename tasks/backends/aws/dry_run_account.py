"""The dry run's model of a fresh account (`FreshAccount`): what the README's first-run steps leave, what a release
creates, and each modelled operation's answer, in its terminal success state (the module docstring of
`recording_session` says how its clients reach it)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from functools import partial
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from shiplift.tasks.backends.aws.dry_run_answers import (
    BUILT,
    COPIES,
    CREATED,
    DELETED,
    HOSTING,
    LISTED,
    RELEASED,
    ROLLED,
    ROLLING,
    THEN,
    UPDATED,
    Answer,
    Refusal,
    _body,
    _copies,
    _serving,
    _uuid,
    placeholder_hex,
)
from shiplift.tasks.backends.aws.service_model import service_model
from shiplift.tasks.backends.aws.session import partition


class FreshAccount:
    """The config's account and region as the README's first-run steps leave it: the artifact bucket, the checkpoint
    bucket (Object Lock on, its signing key's secret) and the ECR repository exist; nothing of the release does. It
    keeps what the release creates and describes it back as sent, in its terminal success state."""

    def __init__(self, backend, stand_in: Callable[[str, str], str], *, release_id: str):
        self.region, self.account_id = backend.region, backend.account_id
        self.partition = partition(self.region)
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
            ("s3", "GetObjectLockConfiguration"): lambda params: {
                "ObjectLockConfiguration": {"ObjectLockEnabled": "Enabled"}},
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
            ("sagemaker-runtime", "InvokeEndpoint"): lambda params: {"Body": _body(b"{}"),
                                                                     "ContentType": "application/json"},
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
                                      "shiplift.tasks.backends.aws.recording_session.FreshAccount")
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
        return {"KeyMetadata": {"KeyId": key_id, "Arn": self.arn("kms", f"key/{key_id}"), "Enabled": True,
                                "KeyState": "Enabled", "KeyUsage": "ENCRYPT_DECRYPT", "KeySpec": "SYMMETRIC_DEFAULT"}}

    def _secret(self, params: dict) -> dict:
        """An Ed25519 key as PEM text, derived from the release id: it stands for the secret's key and never leaves
        the run."""
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
        etag = self._keep({**params, "Metadata": upload["metadata"]}, size=sum(size for size, _ in parts),
                          checksum=checksum, body=None, what="the upload")
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
            raise Refusal("RepositoryNotFoundException",
                          f"The repository with name '{missing[0]}' does not exist in the "
                          f"registry with id '{self.account_id}'")
        return {"repositories": [{"repositoryName": name, "registryId": self.account_id,
                                  "imageTagMutability": "IMMUTABLE",
                                  "repositoryArn": self.arn("ecr", f"repository/{name}"), "createdAt": THEN}
                                 for name in params["repositoryNames"]]}

    def _describe_images(self, params: dict) -> dict:
        repository, details = params["repositoryName"], []
        for wanted in params["imageIds"]:
            found = [(tag, digest) for (repo, tag), digest in self.images.items() if repo == repository
                     and wanted.get("imageTag", tag) == tag and wanted.get("imageDigest", digest) == digest]
            if not found:
                raise Refusal("ImageNotFoundException", f"The image with imageId {wanted} does not exist within "
                              f"the repository with name '{repository}'")
            details += [{"registryId": self.account_id, "repositoryName": repository, "imageDigest": digest,
                         "imageTags": [tag], "imagePushedAt": THEN} for tag, digest in found]
        return {"imageDetails": details}

    def _published_image(self, params: dict) -> dict:
        registry, repository = params["registryId"], params["repositoryName"]
        images = [{"registryId": registry, "repositoryName": repository,
                   "imageId": {"imageDigest": self.published[(registry, repository, wanted["imageTag"])],
                               "imageTag": wanted["imageTag"]},
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
                                 "environment": {**project["environment"],
                                                 "environmentVariables": params["environmentVariablesOverride"]}}
        self.polls[("build", build_id)] = [({}, BUILT)]
        return {"build": {**self.builds[build_id], "buildStatus": "IN_PROGRESS", "currentPhase": "SUBMITTED",
                          "buildComplete": False}}

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
            raise Refusal("ValidationException",
                          f'Cannot create already existing {wording} "{self.arn("sagemaker", f"{resource}/{name}")}".')
        arn = self.arn("sagemaker", f"{resource}/{name.lower()}")
        described = {**{k: v for k, v in params.items() if k != "Tags"}, f"{kind}Arn": arn, "CreationTime": THEN}
        if kind == "Endpoint":
            config = self.hosting["EndpointConfig"].get(params["EndpointConfigName"])
            if config is None:
                raise Refusal("ValidationException",
                              f'Could not find endpoint configuration "{params["EndpointConfigName"]}".')
            described.update(EndpointStatus="InService", LastModifiedTime=THEN,
                             ProductionVariants=[_serving(variant) for variant in config["ProductionVariants"]])
        elif kind == "InferenceComponent":
            described.update(EndpointArn=self.hosting["Endpoint"][params["EndpointName"]]["EndpointArn"],
                             RuntimeConfig=_copies(params["RuntimeConfig"]["CopyCount"]),
                             InferenceComponentStatus="InService",
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
            raise Refusal("ValidationException",
                          f'Could not find endpoint configuration "{params["EndpointConfigName"]}".')
        endpoint.update(EndpointConfigName=params["EndpointConfigName"], EndpointStatus="InService",
                        LastModifiedTime=THEN,
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
        return {f"{kind}s": [{field: item[field] for field in LISTED[kind]}
                             for item in sorted(found, key=lambda i: i[key])]}

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
            rolling = ({"InferenceComponentStatus": "Updating"}, ROLLING)
            self.polls[("InferenceComponent", name)] = [rolling, ({}, ROLLED)]
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
        """The endpoint's instances once a component's copies changed: its config's, or none while no component on it
        has a copy and its variants' ManagedInstanceScaling may go to 0 (MinInstanceCount 0,
        https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html)."""
        endpoint = self.hosting["Endpoint"].get(endpoint_name)
        if endpoint is None:
            return
        variants = self.hosting["EndpointConfig"][endpoint["EndpointConfigName"]]["ProductionVariants"]
        idle = not any(component["RuntimeConfig"]["DesiredCopyCount"]
                       for component in self.hosting["InferenceComponent"].values()
                       if component["EndpointName"] == endpoint_name)
        released = idle and all((variant.get("ManagedInstanceScaling") or {}).get("MinInstanceCount") == 0
                                for variant in variants)
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
                       "sagemaker.application-autoscaling.amazonaws.com/"
                       "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint",
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
            raise Refusal("ObjectNotFoundException",
                          f"No scaling policy found for service namespace: {key[0]}, resource ID: "
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
        self.groups[name] = {"ModelPackageGroupName": name, "ModelPackageGroupArn": arn, "CreationTime": THEN,
                             "CreatedBy": {},
                             "ModelPackageGroupStatus": "Completed",
                             "ModelPackageGroupDescription": params.get("ModelPackageGroupDescription", "")}
        return {"ModelPackageGroupArn": arn}

    def _list_packages(self, params: dict) -> dict:
        summary = ("ModelPackageName", "ModelPackageGroupName", "ModelPackageVersion", "ModelPackageArn",
                   "ModelPackageDescription", "CreationTime", "ModelPackageStatus", "ModelApprovalStatus")
        return {"ModelPackageSummaryList": [{key: package[key] for key in summary if key in package}
                                            for package in reversed(self.packages.values())
                                            if package["ModelPackageGroupName"] == params["ModelPackageGroupName"]]}

    def _create_package(self, params: dict) -> dict:
        group = params["ModelPackageGroupName"]
        version = 1 + sum(package["ModelPackageGroupName"] == group for package in self.packages.values())
        arn = self.arn("sagemaker", f"model-package/{group}/{version}")
        self.packages[arn] = {**{k: v for k, v in params.items() if k not in ("Tags", "ClientToken")},
                              "ModelPackageName": group, "ModelPackageVersion": version, "ModelPackageArn": arn,
                              "CreationTime": THEN,
                              "ModelPackageStatus": "Completed",
                              "ModelPackageStatusDetails": {"ValidationStatuses": []}}
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
        members = service_model("cloudwatch").shape_for("MetricAlarm").members
        return {"MetricAlarms": [{**{k: v for k, v in self.alarms[name].items() if k in members},
                                  "AlarmArn": self.arn("cloudwatch", f"alarm:{name}"), "StateValue": "OK",
                                  "StateReason": "the dry run's alarms never fire"}
                                 for name in params.get("AlarmNames", []) if name in self.alarms]}
