"""The live AWS suite's one run (issue 17): a tiny CPU canary released twice into a real account, as the roles
`shiplift iam` writes, then everything it made deleted again.

`LiveRelease.run` is the whole run, used by `tests/live/test_aws_live.py` against the account of the credential chain
and by `tests/live/test_live_release_double.py` against the AWS double, so the code that spends money is the code the
default suite tests. Everything it creates is named with one run prefix (`sl-live-<8 hex>`: the resource prefix, the
S3 key prefix, the CodeBuild project and the role names), so cleanup finds all of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import yaml

from shiplift.tasks.backends.aws.iam import codebuild_role_policy, execution_role_policy, pipeline_policy, trust_policy
from shiplift.tasks.backends.aws.session import ACCESS_DENIED, Aws
from shiplift.tasks.config import ReleaseConfig, load_release_config
from shiplift.tasks.errors import ConfigError, NotFound, ShipliftError
from shiplift.tasks.pipeline.release import print_progress, run_release
from tests.tiny_release import write_tiny_config

MODEL_NAME = "tiny-live"
SECOND_RELEASE = ("artifact.quantization=F16",)  # another GGUF (the first is Q8_0), so production must change models
POOLS = [{"instance_type": "ml.c6i.large", "priority": 1}, {"instance_type": "ml.c5.large", "priority": 2},
         {"instance_type": "ml.m5.large", "priority": 3}]
ROLES = {"pipeline": None, "sagemaker-execution": "sagemaker.amazonaws.com", "codebuild": "codebuild.amazonaws.com"}
TAGS = {"shiplift:managed": "true"}  # plus shiplift:live-run=<prefix> on the roles
DECISION = {"id": "live", "state": "The sky is blue.", "question": "Is the sky blue?",
            "options": [{"id": "no", "description": "no"}, {"id": "yes", "description": "yes"}]}
CONFIRM = "pass --yes (make test-aws-live PYTEST_ARGS=--yes) or set SHIPLIFT_LIVE_OK=1"

# The cost estimate, in one place. On-demand list prices for us-east-1, rounded up; check
# https://aws.amazon.com/sagemaker/pricing/ (real-time inference) and https://aws.amazon.com/codebuild/pricing/ for your
# region before relying on them.
INSTANCE_USD_PER_HOUR = 0.12  # the dearest pool type: ml.m5.large ≈ 0.115; ml.c6i.large and ml.c5.large ≈ 0.10
EXPECTED_HOURS = 1.5  # two candidates, production, a rolling update with managed scaling, and the deletions
CODEBUILD_USD_PER_MINUTE = 0.02  # BUILD_GENERAL1_LARGE (tasks.backends.aws.image_builder.COMPUTE_TYPE)
BUILD_MINUTES = 25  # one CPU image build (llama-cpp-python compiles from source); none when ECR has the image already


@dataclass(frozen=True)
class Pace:
    """How fast the run polls and bakes: the live defaults, or the double's fast ones."""

    poll_s: float = 15.0  # backend.poll_s, and the wait between retries while IAM propagates or cleanup waits on AWS
    wait_interval_s: int = 60  # the canary's bake after each batch
    check_interval_s: float = 5.0  # how often the bake reads the alarms (the default)
    iam_deadline_s: float = 180.0  # how long a new role may take to become assumable and usable
    cleanup_deadline_s: float = 1800.0  # how long cleanup keeps retrying resources AWS is still busy with


@dataclass(frozen=True)
class Settings:
    """Where the run goes: region, the artifact bucket and the image repository (created once per account)."""

    region: str
    bucket: str
    repository: str

    @classmethod
    def from_env(cls, env: Mapping[str, str], session) -> Settings:
        """From SHIPLIFT_LIVE_*; ConfigError naming every missing variable and how to create what it names."""
        region = env.get("SHIPLIFT_LIVE_REGION") or session.region_name
        bucket, repository = env.get("SHIPLIFT_LIVE_BUCKET"), env.get("SHIPLIFT_LIVE_ECR_REPOSITORY")
        where = region or "REGION"
        missing = [text for value, text in (
            (region, "SHIPLIFT_LIVE_REGION: the region to release into (default: the credential chain's, AWS_REGION or "
                     "the profile's region), e.g. us-east-1"),
            (bucket, f"SHIPLIFT_LIVE_BUCKET: an S3 bucket in {where} for the run's artifacts "
                     f"(aws s3 mb s3://NAME --region {where}; README, 'First run on AWS' step 3)"),
            (repository, f"SHIPLIFT_LIVE_ECR_REPOSITORY: an ECR repository in {where} with immutable tags (aws ecr "
                         "create-repository --repository-name shiplift/semif --image-tag-mutability IMMUTABLE "
                         f"--region {where})"),
        ) if not value]
        if missing:
            raise ConfigError("the live AWS suite needs " + "; ".join(missing),
                              fix="set the variables named above (nothing was created)")
        return cls(region, bucket, repository)


def run_prefix() -> str:
    """A fresh prefix for one run; at most 16 characters, as `resource_prefix` allows."""
    return f"sl-live-{secrets.token_hex(4)}"


class LiveRelease:
    """One live run: settings, config, cost estimate and confirmation, roles, two releases and their checks, cleanup."""

    def __init__(self, workdir: Path, *, yes: bool = False, env: Mapping[str, str] = os.environ,
                 session_factory: Callable[[], Any] = boto3.Session, stdin=None, say: Callable[[str], None] = print,
                 progress: Callable[[str], None] | None = None, pace: Pace = Pace()):
        self.workdir, self.yes, self.env, self.pace = Path(workdir), yes, env, pace
        self.stdin = sys.stdin if stdin is None else stdin
        self.say = lambda message: say(f"[live] {message}")
        self.progress = progress or print_progress
        self.session = session_factory()
        self.prefix = run_prefix()
        self.config: ReleaseConfig | None = None

    # ---- the run ----------------------------------------------------------------------------------------------------

    def run(self) -> dict:
        """Plan and confirm, then release twice as the pipeline role and check what serves; clean up in every outcome.
        Returns both summaries and what was left (empty, or the run fails)."""
        settings = Settings.from_env(self.env, self.session)
        self.caller = Aws(region=settings.region, access=self.session)
        identity = self.caller.call("sts", "GetCallerIdentity")
        self.partition, self.account = identity["Arn"].split(":")[1], identity["Account"]
        config_path = self.write_config(settings)
        self.config = load_release_config(config_path)  # the capacity and batch checks run here, before anything exists
        load_release_config(config_path, overrides=SECOND_RELEASE)
        self.say(f"run {self.prefix} as {identity['Arn']} in {settings.region}: {config_path}")
        self.confirm(self.estimate())
        result: dict[str, Any] = {"prefix": self.prefix, "config": str(config_path)}
        with signals_interrupt():
            try:
                self.create_roles()
                pipeline = self.assumed_session(self.role_arn("pipeline"))
                first = run_release(config_path, session=pipeline, progress=self.progress)
                result["first"] = first
                self.check_first(first, pipeline)
                second = run_release(config_path, overrides=SECOND_RELEASE, session=pipeline, progress=self.progress)
                result["second"] = second
                self.check_second(first, second, pipeline)
            except BaseException as exc:
                left = self.cleanup()
                if left:
                    exc.add_note("the live run also left resources behind: " + "; ".join(left))
                raise
            result["left"] = self.cleanup()
        if result["left"]:
            raise AssertionError("the live run passed but left resources behind: " + "; ".join(result["left"]))
        return result

    def write_config(self, settings: Settings) -> Path:
        """The tiny decision release (generated GGUF, 32 tasks) on CPU instances, as a canary of two copies."""
        state_dir = self.workdir / "state"
        path = write_tiny_config(self.workdir / "configs", state_dir, name=MODEL_NAME)
        tree = yaml.safe_load(path.read_text())
        tree["resource_prefix"] = self.prefix
        tree["backend"] = {
            "kind": "aws", "region": settings.region, "bucket": settings.bucket, "key_prefix": self.prefix,
            "ecr_repository": settings.repository, "codebuild_project": f"{self.prefix}-semif-image",
            "execution_role_arn": self.role_arn("sagemaker-execution"),
            "codebuild_role_arn": self.role_arn("codebuild"),
            "ledger_url": f"sqlite:///{state_dir / 'ledger.db'}", "state_dir": str(state_dir),
            "poll_s": self.pace.poll_s,
            # the Model Registry is a view of the ledger that `shiplift cleanup` does not delete; the run leaves no
            # group
            "model_registry": False,
        }
        # the CPU image: the tiny config keeps gemma-decision's base image, the CPU one (images/semif/Dockerfile's
        # default)
        tree["image"].update(n_gpu_layers=0, threads=1)
        # one-core copies on 2-vCPU instances: production holds 2 on one instance; the canary's batch of 1 beside them
        # peaks at 3, which managed instance scaling makes room for with a second instance (tasks.backends.capacity)
        tree["placement"] = {"kind": "instance_pool", "pools": POOLS, "provision_timeout_s": 1800, "instance_count": 1,
                             "max_instance_count": 2}
        tree["rollout"] = {"strategy": "canary", "copies": 2, "batch": {"type": "COPY_COUNT", "value": 1},
                           "wait_interval_s": self.pace.wait_interval_s,
                           "alarms": {"check_interval_s": self.pace.check_interval_s}}  # the default thresholds
        path.write_text(yaml.safe_dump(tree))
        return path

    def estimate(self) -> str:
        """The run's estimated cost, from the constants above and the config's peak instance count."""
        # the second candidate beside production grown for its update
        peak = 1 + self.config.placement.max_instance_count
        hosting = INSTANCE_USD_PER_HOUR * peak * EXPECTED_HOURS
        build = CODEBUILD_USD_PER_MINUTE * BUILD_MINUTES
        return (f"ESTIMATED cost of this run: at most about {hosting + build:.2f} USD (list-price estimate for "
                f"us-east-1): {peak} instances of the ml.c6i.large class at most at once x {INSTANCE_USD_PER_HOUR} "
                f"USD/h x {EXPECTED_HOURS} h = {hosting:.2f} USD, plus up to {BUILD_MINUTES} CodeBuild minutes x "
                f"{CODEBUILD_USD_PER_MINUTE} USD = {build:.2f} USD")

    def confirm(self, estimate: str) -> None:
        """Go on only with --yes, SHIPLIFT_LIVE_OK=1 or a 'yes' typed at a terminal; ConfigError otherwise."""
        self.say(estimate)
        if self.yes or self.env.get("SHIPLIFT_LIVE_OK") == "1":
            return
        if self.stdin.isatty():
            self.say("type yes to create the resources above (anything else stops here): ")
            if self.stdin.readline().strip().lower() == "yes":
                return
        raise ConfigError(f"the live AWS suite creates billed resources ({estimate}) and was not confirmed",
                          fix=f"{CONFIRM}; nothing was created")

    # ---- roles
    # --------------------------------------------------------------------------------------------------------

    def role_name(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    def role_arn(self, role: str) -> str:
        return f"arn:{self.partition}:iam::{self.account}:role/{self.role_name(role)}"

    def trust(self, role: str) -> dict:
        """Who may assume each role. `shiplift iam` writes trust policies for the SageMaker and CodeBuild roles only:
        who runs the pipeline (an ECS task, an Airflow connection, a person) is the operator's choice. Here it is the
        caller, so the pipeline role trusts its own account (any principal there whose policy allows sts:AssumeRole on
        it, as the caller's must); the role lives only as long as the run."""
        service = ROLES[role]
        if service:
            return trust_policy(service)
        root = f"arn:{self.partition}:iam::{self.account}:root"
        return {"Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": root}}]}

    def create_roles(self) -> None:
        """The three roles, tagged with the run, each with the policy `shiplift iam` generates for the config. The
        pipeline role comes last: once STS lets the caller assume it (`assumed_session` waits for that), the roles
        SageMaker and CodeBuild assume have had longer to propagate, and the release only passes them on after that."""
        policies = {"sagemaker-execution": execution_role_policy(self.config),
                    "codebuild": codebuild_role_policy(self.config), "pipeline": pipeline_policy(self.config)}
        tags = [{"Key": key, "Value": value} for key, value in {**TAGS, "shiplift:live-run": self.prefix}.items()]
        for role, policy in policies.items():
            name = self.role_name(role)
            self.caller.call("iam", "CreateRole", RoleName=name, AssumeRolePolicyDocument=json.dumps(self.trust(role)),
                             Description=f"shiplift live suite run {self.prefix} ({role}); deleted when the run ends",
                             Tags=tags)
            self.caller.call("iam", "PutRolePolicy", RoleName=name, PolicyName=f"shiplift-{role}",
                             PolicyDocument=json.dumps(policy))
            self.say(f"created role {name}")

    def assumed_session(self, role_arn: str):
        """A boto3 session as `role_arn` whose credentials renew themselves before they expire (a session assumed from
        an assumed role lasts at most an hour; the run takes longer), once the role can be assumed and is allowed to
        read the bucket: new roles and their policies take a while to reach STS and the services."""
        import botocore.session
        from botocore.credentials import CredentialProvider, RefreshableCredentials

        def assume() -> dict:
            credentials = self.caller.call("sts", "AssumeRole", RoleArn=role_arn, RoleSessionName=self.prefix,
                                           DurationSeconds=3600)["Credentials"]
            return {"access_key": credentials["AccessKeyId"], "secret_key": credentials["SecretAccessKey"],
                    "token": credentials["SessionToken"], "expiry_time": credentials["Expiration"].isoformat()}

        first = self.while_iam_propagates(assume, f"assume {role_arn}")

        class Assumed(CredentialProvider):
            METHOD = CANONICAL_NAME = "shiplift-live-assume-role"

            def load(self):
                return RefreshableCredentials.create_from_metadata(first, refresh_using=assume, method=self.METHOD)

        core = botocore.session.Session()
        core.get_component("credential_provider").insert_before("env", Assumed())
        session = boto3.Session(botocore_session=core, region_name=self.caller.region)
        role = Aws(region=self.caller.region, access=session)
        self.while_iam_propagates(lambda: role.call("s3", "HeadBucket", Bucket=self.config.backend.bucket),
                                  f"read bucket {self.config.backend.bucket} as {role_arn}")
        return session

    def while_iam_propagates(self, attempt: Callable[[], Any], what: str) -> Any:
        """`attempt()`, tried again while AWS denies it (AccessDenied, or a bare 403 to a HEAD request), until
        `pace.iam_deadline_s` has passed."""
        deadline = time.monotonic() + self.pace.iam_deadline_s
        while True:
            try:
                return attempt()
            except ConfigError as exc:
                if not any(f": {code}: " in exc.problem for code in ACCESS_DENIED) or time.monotonic() > deadline:
                    raise
                self.say(f"{what}: not yet allowed ({exc.problem}); IAM may still be propagating, trying again")
            time.sleep(self.pace.poll_s)

    # ---- checks (before cleanup: production must be there to look at)
    # -------------------------------------------------

    def check_first(self, first: dict, pipeline) -> None:
        """The first release is promoted and production runs its two copies."""
        check(first["status"] == "promoted", f"the first release ended {first['status']}, not promoted: {first}")
        live = Aws(region=self.caller.region, access=pipeline).call(
            "sagemaker", "DescribeInferenceComponent", InferenceComponentName=first["component"])
        copies = live["RuntimeConfig"]["CurrentCopyCount"]
        check((live["InferenceComponentStatus"], copies) == ("InService", 2),
              f"production {first['component']} is {live['InferenceComponentStatus']} with {copies} copies, not "
              "InService with 2")
        self.say(f"release 1 {first['release_id']} promoted: {first['component']} on {first['served_by']}, 2 copies")

    def check_second(self, first: dict, second: dict, pipeline) -> None:
        """The second release is a canary that promoted: the ledger verifies, the audit reads it back from SageMaker as
        what serves, and production answers with its model."""
        from shiplift.tasks.ledger.release_state import ReleaseState
        from shiplift.tasks.ledger.store import Ledger
        from shiplift.tasks.pipeline.audit import audit

        check(second["status"] == "promoted", f"the second release ended {second['status']}, not promoted: {second}")
        check(second["rollout"]["strategy"] == "canary" and second["rollout"]["steps"] > 0,
              f"the second release was not rolled out as a canary: {second['rollout']}")
        ledger = Ledger(self.config.backend.ledger_url)
        try:
            check(ledger.verify().ok, "the ledger does not verify")
            models = {summary["release_id"]: ReleaseState.load(ledger,
                                                               summary["release_id"]).result("build").model_sha256
                      for summary in (first, second)}
        finally:
            ledger.close()
        check(len(set(models.values())) == 2, f"both releases built the same model: {models}")
        served = audit(self.config.backend.state_dir, session=pipeline)["models"][MODEL_NAME]["live"]["release_id"]
        check(served == second["release_id"], f"the audit reads {served} serving, not {second['release_id']}")
        answer = Aws(region=self.caller.region, access=pipeline).call(
            "sagemaker-runtime", "InvokeEndpoint", EndpointName=second["served_by"],
            InferenceComponentName=second["component"],
            ContentType="application/json", Body=json.dumps({"decision": DECISION}))
        model = json.loads(answer["Body"].read())["result"]["model"]["sha256"]
        check(model == models[second["release_id"]], f"production answered with model {model}, not release 2's "
              f"{models[second['release_id']]}")
        self.say(f"release 2 {second['release_id']} promoted by a canary ({second['rollout']['steps']} traffic steps); "
                 "production answers with its model")

    # ---- cleanup
    # ------------------------------------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Delete everything named with the run prefix, with the caller's credentials (the roles may be gone or never
        made): SageMaker and CloudWatch resources as `shiplift cleanup --delete-all` does, the CodeBuild project, log
        groups, the S3 objects under the key prefix, the roles. Returns what is left, each with why; prints it."""
        left: list[str] = []
        steps = (("sagemaker", self.delete_hosted), ("codebuild", self.delete_project),
                 ("logs", self.delete_log_groups), ("s3", self.delete_objects), ("iam", self.delete_roles))
        try:
            for service, step in steps:
                try:
                    left += step()
                except ShipliftError as exc:
                    left.append(f"{service}: {exc}")
        except BaseException:
            self.say(f"cleanup of {self.prefix} was interrupted; finish it by hand: shiplift cleanup "
                     f"{self.workdir}/configs/{MODEL_NAME}.yaml --delete-all, the CodeBuild project "
                     f"{self.prefix}-semif-image, s3://{self.config.backend.bucket}/{self.prefix}/ and the roles "
                     f"{self.prefix}-*")
            raise
        for line in left:
            self.say(f"LEFT BEHIND: {line}")
        self.say(f"cleanup of {self.prefix}: " + ("done, nothing left" if not left else f"{len(left)} things left"))
        return left

    def delete_hosted(self) -> list[str]:
        """Everything `shiplift cleanup --delete-all` deletes for the prefix, again while AWS is still busy with some
        of it (an endpoint still Creating), until the deadline."""
        from shiplift.tasks.backends.registry import make_backends

        backends = make_backends(self.config, session=self.session)
        deadline = time.monotonic() + self.pace.cleanup_deadline_s
        try:
            while True:
                problems = []
                for resource in backends.hosting.managed_resources(self.prefix):
                    try:
                        backends.hosting.delete_resource(resource, progress=self.say)
                    except ShipliftError as exc:
                        problems.append(f"{resource.kind} {resource.name}: {exc}")
                if not problems:
                    return [f"{r.kind} {r.name}: still listed after its deletion"
                            for r in backends.hosting.managed_resources(self.prefix)]
                if time.monotonic() > deadline:
                    return problems
                self.say(f"{len(problems)} resources not deleted yet ({problems[0]}); trying again")
                time.sleep(self.pace.poll_s)
        finally:
            backends.ledger.close()

    def delete_project(self) -> list[str]:
        """The CodeBuild project the image stage created, if it built (its builds' history stays with CodeBuild)."""
        try:
            self.caller.call("codebuild", "DeleteProject", name=self.config.backend.codebuild_project)
        except NotFound:
            pass
        return []

    def delete_log_groups(self) -> list[str]:
        """The log groups SageMaker and CodeBuild wrote for the run's endpoints, components and project."""
        for prefix in (f"/aws/sagemaker/Endpoints/{self.prefix}-", f"/aws/sagemaker/InferenceComponents/{self.prefix}-",
                       f"/aws/codebuild/{self.config.backend.codebuild_project}"):
            params: dict[str, Any] = {"logGroupNamePrefix": prefix}
            while True:
                page = self.caller.call("logs", "DescribeLogGroups", **params)
                for group in page.get("logGroups", []):
                    self.caller.call("logs", "DeleteLogGroup", logGroupName=group["logGroupName"])
                    self.say(f"deleted log group {group['logGroupName']}")
                if not page.get("nextToken"):
                    break
                params["nextToken"] = page["nextToken"]
        return []

    def delete_objects(self) -> list[str]:
        """Every object version and delete marker under the run's key prefix (a versioned bucket keeps both)."""
        bucket, left = self.config.backend.bucket, []
        params: dict[str, Any] = {"Bucket": bucket, "Prefix": f"{self.prefix}/"}
        while True:
            page = self.caller.call("s3", "ListObjectVersions", **params)
            objects = [{"Key": item["Key"], "VersionId": item["VersionId"]}
                       for item in page.get("Versions", []) + page.get("DeleteMarkers", [])]
            if objects:  # a page holds at most 1000 entries, DeleteObjects' limit
                answer = self.caller.call("s3", "DeleteObjects", Bucket=bucket,
                                          Delete={"Objects": objects, "Quiet": True})
                left += [f"s3://{bucket}/{error['Key']}: {error.get('Code')} {error.get('Message')}"
                         for error in answer.get("Errors", [])]
                self.say(f"deleted {len(objects) - len(answer.get('Errors', []))} object versions under "
                         f"s3://{bucket}/{self.prefix}/")
            if not page.get("IsTruncated"):
                return left
            params.update(KeyMarker=page["NextKeyMarker"], VersionIdMarker=page["NextVersionIdMarker"])

    def delete_roles(self) -> list[str]:
        """Each role's inline policies, then the role."""
        left = []
        for role in ROLES:
            name = self.role_name(role)
            try:
                for policy in self.caller.call("iam", "ListRolePolicies", RoleName=name)["PolicyNames"]:
                    self.caller.call("iam", "DeleteRolePolicy", RoleName=name, PolicyName=policy)
                self.caller.call("iam", "DeleteRole", RoleName=name)
                self.say(f"deleted role {name}")
            except NotFound:
                continue  # never created (the run stopped before) or already gone
            except ShipliftError as exc:
                left.append(f"role {name}: {exc}")
        return left


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """While the run holds resources, SIGTERM and SIGHUP (a cancelled CI job, a closed terminal) raise KeyboardInterrupt
    as Ctrl-C does, so the cleanup runs (signal handlers can only be set from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def check(condition: bool, message: str) -> None:
    """An assertion that stays when Python runs with -O."""
    if not condition:
        raise AssertionError(message)
