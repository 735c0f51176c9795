"""The refresh DAG of an aws config under `dag.test()`, against the AWS double, its session from `aws_default`.

The Airflow subprocess gets no AWS credentials and no AWS endpoint in its environment: only the
`aws_default` connection (login/password and `endpoint_url` in its extra) can reach the double, so a
release that gets as far as promotion took its boto3 session from the connection.
"""

from __future__ import annotations

import json
import os


def test_refresh_dag_of_an_aws_config_takes_its_session_from_aws_default(aws_double, aws_release, tmp_path, airflow_env,
                                                                          run_dags, dags_for_configs, tiny_release):
    from shiplift.tasks.ledger.store import Ledger

    double = aws_double
    double.reset()
    aws_release.prepare_account(double)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", name="tiny-aws-dag")
    connection = {"conn_type": "aws", "login": "testing", "password": "testing",
                  "extra": {"region_name": "us-east-1", "endpoint_url": double.url}}
    env = {key: value for key, value in airflow_env.items() if not key.startswith("AWS_")}
    env.update({"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(connection), "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "AWS_CONFIG_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"})
    result, output = run_dags(dags_for_configs(config), [{"dag_id": "refresh_tiny_aws_dag"}], timeout_s=420, env=env)
    run = result["runs"][0]
    assert run["state"] == "success", output[-6000:]
    assert set(run["tasks"].values()) == {"success"}
    end = run["xcom"]["end"]
    assert end["status"] == "promoted" and end["served_by"] == "shiplift-tiny-aws-dag-prod"
    assert run["xcom"]["deploy_candidate"]["placement"]["kind"] == "instance_pool"
    sagemaker = double.client("sagemaker")
    component = sagemaker.describe_inference_component(InferenceComponentName="shiplift-tiny-aws-dag")
    assert component["InferenceComponentStatus"] == "InService"
    assert [e["EndpointName"]
            for e in sagemaker.list_endpoints()["Endpoints"]] == ["shiplift-tiny-aws-dag-prod"], "candidate torn down"
    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    release_id = run["xcom"]["begin"]["release_id"]
    assert [r.stage for r in ledger.release(release_id) if r.event == "succeeded"][:3] == ["resolve", "build",
                                                                                           "package"]
    assert all(r.actor.startswith("airflow:refresh_tiny_aws_dag/") for r in ledger.release(release_id)
               if r.stage != "release")
    assert ledger.verify().ok
