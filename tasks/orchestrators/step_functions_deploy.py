"""The state machine on AWS: its definition as the JSON Step Functions takes, created or updated in place
(idempotent, and only a state machine shiplift manages), and the check that a runner's task definition runs the pinned
pipeline image."""

from __future__ import annotations

import json
import re

from shiplift.tasks.config import ReleaseConfig
from shiplift.tasks.errors import BadInput, ConfigError, Conflict, NotFound
from shiplift.tasks.hashing import canonical_json
from shiplift.tasks.orchestrators.step_functions_runner import RunnerSettings
from shiplift.tasks.orchestrators.step_functions_tasks import state_machine_name
from shiplift.tasks.orchestrators.task_token import CLIENT_TIMEOUTS

MANAGED_TAGS = ("shiplift:model", "shiplift:managed")
ROLE_ARN_PATTERN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/.+")


def definition_json(definition: dict) -> str:
    """The definition as the JSON text sent to Step Functions (stable key order, indented)."""
    return json.dumps(definition, indent=2, ensure_ascii=False)


def _stepfunctions_client(config: ReleaseConfig):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    region = getattr(config.backend, "region", None)
    try:
        return boto3.client("stepfunctions", region_name=region, config=Config(**CLIENT_TIMEOUTS))
    except NoRegionError as exc:
        raise ConfigError("no AWS region for Step Functions",
                          fix="use an aws backend config or set AWS_DEFAULT_REGION") from exc


def _find_state_machine(client, name: str) -> str | None:
    for page in client.get_paginator("list_state_machines").paginate():
        for machine in page["stateMachines"]:
            if machine["name"] == name:
                return machine["stateMachineArn"]
    return None


def deploy_state_machine(config: ReleaseConfig, definition: dict, *, role_arn: str, client=None) -> dict:
    """Create the model's state machine, or update it in place when its definition or role differ.

    Idempotent: when definition, role and tags already match, no call that changes anything is
    made. A same-named state machine that shiplift does not manage is never touched.
    """
    from botocore.exceptions import ClientError

    if not ROLE_ARN_PATTERN.match(role_arn):
        raise BadInput(f"role_arn {role_arn!r} is not an IAM role ARN", fix="pass arn:aws:iam::ACCOUNT:role/NAME")
    name = state_machine_name(config)
    tags = {MANAGED_TAGS[0]: config.name, MANAGED_TAGS[1]: "true"}
    client = client or _stepfunctions_client(config)
    text = definition_json(definition)
    try:
        arn = _find_state_machine(client, name)
        if arn is None:
            created = client.create_state_machine(
                name=name, definition=text, roleArn=role_arn, type="STANDARD",
                tags=[{"key": k, "value": v} for k, v in tags.items()],
            )
            return {"arn": created["stateMachineArn"], "name": name, "status": "created"}
        live_tags = {t["key"]: t["value"] for t in client.list_tags_for_resource(resourceArn=arn)["tags"]}
        if live_tags.get(MANAGED_TAGS[1]) != "true" or live_tags.get(MANAGED_TAGS[0]) not in (None, config.name):
            raise Conflict(
                f"state machine {name} exists but is not managed by shiplift for {config.name} (tags {live_tags})",
                fix="delete or rename it, or change resource_prefix",
            )
        described = client.describe_state_machine(stateMachineArn=arn)
        if described.get("type", "STANDARD") != "STANDARD":
            raise Conflict(f"state machine {name} is {described['type']}; .sync tasks need STANDARD",
                           fix="delete it and deploy again")
        status = "unchanged"
        if (canonical_json(json.loads(described["definition"])) != canonical_json(definition)
                or described["roleArn"] != role_arn):
            client.update_state_machine(stateMachineArn=arn, definition=text, roleArn=role_arn)
            status = "updated"
        if any(live_tags.get(k) != v for k, v in tags.items()):
            client.tag_resource(resourceArn=arn, tags=[{"key": k, "value": v} for k, v in tags.items()])
            status = "updated"
        return {"arn": arn, "name": name, "status": status}
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", str(exc))
        if code in ("InvalidDefinition", "InvalidArn", "InvalidName", "ValidationException"):
            raise BadInput(f"Step Functions refused state machine {name}: {code}: {message}",
                           fix="fix the definition or arguments") from exc
        raise


def verify_task_definition(runner: RunnerSettings, *, client=None, region: str | None = None) -> dict:
    """Check that the runner's task definition runs the pinned pipeline image in the named container."""
    if client is None:
        import boto3
        from botocore.config import Config

        client = boto3.client("ecs", region_name=region, config=Config(**CLIENT_TIMEOUTS))
    task = client.describe_task_definition(taskDefinition=runner.task_definition)["taskDefinition"]
    containers = {c["name"]: c for c in task.get("containerDefinitions", [])}
    if runner.container_name not in containers:
        raise NotFound(
            f"task definition {runner.task_definition} has no container {runner.container_name!r} (has "
            f"{sorted(containers)})",
            fix="set container_name in the runner settings",
        )
    image = containers[runner.container_name]["image"]
    if image != runner.pipeline_image:
        raise Conflict(
            f"task definition {runner.task_definition} runs {image}, not the pinned pipeline image "
            f"{runner.pipeline_image}",
            fix="register a revision with the pinned image and point task_definition at it",
        )
    if runner.launch_type not in task.get("requiresCompatibilities", [runner.launch_type]):
        raise Conflict(f"task definition {runner.task_definition} is not compatible with {runner.launch_type}",
                       fix="register it with requiresCompatibilities including the launch type")
    return {"task_definition": task.get("taskDefinitionArn", runner.task_definition), "image": image}
