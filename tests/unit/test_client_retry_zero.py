"""`shiplift eval` against a real local router whose component is at zero copies (issue 44): the runner retries the
router's no-capacity answer while the scaler starts a copy, so no task is lost and the command exits 0; with a retry
deadline too short for the start, the command exits 1 and says how many tasks it lost. On the runtime route the
answer is SageMaker's no-capacity ValidationError (400); on the container route, `503 {"retryable": true}`
(https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html: while an endpoint at zero
provisions, "any attempts to invoke the endpoint will produce an error"). Real router, real scaler processes, real
SemIf copies of a tiny GGUF model (or a fake model server that starts slowly)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.backends.interfaces import ScaleToZeroPlan
from shiplift.tasks.backends.local.hosting import process_spec
from shiplift.tasks.cli.main import main as shiplift
from shiplift.tasks.console import EXIT_ERROR
from shiplift.validation.runner import read_predictions
from shiplift.validation.transport import NO_CAPACITY
from tests.unit.test_local_hosting import _spec, _wait_for
from tests.unit.test_scale_to_zero_local import _copies
from tests.unit.test_serverless_local import _serverless

DECISIONS = Path(__file__).resolve().parents[2] / "validation" / "data" / "decisions.jsonl"
N_TASKS = 12
NEVER_IDLE = ScaleToZeroPlan(max_copies=1, idle_s=3600, invocations_per_copy=1)  # scaled in by the test, not by idling


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    write_tiny_gguf(folder / "model.gguf", seed=0)
    return folder


@pytest.fixture()
def tasks_file(tmp_path) -> Path:
    """N_TASKS tasks of the project's decision set's test split."""
    lines = [line for line in DECISIONS.read_text(encoding="utf-8").splitlines() if json.loads(line)["split"] == "test"]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines[:N_TASKS]) + "\n", encoding="utf-8")
    return path


def _at_zero(hosting, endpoint: str, spec) -> str:
    """A component `semif` that scales to zero, scaled in to zero copies now; the endpoint's runtime URL."""
    info = hosting.ensure_endpoint(endpoint)
    hosting.put_component(endpoint, "semif", spec, ready_timeout_s=60)
    hosting.set_scaling(endpoint, "semif", NEVER_IDLE)
    hosting.scale(endpoint, "semif", 0)
    assert _copies(hosting, endpoint, "semif") == []
    return info.url


def _eval(url: str, tasks_file: Path, out: Path, *extra: str) -> int:
    return shiplift(["eval", "jevbench", "--endpoint", url, "--component", "semif", "--data", str(tasks_file),
                     "--out", str(out), "--bootstrap", "100", "--timeout", "30", "--json", *extra])


@pytest.mark.parametrize("route", ["runtime", "container"])
def test_an_eval_of_a_component_at_zero_copies_loses_no_task_and_exits_0(hosting, tiny_model, tasks_file, tmp_path,
                                                                          route, capsys):
    spec = process_spec("semif", tiny_model, {"SEMIF_THREADS": "1", "SEMIF_MAX_TOKENS": "2048"}, copies=1,
                        model_ref={"version": "v1"})
    url = _at_zero(hosting, f"ep-wake-{route}", spec)
    endpoint = url if route == "runtime" else url.rsplit("/endpoints/", 1)[0]  # the router's container root
    code = _eval(endpoint, tasks_file, tmp_path / "out")
    captured = capsys.readouterr()
    predictions = read_predictions(tmp_path / "out" / "predictions.jsonl")
    assert code == 0, captured.err
    assert len(predictions) == N_TASKS and [p.error for p in predictions] == [None] * N_TASKS, "all N answered"
    assert not any(p.lost for p in predictions)
    assert sum(p.retries_503 for p in predictions) >= 1, "the first requests met no capacity and were retried"
    counters = hosting.metrics(f"ep-wake-{route}")["components"]["semif"]
    assert counters["no_capacity_invocation_failures"] >= 1, "the eval's own requests found the component at zero"
    assert len(_copies(hosting, f"ep-wake-{route}", "semif")) == 1, "its first request woke one copy"


def test_a_retry_deadline_too_short_for_the_cold_start_exits_1_naming_the_lost_tasks(hosting, tasks_file, tmp_path,
                                                                                    capsys):
    url = _at_zero(hosting, "ep-slow-wake", _spec(copies=1, FAKE_STARTUP_DELAY_S="8"))
    code = _eval(url, tasks_file, tmp_path / "out", "--retry-deadline", "1")
    captured = capsys.readouterr()
    assert code == EXIT_ERROR, captured.err
    assert f"{N_TASKS} of {N_TASKS} candidate tasks got no answer (lost)" in captured.err
    assert NO_CAPACITY in captured.err and "--retry-deadline" in captured.err, "why, and what to do"
    predictions = read_predictions(tmp_path / "out" / "predictions.jsonl")
    assert all(p.lost for p in predictions) and len(predictions) == N_TASKS, "the evidence is written and says so"


def test_a_retry_deadline_that_is_no_number_of_seconds_is_refused_before_anything_runs(tasks_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        _eval("http://127.0.0.1:9/endpoints/ep", tasks_file, tmp_path / "out", "--retry-deadline", "0")
    assert exit_.value.code == 2 and "is not a number of seconds above 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _post_root(url: str, component: str) -> tuple[int, dict]:
    """One request to the router's container route (its root's POST /invocations)."""
    request = urllib.request.Request(url.rsplit("/endpoints/", 1)[0] + "/invocations", data=b'{"q": 1}', method="POST",
                                     headers={"Content-Type": "application/json",
                                              "X-Amzn-SageMaker-Inference-Component": component})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_container_route_answers_no_capacity_and_throttling_as_retryable_503s(hosting):
    """As its other back-pressure answers do: a client of the container contract retries `503 {"retryable": true}`."""
    url = _at_zero(hosting, "ep-root-zero", _spec(copies=1, FAKE_STARTUP_DELAY_S="3"))
    status, body = _post_root(url, "semif")
    assert (status, body["retryable"]) == (503, True) and NO_CAPACITY in body["error"]

    busy = _serverless(hosting, "ep-root-busy", max_concurrency=1, warm=True, FAKE_DELAY_S="1.5")
    first = threading.Thread(target=_post_root, args=(busy, "encoder"))
    first.start()
    _wait_for(lambda: hosting._admin(hosting._load("ep-root-busy"), "GET", "state")[1]["components"]["encoder"]
              ["copies"][0]["outstanding"] == 1, 10, "the first request in flight")
    status, body = _post_root(busy, "encoder")
    first.join(timeout=20)
    assert (status, body["retryable"]) == (503, True) and "MaxConcurrency of 1" in body["error"]
    status, body = _post_root(busy, "absent")
    assert status == 400 and body["retryable"] is False, "a wrong component name is not retried"
