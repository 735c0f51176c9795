"""The live AWS suite (`make test-aws-live`): the tiny CPU canary released into the account of the credential chain,
as the roles `shiplift iam` generates, and deleted again. It costs money (the run prints its estimate and waits for
--yes or SHIPLIFT_LIVE_OK=1) and needs SHIPLIFT_LIVE_BUCKET and SHIPLIFT_LIVE_ECR_REPOSITORY (README, "First run on AWS"
step 3). The caller creates, assumes and deletes the run's IAM roles and deletes what the run made
(S3 object versions, the CodeBuild project, log groups, SageMaker and CloudWatch resources): an administrator's
session in a sandbox account. Without credentials it skips."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tests.live.live_release import LiveRelease

pytestmark = pytest.mark.live


# A run takes about an hour and a half, well past the suite's 600 s; past this limit pytest-timeout's signal method
# fails the test by raising inside the run, so its cleanup still runs.
@pytest.mark.timeout(3 * 3600, method="signal")
def test_a_tiny_cpu_canary_is_released_twice_as_the_generated_roles_and_cleaned_up(tmp_path, request):
    session = boto3.Session()
    try:
        credentials = session.get_credentials()
    except BotoCoreError as exc:  # an expired SSO token, a broken profile
        pytest.skip(f"the AWS credential chain failed ({exc}): refresh the credentials (aws sso login) or fix the "
                    "profile")
    if credentials is None:
        pytest.skip("no AWS credentials in the credential chain (AWS_PROFILE, SSO login, environment, instance role): "
                    "the live suite releases into a real account")
    try:
        identity = session.client("sts",
                                  config=Config(connect_timeout=10, read_timeout=30, retries={"total_max_attempts": 2})
                                  ).get_caller_identity()
    except (BotoCoreError, ClientError) as exc:
        pytest.skip(f"AWS credentials were found, but STS GetCallerIdentity failed ({exc}): refresh them (aws sso "
                    "login) or check the network path to AWS")
    print(f"live AWS suite as {identity['Arn']}")
    result = LiveRelease(tmp_path, yes=request.config.getoption("--yes", default=False)).run()
    assert result["left"] == []
