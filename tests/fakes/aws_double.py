"""A stateful AWS test double on one loopback HTTP server, reachable by the test, its threads and subprocesses.

moto answers S3 (the double answers a conditional write racing another with 409, when a scenario asks), ECR,
CodeBuild, CloudWatch, STS, IAM and Step Functions.
This module answers SageMaker hosting itself (control plane and runtime): moto's SageMaker refuses what
shiplift sends (instance pools, MIG fields, new instance types), drops fields, has no inference
components and makes endpoints InService at once. The Model Registry (`MODEL_REGISTRY`) is moto's, behind the
double's call log, throttling and model check. Every SageMaker request is checked against the full
botocore model (`tasks.backends.aws.service_model.request_problems`) and the rules the model cannot express;
endpoints and components move through realistic statuses and run the project's real model servers
(images/<kind>/server.py) as subprocesses, to which InvokeEndpoint forwards. CodeBuild builds are
simulated from the buildspec (source zip checked, image pushed to moto's ECR, image-detail.json written),
which is how an image digest comes to name the server it runs; ECR DescribeImages reports `imageSizeInBytes` as ECR
does, the sum of the pushed (compressed) layers (moto reports the config blob's size), and `image_bytes` sets that
size for a build's image. A published image (the llama.cpp DLC, in another account's registry) is put there with
`publish_image`; the double answers ECR BatchGetImage across registries itself
(`PublishedRegistries`: moto's ignores `registryId`) and runs the image's local stand-in (images/<kind>/server.py).

InvokeEndpoint publishes SageMaker's invocation metrics into moto's CloudWatch, and UpdateInferenceComponent with a
DeploymentConfig runs a rolling update that evaluates its AutoRollbackConfiguration alarms on those datapoints (moto
stores alarms but evaluates none) and rolls back as SageMaker does.

Application Auto Scaling is the double's own (`AutoScaling`: moto's refuses SageMaker's inference-component dimension):
scalable targets, scaling policies and their tags, checked against the botocore model. Scale to zero follows
https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html: an invocation of a component
with no copy is refused with SageMaker's no-capacity ValidationError and counted as NoCapacityInvocationFailures, and a
CloudWatch alarm on that metric whose action is a step-scaling policy on the component's scalable target scales the
component out, as Application Auto Scaling does. Target tracking (scale in) never acts.

Point boto3 at it with `AwsDouble.env()` (AWS_ENDPOINT_URL and test credentials); steer it with
`scenario(...)`, or from another process with POST /_double/scenario, GET /_double/calls, GET /_double/rollouts,
POST /_double/reset.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import http.client
import io
import itertools
import json
import math
import operator
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.validate import ParamValidator
from moto.cloudwatch import models as cloudwatch_models
from moto.core import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

from shiplift.tasks.artifacts.packaging import safe_extract
from shiplift.tasks.backends.aws.service_model import request_problems, service_model
from shiplift.tasks.backends.capacity import cpu_count
from shiplift.tasks.backends.local.event_stream import payload_events
from shiplift.tasks.backends.mig_profiles import MIG_GPUS, gpu_for_instance
from shiplift.tasks.backends.mig_profiles import layout_problem as mig_layout_problem
from shiplift.tasks.backends.placement import gpus_per_instance

PERCENTILE = re.compile(r"p(\d{1,2}(?:\.\d+)?)")


def _percentile_statistic(plain: Callable) -> Callable:
    """moto's CloudWatch computes Sum/Average/Minimum/Maximum/SampleCount only; SageMaker's latency alarms and
    shiplift's metrics read percentiles (`p99`), so the double adds nearest-rank percentiles of the datapoints."""

    def statistic(self, stat: str):
        match = PERCENTILE.fullmatch(stat)
        values = sorted(self.metric_single_values_list)
        if match is None or not values:
            return plain(self, stat)
        rank = max(1, math.ceil(float(match[1]) / 100 * len(values)))
        return values[rank - 1]

    return statistic


cloudwatch_models.Statistics.get_statistics_for_type = _percentile_statistic(
    cloudwatch_models.Statistics.get_statistics_for_type)


ACCOUNT_ID = DEFAULT_ACCOUNT_ID  # moto's account, 123456789012
REGION = "us-east-1"
ARN_PREFIX = f"arn:aws:sagemaker:{REGION}:{ACCOUNT_ID}"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
IMAGES_DIR = Path(__file__).resolve().parents[2] / "images"
# image folder -> prefix of its variables
IMAGE_KINDS = {"semif": "SEMIF", "encoder": "ENCODER", "dlc-chat": "DLC_CHAT"}
# The double's "instances" have no GPU: GPU images run on the CPU (the encoder server would refuse cuda without one).
CPU_ONLY = {"semif": {"SEMIF_N_GPU_LAYERS": "0"}, "encoder": {"ENCODER_DEVICE": "cpu"},
            "dlc-chat": {"SM_LLAMA_CPP_N_GPU_LAYERS": "0"}}
MIG_PROFILE = re.compile(r"mig-(\d+)g\.(\d+)gb(?:[+-][a-z0-9.]+)*")
RUNTIME_PATH = re.compile(r"/endpoints/([^/]+)/([a-z-]+)")
ECR_IMAGE = re.compile(
    r"(?P<registry>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com/(?P<repository>[^@:]+)"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64})|:(?P<tag>[\w.-]+))?"
)
SIGNING_SERVICE = re.compile(r"Credential=[^/,]+/\d{8}/[^/]+/([^/]+)/aws4_request")
ACCESS_KEY = re.compile(r"Credential=([^/,]+)/")
IC_NAME_REQUIRED = (
    "Inference Component Name header is required for endpoints to which you plan to deploy inference components. "
    "Please include Inference Component Name header or consider using SageMaker models."
)
IC_NAME_REFUSED = (
    "Inference Component Name header is not allowed for endpoints to which you dont plan to deploy inference "
    "components. Please remove the Inference Component Name header and try again."
)
CONDITIONAL_CONFLICT = (  # S3's text for 409 ConditionalRequestConflict (API_PutObject, API_CompleteMultipartUpload)
    "A conflicting operation occurred. If using PutObject you can retry the request. If using multipart upload you "
    "should initiate another CreateMultipartUpload request and re-upload each part."
)
NO_COPIES = (
    "Inference Component has no capacity to process this request. ApplicationAutoScaling may be in-progress "
    "(if configured) or try to increase the capacity by invoking UpdateInferenceComponentRuntimeConfig API."
)
BUILD_PHASES = ("SUBMITTED", "QUEUED", "PROVISIONING", "DOWNLOAD_SOURCE", "INSTALL", "PRE_BUILD", "BUILD",
                "POST_BUILD", "UPLOAD_ARTIFACTS", "FINALIZING", "COMPLETED")
MUTATING_PREFIXES = ("Create", "Update", "Delete", "Add", "Put", "Start", "Stop")
# The Model Registry, which moto implements (its UpdateModelPackage drops what is not passed: send complete updates)
MODEL_REGISTRY = frozenset({"CreateModelPackageGroup", "DescribeModelPackageGroup", "ListModelPackageGroups",
                            "CreateModelPackage", "DescribeModelPackage", "ListModelPackages", "UpdateModelPackage"})
# Scale to zero: https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html (the page the
# behaviours below follow); Application Auto Scaling's JSON target prefix, the dimension it scales a component on, the
# metric SageMaker emits when a request finds no copy, and the service-linked role a target names
SCALE_TO_ZERO_PAGE = "https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html"
AUTOSCALING_TARGET = "AnyScaleFrontendService."
COPY_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
VARIANT_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
NO_CAPACITY_METRIC = "NoCapacityInvocationFailures"
AUTOSCALING_ROLE_ARN = (f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/aws-service-role/"
                        "sagemaker.application-autoscaling.amazonaws.com/"
                        "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint")
DEFAULT_TARGETS_PAGE = 50  # DescribeScalableTargets / DescribeScalingPolicies: MaxResults' default (and maximum)
INVOKE_TIMEOUT_S = 60.0  # SageMaker's own limit on one invocation
CLIENT_TIMEOUT_S = 60.0
PING_TIMEOUT_S = 2.0
PING_INTERVAL_S = 0.1
STOP_GRACE_S = 5.0
JOB_DRAIN_TIMEOUT_S = 30.0
JOB_WORKERS = 4
MAX_REQUEST_BYTES = 32 << 20  # above the runtime's 25 MB payload limit, so the model check reports it
FAILURE_REASON_MAX = 1024  # the FailureReason shape's maximum
LOG_TAIL_CHARS = 600
DEFAULT_PAGE = 10
SAGEMAKER_NAMESPACE = "AWS/SageMaker"
DEFAULT_ROLLING_TIMEOUT_S = 28800  # RollingUpdatePolicy.MaximumExecutionTimeoutInSeconds when it is left out
ALARM_CHECK_S = 0.25  # how often a rolling update's bake evaluates its alarms
STATISTICS = ("Sum", "Average", "Minimum", "Maximum", "SampleCount")
COMPARISONS = {"GreaterThanThreshold": (operator.gt, "greater than"),
               "GreaterThanOrEqualToThreshold": (operator.ge, "greater than or equal to"),
               "LessThanThreshold": (operator.lt, "less than"),
               "LessThanOrEqualToThreshold": (operator.le, "less than or equal to")}
MATH_TOKEN = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+|[A-Za-z_][A-Za-z0-9_]*|>=|<=|[-+*/<>()\[\],])")
MATH_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")
MATH_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MATH_OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
                   ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


class ApiError(Exception):
    """An AWS error answer: error code, message, HTTP status and any modelled extra fields (ModelError's)."""

    def __init__(self, code: str, message: str, status: int = 400, **extra: Any):
        super().__init__(message)
        self.code, self.message, self.status, self.extra = code, message, status, extra


def validation(message: str) -> ApiError:
    return ApiError("ValidationException", message)


def runtime_validation(message: str) -> ApiError:
    return ApiError("ValidationError", message)


class StartFailure(Exception):
    """Provisioning or a container start failed; str() is the FailureReason SageMaker would show."""

    def __init__(self, reason: str, log_tail: str = ""):
        text = f"{reason} Log tail: {log_tail}" if log_tail else reason
        if len(text) > FAILURE_REASON_MAX:  # keep the reason's head and the log's end
            text = text[: FAILURE_REASON_MAX // 2 - 2] + " … " + text[-(FAILURE_REASON_MAX // 2 - 2):]
        super().__init__(text)


class Call(NamedTuple):
    """One SageMaker or SageMaker-runtime request, as the double received it."""

    service: str
    operation: str
    params: dict[str, Any]

    @property
    def mutating(self) -> bool:
        return self.operation.startswith(MUTATING_PREFIXES)


@dataclass
class Scenario:
    """Knobs that steer the double; `reset()` puts them back to these defaults."""

    polls_before_ready: int = 1  # Describe* calls that still answer Creating/Updating before the outcome shows
    unavailable_instance_types: frozenset[str] = frozenset()  # these fail with insufficient capacity
    fail_next_endpoint_with: str | None = None  # the next CreateEndpoint ends Failed with this reason
    # The next CreateInferenceComponent or UpdateInferenceComponent ends Failed with this reason; a failed update leaves
    # the copies it had serving the old spec, so the component is Failed with CurrentCopyCount > 0
    # (DescribeInferenceComponent reports status, FailureReason and CurrentCopyCount apart:
    # https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_DescribeInferenceComponent.html)
    fail_next_component_with: str | None = None
    # CreateEndpoint/UpdateEndpoint do not find an existing endpoint config this many times: SageMaker reads the config
    # eventually consistently and answers ValidationException "Could not find endpoint configuration"
    # (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateEndpoint.html)
    endpoint_config_unseen: int = 0
    # S3 answers the next this many conditional writes (PutObject or CompleteMultipartUpload with If-None-Match: *) with
    # 409 ConditionalRequestConflict, as when another conditional write of the key is in flight
    # (https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html,
    # https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html)
    race_conditional_writes: int = 0
    # UpdateInferenceComponent/UpdateEndpoint end InService on the OLD spec (a rolling update after its first batch)
    roll_back_updates: bool = False
    throttle: dict[str, int] = field(default_factory=dict)  # operation -> how many next calls get ThrottlingException
    drop_partition_layouts: bool = False  # DescribeEndpointConfig leaves AcceleratorPartitionLayouts out
    fail_builds: bool = False  # CodeBuild builds end FAILED and push nothing
    build_polls_in_progress: int = 1  # BatchGetBuilds answers IN_PROGRESS this often; the image is pushed when it ends
    # the size a simulated build's image has in ECR, the sum of the (compressed) layer sizes of the manifest it pushes
    # (None: the source zip's size plus a few bytes of flavour layer), which DescribeImages then reports in
    # imageSizeInBytes, e.g. an image over serverless's 10 GB; at least the flavour layer's few bytes
    image_bytes: int | None = None
    container_start_timeout_s: float = 60.0  # deadline for a model server's GET /ping to answer 200
    # a rolling update's MaximumExecutionTimeoutInSeconds (API minimum 600) counts this many real seconds per second,
    # so a test can see the timeout rollback (e.g. 0.005: 600 s pass in 3 s)
    rolling_timeout_scale: float = 1.0
    # a step-scaling policy's Cooldown counts this many real seconds per second (e.g. 0.01: the scale-to-zero page's
    # 60 s pass in 0.6 s), so a test can start a component from zero several times in a row
    scaling_cooldown_scale: float = 1.0
    # An inference-component endpoint whose variant's ManagedInstanceScaling (ENABLED) has MinInstanceCount 0 gives back
    # its instances once no component on it has a copy: ManagedInstanceScaling's IDLE_RELEASE "releases instances that
    # have no hosted inference component copies"
    # (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ProductionVariantManagedInstanceScalingScaleInPolicy.html;
    # https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html). AWS takes minutes (its
    # scale-to-zero post saw about 10); the double counts this many DescribeEndpoint calls that still report the
    # instances once the last copy has stopped, then reports CurrentInstanceCount 0 until a copy is placed again.
    instance_release_polls: int = 2
    # Who a Model Registry write is by: access key id -> the UserContext (IamIdentity, UserProfileArn/Name, DomainId)
    # DescribeModelPackage then reads back as LastModifiedBy after that caller's UpdateModelPackage, as SageMaker names
    # the caller (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_UserContext.html); a caller not listed
    # reads back as moto's fake Studio user
    principals: dict[str, dict] = field(default_factory=dict)

    def updated(self, knobs: dict[str, Any]) -> Scenario:
        """A copy with `knobs` applied; ValueError names an unknown knob or a bad value."""
        unknown = sorted(set(knobs) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"unknown scenario knobs {unknown}; known: {[f.name for f in fields(self)]}")
        new = replace(self, **knobs)
        new.unavailable_instance_types = frozenset(new.unavailable_instance_types)
        new.throttle = {str(op): int(count) for op, count in dict(new.throttle).items()}
        new.principals = {str(key): dict(context) for key, context in dict(new.principals).items()}
        context_members = set(service_model("sagemaker").shape_for("UserContext").members)
        for key, context in new.principals.items():
            if not context or set(context) - context_members:
                raise ValueError(f"principals[{key!r}] must be a UserContext (members {sorted(context_members)}), got "
                                 f"{context!r}")
        new._check_values()
        return new

    def _check_values(self) -> None:
        """ValueError names a knob whose value is of the wrong type or out of range."""
        for knob in ("polls_before_ready", "endpoint_config_unseen", "race_conditional_writes"):
            if not isinstance(getattr(self, knob), int) or getattr(self, knob) < 0:
                raise ValueError(f"{knob} must be an integer >= 0, got {getattr(self, knob)!r}")
        if self.image_bytes is not None and (not isinstance(self.image_bytes, int) or self.image_bytes < 0):
            raise ValueError(f"image_bytes must be an integer >= 0 or None, got {self.image_bytes!r}")
        if not 0 < float(self.container_start_timeout_s) <= 3600:
            raise ValueError(f"container_start_timeout_s must be in (0, 3600], got {self.container_start_timeout_s!r}")
        if not 0 < float(self.rolling_timeout_scale) <= 1:
            raise ValueError(f"rolling_timeout_scale must be in (0, 1], got {self.rolling_timeout_scale!r}")
        if not 0 <= float(self.scaling_cooldown_scale) <= 1:
            raise ValueError(f"scaling_cooldown_scale must be in [0, 1], got {self.scaling_cooldown_scale!r}")
        for knob in ("fail_next_endpoint_with", "fail_next_component_with"):
            if getattr(self, knob) is not None and not isinstance(getattr(self, knob), str):
                raise ValueError(f"{knob} must be a string or None")

    def to_json(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["unavailable_instance_types"] = sorted(self.unavailable_instance_types)
        return values


def arn(kind: str, name: str) -> str:
    """The SageMaker ARN of a model, endpoint-config, endpoint or inference-component."""
    return f"{ARN_PREFIX}:{kind}/{name.lower()}"


def compact(value: Any) -> Any:
    """The value with every None member dropped, recursively."""
    if isinstance(value, dict):
        return {key: compact(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [compact(item) for item in value]
    return value


def shaped(shape, value: Any) -> Any:
    """Only what an output shape knows of `value` (a request's fields given back on Describe)."""
    if shape.type_name == "structure" and isinstance(value, dict):
        return {key: shaped(shape.members[key], item) for key, item in value.items() if key in shape.members}
    if shape.type_name == "list" and isinstance(value, list):
        return [shaped(shape.member, item) for item in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {key: shaped(shape.value, item) for key, item in value.items()}
    return value


def parse_s3_url(url: str) -> tuple[str, str] | None:
    match = re.fullmatch(r"s3://([^/]+)/(.+)", url)
    return (match.group(1), match.group(2)) if match else None


# --------------------------------------------------------------------------------------
# Containers: the project's model servers as subprocesses


@dataclass(frozen=True)
class Source:
    """What a container runs: the image as given, the model archive and the container environment."""

    image: str
    model_data_url: str | None
    environment: dict[str, str]


class Container:
    """One copy of a model server: `images/<kind>/server.py` in its own process group, logging to a file."""

    def __init__(self, kind: str, environment: dict[str, str], model_dir: Path, log_path: Path):
        prefix = IMAGE_KINDS[kind]
        self.port = free_port()
        self.log_path = log_path
        self.in_flight = 0
        base = {key: os.environ[key] for key in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH")
                if key in os.environ}
        env = {
            **base,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            **environment,
            **CPU_ONLY.get(kind, {}),
            f"{prefix}_MODEL_DIR": str(model_dir),
            f"{prefix}_PORT": str(self.port),
            f"{prefix}_HOST": "127.0.0.1",
        }
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(IMAGES_DIR / kind / "server.py")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=model_dir, start_new_session=True,
            )

    def wait_ready(self, deadline: float, cancel: threading.Event) -> str | None:
        """None once GET /ping answers 200; otherwise what went wrong (exit, deadline, cancel)."""
        while True:
            code = self.process.poll()
            if code is not None:
                return f"the server process exited with code {code}"
            if cancel.is_set():
                return "provisioning was cancelled"
            if ping(self.port) == 200:
                return None
            if time.monotonic() >= deadline:
                return "GET /ping did not answer 200 before the startup health check deadline"
            time.sleep(PING_INTERVAL_S)

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log written)"
        return text.strip()[-LOG_TAIL_CHARS:] or "(log is empty)"

    def send(self, sig: int) -> None:
        """Signal the container's whole process group."""
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_containers(containers: list[Container]) -> None:
    """SIGTERM every container's process group, then SIGKILL what is left after the grace period."""
    for container in containers:
        container.send(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for container in containers:
        try:
            container.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            container.send(signal.SIGKILL)
            container.process.wait(timeout=STOP_GRACE_S)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ping(port: int) -> int | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PING_TIMEOUT_S)
    try:
        connection.request("GET", "/ping")
        response = connection.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


# --------------------------------------------------------------------------------------
# CloudWatch: the metrics SageMaker publishes and the alarm evaluation moto does not do


def cloudwatch() -> cloudwatch_models.CloudWatchBackend:
    """moto's in-process CloudWatch backend of the double's account (looked up each time: a moto reset replaces it)."""
    return cloudwatch_models.cloudwatch_backends[ACCOUNT_ID][REGION]


def put_invocation_metrics(dimensions: list[dict[str, str]], status: int | None, latency_us: float | None) -> None:
    """The AWS/SageMaker datapoints of one invocation (`status` None: the model did not answer); never fails it."""
    client_error, server_error = status is not None and 400 <= status < 500, status is not None and status >= 500
    counts = {"Invocations": 1, "Invocation4XXErrors": client_error, "Invocation5XXErrors": server_error,
              "InvocationModelErrors": status is None or not 200 <= status < 300}
    data = [{"MetricName": name, "Value": float(value), "Unit": "None", "Dimensions": dimensions} for name,
            value in counts.items()]
    if latency_us is not None:
        data.append({"MetricName": "ModelLatency", "Value": latency_us, "Unit": "Microseconds",
                     "Dimensions": dimensions})
    try:
        cloudwatch().put_metric_data(SAGEMAKER_NAMESPACE, data)
    # noqa: BLE001 - a reset replacing the backend mid-call: a lost datapoint, never a failed invocation
    except Exception:
        pass


def put_no_capacity_metric(component: str) -> None:
    """One NoCapacityInvocationFailures datum of a component: "SageMaker AI emits this metric when an endpoint receives
    an inference request, but the endpoint has no active instances to serve the request" (SCALE_TO_ZERO_PAGE), by
    InferenceComponentName as the page's alarm reads it; never fails the invocation."""
    datum = {"MetricName": NO_CAPACITY_METRIC, "Value": 1.0, "Unit": "None",
             "Dimensions": [{"Name": "InferenceComponentName", "Value": component}]}
    try:
        cloudwatch().put_metric_data(SAGEMAKER_NAMESPACE, [datum])
    except Exception:  # noqa: BLE001 - a reset replacing the backend mid-call: a lost datapoint
        pass


def epoch(timestamp: datetime) -> float:
    """A moto datapoint's timestamp (naive UTC, or aware) in seconds since the epoch."""
    return (timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=UTC)).timestamp()


class MetricMath:
    """A metric-math expression of the subset shiplift's alarms use, parsed by recursive descent (no eval) and
    evaluated on one period's values: ids, numbers, + - * /, parentheses, >= > <= <, IF(c, a, b), MAX([..]),
    MIN([..]). Missing data (None) propagates (MAX/MIN skip it); a division by zero is missing data; anything
    outside the subset is refused with a ValidationException, never evaluated as something else."""

    def __init__(self, text: str, ids: set[str]):
        self.text, self.ids = text, ids
        self.tokens = self._tokenize(text)
        self.position = 0
        self.tree = self._comparison()
        if self._peek() is not None:
            self._refuse(f"unexpected {self._peek()!r} after a complete expression")

    def evaluate(self, values: dict[str, float | None]) -> float | None:
        """The expression's value given each id's value for the period (None: missing data)."""
        return self._value(self.tree, values)

    # ---- parsing --------------------------------------------------------------------

    def _refuse(self, why: str) -> None:
        raise validation(f'The metric math expression "{self.text}" is not supported by the AWS double: {why}. It '
                         "evaluates ids, numbers, + - * /, parentheses, >= > <= <, IF(c, a, b), MAX([...]) and "
                         "MIN([...]).")

    def _tokenize(self, text: str) -> list[str]:
        tokens, position, end = [], 0, len(text.rstrip())
        while position < end:
            match = MATH_TOKEN.match(text, position)
            if match is None:
                self._refuse(f"unexpected character {text[position:].lstrip()[0]!r}")
            tokens.append(match[1])
            position = match.end()
        return tokens

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if token is None:
            self._refuse("it ends too early" + (f" (expected {expected!r})" if expected else ""))
        if expected is not None and token != expected:
            self._refuse(f"expected {expected!r}, got {token!r}")
        self.position += 1
        return token

    def _comparison(self) -> tuple:
        left = self._sum()
        if self._peek() in (">=", ">", "<=", "<"):
            operation = self._take()
            return (operation, left, self._sum())
        return left

    def _left_associative(self, operators: tuple[str, ...], operand: Callable[[], tuple]) -> tuple:
        """`operand (operator operand)*`, grouped from the left."""
        node = operand()
        while self._peek() in operators:
            operation = self._take()
            node = (operation, node, operand())
        return node

    def _sum(self) -> tuple:
        return self._left_associative(("+", "-"), self._product)

    def _product(self) -> tuple:
        return self._left_associative(("*", "/"), self._unary)

    def _unary(self) -> tuple:
        if self._peek() == "-":
            self._take()
            return ("neg", self._unary())
        return self._primary()

    def _primary(self) -> tuple:
        token = self._take()
        if token == "(":
            node = self._comparison()
            self._take(")")
            return node
        if MATH_NUMBER.fullmatch(token):
            return ("number", float(token))
        if not MATH_NAME.fullmatch(token):
            self._refuse(f"unexpected {token!r}")
        if self._peek() == "(":
            return self._call(token)
        if token not in self.ids:
            self._refuse(f"{token!r} is not the id of an earlier metric or expression of the alarm "
                         f"({sorted(self.ids)})")
        return ("id", token)

    def _call(self, function: str) -> tuple:
        if function not in ("IF", "MAX", "MIN"):
            self._refuse(f"the function {function} is not supported")
        self._take("(")
        if function == "IF":
            condition = self._comparison()
            self._take(",")
            when_true = self._comparison()
            self._take(",")
            node = ("IF", condition, when_true, self._comparison())
        else:
            self._take("[")
            items = [self._comparison()]
            while self._peek() == ",":
                self._take()
                items.append(self._comparison())
            self._take("]")
            node = (function, items)
        self._take(")")
        return node

    # ---- evaluation -----------------------------------------------------------------

    def _value(self, node: tuple, values: dict[str, float | None]) -> float | None:
        kind = node[0]
        if kind == "number":
            return node[1]
        if kind == "id":
            return values.get(node[1])
        if kind == "neg":
            operand = self._value(node[1], values)
            return None if operand is None else -operand
        if kind == "IF":
            condition = self._value(node[1], values)
            return None if condition is None else self._value(node[2] if condition != 0 else node[3], values)
        if kind in ("MAX", "MIN"):
            present = [v for v in (self._value(item, values) for item in node[1]) if v is not None]
            return (max if kind == "MAX" else min)(present) if present else None
        left, right = self._value(node[1], values), self._value(node[2], values)
        if left is None or right is None or (kind == "/" and right == 0):
            return None
        return float(MATH_OPERATIONS[kind](left, right))


class MetricQuery(NamedTuple):
    """One metric of an alarm: the datapoints of exactly these dimensions, and a statistic over one period."""

    namespace: str
    name: str
    dimensions: frozenset[tuple[str, str]]
    period: int
    stat: str

    @classmethod
    def of(cls, namespace: str | None, name: str | None, dimensions: list, period: Any,
           stat: str | None) -> MetricQuery:
        """A query from moto's alarm fields (Dimension objects); ValidationException for what cannot be evaluated."""
        if not namespace or not name:
            raise validation("The alarm names no Namespace and MetricName (nor Metrics) the AWS double can evaluate.")
        if stat not in STATISTICS and not (stat and PERCENTILE.fullmatch(stat)):
            raise validation(f"The statistic {stat!r} of alarm metric {namespace}/{name} is not supported by the AWS "
                             f"double (one of {', '.join(STATISTICS)} or a percentile such as p99).")
        if not isinstance(period, int) or period <= 0:
            raise validation(f"The period {period!r} of alarm metric {namespace}/{name} is not a positive number of "
                             "seconds.")
        return cls(namespace, name, frozenset((d.name, d.value) for d in dimensions), period, stat)

    def value(self, data: list[cloudwatch_models.MetricDatumBase], end: float) -> float | None:
        """The statistic of the datapoints in [end - period, end), None when there are none."""
        start = end - self.period
        chosen = [d for d in data if d.name == self.name and d.namespace == self.namespace
                  and start <= epoch(d.timestamp) < end
                  and frozenset((x.name, x.value) for x in d.dimensions) == self.dimensions]
        if not chosen:
            return None
        # moto's statistics, with the percentiles added above
        statistics = cloudwatch_models.Statistics([self.stat], None)
        statistics.metric_data = chosen
        value = statistics.get_statistics_for_type(self.stat)
        return None if value is None else float(value)


class AlarmRule:
    """A metric alarm of moto's backend compiled for evaluation: its metrics, the expressions on them (each sees the
    metrics and the expressions listed before it) and the one that meets the threshold. Each of the last
    EvaluationPeriods periods is a window of Period seconds ending now, then Period before that, and so on: a sliding
    window, where CloudWatch aligns periods to the clock (a datapoint can count a little later or earlier here than
    there)."""

    def __init__(self, alarm: cloudwatch_models.Alarm):
        self.alarm = alarm
        if alarm.rule is not None:
            raise validation(f"Alarm {alarm.name} is a composite alarm; the AWS double evaluates metric alarms only.")
        if alarm.comparison_operator not in COMPARISONS:
            raise validation(f"The ComparisonOperator {alarm.comparison_operator} of alarm {alarm.name} is not "
                             f"supported by the AWS double (one of {', '.join(COMPARISONS)}).")
        self.queries: dict[str, MetricQuery] = {}
        self.expressions: list[tuple[str, MetricMath]] = []
        if alarm.metric_data_queries:
            self.returned = self._compile_queries(alarm)
        else:
            self.queries["m1"] = MetricQuery.of(alarm.namespace, alarm.metric_name, alarm.dimensions, alarm.period,
                                                alarm.statistic or alarm.extended_statistic)
            self.returned = "m1"
        if not self.queries:
            raise validation(f"Alarm {alarm.name} has no MetricStat to read datapoints from.")
        self.period = max(query.period for query in self.queries.values())

    def _compile_queries(self, alarm: cloudwatch_models.Alarm) -> str:
        """The alarm's Metrics: each MetricStat, then each Expression on those listed before it; returns the id of the
        one whose ReturnData is true."""
        for query in alarm.metric_data_queries:
            if not query.expression and query.metric_stat is None:
                raise validation(f"Metric {query.id} of alarm {alarm.name} has neither a MetricStat nor an "
                                 "Expression.")
            if not query.expression:
                stat = query.metric_stat
                self.queries[query.id] = MetricQuery.of(stat.metric.namespace, stat.metric.metric_name,
                                                        stat.metric.dimensions, stat.period, stat.stat)
        for query in alarm.metric_data_queries:
            if query.expression:
                ids = set(self.queries) | {name for name, _ in self.expressions}
                self.expressions.append((query.id, MetricMath(query.expression, ids)))
        returned = [query.id for query in alarm.metric_data_queries if query.return_data is not False]
        if len(returned) != 1:
            raise validation(f"Alarm {alarm.name} must set ReturnData true on exactly one of its Metrics, not "
                             f"{returned}.")
        return returned[0]

    def values(self, data: list[cloudwatch_models.MetricDatumBase], now: float) -> list[tuple[float, float | None]]:
        """(period end, value) of each of the last EvaluationPeriods periods, newest first."""
        evaluated = []
        for index in range(self.alarm.evaluation_periods):
            end = now - index * self.period
            values = {name: query.value(data, end) for name, query in self.queries.items()}
            for name, expression in self.expressions:
                values[name] = expression.evaluate(values)
            evaluated.append((end, values[self.returned]))
        return evaluated

    def verdict(self, data: list[cloudwatch_models.MetricDatumBase], now: float) -> tuple[str, str, str]:
        """(StateValue, StateReason, StateReasonData) as CloudWatch would set them now."""
        alarm = self.alarm
        compare, phrase = COMPARISONS[alarm.comparison_operator]
        evaluated = self.values(data, now)
        present = [(end, value) for end, value in evaluated if value is not None]
        treat = alarm.treat_missing_data or "missing"
        missing = len(evaluated) - len(present)
        breaching = sum(compare(value, alarm.threshold) for _, value in present) + (missing
                                                                                    if treat == "breaching" else 0)
        needed, periods = alarm.datapoints_to_alarm or alarm.evaluation_periods, len(evaluated)
        reason_data = json.dumps({"version": "1.0", "queryDate": iso_time(now),
                                  "startDate": iso_time(now - periods * self.period),
                                  "period": self.period, "recentDatapoints": [value for _, value in present],
                                  "threshold": alarm.threshold})
        if not present:
            if treat in ("missing", "ignore"):
                if treat == "ignore":
                    return alarm.state_value, alarm.state_reason, alarm.state_reason_data
                were = "was" if periods == 1 else "were"
                return ("INSUFFICIENT_DATA", f"Insufficient Data: {plural(periods, 'datapoint')} {were} unknown.",
                        reason_data)
            state, treated = ("ALARM", "Breaching") if treat == "breaching" else ("OK", "NonBreaching")
            return state, (f"Threshold Crossed: no datapoints were received for {plural(periods, 'period')} and "
                           f"{plural(missing, 'missing datapoint')} {'was' if missing == 1 else 'were'} treated as "
                           f"[{treated}]."), reason_data
        listing = ", ".join(f"{value:g} ({time.strftime('%d/%m/%y %H:%M:%S', time.gmtime(end))})" for end,
                            value in present)
        state = "ALARM" if breaching >= needed else "OK"
        count = breaching if state == "ALARM" else periods - breaching
        return state, (f"Threshold Crossed: {count} out of the last {periods} datapoints [{listing}] "
                       f"{'was' if count == 1 else 'were'} {'' if state == 'ALARM' else 'not '}{phrase} the threshold "
                       f"({alarm.threshold:g}) (minimum {plural(needed, 'datapoint')} for "
                       f"{'OK -> ALARM' if state == 'ALARM' else 'ALARM -> OK'} transition)."), reason_data


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def iso_time(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000+0000", time.gmtime(seconds))


def find_alarms(names: list[str]) -> list[AlarmRule]:
    """The named alarms of moto's backend, compiled; ValidationException names any that are missing or unsupported."""
    alarms = cloudwatch().alarms
    missing = [name for name in names if name not in alarms]
    if missing:
        raise validation(f"The CloudWatch alarms {missing} of AutoRollbackConfiguration do not exist.")
    return [AlarmRule(alarms[name]) for name in names]


def evaluate_alarms(names: list[str]) -> dict[str, tuple[str, str]]:
    """Evaluate the named alarms on moto's datapoints now and set each changed state in moto (DescribeAlarms shows
    it): name -> (state, reason); an alarm deleted meanwhile is NOT_FOUND."""
    backend = cloudwatch()
    data, now, verdicts = list(backend.metric_data), time.time(), {}
    for name in names:
        alarm = backend.alarms.get(name)
        if alarm is None:
            verdicts[name] = ("NOT_FOUND", "the alarm no longer exists")
            continue
        state, reason, reason_data = AlarmRule(alarm).verdict(data, now)
        if state != alarm.state_value or alarm.state_reason.startswith("Unchecked"):  # moto's reason until evaluated
            alarm.update_state(reason, reason_data, state)  # what SetAlarmState does, on the alarm already in hand
        verdicts[name] = (state, reason)
    return verdicts


# --------------------------------------------------------------------------------------
# SageMaker resources


@dataclass
class Outcome:
    """What a background job produced: a FailureReason, or placed variants / started copies."""

    failure_reason: str | None = None
    variants: dict[str, Placement] = field(default_factory=dict)
    copies: list[Container] = field(default_factory=list)
    image: dict[str, Any] | None = None  # the DeployedImage of started copies
    rolled_back: bool = False  # a rolling update ended on the old spec (its copies are the component's already)

    def containers(self) -> list[Container]:
        return self.copies + [c for placement in self.variants.values() for c in placement.containers]


@dataclass
class Job:
    """A transition in progress: its outcome shows on Describe after `polls_left` polls and once it is done."""

    future: Future
    finish: Callable[[Outcome], None]
    polls_left: int
    cancel: threading.Event
    # Application Auto Scaling's: its outcome shows once done, also to an invocation (no Describe)
    unpolled: bool = False


@dataclass(frozen=True)
class VariantPlan:
    """How to provision one production variant: (instance type, model source) candidates in priority order."""

    name: str
    candidates: tuple[tuple[str | None, Source | None], ...]
    pool_types: tuple[str, ...]  # empty unless the variant has InstancePools
    instance_count: int


@dataclass
class Placement:
    """A provisioned production variant."""

    instance_type: str | None
    pool_types: tuple[str, ...]
    instance_count: int
    containers: list[Container]
    image: dict[str, Any] | None


@dataclass
class Model:
    """A CreateModel request as sent, with its ARN and creation time."""

    params: dict[str, Any]
    arn: str
    created: float

    def source(self) -> Source:
        """The primary container (or the first of Containers) as what a copy runs."""
        container = self.params.get("PrimaryContainer") or (self.params.get("Containers") or [{}])[0]
        return Source(container.get("Image", ""), container.get("ModelDataUrl"), dict(container.get("Environment", {})))


@dataclass
class EndpointConfig:
    """A CreateEndpointConfig request as sent, with its ARN and creation time."""

    params: dict[str, Any]
    arn: str
    created: float

    @property
    def for_components(self) -> bool:
        """True for an inference-component endpoint config (its variants name no model)."""
        return not any(v.get("ModelName") for v in self.params["ProductionVariants"])

    def variant(self, name: str) -> dict[str, Any] | None:
        return next((v for v in self.params["ProductionVariants"] if v["VariantName"] == name), None)


@dataclass
class Endpoint:
    """An endpoint: its live config, status, provisioned variants and the transition in progress."""

    name: str
    arn: str
    config: EndpointConfig
    created: float
    modified: float
    status: str
    failure_reason: str | None = None
    variants: dict[str, Placement] = field(default_factory=dict)
    job: Job | None = None
    deployment_config: dict[str, Any] | None = None
    idle_polls: int = 0  # DescribeEndpoint calls since no component on it has a copy (instance release, Scenario)

    def containers(self) -> list[Container]:
        return [c for placement in self.variants.values() for c in placement.containers]


@dataclass
class Component:
    """An inference component: its live spec, copies, status and the transition in progress."""

    name: str
    arn: str
    endpoint: Endpoint
    variant_name: str
    spec: dict[str, Any]
    source: Source
    desired_copies: int
    created: float
    modified: float
    status: str
    copies: list[Container] = field(default_factory=list)
    image: dict[str, Any] | None = None
    failure_reason: str | None = None
    job: Job | None = None
    deployment_config: dict[str, Any] | None = None
    holds_capacity: bool = True  # False once its creation was refused for capacity


def partition_types(config: EndpointConfig, variant_name: str) -> list[str]:
    """The MIG partition types a variant's layout declares, one entry per partition."""
    variant = config.variant(variant_name) or {}
    layouts = variant.get("AcceleratorPartitionLayouts") or [{}]
    return list(layouts[0].get("AcceleratorPartitionTypes", []))


def resource_of(requirements: dict[str, Any]) -> tuple[str, float]:
    """What one copy takes of an instance, and how much: a MIG partition, whole GPUs or vCPUs."""
    if requirements.get("AcceleratorPartitionType"):
        return f"{requirements['AcceleratorPartitionType']} partitions", 1
    if requirements.get("NumberOfAcceleratorDevicesRequired"):
        return "GPUs", requirements["NumberOfAcceleratorDevicesRequired"]
    return "vCPUs", requirements.get("NumberOfCpuCoresRequired", 1)


def instance_resources(instance_type: str | None, unit: str, layout: list[str]) -> float | None:
    """How much of `unit` one instance of the type has (None where tasks.backends.capacity's tables do not know it)."""
    if instance_type is None:
        return None
    gpus = gpus_per_instance(instance_type)
    if unit.endswith("partitions"):
        return layout.count(unit.split()[0]) * gpus if gpus else None
    if unit == "GPUs":
        return gpus
    return cpu_count(instance_type)


def _check_layout_fits(name: str, instance_type: str, types: list[str]) -> None:
    """Refuse, as SageMaker does, a layout that one GPU of `instance_type` cannot hold by NVIDIA's rules."""
    gpu = gpu_for_instance(instance_type)
    if gpu is None:
        raise validation(f"Instance type {instance_type} does not support accelerator partitions; "
                         f"use an instance of the families {sorted(MIG_GPUS)}.")
    slices = memory = 0
    for partition in types:
        match = MIG_PROFILE.fullmatch(partition)
        if match is None:
            raise validation(f'Accelerator partition type "{partition}" is not a MIG profile such as mig-1g.10gb.')
        slices, memory = slices + int(match.group(1)), memory + int(match.group(2))
    # SageMaker refuses with a 400 a layout that does not fit one accelerator (stating what it provides and what was
    # requested) and a type the instance's GPU lacks (listing the valid ones); NVIDIA's placement rules decide the
    # fit: https://docs.aws.amazon.com/sagemaker/latest/dg/inference-components-accelerator-partitioning-troubleshoot.html
    if slices > gpu.compute_slices or memory > gpu.memory_gb:
        raise validation(f'The accelerator partition layout of production variant "{name}" ({", ".join(types)}) '
                         f"needs {slices} compute slices and {memory} GB, but one GPU of {instance_type} has "
                         f"{gpu.compute_slices} compute slices and {gpu.memory_gb} GB.")
    invalid = sorted({partition for partition in types if gpu.profile(partition) is None})
    if invalid:
        raise validation(f'Accelerator partition type "{invalid[0]}" is not valid for instance type {instance_type}. '
                         f"Valid types: {', '.join(p.name for p in gpu.profiles)}.")
    if mig_layout_problem(instance_type, types):
        raise validation(f'The accelerator partition layout of production variant "{name}" ({", ".join(types)}) '
                         f"cannot be placed on one GPU of {instance_type}: it provides at most "
                         f"{', '.join(f'{p.max_instances} x {p.name}' for p in gpu.profiles)}, on "
                         f"{gpu.memory_slices} memory slices.")


class SageMaker:
    """The SageMaker control plane and runtime: stores, validation, transitions, invocation."""

    def __init__(self, shared: Shared, runtime: ContainerRuntime):
        self.shared, self.runtime = shared, runtime
        self.executor = ThreadPoolExecutor(max_workers=JOB_WORKERS, thread_name_prefix="aws-double-job")
        self.models: dict[str, Model] = {}
        self.configs: dict[str, EndpointConfig] = {}
        self.endpoints: dict[str, Endpoint] = {}
        self.components: dict[str, Component] = {}
        self.tags: dict[str, dict[str, str]] = {}
        self.autoscaling: AutoScaling | None = None  # wired by AwsDouble.start: the scale-out alarms' policies act here
        self.turns = itertools.count()  # spreads invocations over equally busy copies
        self.operations: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            name: getattr(self, re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower())
            for name in (
                "CreateModel", "DescribeModel", "DeleteModel", "ListModels",
                "CreateEndpointConfig", "DescribeEndpointConfig", "DeleteEndpointConfig", "ListEndpointConfigs",
                "CreateEndpoint", "DescribeEndpoint", "UpdateEndpoint", "DeleteEndpoint", "ListEndpoints",
                "CreateInferenceComponent", "DescribeInferenceComponent", "UpdateInferenceComponent",
                "UpdateInferenceComponentRuntimeConfig", "DeleteInferenceComponent", "ListInferenceComponents",
                "AddTags", "ListTags", "DeleteTags",
            )
        }

    # ---- dispatch -------------------------------------------------------------------

    def admit(self, operation: str, params: dict[str, Any]) -> None:
        """What every SageMaker request meets first: the call log, throttling and the full service model check."""
        self.shared.log("sagemaker", operation, params)
        self.shared.take_throttle(operation)
        problems = request_problems("sagemaker", operation, params)
        if problems:
            raise validation(f"{len(problems)} validation error(s) detected: " + "; ".join(problems))

    def handle(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """One control-plane request: admission, the double's rules, then the operation."""
        self.admit(operation, params)
        if operation not in self.operations:
            raise ApiError("UnknownOperationException", f"the AWS double does not implement SageMaker.{operation}")
        with self.shared.lock:
            result = self.operations[operation](params)
        output_shape = service_model("sagemaker").operation_model(operation).output_shape
        if output_shape is not None:
            report = ParamValidator().validate(result, output_shape)
            if report.has_errors():  # a bug in the double: fail loudly rather than answer off-shape
                raise ApiError("InternalFailure", f"the double's {operation} answer breaks its output shape: "
                               + report.generate_report(), status=500)
        return result

    # ---- lookups --------------------------------------------------------------------

    def _model(self, name: str) -> Model:
        model = self.models.get(name.lower())
        if model is None:
            raise validation(f'Could not find model "{arn("model", name)}".')
        return model

    def _config(self, name: str) -> EndpointConfig:
        config = self.configs.get(name.lower())
        if config is None:
            raise validation(f'Could not find endpoint configuration "{name}".')
        return config

    def _config_read_by_endpoint(self, name: str) -> EndpointConfig:
        """The config CreateEndpoint/UpdateEndpoint name, read eventually consistently: an existing one goes unseen
        while `endpoint_config_unseen` lasts
        (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateEndpoint.html)."""
        scenario = self.shared.scenario
        if scenario.endpoint_config_unseen > 0 and name.lower() in self.configs:
            scenario.endpoint_config_unseen -= 1
            raise validation(f'Could not find endpoint configuration "{name}".')
        return self._config(name)

    def _endpoint(self, name: str) -> Endpoint:
        endpoint = self.endpoints.get(name.lower())
        if endpoint is None:
            raise validation(f'Could not find endpoint "{name}".')
        return endpoint

    def _component(self, name: str) -> Component:
        component = self.components.get(name.lower())
        if component is None:
            raise validation(f'Could not find inference component "{name}".')
        return component

    @staticmethod
    def _refuse_existing(store: dict[str, Any], kind: str, what: str, name: str) -> None:
        if name.lower() in store:
            raise validation(f'Cannot create already existing {what} "{arn(kind, name)}".')

    # ---- jobs -----------------------------------------------------------------------

    def _start_job(self, resource: Endpoint | Component, work: Callable[[threading.Event], Outcome],
                   finish: Callable[[Outcome], None], polls: int | None = None, unpolled: bool = False) -> None:
        cancel = threading.Event()
        future = self.executor.submit(self._guarded, work, cancel)
        resource.job = Job(future, finish, self.shared.scenario.polls_before_ready if polls is None else polls, cancel,
                           unpolled=unpolled)

    @staticmethod
    def _guarded(work: Callable[[threading.Event], Outcome], cancel: threading.Event) -> Outcome:
        try:
            return work(cancel)
        except StartFailure as failure:
            return Outcome(failure_reason=str(failure))
        except Exception as exc:  # a resource must end Failed, never hang in Creating
            return Outcome(failure_reason=str(StartFailure(f"InternalFailure: {exc!r}")))

    def _settle(self, resource: Endpoint | Component, count_poll: bool) -> None:
        """Apply a finished job's outcome once its polls are used up (a Describe uses one)."""
        job = resource.job
        if job is None:
            return
        if job.polls_left > 0:
            if count_poll:
                job.polls_left -= 1
            return
        if job.future.done():
            resource.job = None
            job.finish(job.future.result())

    @staticmethod
    def cancel(job: Job | None) -> None:
        """Tell a job to stop, with the lock held: a rolling update then no longer touches its component's copies."""
        if job is not None:
            job.cancel.set()

    @staticmethod
    def discard(job: Job | None) -> None:
        """Cancel a job and stop whatever it started (never called with the lock held)."""
        if job is None:
            return
        job.cancel.set()
        if job.future.cancel():
            return
        try:
            stop_containers(job.future.result(timeout=JOB_DRAIN_TIMEOUT_S).containers())
        except FutureTimeout:
            pass

    def _retire(self, job: Job | None, containers: list[Container]) -> Callable[[threading.Event], Outcome]:
        def work(cancel: threading.Event) -> Outcome:
            self.discard(job)
            stop_containers(containers)
            return Outcome()

        return work

    def drain(self) -> None:
        """Stop every job and container and forget all resources (reset and shutdown)."""
        with self.shared.lock:
            endpoints, components = list(self.endpoints.values()), list(self.components.values())
            for store in (self.models, self.configs, self.endpoints, self.components, self.tags):
                store.clear()
            for resource in [*components, *endpoints]:
                self.cancel(resource.job)
        for resource in [*components, *endpoints]:
            self.discard(resource.job)
            stop_containers(resource.copies if isinstance(resource, Component) else resource.containers())

    # ---- paging and tags ------------------------------------------------------------

    @staticmethod
    def _page(items: list[tuple[str, float, float, str | None, dict]], params: dict[str, Any], key: str,
              default_page: int = DEFAULT_PAGE) -> dict[str, Any]:
        """Filter (NameContains, StatusEquals, times), sort and page (name, created, modified, status, summary) rows."""
        needle = params.get("NameContains", "").lower()
        rows = [row for row in items if needle in row[0].lower()]
        if "StatusEquals" in params:
            rows = [row for row in rows if row[3] == params["StatusEquals"]]
        for bound, index, keep in (("CreationTimeBefore", 1, float.__lt__), ("CreationTimeAfter", 1, float.__gt__),
                                   ("LastModifiedTimeBefore", 2, float.__lt__),
                                   ("LastModifiedTimeAfter", 2, float.__gt__)):
            if bound in params:
                rows = [row for row in rows if keep(float(row[index]), float(params[bound]))]
        sort_by = params.get("SortBy", "CreationTime")
        rows.sort(key=lambda row: row[0].lower() if sort_by == "Name" else (row[3] or "") if sort_by == "Status"
                  else row[1], reverse=params.get("SortOrder", "Descending") == "Descending")
        try:
            offset = int(json.loads(base64.b64decode(params["NextToken"]))["offset"]) if "NextToken" in params else 0
        except (ValueError, KeyError, TypeError):
            raise validation(f"Invalid pagination token: {params['NextToken']}") from None
        size = params.get("MaxResults", default_page)
        result: dict[str, Any] = {key: [row[4] for row in rows[offset:offset + size]]}
        if offset + size < len(rows):
            result["NextToken"] = base64.b64encode(json.dumps({"offset": offset + size}).encode()).decode()
        return result

    def _tag(self, resource_arn: str, tags: list[dict[str, str]] | None) -> None:
        self.tags.setdefault(resource_arn, {}).update({tag["Key"]: tag["Value"] for tag in tags or []})

    def _require_arn(self, resource_arn: str) -> None:
        known = {r.arn for store in (self.models, self.configs, self.endpoints, self.components)
                 for r in store.values()}
        if resource_arn not in known:
            raise validation(f'Could not find resource "{resource_arn}".')

    def add_tags(self, params: dict[str, Any]) -> dict[str, Any]:
        self._require_arn(params["ResourceArn"])
        self._tag(params["ResourceArn"], params["Tags"])
        return {"Tags": params["Tags"]}

    def list_tags(self, params: dict[str, Any]) -> dict[str, Any]:
        self._require_arn(params["ResourceArn"])
        rows = [(key, 0.0, 0.0, None, {"Key": key, "Value": value})
                for key, value in self.tags.get(params["ResourceArn"], {}).items()]
        return self._page(rows, {**params, "SortBy": "Name", "SortOrder": "Ascending"}, "Tags", default_page=50)

    def delete_tags(self, params: dict[str, Any]) -> dict[str, Any]:
        self._require_arn(params["ResourceArn"])
        for key in params["TagKeys"]:
            self.tags.get(params["ResourceArn"], {}).pop(key, None)
        return {}

    # ---- models ---------------------------------------------------------------------

    def create_model(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params["ModelName"]
        self._refuse_existing(self.models, "model", "model", name)
        if not params.get("PrimaryContainer") and not params.get("Containers"):
            raise validation("Either PrimaryContainer or Containers must be specified for a model.")
        model = Model(params, arn("model", name), time.time())
        url = model.source().model_data_url
        if url and url.startswith("s3://") and not self.runtime.s3_object_exists(url):
            raise validation(f"Could not find model data at {url}.")
        self.models[name.lower()] = model
        self._tag(model.arn, params.get("Tags"))
        return {"ModelArn": model.arn}

    def describe_model(self, params: dict[str, Any]) -> dict[str, Any]:
        model = self._model(params["ModelName"])
        shape = service_model("sagemaker").operation_model("DescribeModel").output_shape
        return shaped(shape, {**model.params, "ModelArn": model.arn, "CreationTime": model.created})

    def delete_model(self, params: dict[str, Any]) -> dict[str, Any]:
        model = self._model(params["ModelName"])
        del self.models[params["ModelName"].lower()]
        self.tags.pop(model.arn, None)
        return {}

    def list_models(self, params: dict[str, Any]) -> dict[str, Any]:
        rows = [(m.params["ModelName"], m.created, m.created, None,
                 {"ModelName": m.params["ModelName"], "ModelArn": m.arn, "CreationTime": m.created})
                 for m in self.models.values()]
        return self._page(rows, params, "Models")

    # ---- endpoint configs -----------------------------------------------------------

    def _check_endpoint_config(self, params: dict[str, Any]) -> None:
        """The ProductionVariant rules the service model cannot express (DESIGN §7)."""
        config_name = params["EndpointConfigName"]
        variants = params["ProductionVariants"]
        names = [v["VariantName"] for v in variants]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise validation(f"Production variant names must be unique; {duplicated} appear more than once.")
        with_model = [v["VariantName"] for v in variants if v.get("ModelName")]
        if with_model and len(with_model) != len(variants):
            raise validation("Either every production variant names a ModelName, or none does "
                             "(an endpoint for inference components); mixing them is not supported.")
        for variant in variants:
            self._check_variant(variant)
        if not with_model and not params.get("ExecutionRoleArn"):
            raise validation(f'Endpoint configuration "{config_name}" has production variants without a ModelName '
                             "(an endpoint for inference components); such endpoint configurations require "
                             "ExecutionRoleArn.")

    def _check_variant(self, variant: dict[str, Any]) -> None:
        """One ProductionVariant: serverless or instance-based (a type or pools), the models it names, its layout."""
        name = variant["VariantName"]
        has_type, has_pools = "InstanceType" in variant, "InstancePools" in variant
        serverless = "ServerlessConfig" in variant
        if serverless and (has_type or has_pools):
            raise validation(f'Production variant "{name}": ServerlessConfig cannot be combined with InstanceType '
                             'or InstancePools.')
        if serverless and not variant.get("ModelName"):
            raise validation(f'Production variant "{name}": a serverless variant needs a ModelName; '
                             "inference components need instance-based variants.")
        if not serverless and has_type == has_pools:
            raise validation(f'Production variant "{name}" must specify exactly one of InstanceType or '
                             'InstancePools.')
        if has_pools:
            priorities = [pool["Priority"] for pool in variant["InstancePools"]]
            if sorted(priorities) != list(range(1, len(priorities) + 1)):
                raise validation(f'InstancePools of production variant "{name}" must have unique priorities '
                                 f"1..{len(priorities)}; got {priorities}.")
            for pool in variant["InstancePools"]:
                if pool.get("ModelNameOverride"):
                    self._model(pool["ModelNameOverride"])
        if variant.get("ModelName"):
            self._model(variant["ModelName"])
        if "AcceleratorPartitionLayouts" in variant:
            self._check_partition_layout(variant)

    @staticmethod
    def _check_partition_layout(variant: dict[str, Any]) -> None:
        name, layouts = variant["VariantName"], variant["AcceleratorPartitionLayouts"]
        if variant.get("ModelName"):
            raise validation(f'AcceleratorPartitionLayouts is supported only on endpoints for inference components; '
                             f'production variant "{name}" names a model. Remove ModelName or the layout.')
        if "InstancePools" in variant or "ServerlessConfig" in variant:
            raise validation(f'Production variant "{name}": AcceleratorPartitionLayouts cannot be combined with '
                             "InstancePools or ServerlessConfig.")
        if len(layouts) != 1:
            raise validation(f'Production variant "{name}": AcceleratorPartitionLayouts must contain exactly one '
                             f'layout, got {len(layouts)}.')
        types = layouts[0].get("AcceleratorPartitionTypes") or []
        if not types:
            raise validation(f'Production variant "{name}": the layout lists no AcceleratorPartitionTypes.')
        _check_layout_fits(name, variant["InstanceType"], types)

    def create_endpoint_config(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params["EndpointConfigName"]
        self._refuse_existing(self.configs, "endpoint-config", "endpoint configuration", name)
        self._check_endpoint_config(params)
        config = EndpointConfig(params, arn("endpoint-config", name), time.time())
        self.configs[name.lower()] = config
        self._tag(config.arn, params.get("Tags"))
        return {"EndpointConfigArn": config.arn}

    def describe_endpoint_config(self, params: dict[str, Any]) -> dict[str, Any]:
        config = self._config(params["EndpointConfigName"])
        shape = service_model("sagemaker").operation_model("DescribeEndpointConfig").output_shape
        described = shaped(shape, {**config.params, "EndpointConfigArn": config.arn, "CreationTime": config.created})
        if self.shared.scenario.drop_partition_layouts:
            for variant in described["ProductionVariants"]:
                variant.pop("AcceleratorPartitionLayouts", None)
        return described

    def delete_endpoint_config(self, params: dict[str, Any]) -> dict[str, Any]:
        config = self._config(params["EndpointConfigName"])
        del self.configs[params["EndpointConfigName"].lower()]
        self.tags.pop(config.arn, None)
        return {}

    def list_endpoint_configs(self, params: dict[str, Any]) -> dict[str, Any]:
        rows = [(c.params["EndpointConfigName"], c.created, c.created, None,
                 {"EndpointConfigName": c.params["EndpointConfigName"], "EndpointConfigArn": c.arn,
                  "CreationTime": c.created}) for c in self.configs.values()]
        return self._page(rows, params, "EndpointConfigs")

    # ---- endpoints ------------------------------------------------------------------

    def _plan(self, config: EndpointConfig) -> list[VariantPlan]:
        """Each variant's candidates in priority order, with the models resolved now (as CreateEndpoint does)."""
        plans = []
        for variant in config.params["ProductionVariants"]:
            pools = sorted(variant.get("InstancePools", []), key=lambda pool: pool["Priority"])
            choices = [(p["InstanceType"], p.get("ModelNameOverride") or variant.get("ModelName")) for p in pools]
            choices = choices or [(variant.get("InstanceType"), variant.get("ModelName"))]
            candidates = tuple((kind, self._model(model).source() if model else None) for kind, model in choices)
            plans.append(VariantPlan(variant["VariantName"], candidates, tuple(p["InstanceType"] for p in pools),
                                     variant.get("InitialInstanceCount", 1)))
        return plans

    def _provision(self, plans: list[VariantPlan], fail_with: str | None, unavailable: frozenset[str],
                   timeout_s: float) -> Callable[[threading.Event], Outcome]:
        def work(cancel: threading.Event) -> Outcome:
            if fail_with is not None:
                return Outcome(failure_reason=fail_with)
            placed: dict[str, Placement] = {}
            try:
                for plan in plans:
                    placed[plan.name] = self._place(plan, unavailable, timeout_s, cancel)
            except StartFailure as failure:
                stop_containers([c for placement in placed.values() for c in placement.containers])
                return Outcome(failure_reason=str(failure))
            return Outcome(variants=placed)

        return work

    def _place(self, plan: VariantPlan, unavailable: frozenset[str], timeout_s: float,
               cancel: threading.Event) -> Placement:
        """Try the candidates in priority order; the first with capacity gets the variant's container."""
        tried = []
        for instance_type, source in plan.candidates:
            if instance_type in unavailable:
                tried.append(instance_type)
                continue
            containers, image = [], None
            if source is not None:
                label = f"The primary container for production variant {plan.name}"
                containers, image = self.runtime.start(source, 1, label, timeout_s, cancel)
            return Placement(instance_type, plan.pool_types, plan.instance_count, containers, image)
        raise StartFailure(f"InsufficientInstanceCapacity: Unable to provision requested ML compute capacity for "
                           f"production variant {plan.name}; tried {', '.join(tried)} (insufficient capacity).")

    def create_endpoint(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params["EndpointName"]
        self._refuse_existing(self.endpoints, "endpoint", "endpoint", name)
        config = self._config_read_by_endpoint(params["EndpointConfigName"])
        plans = self._plan(config)
        scenario = self.shared.scenario
        fail_with, scenario.fail_next_endpoint_with = scenario.fail_next_endpoint_with, None
        now = time.time()
        endpoint = Endpoint(name, arn("endpoint", name), config, now, now, "Creating",
                            deployment_config=params.get("DeploymentConfig"))
        self.endpoints[name.lower()] = endpoint
        self._tag(endpoint.arn, params.get("Tags"))

        def finish(outcome: Outcome) -> None:
            endpoint.status = "Failed" if outcome.failure_reason else "InService"
            endpoint.failure_reason, endpoint.variants = outcome.failure_reason, outcome.variants
            endpoint.modified = time.time()

        work = self._provision(plans, fail_with, scenario.unavailable_instance_types,
                               scenario.container_start_timeout_s)
        self._start_job(endpoint, work, finish)
        return {"EndpointArn": endpoint.arn}

    def update_endpoint(self, params: dict[str, Any]) -> dict[str, Any]:
        endpoint = self._endpoint(params["EndpointName"])
        self._settle(endpoint, count_poll=False)
        if endpoint.status != "InService":
            raise validation(f'Cannot update in-progress endpoint "{endpoint.arn}".')
        config = self._config_read_by_endpoint(params["EndpointConfigName"])
        if config.for_components != endpoint.config.for_components:
            raise validation("UpdateEndpoint cannot switch an endpoint between SageMaker models and inference "
                             "components; create a new endpoint.")
        for variant in config.params["ProductionVariants"]:
            old = endpoint.config.variant(variant["VariantName"]) or {}
            if old.get("AcceleratorPartitionLayouts") != variant.get("AcceleratorPartitionLayouts"):
                raise validation(f'The accelerator partition layout of production variant "{variant["VariantName"]}" '
                                 "cannot change on a running endpoint; create a new endpoint.")
        plans = self._plan(config)
        scenario = self.shared.scenario
        roll_back = scenario.roll_back_updates
        endpoint.status, endpoint.modified = "Updating", time.time()
        endpoint.deployment_config = params.get("DeploymentConfig", endpoint.deployment_config)

        def finish(outcome: Outcome) -> None:
            endpoint.status, endpoint.modified = "InService", time.time()
            endpoint.failure_reason = outcome.failure_reason
            if not roll_back and outcome.failure_reason is None:
                stop_containers(endpoint.containers())
                endpoint.config, endpoint.variants = config, outcome.variants

        work = (lambda cancel: Outcome()) if roll_back else self._provision(
            plans, None, scenario.unavailable_instance_types, scenario.container_start_timeout_s)
        self._start_job(endpoint, work, finish)
        return {"EndpointArn": endpoint.arn}

    def describe_endpoint(self, params: dict[str, Any]) -> dict[str, Any]:
        endpoint = self._endpoint(params["EndpointName"])
        self._settle(endpoint, count_poll=True)
        endpoint = self._endpoint(params["EndpointName"])  # a finished deletion removed it
        described: dict[str, Any] = {
            "EndpointName": endpoint.name, "EndpointArn": endpoint.arn,
            "EndpointConfigName": endpoint.config.params["EndpointConfigName"], "EndpointStatus": endpoint.status,
            "FailureReason": endpoint.failure_reason, "CreationTime": endpoint.created,
            "LastModifiedTime": endpoint.modified,
            "LastDeploymentConfig": endpoint.deployment_config,
        }
        released = self._instances_released(endpoint)
        if endpoint.variants:
            described["ProductionVariants"] = [self._variant_summary(endpoint.config, name, placement, released)
                                               for name, placement in endpoint.variants.items()]
        return compact(described)

    def _instances_released(self, endpoint: Endpoint) -> bool:
        """Whether the endpoint has given back its instances (Scenario.instance_release_polls): an inference-component
        endpoint with ManagedInstanceScaling ENABLED at MinInstanceCount 0, no component on it holding or starting a
        copy, for more than that many DescribeEndpoint calls. Counted per call; reset when a copy is there again."""
        scaling = [v.get("ManagedInstanceScaling") or {} for v in endpoint.config.params["ProductionVariants"]]
        may_release = endpoint.config.for_components and endpoint.status == "InService" and all(
            s.get("Status") == "ENABLED" and s.get("MinInstanceCount") == 0 for s in scaling)
        busy = any(c.copies or c.desired_copies or c.status != "InService"
                   for c in self.components.values() if c.endpoint is endpoint)
        endpoint.idle_polls = endpoint.idle_polls + 1 if may_release and not busy else 0
        return endpoint.idle_polls > self.shared.scenario.instance_release_polls

    @staticmethod
    def _variant_summary(config: EndpointConfig, name: str, placement: Placement, released: bool) -> dict[str, Any]:
        variant = config.variant(name) or {}
        weight = float(variant.get("InitialVariantWeight", 1.0))
        summary: dict[str, Any] = {"VariantName": name, "CurrentWeight": weight, "DesiredWeight": weight,
                                   "DeployedImages": [placement.image] if placement.image else None,
                                   "ManagedInstanceScaling": variant.get("ManagedInstanceScaling"),
                                   "RoutingConfig": variant.get("RoutingConfig"),
                                   "AcceleratorPartitionLayouts": variant.get("AcceleratorPartitionLayouts")}
        if "ServerlessConfig" in variant:
            summary["CurrentServerlessConfig"] = summary["DesiredServerlessConfig"] = variant["ServerlessConfig"]
        else:
            count = 0 if released else placement.instance_count
            summary["CurrentInstanceCount"] = summary["DesiredInstanceCount"] = count
        if placement.pool_types:
            summary["InstancePools"] = [
                {"InstanceType": kind,
                 "CurrentInstanceCount": placement.instance_count if kind == placement.instance_type
                 and not released else 0}
                for kind in placement.pool_types
            ]
        return compact(summary)

    def delete_endpoint(self, params: dict[str, Any]) -> dict[str, Any]:
        endpoint = self._endpoint(params["EndpointName"])
        remaining = sorted(c.name for c in self.components.values() if c.endpoint is endpoint)
        if remaining:
            raise validation(f'Cannot delete endpoint "{endpoint.arn}": inference components {remaining} are deployed '
                             'on it. '
                             "Delete the inference components first.")
        if endpoint.status == "Deleting":
            raise validation(f'Cannot delete endpoint "{endpoint.arn}": it is already being deleted.')
        old_job, containers = endpoint.job, endpoint.containers()
        endpoint.status, endpoint.modified, endpoint.variants = "Deleting", time.time(), {}

        def finish(outcome: Outcome) -> None:
            self.endpoints.pop(endpoint.name.lower(), None)
            self.tags.pop(endpoint.arn, None)

        self._start_job(endpoint, self._retire(old_job, containers), finish, polls=1)
        return {}

    def list_endpoints(self, params: dict[str, Any]) -> dict[str, Any]:
        for endpoint in list(self.endpoints.values()):
            self._settle(endpoint, count_poll=False)
        rows = [(e.name, e.created, e.modified, e.status,
                 {"EndpointName": e.name, "EndpointArn": e.arn, "CreationTime": e.created,
                  "LastModifiedTime": e.modified, "EndpointStatus": e.status})
                for e in self.endpoints.values()]
        return self._page(rows, params, "Endpoints")

    # ---- inference components -------------------------------------------------------

    def _component_source(self, spec: dict[str, Any]) -> Source:
        """The model's container, with the specification's own Container fields on top."""
        container = spec.get("Container", {})
        if spec.get("ModelName"):
            base = self._model(spec["ModelName"]).source()
        elif container.get("Image"):
            base = Source(container["Image"], None, {})
        else:
            raise validation("Specification must name a ModelName or a Container with an Image.")
        return Source(container.get("Image", base.image), container.get("ArtifactUrl", base.model_data_url),
                      {**base.environment, **container.get("Environment", {})})

    def _check_component_spec(self, endpoint: Endpoint, variant_name: str, spec: dict[str, Any]) -> None:
        requirements = spec.get("ComputeResourceRequirements")
        if requirements is None:
            raise validation("Specification.ComputeResourceRequirements is required.")
        partition = requirements.get("AcceleratorPartitionType")
        if partition is None:
            return
        declared = partition_types(endpoint.config, variant_name)
        if partition not in declared:
            raise validation(f'AcceleratorPartitionType "{partition}" is not one of the partition types declared on '
                             f'production variant "{variant_name}" of endpoint "{endpoint.name}": '
                             f'{sorted(set(declared)) or "none"}.')
        if requirements.get("NumberOfAcceleratorDevicesRequired") != 1:
            raise validation("NumberOfAcceleratorDevicesRequired must be 1 when AcceleratorPartitionType is set "
                             f"(one partition per copy); got {requirements.get('NumberOfAcceleratorDevicesRequired')}.")

    def _capacity_problem(self, endpoint: Endpoint, variant_name: str, requirements: dict[str, Any], copies: int,
                          name: str) -> str | None:
        """Why `copies` copies of component `name` do not fit beside the other components of the variant, if so.
        Capacity as SageMaker counts it (tasks.backends.capacity): a copy takes its AcceleratorPartitionType partition
        (the layout applies to every GPU of every instance,
        https://docs.aws.amazon.com/sagemaker/latest/dg/inference-components-accelerator-partitioning-manage.html), else
        NumberOfAcceleratorDevicesRequired whole GPUs, else NumberOfCpuCoresRequired vCPUs of one instance; the
        instances are InitialInstanceCount, or up to ManagedInstanceScaling.MaxInstanceCount where that is ENABLED
        (SageMaker adds instances to place copies,
        https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ProductionVariantManagedInstanceScaling.html). An
        instance type this table does not know is not checked."""
        placement = endpoint.variants.get(variant_name)
        variant = endpoint.config.variant(variant_name) or {}
        unit, per_copy = resource_of(requirements)
        per_instance = placement and instance_resources(placement.instance_type, unit,
                                                        partition_types(endpoint.config, variant_name))
        if not per_instance:
            return None
        scaling = variant.get("ManagedInstanceScaling") or {}
        instances = max(placement.instance_count, scaling.get("MaxInstanceCount", 0)
                        if scaling.get("Status") == "ENABLED" else 0)
        held = sum(c.desired_copies * resource_of(c.spec.get("ComputeResourceRequirements", {}))[1]
                   for c in self.components.values()
                   if c.endpoint is endpoint and c.variant_name == variant_name and c.name != name
                   and resource_of(c.spec.get("ComputeResourceRequirements", {}))[0] == unit
                   and c.holds_capacity and (c.status != "Failed" or c.copies))
        fit = min((per_instance // per_copy) * instances, (per_instance * instances - held) // per_copy)
        if copies <= fit:
            return None
        return (f"InsufficientCapacity: Unable to place {copies} copies of inference component {name}: endpoint "
                f"{endpoint.name} has room for {max(0, fit)} ({instances} x {placement.instance_type} with "
                f"{per_instance:g} {unit} each, {held:g} held by other inference components, {per_copy:g} a copy).")

    def _copies_job(self, source: Source, count: int, name: str, problem: str | None, timeout_s: float):
        def work(cancel: threading.Event) -> Outcome:
            if problem:
                return Outcome(failure_reason=problem)
            copies, image = self.runtime.start(source, count, f"Inference component {name}", timeout_s, cancel)
            return Outcome(copies=copies, image=image)

        return work

    def create_inference_component(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params["InferenceComponentName"]
        self._refuse_existing(self.components, "inference-component", "inference component", name)
        endpoint = self._endpoint(params["EndpointName"])
        self._settle(endpoint, count_poll=False)
        if not endpoint.config.for_components:
            raise validation(f'Endpoint "{endpoint.name}" hosts SageMaker models; inference components need an '
                             'endpoint '
                             "whose production variants name no ModelName.")
        if endpoint.status not in ("InService", "Updating"):
            raise validation(f'Cannot create inference component on endpoint "{endpoint.arn}" in status '
                             f'{endpoint.status}.')
        variants = [v["VariantName"] for v in endpoint.config.params["ProductionVariants"]]
        variant_name = params.get("VariantName") or (variants[0] if len(variants) == 1 else "")
        if variant_name not in variants:
            raise validation(f'Could not find production variant "{variant_name}" on endpoint "{endpoint.name}" '
                             f"(variants: {variants}).")
        if "Specification" not in params or "RuntimeConfig" not in params:
            raise validation("CreateInferenceComponent requires Specification and RuntimeConfig.")
        spec = params["Specification"]
        self._check_component_spec(endpoint, variant_name, spec)
        source = self._component_source(spec)
        copies = params["RuntimeConfig"]["CopyCount"]
        problem = self._capacity_problem(endpoint, variant_name, spec["ComputeResourceRequirements"], copies, name)
        scenario = self.shared.scenario
        fail_with, scenario.fail_next_component_with = scenario.fail_next_component_with, None
        now = time.time()
        component = Component(name, arn("inference-component", name), endpoint, variant_name, spec, source, copies,
                              now, now, "Creating", holds_capacity=problem is None)
        self.components[name.lower()] = component
        self._tag(component.arn, params.get("Tags"))
        problem = problem or fail_with

        def finish(outcome: Outcome) -> None:
            component.status = "Failed" if outcome.failure_reason else "InService"
            component.failure_reason, component.modified = outcome.failure_reason, time.time()
            component.copies, component.image = outcome.copies, outcome.image

        timeout_s = self.shared.scenario.container_start_timeout_s
        self._start_job(component, self._copies_job(source, copies, name, problem, timeout_s), finish)
        return {"InferenceComponentArn": component.arn}

    def update_inference_component(self, params: dict[str, Any]) -> dict[str, Any]:
        component = self._component(params["InferenceComponentName"])
        self._settle(component, count_poll=False)
        # SageMaker refuses to update a component that is Creating or Updating (ValidationException); InService and
        # Failed ones can be updated. Not stated on API_UpdateInferenceComponent (its statuses:
        # https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_DescribeInferenceComponent.html): the double
        # follows the behaviour issue 17 reports (docs/aws-double.md)
        if component.status not in ("InService", "Failed"):
            raise validation(f'Cannot update in-progress inference component "{component.arn}".')
        spec = params.get("Specification", component.spec)
        self._check_component_spec(component.endpoint, component.variant_name, spec)
        source = self._component_source(spec)
        copies = params.get("RuntimeConfig", {}).get("CopyCount", component.desired_copies)
        scenario = self.shared.scenario
        rolling = RollingUpdate(self, component, source, copies, params["DeploymentConfig"], scenario) \
            if "DeploymentConfig" in params else None
        # the new copies start beside the old ones: one batch at a time with a RollingUpdatePolicy ("provisions capacity
        # on the new endpoint fleet ... and terminates capacity on the old",
        # https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html);
        # without a DeploymentConfig all of them. That case is not documented for inference components: the double
        # follows SageMaker's blue/green update of endpoints (the new fleet before the old one goes,
        # https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-blue-green.html), as DESIGN §7 does
        peak = rolling.peak_copies if rolling else copies + len(component.copies)
        problem = self._capacity_problem(component.endpoint, component.variant_name,
                                         spec["ComputeResourceRequirements"], peak, component.name)
        roll_back = scenario.roll_back_updates and rolling is None  # a rolling update rolls back after its first batch
        fail_with, scenario.fail_next_component_with = scenario.fail_next_component_with, None
        component.status, component.modified = "Updating", time.time()
        component.deployment_config = params.get("DeploymentConfig", component.deployment_config)

        def finish(outcome: Outcome) -> None:
            component.modified = time.time()
            # Failed, the old copies still serving the old spec (see fail_next_component_with)
            if fail_with is not None:
                component.status, component.failure_reason = "Failed", fail_with
            elif roll_back:  # what SageMaker shows after an auto-rollback: InService, old spec, no FailureReason
                stop_containers(outcome.copies)
                component.status, component.failure_reason = "InService", None
            elif outcome.failure_reason or outcome.rolled_back:
                # a rollback puts the old fleet back ("SageMaker AI provisions the entire capacity of the old endpoint
                # fleet", RollbackMaximumBatchSize in API_InferenceComponentRollingUpdatePolicy.html): a component
                # scaled to zero before its update is back at zero copies, InService as a scaled-in component is
                # (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html); AWS
                # documents no Failed for it. Failed only where copies that served before the update are gone.
                restored = component.copies or (rolling is not None and rolling.old_count == 0)
                component.status = "InService" if restored else "Failed"
                component.failure_reason = outcome.failure_reason
            else:
                if rolling is None:
                    stop_containers(component.copies)
                    component.copies = outcome.copies
                component.status, component.failure_reason = "InService", None
                component.spec, component.source, component.desired_copies = spec, source, copies
                component.image = outcome.image

        if fail_with is not None:
            work = lambda cancel: Outcome(failure_reason=fail_with)  # noqa: E731
        elif roll_back:
            work = lambda cancel: Outcome()  # noqa: E731
        elif rolling is not None and problem is None:
            work = rolling
        else:
            work = self._copies_job(source, copies, component.name, problem, scenario.container_start_timeout_s)
        self._start_job(component, work, finish)
        return {"InferenceComponentArn": component.arn}

    def update_inference_component_runtime_config(self, params: dict[str, Any]) -> dict[str, Any]:
        """Updating, then InService at the new CopyCount; 0 stops every copy and leaves the component InService with
        none (the model's CopyCount minimum is 0; AWS's scale-to-zero post schedules exactly that:
        https://aws.amazon.com/blogs/machine-learning/unlock-cost-savings-with-the-new-scale-down-to-zero-feature-in-amazon-sagemaker-inference/)."""
        component = self._component(params["InferenceComponentName"])
        self._settle(component, count_poll=False)
        if component.status != "InService":
            raise validation(f'Cannot update in-progress inference component "{component.arn}".')
        self._set_copies(component, params["DesiredRuntimeConfig"]["CopyCount"])
        return {"InferenceComponentArn": component.arn}

    def scale(self, component: Component, wanted: int, why: str) -> None:
        """Application Auto Scaling setting a component's copy count (a step policy, a target registered with a range
        the count is outside): the same Updating -> InService transition, whose outcome shows as soon as the copies are
        up, also to invocations, since no one polls for it. Noted in the rollout log; not in the call log (the caller
        sent nothing)."""
        self.shared.note(component.name,
                         f"Application Auto Scaling: {why}: {component.desired_copies} -> {wanted} copies")
        self._set_copies(component, wanted, polls=0, unpolled=True)

    def _set_copies(self, component: Component, wanted: int, polls: int | None = None, unpolled: bool = False) -> None:
        extra = max(0, wanted - len(component.copies))
        problem = self._capacity_problem(component.endpoint, component.variant_name,
                                         component.spec["ComputeResourceRequirements"], wanted, component.name)
        component.status, component.modified = "Updating", time.time()

        def finish(outcome: Outcome) -> None:
            component.status, component.modified = "InService", time.time()
            component.failure_reason = outcome.failure_reason
            if outcome.failure_reason is None:
                surplus = component.copies[wanted:]
                stop_containers(surplus)
                component.copies = component.copies[:wanted] + outcome.copies
                component.desired_copies = wanted

        timeout_s = self.shared.scenario.container_start_timeout_s
        work = self._copies_job(component.source, extra, component.name, problem,
                                timeout_s) if extra else (lambda cancel: Outcome())
        self._start_job(component, work, finish, polls=polls, unpolled=unpolled)

    def describe_inference_component(self, params: dict[str, Any]) -> dict[str, Any]:
        component = self._component(params["InferenceComponentName"])
        self._settle(component, count_poll=True)
        component = self._component(params["InferenceComponentName"])
        spec, source = component.spec, component.source
        return compact({
            "InferenceComponentName": component.name, "InferenceComponentArn": component.arn,
            "EndpointName": component.endpoint.name, "EndpointArn": component.endpoint.arn,
            "VariantName": component.variant_name, "FailureReason": component.failure_reason,
            "Specification": {
                "ModelName": spec.get("ModelName"),
                "Container": {"DeployedImage": component.image, "ArtifactUrl": source.model_data_url,
                              "Environment": source.environment or None},
                "ComputeResourceRequirements": spec.get("ComputeResourceRequirements"),
                "StartupParameters": spec.get("StartupParameters"),
            },
            "RuntimeConfig": {"DesiredCopyCount": component.desired_copies, "CurrentCopyCount": len(component.copies)},
            "CreationTime": component.created, "LastModifiedTime": component.modified,
            "InferenceComponentStatus": component.status, "LastDeploymentConfig": component.deployment_config,
        })

    def delete_inference_component(self, params: dict[str, Any]) -> dict[str, Any]:
        component = self._component(params["InferenceComponentName"])
        if component.status == "Deleting":
            raise validation(f'Cannot delete inference component "{component.arn}": it is already being deleted.')
        old_job, copies = component.job, component.copies
        self.cancel(old_job)
        component.status, component.modified, component.copies = "Deleting", time.time(), []

        def finish(outcome: Outcome) -> None:
            self.components.pop(component.name.lower(), None)
            self.tags.pop(component.arn, None)

        self._start_job(component, self._retire(old_job, copies), finish, polls=1)
        return {}

    def list_inference_components(self, params: dict[str, Any]) -> dict[str, Any]:
        for component in list(self.components.values()):
            self._settle(component, count_poll=False)
        chosen = [c for c in self.components.values()
                  if params.get("EndpointNameEquals", c.endpoint.name) == c.endpoint.name
                  and params.get("VariantNameEquals", c.variant_name) == c.variant_name]
        rows = [(c.name, c.created, c.modified, c.status,
                 {"CreationTime": c.created, "InferenceComponentArn": c.arn, "InferenceComponentName": c.name,
                  "EndpointArn": c.endpoint.arn, "EndpointName": c.endpoint.name, "VariantName": c.variant_name,
                  "InferenceComponentStatus": c.status, "LastModifiedTime": c.modified})
                for c in chosen]
        return self._page(rows, params, "InferenceComponents")

    # ---- runtime --------------------------------------------------------------------

    def invoke(self, endpoint_name: str, action: str, headers: dict[str, str], body: bytes) -> tuple[int,
                                                                                                     dict[str, str],
                                                                                                     bytes]:
        """InvokeEndpoint (and InvokeEndpointWithResponseStream): validate, pick the least-busy copy, forward, map a
        non-200 to ModelError; a streamed answer's body is an iterator of event-stream messages (`stream_events`)."""
        params = runtime_params(endpoint_name, headers, body)
        operation = {"invocations": "InvokeEndpoint", "async-invocations": "InvokeEndpointAsync",
                     "invocations-response-stream": "InvokeEndpointWithResponseStream"}.get(action, action)
        self.shared.log("sagemaker-runtime", operation, params)
        if operation not in ("InvokeEndpoint", "InvokeEndpointWithResponseStream"):
            raise ApiError("UnknownOperationException", "the AWS double implements InvokeEndpoint and "
                           f"InvokeEndpointWithResponseStream only, not {operation}")
        self.shared.take_throttle(operation)
        problems = request_problems("sagemaker-runtime", operation, params)
        if problems:
            raise runtime_validation(f"{len(problems)} validation error(s) detected: " + "; ".join(problems))
        with self.shared.lock:
            copy, variant, dimensions = self._pick_copy(params)
            copy.in_flight += 1
        origin = "model" if params.get("InferenceComponentName") else "primary"
        started = time.perf_counter()
        streamed = operation == "InvokeEndpointWithResponseStream"
        try:
            if streamed:
                status, content_type, answer = self._streamed(copy, params, dimensions, started)
            else:
                status, content_type, answer = forward(copy.port, params)
        except (OSError, http.client.HTTPException) as exc:
            put_invocation_metrics(dimensions, None, None)
            raise ApiError("ModelError",
                           f"Received server error from {origin}: the model server did not answer ({exc}).",
                           status=424, LogStreamArn=log_stream_arn(endpoint_name)) from None
        finally:
            if not streamed:  # a stream's copy is in flight until the stream ends
                with self.shared.lock:
                    copy.in_flight -= 1
        if not streamed:
            put_invocation_metrics(dimensions, status, (time.perf_counter() - started) * 1e6)
        if status != 200:
            text = answer.decode("utf-8", errors="replace")
            side = "client" if 400 <= status < 500 else "server"
            raise ApiError(
                "ModelError",
                f'Received {side} error ({status}) from {origin} with message "{text}". See '
                f"https://{REGION}.console.aws.amazon.com/cloudwatch/home?region={REGION}#logEventViewer:group="
                f"/aws/sagemaker/Endpoints/{endpoint_name} in account {ACCOUNT_ID} for more information.",
                status=424, OriginalStatusCode=status, OriginalMessage=text, LogStreamArn=log_stream_arn(endpoint_name),
            )
        if streamed:  # the container's content type is a header of its own; the body is the event stream
            return 200, {"Content-Type": "application/vnd.amazon.eventstream", "X-Amzn-SageMaker-Content-Type":
                         content_type, "x-Amzn-Invoked-Production-Variant": variant}, answer
        return 200, {"Content-Type": content_type, "x-Amzn-Invoked-Production-Variant": variant}, answer

    def _streamed(self, copy: Container, params: dict[str, Any], dimensions: list[dict[str, str]],
                  started: float) -> tuple[int, str, Any]:
        """InvokeEndpointWithResponseStream's forward: a non-200 read whole (a ModelError before any event, as
        InvokeEndpoint's), a 200 as the event stream (`stream_events`); the copy is in flight until its answer ends."""
        try:
            connection, response = open_invocation(copy.port, params)
        except BaseException:
            with self.shared.lock:
                copy.in_flight -= 1
            raise

        def done() -> None:
            with self.shared.lock:
                copy.in_flight -= 1
            put_invocation_metrics(dimensions, response.status, (time.perf_counter() - started) * 1e6)
            connection.close()

        content_type = response.getheader("Content-Type", "application/json")
        if response.status == 200:
            return 200, content_type, stream_events(response, done)
        try:
            return response.status, content_type, response.read()
        finally:
            done()

    def _pick_copy(self, params: dict[str, Any]) -> tuple[Container, str, list[dict[str, str]]]:
        """The copy to serve an invocation (the least busy, in turn among equals), its variant and the dimensions of
        its metrics."""
        endpoint = self.endpoints.get(params["EndpointName"].lower())
        if endpoint is None:
            raise runtime_validation(f"Endpoint {params['EndpointName']} of account {ACCOUNT_ID} not found.")
        if endpoint.status not in ("InService", "Updating"):
            raise runtime_validation(f"Endpoint {endpoint.name} of account {ACCOUNT_ID} is not in service "
                                     f"(status {endpoint.status}).")
        component_name = params.get("InferenceComponentName")
        if endpoint.config.for_components:
            if not component_name:
                raise runtime_validation(IC_NAME_REQUIRED)
            copies, variant, dimensions = self._component_copies(endpoint, component_name)
        else:
            if component_name:
                raise runtime_validation(IC_NAME_REFUSED)
            variant = params.get("TargetVariant") or next(iter(endpoint.variants), "")
            if variant not in endpoint.variants:
                raise runtime_validation(f"Variant {variant} not found for endpoint {endpoint.name}.")
            copies = endpoint.variants[variant].containers
            dimensions = [{"Name": "EndpointName", "Value": endpoint.name}, {"Name": "VariantName", "Value": variant}]
        least = min(copy.in_flight for copy in copies)
        idle = [copy for copy in copies if copy.in_flight == least]
        return idle[next(self.turns) % len(idle)], variant, dimensions

    def _component_copies(self, endpoint: Endpoint,
                          component_name: str) -> tuple[list[Container], str, list[dict[str, str]]]:
        """The copies of the inference component an invocation names, its variant and the dimensions of its metrics."""
        component = self.components.get(component_name.lower())
        if component is None or component.endpoint is not endpoint:
            raise runtime_validation(f"Inference component {component_name} was not found on endpoint "
                                     f"{endpoint.name}.")
        if component.job is not None and component.job.unpolled:  # Application Auto Scaling's copies, once up
            self._settle(component, count_poll=False)
        # copies a failed update left serve on (see Scenario.fail_next_component_with); none, none do
        if component.status not in ("InService", "Updating", "Failed") or not component.copies:
            if component.status in ("InService", "Updating") and self.autoscaling is not None:
                # scaled to zero (or scaling out): the request "can't respond" and SageMaker emits
                # NoCapacityInvocationFailures, which the scale-out alarm reads (SCALE_TO_ZERO_PAGE)
                put_no_capacity_metric(component.name)
                self.autoscaling.no_capacity(component)
            raise runtime_validation(NO_COPIES)
        return component.copies, component.variant_name, [{"Name": "InferenceComponentName", "Value": component.name}]


class Cancelled(Exception):
    """The job was cancelled (reset, drain, deletion): whoever cancelled it owns the component's copies now."""


def capacity_size(size: dict[str, Any], total: int) -> int:
    """A CapacitySize as a copy count: COPY_COUNT's value, or CAPACITY_PERCENT of `total` rounded down, at least 1."""
    return size["Value"] if size["Type"] == "COPY_COUNT" else max(1, size["Value"] * total // 100)


def batch_bounds(size: dict[str, Any], copies: int) -> None:
    """Refuse a MaximumBatchSize outside 5-50 % of the copy count, as the API reference states it (for COPY_COUNT,
    5-50 % of `copies`; for CAPACITY_PERCENT, a Value of 5-50)
    (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html).
    The reference does not say how a count between the bounds' roundings is judged; this compares without rounding."""
    percent = size["Type"] == "CAPACITY_PERCENT"
    low, high = (5, 50) if percent else (copies * 0.05, copies * 0.5)
    if not low <= size["Value"] <= high:
        raise validation(f"RollingUpdatePolicy.MaximumBatchSize {size['Type']} {size['Value']} must be between 5% and "
                         f"50% of the copy count of the inference component ({copies}).")


class RollingUpdate:
    """UpdateInferenceComponent with a RollingUpdatePolicy, run as the component's job. Each batch starts new-spec
    copies beside the old ones (invocations reach both), then stops as many old copies (after their requests in
    flight) and bakes WaitIntervalInSeconds, evaluating the AutoRollbackConfiguration alarms every ALARM_CHECK_S. An
    alarm in ALARM, MaximumExecutionTimeoutInSeconds or the `roll_back_updates` knob roll back to the old spec
    (InService, no FailureReason: SageMaker has no rollback status); new copies that fail to start roll back too,
    with a FailureReason. Every step is written to the double's rollout log (`AwsDouble.rollout_events`)."""

    def __init__(self, sagemaker: SageMaker, component: Component, source: Source, copies: int,
                 config: dict[str, Any], scenario: Scenario):
        policy = config["RollingUpdatePolicy"]
        self.shared, self.runtime, self.component = sagemaker.shared, sagemaker.runtime, component
        self.old_source, self.new_source, self.copies = component.source, source, copies
        self.old_count = len(component.copies)
        self.batch = capacity_size(policy["MaximumBatchSize"], copies)
        batch_bounds(policy["MaximumBatchSize"], copies)
        rollback = policy.get("RollbackMaximumBatchSize")
        self.rollback_batch = capacity_size(rollback, self.old_count) if rollback else max(1, self.old_count)
        self.wait_s = policy["WaitIntervalInSeconds"]
        self.timeout_s = policy.get("MaximumExecutionTimeoutInSeconds", DEFAULT_ROLLING_TIMEOUT_S)
        self.limit_s = self.timeout_s * scenario.rolling_timeout_scale
        self.start_timeout_s, self.scenario_roll_back = scenario.container_start_timeout_s, scenario.roll_back_updates
        self.alarms = [alarm["AlarmName"] for alarm in config.get("AutoRollbackConfiguration", {}).get("Alarms", [])]
        find_alarms(self.alarms)  # refuse the update now if an alarm is missing or cannot be evaluated
        self.states: dict[str, str] = {}
        self.label = f"Inference component {component.name}"

    @property
    def peak_copies(self) -> int:
        """The most copies running at once (a batch's new copies start before as many old ones stop)."""
        batches = math.ceil(self.copies / self.batch)
        return max([min(k * self.batch, self.copies) + max(0, self.old_count - (k - 1) * self.batch)
                    for k in range(1, batches + 1)] + [self.old_count])

    def note(self, message: str) -> None:
        self.shared.note(self.component.name, message)

    def __call__(self, cancel: threading.Event) -> Outcome:
        deadline = time.monotonic() + self.limit_s
        batches = math.ceil(self.copies / self.batch)
        self.note(f"started: {self.old_count} old copies -> {self.copies} new copies in {batches} batches of "
                  f"{self.batch}, wait {self.wait_s} s, timeout {self.timeout_s} s, alarms {self.alarms}")
        new: list[Container] = []
        image = None
        with self.shared.lock:
            old = list(self.component.copies)
        try:
            for number in range(1, batches + 1):
                count = min(self.batch, self.copies - len(new))
                self.note(f"batch {number}/{batches}: starting {count} new copies")
                try:
                    started, image = self.runtime.start(self.new_source, count, self.label, self.start_timeout_s,
                                                        cancel)
                except StartFailure as failure:
                    if cancel.is_set():
                        raise Cancelled from None
                    self.note(f"rolling back: new copies failed to start: {failure}")
                    return self._roll_back(new, old, cancel, str(failure))
                self._serve(started, cancel)
                new, stopping, old = new + started, old[:count], old[count:]
                self.note(f"batch {number}/{batches}: {len(new)} new and {len(old) + len(stopping)} old copies "
                          f"serving; stopping {len(stopping)} old copies, then baking {self.wait_s} s")
                self._retire(stopping, cancel)
                try:
                    reason = self._bake(deadline, cancel)
                except ApiError as error:  # an alarm changed into one the double cannot evaluate: loudly
                    self.note(f"rolling back: {error.message}")
                    return self._roll_back(new, old, cancel, error.message)
                if reason:
                    self.note(f"rolling back: {reason}")
                    return self._roll_back(new, old, cancel)
            self._retire(old, cancel)  # the update lowered the copy count
            self.note(f"completed: {len(new)} new copies serving")
            return Outcome(image=image)
        except Cancelled:
            self.note("cancelled")
            return Outcome(failure_reason="the update was cancelled")

    def _serve(self, copies: list[Container], cancel: threading.Event) -> None:
        """Put started copies in rotation, unless the job was cancelled meanwhile (then they are stopped here)."""
        with self.shared.lock:
            if not cancel.is_set():
                self.component.copies = self.component.copies + copies
                return
        stop_containers(copies)
        raise Cancelled

    def _retire(self, copies: list[Container], cancel: threading.Event) -> None:
        """Take copies out of rotation, let their requests in flight finish (bounded), then stop them."""
        if not copies:
            return
        with self.shared.lock:
            if cancel.is_set():
                raise Cancelled
            self.component.copies = [copy for copy in self.component.copies if copy not in copies]
        deadline = time.monotonic() + INVOKE_TIMEOUT_S
        while any(copy.in_flight
                  for copy in copies) and time.monotonic() < deadline and not cancel.wait(PING_INTERVAL_S):
            pass
        stop_containers(copies)

    def _bake(self, deadline: float, cancel: threading.Event) -> str | None:
        """Check at once, then every ALARM_CHECK_S for WaitIntervalInSeconds: why to roll back, or None."""
        end = time.monotonic() + self.wait_s
        while True:
            reason = self._breach(deadline)
            if reason or time.monotonic() >= end:
                return reason
            if cancel.wait(min(ALARM_CHECK_S, max(0.0, end - time.monotonic()))):
                raise Cancelled

    def _breach(self, deadline: float) -> str | None:
        """Evaluate the alarms (noting each change of state) and the time limit: why to roll back, or None."""
        if self.scenario_roll_back:
            return "scenario roll_back_updates"
        for name, (state, reason) in evaluate_alarms(self.alarms).items():
            if self.states.get(name) != state:
                self.states[name] = state
                self.note(f"alarm {name}: {state}: {reason}")
        firing = [name for name in self.alarms if self.states[name] == "ALARM"]
        if firing:
            return f"alarm {firing[0]} in ALARM"
        if time.monotonic() >= deadline:
            return f"MaximumExecutionTimeoutInSeconds ({self.timeout_s} s) passed"
        return None

    def _roll_back(self, new: list[Container], old: list[Container], cancel: threading.Event,
                   failure_reason: str | None = None) -> Outcome:
        """Start old-spec copies back up to the old count (RollbackMaximumBatchSize at a time, or all at once), stopping
        as many new copies after each batch, then the rest of them."""
        batches = math.ceil((self.old_count - len(old)) / self.rollback_batch)
        try:
            for number in range(1, batches + 1):
                count = min(self.rollback_batch, self.old_count - len(old))
                self.note(f"rollback batch {number}/{batches}: starting {count} old copies")
                started, _ = self.runtime.start(self.old_source, count, self.label, self.start_timeout_s, cancel)
                self._serve(started, cancel)
                old, stopping, new = old + started, new[:count], new[count:]
                self._retire(stopping, cancel)
        except StartFailure as failure:
            if cancel.is_set():
                raise Cancelled from None
            failure_reason = "; ".join(filter(None, [failure_reason, f"the rollback failed: {failure}"]))
        self._retire(new, cancel)
        self.note(f"rolled back: {len(old)} old copies serving"
                  + (f"; FailureReason: {failure_reason}" if failure_reason else ""))
        bounded = str(StartFailure(failure_reason)) if failure_reason else None  # within FailureReason's maximum
        return Outcome(failure_reason=bounded, rolled_back=True)


def runtime_params(endpoint_name: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """The InvokeEndpoint parameters a request carries, read back through the model's serialization."""
    shape = service_model("sagemaker-runtime").operation_model("InvokeEndpoint").input_shape
    lowered = {key.lower(): value for key, value in headers.items()}
    params: dict[str, Any] = {"EndpointName": endpoint_name, "Body": body}
    for member, member_shape in shape.members.items():
        location = member_shape.serialization.get("location")
        if location == "header" and member_shape.serialization["name"].lower() in lowered:
            params[member] = lowered[member_shape.serialization["name"].lower()]
    return params


def forward(port: int, params: dict[str, Any]) -> tuple[int, str, bytes]:
    """POST the body to a model server's /invocations; (status, content type, body)."""
    connection, response = open_invocation(port, params)
    try:
        return response.status, response.getheader("Content-Type", "application/json"), response.read()
    finally:
        connection.close()


def open_invocation(port: int, params: dict[str, Any]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """POST the body to a model server's /invocations; the connection and its response, not read yet (each read
    waits at most INVOKE_TIMEOUT_S; closing the connection closes the response)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=INVOKE_TIMEOUT_S)
    try:
        headers = {"Content-Type": params.get("ContentType", "application/octet-stream")}
        if "Accept" in params:
            headers["Accept"] = params["Accept"]
        connection.request("POST", "/invocations", body=params["Body"], headers=headers)
        return connection, connection.getresponse()
    except BaseException:
        connection.close()
        raise


def stream_events(response: http.client.HTTPResponse, done: Callable[[], None]) -> Iterator[bytes]:
    """InvokeEndpointWithResponseStream's body: each piece the container writes as a `PayloadPart` event as it
    comes; a read that fails or waits past INVOKE_TIMEOUT_S ends the stream with a `ModelStreamError` event (error
    codes StreamBroken and ModelInvocationTimeExceeded, as the API reference lists them:
    https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_InvokeEndpointWithResponseStream.html).
    The framing is the local router's (`event_stream.payload_events`); both are decoded by botocore's own parser in
    the tests, the oracle for the encoding. `done` runs once the stream ends, however it ends."""

    def pieces() -> Iterator[bytes]:
        while chunk := response.read1(1 << 16):
            yield chunk

    try:
        yield from payload_events(pieces(), INVOKE_TIMEOUT_S)
    finally:
        done()


def log_stream_arn(endpoint_name: str) -> str:
    return f"arn:aws:logs:{REGION}:{ACCOUNT_ID}:log-group:/aws/sagemaker/Endpoints/{endpoint_name}"


# --------------------------------------------------------------------------------------
# Application Auto Scaling: scalable targets and scaling policies, and the step policies scale-out alarms run


@dataclass
class ScalableTarget:
    """A registered scalable target: its capacity range, ARN (an id Application Auto Scaling chooses) and tags."""

    namespace: str
    resource_id: str
    dimension: str
    min_capacity: int
    max_capacity: int
    arn: str
    created: float
    suspended: dict[str, Any] | None = None


@dataclass
class ScalingPolicy:
    """A scaling policy as put (PutScalingPolicy's parameters), its ARN, and when its last scaling activity began."""

    params: dict[str, Any]
    arn: str
    created: float
    last_activity: float = -math.inf

    @property
    def key(self) -> tuple[str, str, str]:
        return self.params["ServiceNamespace"], self.params["ResourceId"], self.params["ScalableDimension"]


def step_for(adjustments: list[dict[str, Any]], breach: float) -> dict[str, Any] | None:
    """The step adjustment whose interval (relative to the alarm's threshold) holds `breach`: lower bound inclusive and
    upper exclusive above the threshold, the other way round below it; a missing bound is infinite
    (https://docs.aws.amazon.com/autoscaling/application/APIReference/API_StepAdjustment.html)."""
    for step in adjustments:
        lower, upper = step.get("MetricIntervalLowerBound", -math.inf), step.get("MetricIntervalUpperBound", math.inf)
        inside = lower <= breach < upper if breach >= 0 else lower < breach <= upper
        if inside:
            return step
    return None


class AutoScaling:
    """Application Auto Scaling for the double's account (moto's refuses
    sagemaker:inference-component:DesiredCopyCount): RegisterScalableTarget, DeregisterScalableTarget,
    DescribeScalableTargets, PutScalingPolicy, DescribeScalingPolicies, DeleteScalingPolicy and the tag calls, every
    request checked against the botocore model and every answer against its output shape. Of the policies, only a step
    policy acts, when the scale-out alarm of a component scaled to zero fires (`no_capacity`); target tracking is
    stored, never run."""

    OPERATIONS = ("RegisterScalableTarget", "DeregisterScalableTarget", "DescribeScalableTargets", "PutScalingPolicy",
                  "DescribeScalingPolicies", "DeleteScalingPolicy", "TagResource", "UntagResource",
                  "ListTagsForResource")

    def __init__(self, shared: Shared, sagemaker: SageMaker):
        self.shared, self.sagemaker = shared, sagemaker
        self.targets: dict[tuple[str, str, str], ScalableTarget] = {}
        self.policies: dict[tuple[str, str, str, str], ScalingPolicy] = {}
        self.tags: dict[str, dict[str, str]] = {}  # target ARN -> tags

    def clear(self) -> None:
        with self.shared.lock:
            self.targets.clear()
            self.policies.clear()
            self.tags.clear()

    def handle(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        if operation not in self.OPERATIONS:
            raise ApiError("UnknownOperationException",
                           f"the AWS double does not implement ApplicationAutoScaling.{operation}")
        problems = request_problems("application-autoscaling", operation, params)
        if problems:
            raise validation(f"{len(problems)} validation error(s) detected: " + "; ".join(problems))
        with self.shared.lock:
            result = getattr(self, re.sub(r"(?<!^)([A-Z])", r"_\1", operation).lower())(params)
        output_shape = service_model("application-autoscaling").operation_model(operation).output_shape
        report = ParamValidator().validate(result, output_shape)
        if report.has_errors():  # a bug in the double
            raise ApiError("InternalFailure", f"the double's {operation} answer breaks its output shape: "
                           + report.generate_report(), status=500)
        return result

    @staticmethod
    def _key(params: dict[str, Any]) -> tuple[str, str, str]:
        return params["ServiceNamespace"], params["ResourceId"], params["ScalableDimension"]

    @staticmethod
    def _missing_target(key: tuple[str, str, str]) -> ApiError:
        """ObjectNotFoundException (API_PutScalingPolicy, API_DeregisterScalableTarget); the wording is assumed."""
        return ApiError("ObjectNotFoundException", f"No scalable target registered for service namespace: {key[0]}, "
                        f"resource ID: {key[1]}, scalable dimension: {key[2]}")

    def _resource(self, key: tuple[str, str, str]) -> Component | None:
        """The SageMaker resource a target names must exist; the inference component of a copy-count target."""
        namespace, resource_id, dimension = key
        if namespace != "sagemaker":
            return None
        kind, _, rest = resource_id.partition("/")
        if dimension == COPY_DIMENSION:
            if kind != "inference-component" or not rest or "/" in rest:
                raise validation(f"Unsupported resource ID {resource_id} for {dimension}: inference-component/<name> "
                                 "expected.")
            component = self.sagemaker.components.get(rest.lower())
            if component is None:
                raise validation(f"Inference component {rest} does not exist.")
            return component
        if dimension == VARIANT_DIMENSION:
            parts = resource_id.split("/")
            if len(parts) != 4 or parts[0] != "endpoint" or parts[2] != "variant":
                raise validation(f"Unsupported resource ID {resource_id} for {dimension}: "
                                 "endpoint/<name>/variant/<variant> expected.")
            if parts[1].lower() not in self.sagemaker.endpoints:
                raise validation(f"Endpoint {parts[1]} does not exist.")
        return None

    def register_scalable_target(self, params: dict[str, Any]) -> dict[str, Any]:
        """Registers or updates: a new target needs MinCapacity and MaxCapacity, an update changes what it names; Tags
        tag a target when it is created. A resource outside the new range is scaled into it
        (https://docs.aws.amazon.com/autoscaling/application/APIReference/API_RegisterScalableTarget.html)."""
        key = self._key(params)
        component = self._resource(key)
        target = self.targets.get(key)
        if target is None:
            if "MinCapacity" not in params or "MaxCapacity" not in params:
                raise validation("MinCapacity and MaxCapacity are required when registering a new scalable target.")
            target = ScalableTarget(*key, params["MinCapacity"], params["MaxCapacity"],
                                    f"arn:aws:application-autoscaling:{REGION}:{ACCOUNT_ID}:scalable-target/"
                                    f"{uuid.uuid4().hex}{uuid.uuid4().hex[:4]}", time.time())
            self.tags[target.arn] = dict(params.get("Tags") or {})
        low, high = params.get("MinCapacity", target.min_capacity), params.get("MaxCapacity", target.max_capacity)
        if low > high:
            raise validation(f"Minimum capacity {low} cannot be greater than maximum capacity {high}.")
        target.min_capacity, target.max_capacity = low, high
        target.suspended = params.get("SuspendedState", target.suspended)
        self.targets[key] = target
        if component is not None and component.status == "InService" and component.job is None:
            inside = min(high, max(low, component.desired_copies))
            if inside != component.desired_copies:
                self.sagemaker.scale(component, inside, f"RegisterScalableTarget {low}..{high}")
        return {"ScalableTargetARN": target.arn}

    def deregister_scalable_target(self, params: dict[str, Any]) -> dict[str, Any]:
        """The target and the scaling policies on it (API_DeregisterScalableTarget: "Deregistering a scalable target
        deletes the scaling policies ... associated with it")."""
        key = self._key(params)
        target = self.targets.pop(key, None)
        if target is None:
            raise self._missing_target(key)
        self.tags.pop(target.arn, None)
        for policy in [name for name in self.policies if name[:3] == key]:
            del self.policies[policy]
        return {}

    @staticmethod
    def _page(items: list[Any], params: dict[str, Any], key: str) -> dict[str, Any]:
        try:
            offset = int(json.loads(base64.b64decode(params["NextToken"]))["offset"]) if "NextToken" in params else 0
        except (ValueError, KeyError, TypeError):
            raise validation(f"Invalid NextToken: {params['NextToken']}") from None
        size = params.get("MaxResults", DEFAULT_TARGETS_PAGE)
        result: dict[str, Any] = {key: items[offset:offset + size]}
        if offset + size < len(items):
            result["NextToken"] = base64.b64encode(json.dumps({"offset": offset + size}).encode()).decode()
        return result

    def describe_scalable_targets(self, params: dict[str, Any]) -> dict[str, Any]:
        chosen = [t for t in self.targets.values() if t.namespace == params["ServiceNamespace"]
                  and t.resource_id in params.get("ResourceIds", [t.resource_id])
                  and params.get("ScalableDimension", t.dimension) == t.dimension]
        items = [compact({"ServiceNamespace": t.namespace, "ResourceId": t.resource_id,
                          "ScalableDimension": t.dimension,
                          "MinCapacity": t.min_capacity, "MaxCapacity": t.max_capacity, "RoleARN": AUTOSCALING_ROLE_ARN,
                          "CreationTime": t.created, "SuspendedState": t.suspended, "ScalableTargetARN": t.arn})
                 for t in chosen]
        return self._page(items, params, "ScalableTargets")

    def put_scaling_policy(self, params: dict[str, Any]) -> dict[str, Any]:
        """Creates or replaces the policy of that name on a registered target (API_PutScalingPolicy); the ARN stays
        the same when it is replaced (assumed). A policy type needs its configuration (assumed: the API reference says
        each configuration applies to its type)."""
        key = self._key(params)
        if key not in self.targets:
            raise self._missing_target(key)
        kind = params.get("PolicyType", "StepScaling")
        wanted = {"StepScaling": "StepScalingPolicyConfiguration",
                  "TargetTrackingScaling": "TargetTrackingScalingPolicyConfiguration"}.get(kind)
        if wanted is None:
            raise ApiError("UnknownOperationException", f"the AWS double does not model PolicyType {kind}")
        if wanted not in params:
            raise validation(f"{wanted} is required for a {kind} policy.")
        name = (*key, params["PolicyName"])
        old = self.policies.get(name)
        arn = old.arn if old else (f"arn:aws:autoscaling:{REGION}:{ACCOUNT_ID}:scalingPolicy:{uuid.uuid4()}:"
                                   f"resource/{key[0]}/{key[1]}:policyName/{params['PolicyName']}")
        self.policies[name] = ScalingPolicy({**params, "PolicyType": kind}, arn, old.created if old else time.time())
        return {"PolicyARN": arn, "Alarms": []}

    def describe_scaling_policies(self, params: dict[str, Any]) -> dict[str, Any]:
        chosen = [p for (namespace, resource, dimension, name), p in self.policies.items()
                  if namespace == params["ServiceNamespace"] and params.get("ResourceId", resource) == resource
                  and params.get("ScalableDimension", dimension) == dimension
                  and name in params.get("PolicyNames", [name])]
        items = [{**p.params, "PolicyARN": p.arn, "Alarms": [], "CreationTime": p.created} for p in chosen]
        return self._page(items, params, "ScalingPolicies")

    def delete_scaling_policy(self, params: dict[str, Any]) -> dict[str, Any]:
        name = (*self._key(params), params["PolicyName"])
        if self.policies.pop(name, None) is None:
            raise ApiError("ObjectNotFoundException",
                           f"No scaling policy found for service namespace: {name[0]}, resource "
                           f"ID: {name[1]}, scalable dimension: {name[2]}, policy name: {name[3]}")
        return {}

    def _tags_of(self, arn: str) -> dict[str, str]:
        if arn not in self.tags:
            raise ApiError("ResourceNotFoundException", f"Scalable target {arn} not found.")
        return self.tags[arn]

    def tag_resource(self, params: dict[str, Any]) -> dict[str, Any]:
        self._tags_of(params["ResourceARN"]).update(params["Tags"])
        return {}

    def untag_resource(self, params: dict[str, Any]) -> dict[str, Any]:
        tags = self._tags_of(params["ResourceARN"])
        for key in params["TagKeys"]:
            tags.pop(key, None)
        return {}

    def list_tags_for_resource(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"Tags": dict(self._tags_of(params["ResourceARN"]))}

    # ---- the scale-out alarm and its step policy ------------------------------------------------------------

    def no_capacity(self, component: Component) -> None:
        """A request found the component without a copy (its NoCapacityInvocationFailures datum is in): evaluate each
        metric alarm on that metric of this component now, and for one in ALARM run each step-scaling policy its
        AlarmActions name that scales this component's copy count (SCALE_TO_ZERO_PAGE: "the alarm initiates the step
        scaling policy"). CloudWatch evaluates an alarm on its own schedule, about once a period, and performs Auto
        Scaling actions again while the alarm stays in ALARM ("Except for Auto Scaling actions, the actions happen only
        on state transitions": https://docs.amazonaws.cn/en_us/AmazonCloudWatch/latest/monitoring/alarm-actions.html);
        the double evaluates when a failure arrives, so it acts again only when another request fails (callers
        retry)."""
        backend, now = cloudwatch(), time.time()
        data = list(backend.metric_data)
        wanted = frozenset({("InferenceComponentName", component.name)})
        for alarm in list(backend.alarms.values()):
            if (alarm.namespace, alarm.metric_name) != (SAGEMAKER_NAMESPACE,
                                                        NO_CAPACITY_METRIC) or alarm.metric_data_queries \
                    or frozenset((d.name, d.value) for d in alarm.dimensions) != wanted:
                continue
            try:
                rule = AlarmRule(alarm)
            except ApiError as error:
                self.shared.note(component.name, f"alarm {alarm.name} not evaluated: {error.message}")
                continue
            state, reason, reason_data = rule.verdict(data, now)
            if state != alarm.state_value or alarm.state_reason.startswith("Unchecked"):
                alarm.update_state(reason, reason_data, state)
            if state != "ALARM" or str(alarm.actions_enabled).lower() == "false":
                continue
            value = rule.values(data, now)[0][1] or 0.0
            for action in alarm.alarm_actions or []:
                policy = next((p for p in self.policies.values() if p.arn == action), None)
                if policy is not None and policy.key == ("sagemaker", f"inference-component/{component.name}",
                                                         COPY_DIMENSION):
                    self._step(policy, component, value - alarm.threshold, alarm.name, now)

    def _step(self, policy: ScalingPolicy, component: Component, breach: float, alarm: str, now: float) -> None:
        """One step-scaling activity: ChangeInCapacity or ExactCapacity of the step that holds the breach, within the
        target's MinCapacity..MaxCapacity, unless a scaling activity is in progress or the policy's Cooldown
        (`scaling_cooldown_scale` of it) has not passed since its last one: "the scaling policy won't increase the
        desired capacity again unless either a larger scale out is triggered or the cooldown period ends"
        (Cooldown,
        https://docs.aws.amazon.com/autoscaling/application/APIReference/API_StepScalingPolicyConfiguration.html; a
        larger step within the cooldown is not modelled). Adjustments "can continue for additional alarm breaches until
        the alarm state returns to OK"
        (https://docs.aws.amazon.com/autoscaling/application/userguide/step-scaling-policy-overview.html)."""
        if policy.params.get("PolicyType") != "StepScaling":
            return
        config = policy.params["StepScalingPolicyConfiguration"]
        target = self.targets.get(policy.key)
        if target is None or component.status != "InService" or component.job is not None:
            return
        if now < policy.last_activity + config.get("Cooldown", 0) * self.shared.scenario.scaling_cooldown_scale:
            self.shared.note(component.name, f"policy {policy.params['PolicyName']}: in its Cooldown; no scale-out yet")
            return
        step = step_for(config.get("StepAdjustments", []), breach)
        kind = config.get("AdjustmentType")
        if step is None or kind not in ("ChangeInCapacity", "ExactCapacity"):
            if kind not in (None, "ChangeInCapacity", "ExactCapacity"):
                self.shared.note(component.name, f"policy {policy.params['PolicyName']}: AdjustmentType {kind} is not "
                                 "modelled by the AWS double")
            return
        current = component.desired_copies
        wanted = current + step["ScalingAdjustment"] if kind == "ChangeInCapacity" else step["ScalingAdjustment"]
        wanted = max(target.min_capacity, min(target.max_capacity, wanted))
        if wanted == current:
            return
        policy.last_activity = now
        self.sagemaker.scale(component, wanted,
                             f"alarm {alarm} in ALARM ran step scaling policy {policy.params['PolicyName']}")


# --------------------------------------------------------------------------------------
# Images, model data and container start-up


class ContainerRuntime:
    """Resolves images in moto's ECR (the double's own, or a publisher's), fetches model archives from moto's S3,
    starts server copies."""

    def __init__(self, shared: Shared, client: Callable[[str], Any], published: PublishedRegistries):
        self.shared, self.client, self.published = shared, client, published
        self.image_kinds: dict[str, str] = {}  # image digest -> kind, registered by the CodeBuild simulation
        self.started: list[Container] = []  # every copy started since the last clear, running or not
        self.workdir = Path(tempfile.mkdtemp(prefix="aws-double-"))

    def running(self) -> list[Container]:
        with self.shared.lock:
            return [c for c in self.started if c.process.poll() is None]

    def close(self) -> None:
        """Stop any copy still running (none should be, after a drain) and remove the work folder."""
        stop_containers(self.running())
        shutil.rmtree(self.workdir, ignore_errors=True)

    def clear(self) -> None:
        """Close, forget images and started copies, and start an empty work folder."""
        self.close()
        with self.shared.lock:
            self.image_kinds.clear()
            self.started.clear()
        self.workdir.mkdir(parents=True)

    def s3_object_exists(self, url: str) -> bool:
        bucket, key = parse_s3_url(url) or ("", "")
        try:
            self.client("s3").head_object(Bucket=bucket, Key=key)
        except ClientError:
            return False
        return True

    def resolve(self, image: str) -> tuple[dict[str, Any], str]:
        """The DeployedImage of an ECR image reference and the server kind its digest was built (or published) as."""
        match = ECR_IMAGE.fullmatch(image)
        own = match is not None and match["registry"] == ACCOUNT_ID
        if match is None or match["region"] != REGION or not (own or self.published.knows(match["registry"])):
            raise StartFailure(f"Requested image {image} not found: the double runs images from its own Amazon ECR "
                               f"({ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com) and published ones only.")
        image_id = {"imageDigest": match["digest"]} if match["digest"] else {"imageTag": match["tag"] or "latest"}
        ecr = self.client("ecr") if own else self.published.client(match["registry"])
        try:
            details = ecr.describe_images(repositoryName=match["repository"], imageIds=[image_id])
        except ClientError as exc:
            raise StartFailure(f"Requested image {image} not found: {exc.response['Error']['Message']}") from None
        digest = details["imageDetails"][0]["imageDigest"]
        with self.shared.lock:
            kind = self.image_kinds.get(digest)
        if kind is None:
            raise StartFailure(f"The container for image {image} cannot start: its digest {digest} was neither built "
                               "by the double's CodeBuild nor published with a stand-in, so there is no server to run "
                               "for it.")
        resolved = f"{match['registry']}.dkr.ecr.{match['region']}.amazonaws.com/{match['repository']}@{digest}"
        return {"SpecifiedImage": image, "ResolvedImage": resolved, "ResolutionTime": time.time()}, kind

    def fetch_model(self, url: str | None) -> Path:
        """The model archive at `url` extracted into a fresh folder (an empty folder when there is none)."""
        target = self.workdir / "models" / uuid.uuid4().hex
        if url is None:
            target.mkdir(parents=True)
            return target
        bucket_key = parse_s3_url(url)
        archive = self.workdir / "downloads" / f"{uuid.uuid4().hex}.tar.gz"
        archive.parent.mkdir(parents=True, exist_ok=True)
        try:
            if bucket_key is None:
                raise ValueError("not an s3:// URL")
            body = self.client("s3").get_object(Bucket=bucket_key[0], Key=bucket_key[1])["Body"]
            with open(archive, "wb") as out:
                shutil.copyfileobj(body, out, 1 << 20)
        except (ClientError, BotoCoreError, ValueError, OSError) as exc:
            raise StartFailure(f'Failed to download model data for container "container_1" from URL: "{url}". Please '
                               "ensure that there is an object located at the URL and that the role passed to "
                               f"CreateModel has permissions to download the model ({exc}).") from None
        try:
            safe_extract(archive, target)
        except Exception as exc:  # tasks.errors' IntegrityError, Conflict, NotFound (that module is not imported here)
            raise StartFailure(f'Failed to extract model data for container "container_1" from URL "{url}": '
                               f"{exc}") from None
        finally:
            archive.unlink(missing_ok=True)
        return target

    def start(self, source: Source, count: int, label: str, timeout_s: float,
              cancel: threading.Event) -> tuple[list[Container], dict[str, Any]]:
        """Start `count` copies and wait for every GET /ping to answer 200; StartFailure (with the log tail) if not."""
        image, kind = self.resolve(source.image)
        model_dir = self.fetch_model(source.model_data_url)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        copies: list[Container] = []
        try:
            for _ in range(count):
                copies.append(Container(kind, source.environment, model_dir,
                                        self.workdir / "logs" / f"{uuid.uuid4().hex}.log"))
                with self.shared.lock:
                    self.started.append(copies[-1])
            deadline = time.monotonic() + timeout_s
            for index, copy in enumerate(copies, start=1):
                problem = copy.wait_ready(deadline, cancel)
                if problem:
                    which = f"{label} (copy {index} of {count})" if count > 1 else label
                    raise StartFailure(f"{which} did not pass the ping health check: {problem}.", copy.log_tail())
        except BaseException:
            stop_containers(copies)
            raise
        return copies, image


# --------------------------------------------------------------------------------------
# CodeBuild: moto keeps the builds, this runs what the buildspec describes


@dataclass
class Build:
    """A simulated build: its outcome, how often BatchGetBuilds saw it, and what to report."""

    failure: tuple[str, str, str] | None  # (phase, status code, message) of the failed phase
    environment: list[dict[str, str]]
    source: dict[str, str]
    artifact_location: str | None
    push: Callable[[], str | None] | None = None  # the push and image-detail.json, run when the build ends
    started_at: float = field(default_factory=time.time)
    polls: int = 0


class CodeBuildSimulator:
    """StartBuild runs the buildspec's checks; when the build ends (after `build_polls_in_progress` polls) it pushes a
    manifest to moto's ECR and writes image-detail.json, so an image is not there while its build runs."""

    def __init__(self, shared: Shared, runtime: ContainerRuntime, client: Callable[[str], Any]):
        self.shared, self.runtime, self.client = shared, runtime, client
        self.builds: dict[str, Build] = {}

    def clear(self) -> None:
        with self.shared.lock:
            self.builds.clear()

    def started(self, request: dict[str, Any], build: dict[str, Any]) -> None:
        """Simulate the build moto just recorded."""
        project = self.client("codebuild").batch_get_projects(names=[request["projectName"]])["projects"][0]
        variables = {v["name"]: v["value"] for v in project.get("environment", {}).get("environmentVariables", [])}
        variables.update({v["name"]: v["value"] for v in request.get("environmentVariablesOverride", [])})
        source = {"type": request.get("sourceTypeOverride", project["source"]["type"]),
                  "location": request.get("sourceLocationOverride", project["source"].get("location", ""))}
        artifacts = request.get("artifactsOverride", project.get("artifacts", {}))
        failure, push = None, None
        try:
            push = self._run(source, variables, artifacts, build["id"])
        except BuildFailed as failed:
            failure = failed.args
        record = Build(failure, [{"name": k, "value": v, "type": "PLAINTEXT"} for k, v in variables.items()], source,
                       None, push)
        with self.shared.lock:
            self.builds[build["id"]] = record

    def _run(self, source: dict[str, str], variables: dict[str, str], artifacts: dict[str, Any],
             build_id: str) -> Callable[[], str | None]:
        """The buildspec's checks at once; returns the push (image + image-detail.json) that happens when the build
        ends."""
        if self.shared.scenario.fail_builds:
            raise BuildFailed("BUILD", "COMMAND_EXECUTION_ERROR",
                              "Error while executing command: docker build. Reason: exit status 1 (scenario "
                              "fail_builds)")
        data, names = self._download_source(source)
        kind = variables.get("IMAGE_NAME", "")
        if kind not in IMAGE_KINDS:
            raise command_failed(f"IMAGE_NAME={kind!r} is not one of {sorted(IMAGE_KINDS)}")
        images_dir = "images/" if any(n.startswith("images/") for n in names) else ""
        for needed in (f"{kind}/Dockerfile", f"{kind}/server.py", "common/sagemaker_http.py"):
            if images_dir + needed not in names:
                raise command_failed(f"{kind} build: no {needed} under images/ or the source root; the build context "
                                     "is images/, so the source must be the repository root or its images/ folder")
        repository_uri, tag, variant = (variables.get("ECR_REPOSITORY_URI", ""), variables.get("IMAGE_TAG", ""),
                                        variables.get("VARIANT", "cpu"))
        if not repository_uri or not tag:
            raise command_failed(f"{kind} build: set ECR_REPOSITORY_URI and IMAGE_TAG")
        if tag == "latest":
            raise command_failed(f"{kind} build: IMAGE_TAG=latest is mutable; use a content-derived tag")
        if kind == "semif" and variant not in ("cpu", "cuda"):
            raise command_failed(f"semif build: VARIANT={variant} is not cpu or cuda")
        if "BASE_IMAGE" in variables and not re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", variables["BASE_IMAGE"]):
            raise command_failed(f"{kind} build: base image '{variables['BASE_IMAGE']}' is not pinned by digest")

        def push() -> str | None:
            flavour = f"{kind}:{variant}"
            with self.shared.lock:
                image_bytes = self.shared.scenario.image_bytes
            layer_bytes = len(data) if image_bytes is None else max(0, image_bytes - len(flavour))
            digest = self._push(repository_uri, tag, hashlib.sha256(data).hexdigest(), layer_bytes, flavour)
            with self.shared.lock:
                self.runtime.image_kinds[digest] = kind
            return self._write_artifact(artifacts, build_id, {"ImageURI": f"{repository_uri}@{digest}"})

        return push

    def _download_source(self, source: dict[str, str]) -> tuple[bytes, set[str]]:
        """The build's source zip, as CodeBuild's DOWNLOAD_SOURCE phase fetches it from S3, and the names in it."""
        bucket_key = source["location"].split("/", 1)
        if source["type"] != "S3" or len(bucket_key) != 2:
            raise BuildFailed("DOWNLOAD_SOURCE", "CLIENT_ERROR", f"the double builds S3 sources only, got {source}")
        try:
            data = self.client("s3").get_object(Bucket=bucket_key[0], Key=bucket_key[1])["Body"].read()
            names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
        except ClientError as exc:
            raise BuildFailed("DOWNLOAD_SOURCE", "CLIENT_ERROR", f"error downloading source s3://{source['location']}: "
                              f"{exc.response['Error']['Code']}") from None
        except zipfile.BadZipFile as exc:
            raise BuildFailed("DOWNLOAD_SOURCE", "CLIENT_ERROR",
                              f"source s3://{source['location']} is not a zip: {exc}") from None
        return data, names

    def _push(self, repository_uri: str, tag: str, source_sha256: str, size: int, flavour: str) -> str:
        """PutImage a deterministic manifest (layers from the source zip and the image flavour); its digest."""
        repository = repository_uri.split("/", 1)[-1]
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(flavour),
                       "digest": "sha256:" + hashlib.sha256(flavour.encode()).hexdigest()},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": size,
                        "digest": f"sha256:{source_sha256}"},
                       {"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(flavour),
                        "digest": "sha256:" + hashlib.sha256(flavour.encode()).hexdigest()}],
        }, sort_keys=True)
        ecr = self.client("ecr")
        try:
            return ecr.put_image(repositoryName=repository, imageManifest=manifest,
                                 imageTag=tag)["image"]["imageId"]["imageDigest"]
        except ecr.exceptions.ImageAlreadyExistsException:
            return ecr.describe_images(repositoryName=repository,
                                       imageIds=[{"imageTag": tag}])["imageDetails"][0]["imageDigest"]
        except ClientError as exc:
            raise BuildFailed("POST_BUILD", "COMMAND_EXECUTION_ERROR", f"Error while executing command: docker push "
                              f"{repository_uri}:{tag}. Reason: {exc.response['Error']['Message']}") from None

    def _write_artifact(self, artifacts: dict[str, Any], build_id: str, detail: dict[str, str]) -> str | None:
        if artifacts.get("type") != "S3":
            return None
        if artifacts.get("packaging", "NONE") != "NONE":
            raise BuildFailed("UPLOAD_ARTIFACTS", "CLIENT_ERROR", "the double writes NONE-packaged artifacts only")
        namespace = build_id.split(":", 1)[1] if artifacts.get("namespaceType") == "BUILD_ID" else ""
        prefix = "/".join(part.strip("/") for part in (artifacts.get("path", ""), namespace, artifacts.get("name", ""))
                          if part)
        key = f"{prefix}/image-detail.json" if prefix else "image-detail.json"
        try:
            self.client("s3").put_object(Bucket=artifacts["location"], Key=key, Body=json.dumps(detail).encode()
                                         + b"\n")
        except ClientError as exc:
            raise BuildFailed("UPLOAD_ARTIFACTS", "CLIENT_ERROR",
                              f"error uploading artifacts: {exc.response['Error']['Code']}") from None
        return f"arn:aws:s3:::{artifacts['location']}/{prefix}"

    def reported(self, build: dict[str, Any]) -> dict[str, Any]:
        """A build as BatchGetBuilds shows it: IN_PROGRESS on the first poll, then its outcome."""
        with self.shared.lock:
            record = self.builds.get(build.get("id"))
            if record is None:
                return build
            record.polls += 1
            in_progress = record.polls <= self.shared.scenario.build_polls_in_progress
            push, record.push = (None, record.push) if in_progress else (record.push, None)
        if push is not None:
            try:
                record.artifact_location = push()
            except BuildFailed as failed:
                record.failure = failed.args
        now = time.time()
        done_phase = lambda phase: {"phaseType": phase, "phaseStatus": "SUCCEEDED", "startTime": now,  # noqa: E731
                                    "endTime": now, "durationInSeconds": 0}
        build = {**build, "environment": {**build.get("environment", {}), "environmentVariables": record.environment},
                 "source": record.source, "startTime": record.started_at}
        build.pop("endTime", None)
        if in_progress:
            return {**build, "buildStatus": "IN_PROGRESS", "currentPhase": "BUILD", "buildComplete": False,
                    "phases": [done_phase(p) for p in BUILD_PHASES[:6]] + [{"phaseType": "BUILD", "startTime": now}]}
        if record.failure is None:
            phases = [done_phase(p) for p in BUILD_PHASES[:-1]] + [{"phaseType": "COMPLETED", "startTime": now}]
            build["artifacts"] = {"location": record.artifact_location} if record.artifact_location else {}
            return {**build, "buildStatus": "SUCCEEDED", "currentPhase": "COMPLETED", "buildComplete": True,
                    "endTime": now, "phases": phases}
        failed_phase, status_code, message = record.failure
        phases = [done_phase(p) for p in BUILD_PHASES[:BUILD_PHASES.index(failed_phase)]]
        phases.append({"phaseType": failed_phase, "phaseStatus": "FAILED", "startTime": now, "endTime": now,
                       "durationInSeconds": 0, "contexts": [{"statusCode": status_code, "message": message}]})
        phases += [done_phase("FINALIZING"), {"phaseType": "COMPLETED", "startTime": now}]
        return {**build, "buildStatus": "FAILED", "currentPhase": "COMPLETED", "buildComplete": True,
                "endTime": now, "phases": phases, "artifacts": {}}


class BuildFailed(Exception):
    """A simulated build failed: args are (phase, status code, message)."""


def command_failed(message: str) -> BuildFailed:
    """A buildspec command exited non-zero in PRE_BUILD, as CodeBuild reports it."""
    return BuildFailed("PRE_BUILD", "COMMAND_EXECUTION_ERROR",
                       f"Error while executing command: set -euo pipefail. Reason: exit status 1: {message}")


# --------------------------------------------------------------------------------------
# Published images: repositories of another account (the llama.cpp DLC's), read across accounts

PUBLIC_PULL = {"Sid": "pull", "Effect": "Allow", "Principal": "*",  # what a publisher's repository lets any account do
               "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]}


class PublishedRegistries:
    """Other accounts' repositories, kept in moto's ECR of those accounts (written with assumed-role credentials).
    moto's BatchGetImage ignores `registryId` and reads the caller's own repositories, so the double answers a
    BatchGetImage naming another registry as ECR does across accounts
    (https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_BatchGetImage.html): RepositoryNotFoundException
    when the registry has no such repository, AccessDeniedException unless the repository's policy lets other
    accounts pull (https://docs.aws.amazon.com/AmazonECR/latest/userguide/repository-policies.html), and a failure
    `ImageNotFound` for each image id it lacks. Every manifest is returned as stored (none is converted)."""

    def __init__(self, shared: Shared, client: Callable[[str], Any], url: Callable[[], str]):
        self.shared, self.own_client, self.url = shared, client, url
        self.clients: dict[str, Any] = {}  # account -> its ECR client

    def clear(self) -> None:
        with self.shared.lock:
            self.clients.clear()  # moto's reset forgot the assumed roles their credentials came from

    def knows(self, account: str) -> bool:
        with self.shared.lock:
            return account in self.clients

    def client(self, account: str):
        """An ECR client of `account` (moto keeps each account's resources apart by the caller's credentials)."""
        with self.shared.lock:
            if account not in self.clients:
                credentials = self.own_client("sts").assume_role(RoleArn=f"arn:aws:iam::{account}:role/publisher",
                                                                 RoleSessionName="publisher")["Credentials"]
                self.clients[account] = boto3.session.Session().client(
                    "ecr", endpoint_url=self.url(), region_name=REGION, aws_access_key_id=credentials["AccessKeyId"],
                    aws_secret_access_key=credentials["SecretAccessKey"], aws_session_token=credentials["SessionToken"],
                    config=Config(connect_timeout=5, read_timeout=CLIENT_TIMEOUT_S, retries={"total_max_attempts": 3}))
            return self.clients[account]

    def publish(self, account: str, repository: str, tag: str, content: str, *, pull_policy: bool) -> str:
        """Push a manifest under `tag` (a mutable tag moves to it) in `account`'s `repository`; its digest."""
        ecr = self.client(account)
        try:
            ecr.create_repository(repositoryName=repository)
        except ecr.exceptions.RepositoryAlreadyExistsException:
            pass
        if pull_policy:
            ecr.set_repository_policy(repositoryName=repository,
                                      policyText=json.dumps({"Version": "2012-10-17", "Statement": [PUBLIC_PULL]}))
        layer = "sha256:" + hashlib.sha256(f"{account}/{repository}:{tag}:{content}".encode()).hexdigest()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(content),
                       "digest": layer},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(content),
                        "digest": layer}],
        }, sort_keys=True)
        return ecr.put_image(repositoryName=repository, imageManifest=manifest,
                             imageTag=tag)["image"]["imageId"]["imageDigest"]

    def batch_get_image(self, params: dict[str, Any]) -> dict[str, Any]:
        """BatchGetImage in the registry `params["registryId"]` names, by the double's own account."""
        account, repository = params["registryId"], params.get("repositoryName", "")
        arn = f"arn:aws:ecr:{REGION}:{account}:repository/{repository}"
        missing = ApiError("RepositoryNotFoundException",
                           f"The repository with name '{repository}' does not exist in the registry "
                           f"with id '{account}'")
        if not self.knows(account):
            raise missing
        ecr = self.client(account)
        try:
            policy = json.loads(ecr.get_repository_policy(repositoryName=repository)["policyText"])
        except ecr.exceptions.RepositoryNotFoundException:
            raise missing from None
        except ecr.exceptions.RepositoryPolicyNotFoundException:
            policy = {"Statement": []}
        if not any(self._allows(statement, "ecr:BatchGetImage") for statement in policy.get("Statement", [])):
            raise ApiError("AccessDeniedException",
                           f"User: arn:aws:iam::{ACCOUNT_ID}:user/moto is not authorized to perform: "
                           f"ecr:BatchGetImage on resource: {arn} because no resource-based policy allows the "
                           "ecr:BatchGetImage action")
        answer = ecr.batch_get_image(repositoryName=repository, imageIds=params.get("imageIds", []))
        return {"images": answer.get("images", []), "failures": answer.get("failures", [])}

    @staticmethod
    def _allows(statement: dict[str, Any], action: str) -> bool:
        """Whether a repository policy statement lets the double's account (or anyone) do `action`."""
        principal = statement.get("Principal")
        principals = principal.get("AWS", []) if isinstance(principal, dict) else principal
        principals = [principals] if isinstance(principals, str) else principals or []
        actions = statement.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        return (statement.get("Effect") == "Allow" and any(p == "*" or ACCOUNT_ID in p for p in principals)
                and any(a in (action, "ecr:*", "*") for a in actions))


# --------------------------------------------------------------------------------------
# The server


class RolloutEvent(NamedTuple):
    """One step of a rolling update, as the double took it (see `RollingUpdate` for the messages)."""

    component: str
    at: float  # time.time()
    message: str


class Shared:
    """What the parts of the double share: one lock, the scenario, the call log and the rollout log."""

    def __init__(self):
        self.lock = threading.RLock()
        self.scenario = Scenario()
        self.calls: list[Call] = []
        self.rollouts: list[RolloutEvent] = []

    def log(self, service: str, operation: str, params: dict[str, Any]) -> None:
        with self.lock:
            self.calls.append(Call(service, operation, params))

    def note(self, component: str, message: str) -> None:
        with self.lock:
            self.rollouts.append(RolloutEvent(component, time.time(), message))

    def take_throttle(self, operation: str) -> None:
        with self.lock:
            left = self.scenario.throttle.get(operation, 0)
            if left > 0:
                self.scenario.throttle[operation] = left - 1
                raise ApiError("ThrottlingException", "Rate exceeded")


class QuietRequestHandler(MotoRequestHandler):
    """moto's request handler without a log line per request."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class AwsDouble:
    """The double: one threaded HTTP server on 127.0.0.1 (moto behind a SageMaker/CodeBuild middleware)."""

    def __init__(self):
        self._shared = Shared()
        self._moto = DomainDispatcherApplication(create_backend_app)
        self._server = None
        self._thread: threading.Thread | None = None
        self._clients: dict[tuple[str, int], Any] = {}
        self._runtime: ContainerRuntime | None = None
        self._sagemaker: SageMaker | None = None
        self._codebuild: CodeBuildSimulator | None = None
        self._autoscaling: AutoScaling | None = None
        self._published = PublishedRegistries(self._shared, self.client, lambda: self.url)

    # ---- lifecycle ------------------------------------------------------------------

    def start(self) -> AwsDouble:
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True, request_handler=QuietRequestHandler)
        self._server.daemon_threads = True
        self._runtime = ContainerRuntime(self._shared, self.client, self._published)
        self._sagemaker = SageMaker(self._shared, self._runtime)
        self._autoscaling = self._sagemaker.autoscaling = AutoScaling(self._shared, self._sagemaker)
        self._codebuild = CodeBuildSimulator(self._shared, self._runtime, self.client)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="aws-double", daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Stop serving, end every model server process, remove the work folder."""
        if self._server is None:
            return
        atexit.unregister(self.stop)
        self._sagemaker.drain()
        self._sagemaker.executor.shutdown(wait=True, cancel_futures=True)
        self._server.shutdown()
        self._thread.join(timeout=JOB_DRAIN_TIMEOUT_S)
        self._server.server_close()
        self._runtime.close()
        self._server = None

    def __enter__(self) -> AwsDouble:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # ---- public API -----------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self) -> dict[str, str]:
        """The environment that points boto3 (in any process) at the double."""
        return {"AWS_ENDPOINT_URL": self.url, **CREDENTIALS}

    def client(self, service: str, max_attempts: int = 3):
        """A boto3 client of `service` against the double (cached; botocore clients are thread-safe)."""
        key = (service, max_attempts)
        with self._shared.lock:
            if key not in self._clients:
                self._clients[key] = boto3.session.Session().client(
                    service, endpoint_url=self.url, region_name=REGION,
                    aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                    aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                    config=Config(connect_timeout=5, read_timeout=CLIENT_TIMEOUT_S,
                                  retries={"mode": "standard", "total_max_attempts": max_attempts}),
                )
            return self._clients[key]

    def reset(self) -> None:
        """moto's reset plus the double's own: resources, processes, images, builds, scaling, scenario, call and rollout
        logs."""
        self._sagemaker.drain()
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_S) as response:
            response.read()
        self._runtime.clear()
        self._codebuild.clear()
        self._autoscaling.clear()
        self._published.clear()
        with self._shared.lock:
            self._shared.scenario = Scenario()
            self._shared.calls.clear()
            self._shared.rollouts.clear()

    def publish_image(self, account: str, repository: str, tag: str, *, kind: str | None = None, content: str = "1",
                      pull_policy: bool = True) -> str:
        """Publish an image in another account's registry, as the DLC's is (`pull_policy`: any account may pull);
        `kind` names the image folder whose server.py stands in for it when SageMaker runs it; `content` another
        value moves the tag. Returns the digest the tag names."""
        digest = self._published.publish(account, repository, tag, content, pull_policy=pull_policy)
        if kind is not None:
            with self._shared.lock:
                self._runtime.image_kinds[digest] = kind
        return digest

    def scenario(self, **knobs: Any) -> Scenario:
        """Set scenario knobs (see `Scenario`); returns the scenario now in force."""
        with self._shared.lock:
            self._shared.scenario = self._shared.scenario.updated(knobs)
            return self._shared.scenario

    @property
    def calls(self) -> list[Call]:
        """Every SageMaker and SageMaker-runtime request so far, in order (`call.mutating` picks out writes)."""
        with self._shared.lock:
            return list(self._shared.calls)

    def rollout_events(self, component: str | None = None) -> list[RolloutEvent]:
        """The steps of every rolling update so far (of `component` only, if given), in order."""
        with self._shared.lock:
            return [event for event in self._shared.rollouts if component in (None, event.component)]

    def container_pids(self) -> list[int]:
        """The pids of the model server processes now running (endpoints and inference components)."""
        return [c.process.pid for c in self._runtime.running()]

    # ---- the WSGI middleware --------------------------------------------------------

    def _app(self, environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        signing = SIGNING_SERVICE.search(environ.get("HTTP_AUTHORIZATION", ""))
        to_sagemaker = method == "POST" and (signing is None or signing[1] == "sagemaker")
        runtime = RUNTIME_PATH.fullmatch(path) if to_sagemaker else None
        try:
            if path.startswith("/_double/"):
                return self._admin(environ, start_response, path, method)
            if runtime:
                return self._invoke(environ, start_response, runtime)
            if target.startswith("SageMaker."):
                return self._sagemaker_call(environ, start_response, target.split(".", 1)[1])
            if target.startswith(AUTOSCALING_TARGET):
                result = self._autoscaling.handle(target[len(AUTOSCALING_TARGET):], parse_json_body(read_body(environ)))
                return respond(start_response, 200, json.dumps(result).encode(),
                               {"Content-Type": "application/x-amz-json-1.1"})
            if target in ("CodeBuild_20161006.StartBuild", "CodeBuild_20161006.BatchGetBuilds"):
                return self._codebuild_call(environ, start_response, target)
            if target == "AmazonEC2ContainerRegistry_V20150921.DescribeImages":
                return self._describe_images(environ, start_response)
            if target == "AmazonEC2ContainerRegistry_V20150921.BatchGetImage":
                return self._batch_get_image(environ, start_response)
            if signing is not None and signing[1] == "s3" and self._races_write(environ, method):
                drain_body(environ)
                return respond_s3_error(start_response, 409, "ConditionalRequestConflict", CONDITIONAL_CONFLICT)
        except ApiError as error:
            return respond_error(start_response, error, rest_json=bool(runtime))
        return self._moto(environ, start_response)

    def _invoke(self, environ: dict[str, Any], start_response: Callable, runtime: re.Match) -> list[bytes]:
        """InvokeEndpoint of the SageMaker runtime: the double's model servers answer it."""
        headers = {key[5:].replace("_", "-"): value for key, value in environ.items() if key.startswith("HTTP_")}
        if "CONTENT_TYPE" in environ:
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        status, out_headers, body = self._sagemaker.invoke(runtime.group(1), runtime.group(2), headers,
                                                           read_body(environ, too_large="ValidationError"))
        if isinstance(body, bytes):
            return respond(start_response, status, body, out_headers)
        start_response("200 OK", [*out_headers.items(), ("x-amzn-RequestId", str(uuid.uuid4()))])
        return body  # the event stream, sent as it is read (chunked)

    def _sagemaker_call(self, environ: dict[str, Any], start_response: Callable, operation: str) -> list[bytes]:
        """A SageMaker JSON API call: the double's own, or the Model Registry's, which moto answers after the
        double's log, throttling and model check."""
        body = read_body(environ)
        params = parse_json_body(body)
        if operation not in service_model("sagemaker").operation_names:
            raise ApiError("UnknownOperationException", f"SageMaker has no operation {operation}")
        if operation in MODEL_REGISTRY:
            self._sagemaker.admit(operation, params)
            if operation == "UpdateModelPackage":
                return self._update_model_package(environ, start_response, params)
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
            return self._moto(environ, start_response)
        result = self._sagemaker.handle(operation, params)
        return respond(start_response, 200, json.dumps(result).encode(), {"Content-Type": "application/x-amz-json-1.1"})

    def _update_model_package(self, environ: dict[str, Any], start_response: Callable,
                              params: dict[str, Any]) -> list[bytes]:
        """UpdateModelPackage where moto differs from SageMaker: CustomerMetadataProperties are merged into the
        version's (removed by name only with CustomerMetadataPropertiesToRemove:
        https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_UpdateModelPackage.html; moto replaces them, so an
        approval sent without metadata would erase them), and LastModifiedBy names the caller, as `Scenario.principals`
        maps its access key (DescribeModelPackage's LastModifiedBy, a UserContext:
        https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_DescribeModelPackage.html; moto names one fake
        Studio user for every caller). That an update without ApprovalDescription clears it is moto's; AWS does not
        say."""
        from moto.sagemaker.models import sagemaker_backends

        backend = sagemaker_backends[ACCOUNT_ID][REGION]
        try:
            live = backend.describe_model_package(params.get("ModelPackageArn", ""))
        except Exception:  # moto answers the unknown ARN itself
            live = None
        if live is not None and (live.customer_metadata_properties or params.get("CustomerMetadataProperties")):
            params = {**params, "CustomerMetadataProperties": {**(live.customer_metadata_properties or {}),
                                                               **(params.get("CustomerMetadataProperties") or {})}}
        body = json.dumps(params).encode()
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        status, headers, answer = call_wsgi(self._moto, environ)
        key = ACCESS_KEY.search(environ.get("HTTP_AUTHORIZATION", ""))
        with self._shared.lock:
            context = self._shared.scenario.principals.get(key[1]) if key else None
        if status.startswith("200") and live is not None and context is not None:
            live.last_modified_by = json.loads(json.dumps(context))
        return respond(start_response, int(status.split()[0]), answer, dict(headers))

    def _races_write(self, environ: dict[str, Any], method: str) -> bool:
        """Whether this S3 request is a conditional write (PutObject, or CompleteMultipartUpload, with If-None-Match: *)
        that `race_conditional_writes` answers 409 ConditionalRequestConflict (one fewer to come)
        (https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html)."""
        query = environ.get("QUERY_STRING", "")
        conditional = environ.get("HTTP_IF_NONE_MATCH") == "*" and (
            (method == "PUT" and "partNumber=" not in query) or (method == "POST" and "uploadId=" in query))
        if not conditional:  # the lock is not taken for other requests: SageMaker handlers hold it while they read S3
            return False
        with self._shared.lock:
            if self._shared.scenario.race_conditional_writes <= 0:
                return False
            self._shared.scenario.race_conditional_writes -= 1
            return True

    def _batch_get_image(self, environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        """ECR BatchGetImage: a published registry's image (another account's) from the double, the account's own
        from moto."""
        body = read_body(environ)
        params = parse_json_body(body)
        if params.get("registryId", ACCOUNT_ID) != ACCOUNT_ID:
            result = self._published.batch_get_image(params)
            return respond(start_response, 200, json.dumps(result).encode(),
                           {"Content-Type": "application/x-amz-json-1.1"})
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        return self._moto(environ, start_response)

    def _describe_images(self, environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        """ECR DescribeImages as moto answers it, with `imageSizeInBytes` as ECR computes it: moto reports the
        manifest's config blob size, ECR the size of the image in the repository, its pushed (compressed) layers, and
        for a manifest list the largest of its manifests
        (https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_ImageDetail.html). The double's own registry
        only; a detail of another registry keeps moto's value."""
        from moto.ecr.models import ecr_backends

        body = read_body(environ)
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        status, headers, answer = call_wsgi(self._moto, environ)
        if not status.startswith("200"):
            return respond(start_response, int(status.split()[0]), answer, dict(headers))
        result = json.loads(answer)
        repositories = ecr_backends[ACCOUNT_ID][REGION].repositories
        for detail in result.get("imageDetails", []):
            repository = repositories.get(detail.get("repositoryName", ""))
            if detail.get("registryId") != ACCOUNT_ID or repository is None:
                continue
            manifests = {image.image_digest: json.loads(image.image_manifest) for image in repository.images}
            size = ecr_image_size(manifests, detail.get("imageDigest", ""))
            if size is not None:
                detail["imageSizeInBytes"] = size
        content_type = dict(headers).get("Content-Type", "application/x-amz-json-1.1")
        return respond(start_response, 200, json.dumps(result, default=str).encode(), {"Content-Type": content_type})

    def _codebuild_call(self, environ: dict[str, Any], start_response: Callable, target: str) -> list[bytes]:
        body = read_body(environ)
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        status, headers, answer = call_wsgi(self._moto, environ)
        if not status.startswith("200"):
            return respond(start_response, int(status.split()[0]), answer, dict(headers))
        request, result = json.loads(body or b"{}"), json.loads(answer)
        if target.endswith("StartBuild"):
            self._codebuild.started(request, result["build"])
        else:
            result["builds"] = [self._codebuild.reported(build) for build in result.get("builds", [])]
        content_type = dict(headers).get("Content-Type", "application/x-amz-json-1.1")
        return respond(start_response, 200, json.dumps(result, default=str).encode(), {"Content-Type": content_type})

    def _admin(self, environ: dict[str, Any], start_response: Callable, path: str, method: str) -> list[bytes]:
        """POST /_double/scenario {knobs}, GET /_double/calls, GET /_double/rollouts, POST /_double/reset, for tests in
        other processes."""
        try:
            if path == "/_double/scenario" and method == "POST":
                payload = self.scenario(**parse_json_body(read_body(environ))).to_json()
            elif path == "/_double/calls" and method == "GET":
                payload = {"calls": [call._asdict() for call in self.calls]}
            elif path == "/_double/rollouts" and method == "GET":
                payload = {"events": [event._asdict() for event in self.rollout_events()]}
            elif path == "/_double/reset" and method == "POST":
                self.reset()
                payload = {"reset": True}
            else:
                return respond(start_response, 404, json.dumps({"error": f"no admin route {method} {path}"}).encode())
        except (ValueError, TypeError, ApiError) as exc:
            return respond(start_response, 400, json.dumps({"error": str(exc)}).encode())
        body = json.dumps(payload, default=lambda blob: blob.decode("utf-8", "replace"))  # InvokeEndpoint bodies
        return respond(start_response, 200, body.encode())


def ecr_image_size(manifests: dict[str, dict[str, Any]], digest: str) -> int | None:
    """ECR's imageSizeInBytes of the image `digest` among a repository's manifests (by digest): the sum of its layers'
    (compressed) sizes; for a manifest list or index the largest of its manifests'; None when it cannot be told."""
    manifest = manifests.get(digest)
    if manifest is None:
        return None
    if "layers" in manifest:
        return sum(int(layer.get("size", 0)) for layer in manifest["layers"])
    sizes = [ecr_image_size(manifests, entry.get("digest", "")) for entry in manifest.get("manifests", [])]
    return max((size for size in sizes if size is not None), default=None)


def read_body(environ: dict[str, Any], too_large: str = "ValidationException") -> bytes:
    """The request body (Content-Length bytes, bounded); `too_large` is the error code for an oversized one."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError("SerializationException", "Content-Length is not a number") from None
    if length > MAX_REQUEST_BYTES:
        raise ApiError(too_large, f"request body of {length} bytes is over the double's {MAX_REQUEST_BYTES}-byte limit")
    return environ["wsgi.input"].read(length) if length else b""


def drain_body(environ: dict[str, Any]) -> None:
    """Read and drop a request body that is answered without being used (Content-Length bytes, or to the end of a
    chunked one)."""
    stream = environ["wsgi.input"]
    if environ.get("wsgi.input_terminated"):
        while stream.read(1 << 20):
            pass
        return
    left = int(environ.get("CONTENT_LENGTH") or 0)
    while left > 0:
        chunk = stream.read(min(left, 1 << 20))
        if not chunk:
            return
        left -= len(chunk)


def parse_json_body(body: bytes) -> dict[str, Any]:
    try:
        params = json.loads(body or b"{}")
    except ValueError as exc:
        raise ApiError("SerializationException", f"request body is not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise ApiError("SerializationException", "request body is not a JSON object")
    return params


def respond(start_response: Callable, status: int, body: bytes, headers: dict[str, str] | None = None) -> list[bytes]:
    reason = http.client.responses.get(status, "Unknown")
    base = {"Content-Type": "application/json", "x-amzn-RequestId": str(uuid.uuid4())}
    pairs = {**base, **(headers or {})}
    pairs.pop("Content-Length", None)
    start_response(f"{status} {reason}", [*pairs.items(), ("Content-Length", str(len(body)))])
    return [body]


def respond_error(start_response: Callable, error: ApiError, rest_json: bool) -> list[bytes]:
    """The error shape botocore parses: json `__type` for the control plane, `x-amzn-ErrorType` for the runtime."""
    if rest_json:
        body = {"message": error.message, **error.extra}
        headers = {"Content-Type": "application/json", "x-amzn-ErrorType": error.code}
    else:
        body = {"__type": error.code, "message": error.message, **error.extra}
        headers = {"Content-Type": "application/x-amz-json-1.1"}
    return respond(start_response, error.status, json.dumps(body).encode(), headers)


def respond_s3_error(start_response: Callable, status: int, code: str, message: str) -> list[bytes]:
    """An S3 (REST-XML) error answer (https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html)."""
    request_id = uuid.uuid4().hex[:16].upper()
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>{request_id}</RequestId></Error>")
    return respond(start_response, status, body.encode(),
                   {"Content-Type": "application/xml", "x-amz-request-id": request_id})


def call_wsgi(app: Callable, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """Run a WSGI app to completion; (status line, headers, body)."""
    captured: dict[str, Any] = {}
    chunks: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        captured["status"], captured["headers"] = status, headers
        return chunks.append

    result = app(environ, start_response)
    try:
        chunks.extend(result)
    finally:
        if hasattr(result, "close"):
            result.close()
    return captured["status"], captured["headers"], b"".join(chunks)
