"""`shiplift sfn render|deploy` and the commands the rendered state machine runs, through the real CLI parser."""

from __future__ import annotations

import json
import shlex

import pytest
from moto import mock_aws

from shiplift.tasks.cli.main import build_parser, main

QWEN = "configs/releases/qwen35-4b-semif.yaml"
RUNNER = "configs/stepfunctions/runner-example.yaml"
ROLE = "arn:aws:iam::123456789012:role/shiplift-stepfunctions"


def rendered(capsys) -> dict:
    assert main(["sfn", "render", QWEN, "--runner", RUNNER]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_task_command_parses_with_this_cli(capsys):
    definition = rendered(capsys)
    commands = [s["Comment"] for s in definition["States"].values()
                if s["Type"] == "Task" and s["Comment"].startswith("shiplift ")]
    assert len(commands) >= 11
    parser = build_parser()
    for command in commands:
        argv = shlex.split(command.replace("<holder>", "stepfunctions:exec-1"))[1:]
        args = parser.parse_args(argv)
        assert args.func.__name__.startswith("cmd_"), command
    stages = {shlex.split(c)[2] for c in commands if shlex.split(c)[1] == "stage"}
    assert stages == {"resolve", "build", "package", "image", "deploy_candidate", "validate", "promote",
                      "teardown_candidate"}


def test_deploy_is_idempotent_through_the_cli(capsys, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        statuses = []
        for _ in range(2):
            assert main(["sfn", "deploy", QWEN, "--runner", RUNNER, "--role-arn", ROLE]) == 0
            statuses.append(json.loads(capsys.readouterr().out)["status"])
        assert statuses == ["created", "unchanged"]
        assert main(["sfn", "deploy", QWEN, "--runner", RUNNER, "--role-arn", ROLE, "--set",
                     "validation.concurrency=3"]) == 0
        assert json.loads(capsys.readouterr().out)["status"] == "updated"


def test_render_refuses_a_config_outside_the_repository(tmp_path, capsys):
    outside = tmp_path / "x.yaml"
    outside.write_text(open(QWEN).read())
    assert main(["sfn", "render", str(outside), "--runner", RUNNER]) == 2
    assert "outside the repository" in capsys.readouterr().err


def test_stage_result_uri_flag_is_wired():
    args = build_parser().parse_args(["stage", "validate", "--release", "r", "--result-uri", "s3://b/k.json"])
    assert args.result_uri == "s3://b/k.json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["orchestrate", "end", "--release", "r"])  # --holder is required
