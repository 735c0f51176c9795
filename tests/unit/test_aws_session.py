"""shiplift.tasks.backends.aws.session: botocore failures mapped onto domain errors, and the lazily built, bounded
clients of `Aws`."""

from __future__ import annotations

import boto3
import pytest
from botocore import exceptions as bce
from botocore.stub import Stubber

from shiplift.tasks.backends.aws.session import (
    CONNECT_TIMEOUT_S,
    MAX_ATTEMPTS,
    READ_TIMEOUT_S,
    Aws,
    AwsAccess,
    domain_error,
)
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

REGION = "us-east-1"


def client_error(code: str, message: str, status: int, operation: str = "DescribeEndpoint") -> bce.ClientError:
    return bce.ClientError({"Error": {"Code": code, "Message": message},
                            "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


def mapped(exc: Exception, operation: str = "DescribeEndpoint") -> ShipliftError:
    return domain_error(exc, "sagemaker", operation, REGION)


def static_session(region: str = "eu-west-1", key: str = "AKIDSHIPLIFTTEST") -> boto3.Session:
    """A boto3 session with its own (fake) credentials: nothing is read from the environment or ~/.aws."""
    return boto3.Session(aws_access_key_id=key, aws_secret_access_key="not-a-secret", region_name=region)


@pytest.fixture
def no_aws_environment(monkeypatch, tmp_path):
    """No credentials, profile or endpoint from this machine's environment or files."""
    import os

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    (tmp_path / "empty").write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# -- domain_error: ClientError codes, messages and HTTP statuses ----------------------------------------

@pytest.mark.parametrize("code, status", [("ThrottlingException", 400), ("Throttling", 400), ("SlowDown", 503),
                                          ("TooManyRequestsException", 429), ("RequestLimitExceeded", 400)])
def test_throttling_is_throttled_and_retryable(code, status):
    error = mapped(client_error(code, "Rate exceeded", status), "CreateEndpoint")
    assert type(error) is Throttled and isinstance(error, NotReady)
    assert error.retryable is True
    assert "sagemaker CreateEndpoint" in str(error) and code in str(error) and "bounded retries" in str(error)
    assert "retry later" in error.fix


@pytest.mark.parametrize("code, message, status", [
    ("ValidationException", 'Could not find endpoint "arn:aws:sagemaker:us-east-1:123456789012:endpoint/x".', 400),
    ("ValidationException", "Could not find model \"m\".", 400),
    ("ResourceNotFound", "Inference component c does not exist.", 400),
    ("404", "Not Found", 404),
    ("NoSuchKey", "The specified key does not exist.", 404),
    ("RepositoryNotFoundException", "The repository with name 'r' does not exist", 400),
])
def test_missing_resources_are_not_found(code, message, status):
    error = mapped(client_error(code, message, status))
    assert type(error) is NotFound and error.retryable is False
    assert message in str(error) and "check the name and the region" in error.fix


@pytest.mark.parametrize("code, message", [
    ("ValidationException",
     'Cannot create already existing endpoint "arn:aws:sagemaker:us-east-1:123456789012:endpoint/x".'),
    ("ValidationException", "Model m already exists."),
    ("ResourceInUse", "Resource in use"),
    ("PreconditionFailed", "At least one of the pre-conditions you specified did not hold"),
    ("ImageTagAlreadyExistsException", "tag exists"),
])
def test_taken_names_and_failed_preconditions_are_conflicts(code, message):
    error = mapped(client_error(code, message, 400), "CreateEndpoint")
    assert type(error) is Conflict and message in str(error)


@pytest.mark.parametrize("code, message", [
    ("ResourceLimitExceeded", "The account-level service limit 'ml.g6e.xlarge for endpoint usage' is 0 Instances"),
    ("AccountLimitExceededException", "Cannot have more than 1 builds in queue for the account"),
])
def test_an_exhausted_quota_is_a_config_error_naming_service_quotas(code, message):
    """Retrying cannot raise a quota: it is a config error (not the retryable CapacityError) that says where to ask."""
    error = mapped(client_error(code, message, 400), "CreateEndpoint")
    assert type(error) is ConfigError and error.retryable is False
    assert message in str(error) and "Service Quotas" in error.fix


@pytest.mark.parametrize("code, message", [
    ("InsufficientInstanceCapacity", "We currently do not have sufficient ml.g6e.xlarge capacity"),
    ("ValidationException", "Insufficient capacity for ml.p5.48xlarge in us-east-1"),
])
def test_no_capacity_is_capacity_error(code, message):
    error = mapped(client_error(code, message, 400), "CreateEndpoint")
    assert type(error) is CapacityError and error.retryable is True
    assert message in str(error) and "other instance types" in error.fix


@pytest.mark.parametrize("code, status", [("AccessDeniedException", 400), ("AccessDenied", 403), ("Forbidden", 403)])
def test_access_denied_is_a_config_error_pointing_at_shiplift_iam(code, status):
    error = mapped(client_error(code, "User: arn:aws:iam::123456789012:user/x is not authorized to perform: "
                                      "sagemaker:CreateEndpoint", status), "CreateEndpoint")
    assert type(error) is ConfigError and error.retryable is False
    assert "not authorized to perform: sagemaker:CreateEndpoint" in str(error)
    assert "`shiplift iam`" in error.fix


@pytest.mark.parametrize("code",
                         ["ExpiredToken", "UnrecognizedClientException", "InvalidClientTokenId",
                          "SignatureDoesNotMatch"])
def test_rejected_credentials_are_config_errors(code):
    error = mapped(client_error(code, "The security token included in the request is invalid.", 400))
    assert type(error) is ConfigError and "refresh them" in error.fix and "nothing was created" in error.fix


def test_a_wrong_region_is_a_config_error_naming_the_configured_region():
    error = domain_error(client_error("PermanentRedirect", "The bucket you are attempting to access must be addressed "
                                                           "using the specified endpoint.", 301, "HeadBucket"),
                         "s3", "HeadBucket", "us-east-1")
    assert type(error) is ConfigError and "us-east-1" in error.fix and "backend.region" in error.fix


@pytest.mark.parametrize("code, status", [("InternalFailure", 500), ("ServiceUnavailable", 503), ("InternalError", 500),
                                          ("SomethingNew", 502), ("", 504)])
def test_server_side_errors_are_not_ready(code, status):
    error = mapped(client_error(code, "We encountered an internal error. Please try again.", status))
    assert type(error) is NotReady and error.retryable is True and "server-side" in error.fix


def test_any_other_client_error_is_bad_input_carrying_aws_message():
    error = mapped(client_error("ValidationException",
                                "1 validation error detected: Value 'x' at 'endpointName' failed", 400))
    assert type(error) is BadInput and "Value 'x' at 'endpointName' failed" in str(error)


# -- domain_error: botocore's own exceptions -------------------------------------------------------------

@pytest.mark.parametrize("exc", [bce.NoCredentialsError(),
                                 bce.PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"),
                                 bce.CredentialRetrievalError(provider="sso", error_msg="expired")])
def test_no_usable_credentials_is_a_config_error(exc):
    error = domain_error(exc, "sts", "GetCallerIdentity", REGION)
    assert type(error) is ConfigError and "no usable AWS credentials" in str(error)
    assert "AWS_PROFILE" in error.fix and "nothing was created" in error.fix


def test_no_region_is_a_config_error_naming_the_field():
    error = domain_error(bce.NoRegionError(), "sts", "GetCallerIdentity", REGION)
    assert type(error) is ConfigError and "backend.region" in error.fix


@pytest.mark.parametrize("exc",
                         [bce.EndpointConnectionError(endpoint_url="https://api.sagemaker.us-east-1.amazonaws.com"),
                                 bce.ConnectTimeoutError(endpoint_url="https://api.sagemaker.us-east-1.amazonaws.com"),
                                 bce.ReadTimeoutError(endpoint_url="https://api.sagemaker.us-east-1.amazonaws.com"),
                                 bce.ConnectionClosedError(endpoint_url="https://api.sagemaker.us-east-1.amazonaws.com")])
def test_network_trouble_is_not_ready(exc):
    error = mapped(exc)
    assert type(error) is NotReady and error.retryable is True
    assert "could not reach AWS in us-east-1" in str(error) and "api.sagemaker.us-east-1.amazonaws.com" in str(error)


def test_a_parameter_validation_error_is_bad_input():
    error = mapped(bce.ParamValidationError(report="Missing required parameter in input: \"EndpointName\""))
    assert type(error) is BadInput and "EndpointName" in str(error)


def test_an_unknown_exception_is_not_ready_with_its_type():
    error = mapped(RuntimeError("socket exploded"))
    assert type(error) is NotReady and "RuntimeError: socket exploded" in str(error)


# -- Aws: lazy clients, timeouts and retries, where the session comes from --------------------------------

def test_no_client_and_no_session_until_first_use():
    made = []

    def factory():
        made.append(1)
        return static_session()

    aws = Aws(region=REGION, access=factory)
    assert made == [] and aws._clients == {}, "building Aws reads no connection and makes no client"
    aws.client("s3")
    assert made == [1] and len(aws._clients) == 1


def test_the_factory_is_called_once_for_every_client():
    """An Airflow connection (the factory) is read once, however many services the stage uses."""
    made = []

    def factory():
        made.append(1)
        return AwsAccess(session=static_session())

    aws = Aws(region=REGION, access=factory)
    for service in ("s3", "sagemaker", "sts", "ecr"):
        aws.client(service)
    aws.client("sagemaker", read_timeout_s=300)
    assert len(made) == 1, f"the access factory was called {len(made)} times for 5 clients"


def test_clients_carry_the_timeouts_and_bounded_standard_retries():
    aws = Aws(region=REGION, access=static_session())
    client = aws.client("sagemaker")
    config = client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (CONNECT_TIMEOUT_S, READ_TIMEOUT_S) == (10, 60)
    # botocore's `max_attempts` counts retries (it stores max_attempts + 1 as total_max_attempts): MAX_ATTEMPTS is
    # meant as the total, so it is passed as total_max_attempts
    assert config.retries == {"total_max_attempts": MAX_ATTEMPTS, "mode": "standard"}
    assert client.meta.region_name == REGION, "the config's region wins over the session's (eu-west-1)"
    assert "shiplift" in config.user_agent_extra
    assert aws.client("sagemaker") is client, "one client per service, cached"


def test_a_longer_read_timeout_and_adaptive_retries_on_request():
    aws = Aws(region=REGION, access=static_session(), retry_mode="adaptive")
    slow = aws.client("sagemaker-runtime", read_timeout_s=300, max_attempts=2)
    assert slow.meta.config.read_timeout == 300 and slow.meta.config.retries["mode"] == "adaptive"
    assert slow.meta.config.retries["total_max_attempts"] == 2, "max_attempts=2 means two attempts in all"
    assert aws.client("sagemaker-runtime") is not slow
    assert aws.client("sagemaker-runtime").meta.config.read_timeout == 60


def test_a_boto3_session_supplies_the_credentials():
    aws = Aws(region=REGION, access=static_session(key="AKIDFROMSESSION"))
    client = aws.client("s3")
    assert client._request_signer._credentials.access_key == "AKIDFROMSESSION"
    assert client.meta.endpoint_url.startswith("https://s3.") and client.meta.endpoint_url.endswith(".amazonaws.com")


def test_an_aws_access_supplies_the_session_and_the_endpoint():
    aws = Aws(region=REGION,
              access=AwsAccess(session=static_session(key="AKIDFROMACCESS"), endpoint_url="http://127.0.0.1:9"))
    client = aws.client("sagemaker")
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    assert client._request_signer._credentials.access_key == "AKIDFROMACCESS"


def test_an_aws_access_without_session_uses_the_default_chain_and_its_endpoint(no_aws_environment, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDFROMCHAIN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-secret")
    client = Aws(region=REGION, access=AwsAccess(endpoint_url="http://127.0.0.1:9")).client("sts")
    assert client.meta.endpoint_url == "http://127.0.0.1:9" and client.meta.region_name == REGION
    assert client._request_signer._credentials.access_key == "AKIDFROMCHAIN"


def test_an_unknown_profile_is_a_config_error(no_aws_environment):
    aws = Aws(region=REGION, profile="nobody-has-this-profile")
    with pytest.raises(ConfigError) as caught:
        aws.client("s3")
    assert "'nobody-has-this-profile' is not configured" in str(caught.value) and "backend.profile" in caught.value.fix


# -- Aws.call: validate, send, map ---------------------------------------------------------------------

def test_call_maps_a_service_error_onto_the_domain_error():
    aws = Aws(region=REGION, access=static_session())
    with Stubber(aws.client("sagemaker")) as stub:
        stub.add_client_error("describe_endpoint", service_error_code="ValidationException",
                              service_message='Could not find endpoint "x".', http_status_code=400)
        with pytest.raises(NotFound) as caught:
            aws.call("sagemaker", "DescribeEndpoint", EndpointName="x")
    assert 'sagemaker DescribeEndpoint: ValidationException: Could not find endpoint "x".' in str(caught.value)
    assert isinstance(caught.value.__cause__, bce.ClientError)


def test_call_refuses_an_invalid_request_before_sending_it_or_telling_listeners():
    heard = []
    aws = Aws(region=REGION, access=static_session(), listeners=[lambda *call: heard.append(call)])
    with Stubber(aws.client("sagemaker")) as stub:  # nothing queued: any request that went out would fail differently
        with pytest.raises(BadInput) as caught:
            aws.call("sagemaker", "create_endpoint", EndpointName="e" * 64, EndpointConfigName="c")
        stub.assert_no_pending_responses()
    assert "EndpointName: 64 characters, at most 63 allowed" in str(caught.value) and heard == []


def test_call_accepts_snake_case_and_returns_the_answer_after_telling_listeners():
    heard = []
    aws = Aws(region=REGION, access=static_session(), listeners=[lambda *call: heard.append(call)])
    with Stubber(aws.client("sagemaker")) as stub:
        stub.add_response("list_endpoints", {"Endpoints": []}, {"MaxResults": 5})
        assert aws.call("sagemaker", "list_endpoints", MaxResults=5)["Endpoints"] == []
    assert heard == [("sagemaker", "ListEndpoints", {"MaxResults": 5})]
