"""One AWS session factory for every aws backend call (DESIGN §3, §12).

`Aws` holds the clients of one account and region: region and profile from the config (or the
standard environment), a botocore `Config` with connect/read timeouts and bounded retries
(`standard` mode by default, `adaptive` on request), and no client until one is first used.
`Aws.call` checks a request against the service model before it is sent
(`tasks.backends.aws.service_model`), then maps botocore's failures onto the domain errors: throttling that
outlasted the bounded retries is `Throttled` (retryable), a missing resource `NotFound`, a name
taken or a precondition failed `Conflict`, no capacity `CapacityError`, service and network trouble and
a conditional write racing another (S3's 409 ConditionalRequestConflict) `NotReady`, no or rejected
credentials and a wrong region `ConfigError`. Inside Airflow the session comes from the `aws_default`
connection (`AwsAccess`, built in the task body).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shiplift.tasks.backends.aws.service_model import operation_name, validate_request
from shiplift.tasks.errors import (
    BadInput,
    CapacityError,
    ConfigError,
    Conflict,
    NotFound,
    NotReady,
    ShipliftError,
    Throttled,
)

CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 5
THROTTLING = {"Throttling", "ThrottlingException", "ThrottledException", "TooManyRequestsException",
              "RequestLimitExceeded", "SlowDown", "RequestThrottled", "RequestThrottledException",
              "ProvisionedThroughputExceededException"}
NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NotFound", "404", "ResourceNotFound", "ResourceNotFoundException",
             "RepositoryNotFoundException", "ImageNotFoundException", "ResourceNotFoundFault", "NoSuchEntity",
             "NotFoundException"}
CONFLICT = {"ConflictException", "ResourceInUse", "ResourceInUseException", "ResourceAlreadyExistsException",
            "PreconditionFailed", "412", "ResourceAlreadyExists", "AlreadyExistsException",
            "ImageAlreadyExistsException", "ImageTagAlreadyExistsException", "409"}
# S3's 409 to a conditional write (If-None-Match) racing another conditional write of the key: retry it, it is no
# Conflict (https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html; 412 PreconditionFailed: the key exists)
WRITE_RACED = {"ConditionalRequestConflict"}
CAPACITY = {"InsufficientCapacity", "InsufficientInstanceCapacity", "CapacityError", "LimitExceededException"}
QUOTA = {"ResourceLimitExceeded", "AccountLimitExceededException", "ServiceQuotaExceededException"}
CREDENTIALS = {"UnrecognizedClientException", "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException",
               "InvalidSignatureException", "SignatureDoesNotMatch", "AuthFailure", "InvalidAccessKeyId",
               "MissingAuthenticationToken"}
ACCESS_DENIED = {"AccessDenied", "AccessDeniedException", "AccessDeniedFault", "UnauthorizedOperation", "403"}
WRONG_REGION = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301"}
SERVER_SIDE = {"InternalFailure", "InternalServerError", "InternalError", "ServiceUnavailable",
               "ServiceUnavailableException", "ServerException", "InternalServiceError", "InternalDependencyException",
               "503", "500"}


@dataclass(frozen=True)
class AwsAccess:
    """Where credentials and endpoints come from: a boto3 session (an Airflow connection's, say) and an
    endpoint override."""

    session: Any = None
    endpoint_url: str | None = None


@dataclass
class Aws:
    """Lazily created, validated, error-mapped clients of one account and region."""

    region: str
    profile: str | None = None
    access: AwsAccess | Any = None  # an AwsAccess, a boto3 Session, a zero-argument factory of either, or None
    read_timeout_s: int = READ_TIMEOUT_S
    retry_mode: str = "standard"
    listeners: list[Callable[[str, str, dict], None]] = field(default_factory=list)
    _clients: dict = field(default_factory=dict, repr=False)
    _resolved: AwsAccess | None = field(default=None, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def _session(self):
        """The session and endpoint override; a factory (an Airflow connection) is called once, on first use."""
        import boto3
        from botocore.exceptions import ProfileNotFound

        with self._lock:
            if self._resolved is None:
                access = self.access() if callable(self.access) else self.access
                self._resolved = access if isinstance(access, AwsAccess) else AwsAccess(session=access)
        access = self._resolved
        if access.session is not None:
            return access.session, access.endpoint_url
        try:
            return boto3.Session(profile_name=self.profile, region_name=self.region), access.endpoint_url
        except ProfileNotFound as exc:
            raise ConfigError(f"AWS profile {self.profile!r} is not configured",
                              fix="set backend.profile to a profile in ~/.aws/config, "
                              "or leave it unset to use the default credential chain") from exc

    def client(self, service: str, *, read_timeout_s: float | None = None, max_attempts: int = MAX_ATTEMPTS):
        """The client of a service (one per service, read timeout and retry budget), created on first use."""
        from botocore.config import Config

        key = (service, read_timeout_s or self.read_timeout_s, max_attempts)
        with self._lock:
            if key not in self._clients:
                session, endpoint_url = self._session()
                config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=key[1], region_name=self.region,
                                retries={"total_max_attempts": key[2], "mode": self.retry_mode},
                                user_agent_extra="shiplift")
                kwargs = {"endpoint_url": endpoint_url} if endpoint_url else {}
                self._clients[key] = session.client(service, config=config, **kwargs)
            return self._clients[key]

    def call(self, service: str, operation: str, **params: Any) -> dict:
        """Validate, send and map errors: the only way the aws backend talks to AWS."""
        name = operation_name(service, operation)
        validate_request(service, name, params)
        for listener in self.listeners:
            listener(service, name, params)
        method = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client(service), method)(**params)
        except (BotoCoreError, ClientError) as exc:
            raise domain_error(exc, service, name, self.region) from exc


def partition(region: str) -> str:
    """The ARN partition of a region (China and GovCloud have their own)."""
    return "aws-cn" if region.startswith("cn-") else "aws-us-gov" if region.startswith("us-gov-") else "aws"


def write_raced(error: BaseException) -> bool:
    """Whether a domain error is S3's 409 ConditionalRequestConflict (see WRITE_RACED): the write may be retried."""
    return isinstance(error, NotReady) and any(f": {code}: " in error.problem for code in WRITE_RACED)


def error_code(exc: Exception) -> tuple[str, str, int | None]:
    """(code, message, HTTP status) of a botocore ClientError."""
    response = getattr(exc, "response", {}) or {}
    error = response.get("Error", {})
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(error.get("Code", "")), str(error.get("Message", "")), status


def domain_error(exc: Exception, service: str, operation: str, region: str) -> ShipliftError:
    """The domain error for a botocore failure of `service.operation`, naming what to do about it."""
    from botocore import exceptions as bce

    where = f"{service} {operation}"
    if isinstance(exc, bce.ClientError):
        return _answer_error(exc, where, region)
    if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError, bce.CredentialRetrievalError,
                        bce.TokenRetrievalError, bce.SSOError)):
        return ConfigError(f"{where}: no usable AWS credentials ({exc})",
                           fix="configure the credential chain (AWS_PROFILE, SSO login, an instance role) or, in "
                               "Airflow, the aws_default connection; nothing was created")
    if isinstance(exc, bce.NoRegionError):
        return ConfigError(f"{where}: no AWS region", fix="set backend.region in the release config")
    if isinstance(exc, (bce.EndpointConnectionError, bce.ConnectTimeoutError, bce.ReadTimeoutError,
                        bce.ConnectionClosedError)):
        return NotReady(f"{where}: could not reach AWS in {region}: {exc}",
                        fix="check the network path to AWS and retry")
    if isinstance(exc, bce.ParamValidationError):
        return BadInput(f"{where}: {exc}", fix="correct the request parameters")
    return NotReady(f"{where}: {type(exc).__name__}: {exc}", fix="retry; report it if it persists")


def _answer_error(exc: Exception, where: str, region: str) -> ShipliftError:  # noqa: C901 — a first-match table
    """The domain error for AWS's error answer (a ClientError), by its code, HTTP status and message; the checks are
    an ordered table (a code may match a set and a message test), so they read best as one chain."""
    code, message, status = error_code(exc)
    text = f"{where}: {code}: {message}"
    codes = {code, str(status)}
    if codes & THROTTLING:
        return Throttled(f"{text} (still throttled after botocore's bounded retries)",
                         fix="retry later, or raise the API quota")
    if codes & QUOTA:
        return ConfigError(text, fix="a service quota is exhausted: ask for more in Service Quotas (the message names "
                                     "the resource), or delete what is left over (`shiplift cleanup CONFIG --list`)")
    if codes & CREDENTIALS:
        return ConfigError(f"{text}", fix="the credentials are invalid or expired: refresh them; nothing was created")
    if codes & ACCESS_DENIED:
        return ConfigError(f"{text}", fix="grant the permission (`shiplift iam` writes the policies the release needs)")
    lowered = message.lower()
    if codes & WRONG_REGION or "wrong region" in lowered or "expecting" in lowered and "region" in lowered:
        return ConfigError(f"{text}", fix=f"the resource is not in {region}: set backend.region to its region")
    if codes & WRITE_RACED:
        return NotReady(text, fix="another conditional write of the same key was in progress; retry the write")
    if codes & NOT_FOUND or message.startswith("Could not find") or "does not exist" in message:
        return NotFound(text, fix="create it first, or check the name and the region")
    if codes & CONFLICT or "already exist" in message:
        return Conflict(text,
                        fix="a resource of that name exists with other content; rerun to reuse it or pick another name")
    if codes & CAPACITY or "capacity" in lowered:
        return CapacityError(text, fix="try other instance types, another region, or ask for a quota increase")
    if codes & SERVER_SIDE or (status or 0) >= 500:
        return NotReady(text, fix="AWS reported a server-side error; retry")
    return BadInput(text, fix="correct the request; the message above is AWS's")
