"""Where and how the state machine's Task states run the pipeline image (ECS RunTask): the runner settings, read
from their YAML file (docs/step-functions.md, "Runner settings")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shiplift.tasks.errors import ConfigError
from shiplift.tasks.yamlfile import read_yaml_file


class RunnerSettings(BaseModel):
    """Where and how the Task states run the pipeline image (ECS RunTask `.sync`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    cluster: str = Field(min_length=1, description="ECS cluster name or ARN")
    task_definition: str = Field(
        pattern=r"^(arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task-definition/)?[A-Za-z0-9_-]{1,255}:\d+$",
        description="family:revision (a revision is immutable, so it pins the image)",
    )
    container_name: str = Field("pipeline", min_length=1,
                                description="the container in the task definition that runs shiplift")
    pipeline_image: str = Field(pattern=r"^[^@\s]+@sha256:[0-9a-f]{64}$",
                                description="the pipeline image, pinned by digest")
    launch_type: Literal["FARGATE", "EC2"] = "FARGATE"
    platform_version: str | None = Field(None, description="Fargate platform version; None = AWS's LATEST")
    subnets: list[str] = Field(default_factory=list, max_length=16)
    security_groups: list[str] = Field(default_factory=list, max_length=5)
    assign_public_ip: bool = False
    state_dir: str = Field("/tmp/shiplift", description="each task's own scratch space and caches (nothing is shared)")
    result_bucket: str | None = Field(None, description="bucket for stage results; None = the aws backend's bucket")
    result_prefix: str = Field("shiplift/stepfunctions", pattern=r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$")
    startup_allowance_s: int = Field(900, ge=0, le=3600,
                                     description="how long an ECS task may take to start (image pull); "
                                     "added once to every task's timeout from the stage table, and to its heartbeat")
    post_promote_wait_s: int = Field(60, ge=0, le=3600, description="bake after an all_at_once/blue_green promotion")

    @field_validator("subnets")
    @classmethod
    def _subnet_ids(cls, subnets: list[str]) -> list[str]:
        bad = [s for s in subnets if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", s)]
        if bad:
            raise ValueError(f"not subnet ids: {bad}; write subnet-0123456789abcdef0")
        return subnets

    @field_validator("security_groups")
    @classmethod
    def _security_group_ids(cls, groups: list[str]) -> list[str]:
        bad = [g for g in groups if not re.fullmatch(r"sg-[0-9a-f]{8,17}", g)]
        if bad:
            raise ValueError(f"not security group ids: {bad}; write sg-0123456789abcdef0")
        return groups

    @field_validator("state_dir")
    @classmethod
    def _absolute_state_dir(cls, state_dir: str) -> str:
        if not state_dir.startswith("/") or ".." in state_dir.split("/"):
            raise ValueError(f"state_dir must be an absolute path without '..', got {state_dir!r}")
        return state_dir

    @model_validator(mode="after")
    def _launch_type_fits(self) -> RunnerSettings:
        if self.launch_type == "FARGATE" and not self.subnets:
            raise ValueError("FARGATE tasks use awsvpc networking: give at least one subnet in subnets")
        if self.launch_type == "EC2" and (self.platform_version is not None or self.assign_public_ip):
            raise ValueError("platform_version and assign_public_ip apply to FARGATE only; remove them for "
                             "launch_type EC2")
        return self


def load_runner_settings(path: str) -> RunnerSettings:
    """Read RunnerSettings from a YAML file; ConfigError names the file and the bad fields."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"runner settings file {file} does not exist",
                          fix="write one as shown in docs/step-functions.md")
    tree = read_yaml_file(file, "runner settings file")
    try:
        return RunnerSettings.model_validate(tree)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{file}: invalid runner settings\n" + "\n".join(lines),
                          fix="correct the fields listed above") from exc
