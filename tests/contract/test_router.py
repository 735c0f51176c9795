"""Contract tests of the local endpoint router against botocore's sagemaker-runtime client.

One router process and a few fake model servers (stdlib subprocesses) are shared by the
module; each test registers the components it needs through the admin API.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fakes" / "fake_model_server.py"
ENDPOINT = "ep-contract"
INVOKE_TIMEOUT_S = 2.0
SLOW_DELAY_S = 1.5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _request(url: str, method: str = "GET", payload=None, data: bytes | None = None, headers=None):
    """(status, parsed JSON or text) for one request; HTTP errors are returned, not raised."""
    if payload is not None:
        data = json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and "Content-Type" not in req.headers:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode()


def _wait_ping(url: str, deadline_s: float = 15.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if _request(url + "/ping")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} did not come up within {deadline_s}s")


class Fleet:
    """The router process, the fake copies and helpers to register components."""

    def __init__(self, tmp: Path):
        self.procs: list[subprocess.Popen] = []
        state_file = tmp / "router.json"
        self.router = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shiplift.tasks.backends.local.router",
                "--name",
                ENDPOINT,
                "--port",
                "0",
                "--state-file",
                str(state_file),
                "--invoke-timeout-s",
                str(INVOKE_TIMEOUT_S),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(self.router)
        deadline = time.monotonic() + 15
        while not state_file.exists():
            assert self.router.poll() is None, "router exited during start-up"
            assert time.monotonic() < deadline, "router did not write its state file"
            time.sleep(0.05)
        info = json.loads(state_file.read_text())
        assert info["pid"] == self.router.pid and info["name"] == ENDPOINT
        assert state_file.stat().st_mode & 0o777 == 0o600, "the state file holds the control token"
        self.base = f"http://127.0.0.1:{info['port']}"
        self.control = f"http://127.0.0.1:{info['admin_port']}"
        self.token = info["admin_token"]
        self.ok = [self._fake() for _ in range(2)]
        self.slow = [self._fake(FAKE_DELAY_S=str(SLOW_DELAY_S)) for _ in range(2)]
        self.bad_request = self._fake(FAKE_STATUS="400")
        self.unavailable = self._fake(FAKE_STATUS="503")
        self.broken = self._fake(FAKE_STATUS="500")
        self.hung = self._fake(FAKE_DELAY_S="30")
        for url in (
            self.ok + self.slow + [self.bad_request, self.unavailable, self.broken, self.hung]
        ):
            _wait_ping(url)

    def _fake(self, **env: str) -> str:
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, str(FAKE)],
            env={**os.environ, "FAKE_PORT": str(port), **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return f"http://127.0.0.1:{port}"

    def admin(self, method: str, path: str, payload=None, token: str | None = None):
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"}
        return _request(f"{self.control}/_shiplift/{path}", method, payload, headers=headers)

    def put(self, name: str, copies: list[str]) -> None:
        status, body = self.admin("PUT", f"components/{name}",
                                  {"copies": [{"url": url, "spec_sha256": "a" * 64} for url in copies]})
        assert status == 200, body

    def reset(self) -> None:
        for name in self.admin("GET", "state")[1]["components"]:
            assert self.admin("DELETE", f"components/{name}")[0] == 200

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("router"))
    yield fleet
    fleet.stop()


@pytest.fixture()
def router(fleet):
    fleet.reset()
    return fleet


def _client(fleet: Fleet, attempts: int = 1):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=fleet.base,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(
            retries={"mode": "standard", "total_max_attempts": attempts},
            connect_timeout=5,
            read_timeout=30,
        ),
    )


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_boto3_invokes_single_component_with_and_without_component_name(router):
    router.put("echo", router.ok[:1])
    client = _client(router)
    payload = json.dumps({"decision": {"id": "t1"}})
    plain = client.invoke_endpoint(
        EndpointName=ENDPOINT, Body=payload, ContentType="application/json"
    )
    named = client.invoke_endpoint(
        EndpointName=ENDPOINT,
        Body=payload,
        ContentType="application/json",
        InferenceComponentName="echo",
    )
    for response in (plain, named):
        answer = json.loads(response["Body"].read())
        assert answer["echo"] == payload
        assert answer["content_type"] == "application/json"
        assert answer["port"] == _port(router.ok[0])
        assert response["ContentType"] == "application/json"
        assert response["InvokedProductionVariant"] == "AllTraffic"


def test_several_components_need_the_component_name(router):
    from botocore.exceptions import ClientError

    router.put("first", router.ok[:1])
    router.put("second", router.ok[1:])
    client = _client(router)
    with pytest.raises(ClientError) as caught:
        client.invoke_endpoint(EndpointName=ENDPOINT, Body=b"{}", ContentType="application/json")
    assert caught.value.response["Error"]["Code"] == "ValidationError"
    assert "InferenceComponentName" in caught.value.response["Error"]["Message"]
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    second = client.invoke_endpoint(
        EndpointName=ENDPOINT,
        Body=b"{}",
        ContentType="application/json",
        InferenceComponentName="second",
    )
    assert json.loads(second["Body"].read())["port"] == _port(router.ok[1])


def test_unknown_endpoint_or_component_is_a_validation_error(router):
    from botocore.exceptions import ClientError

    router.put("echo", router.ok[:1])
    client = _client(router)
    for kwargs in (
        {"EndpointName": "no-such-endpoint"},
        {"EndpointName": ENDPOINT, "InferenceComponentName": "nope"},
    ):
        with pytest.raises(ClientError) as caught:
            client.invoke_endpoint(Body=b"{}", ContentType="application/json", **kwargs)
        error = caught.value.response["Error"]
        assert error["Code"] == "ValidationError"
        assert "not found" in error["Message"]


def test_model_4xx_and_5xx_become_model_error_with_the_original_message(router):
    from botocore.exceptions import ClientError

    router.put("bad", [router.bad_request])
    router.put("broken", [router.broken])
    client = _client(router)
    for name, status in (("bad", 400), ("broken", 500)):
        with pytest.raises(ClientError) as caught:
            client.invoke_endpoint(
                EndpointName=ENDPOINT,
                Body=b"{}",
                ContentType="application/json",
                InferenceComponentName=name,
            )
        response = caught.value.response
        assert response["Error"]["Code"] == "ModelError"
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 424
        assert response["OriginalStatusCode"] == status
        assert json.loads(response["OriginalMessage"]) == {
            "error": f"fake error {status}",
            "retryable": False,
        }


def test_model_503_is_service_unavailable_and_botocore_retries_it(router):
    from botocore.exceptions import ClientError

    router.put("busy", [router.unavailable])
    with pytest.raises(ClientError) as caught:
        _client(router, attempts=2).invoke_endpoint(
            EndpointName=ENDPOINT, Body=b"{}", ContentType="application/json"
        )
    assert caught.value.response["Error"]["Code"] == "ServiceUnavailable"
    assert caught.value.response["ResponseMetadata"]["RetryAttempts"] == 1
    metrics = router.admin("GET", "metrics")[1]["components"]["busy"]
    assert metrics["invocations"] == 2
    assert metrics["invocation_5xx_errors"] == 2


def test_upstream_timeout_is_a_model_error_not_a_hang(router):
    from botocore.exceptions import ClientError

    router.put("hung", [router.hung])
    started = time.monotonic()
    with pytest.raises(ClientError) as caught:
        _client(router).invoke_endpoint(
            EndpointName=ENDPOINT, Body=b"{}", ContentType="application/json"
        )
    assert time.monotonic() - started < INVOKE_TIMEOUT_S + 3
    assert caught.value.response["Error"]["Code"] == "ModelError"
    assert "did not answer within" in caught.value.response["Error"]["Message"]


def test_concurrent_slow_requests_spread_over_both_copies(router):
    router.put("slow", router.slow)
    answers: list[int] = []
    lock = threading.Lock()

    def call() -> None:
        status, body = _request(f"{router.base}/endpoints/{ENDPOINT}/invocations", "POST", {})
        assert status == 200, body
        with lock:
            answers.append(body["port"])

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(answers) == sorted([_port(u) for u in router.slow] * 2)


def test_busy_copy_is_avoided_while_an_idle_one_exists(router):
    """Round robin would send one of these three to the busy copy; least-outstanding sends none."""
    slow, fast = router.slow[0], router.ok[0]
    router.put("mixed", [slow, fast])
    url = f"{router.base}/endpoints/{ENDPOINT}/invocations"

    def slow_outstanding() -> int:
        copies = router.admin("GET", "state")[1]["components"]["mixed"]["copies"]
        return next(c for c in copies if c["url"] == slow)["outstanding"]

    background = []
    deadline = time.monotonic() + 10
    while slow_outstanding() == 0:  # park one request on the slow copy
        assert time.monotonic() < deadline, "could not park a request on the slow copy"
        if not background or not background[-1].is_alive():
            background.append(threading.Thread(target=_request, args=(url, "POST", {})))
            background[-1].start()
        time.sleep(0.02)
    ports = [_request(url, "POST", {})[1]["port"] for _ in range(3)]
    assert slow_outstanding() == 1, "the parked request ended early; the check proved nothing"
    assert ports == [_port(fast)] * 3
    for thread in background:
        thread.join(timeout=10)


def test_refused_copy_is_skipped(router):
    dead = f"http://127.0.0.1:{_free_port()}"
    router.put("half-dead", [dead, router.ok[0]])
    for _ in range(4):
        status, body = _request(f"{router.base}/invocations", "POST", {"x": 1})
        assert status == 200 and body["port"] == _port(router.ok[0])


def test_metrics_count_errors_and_latency_per_component(router):
    router.put("broken", [router.broken])
    router.put("echo", router.ok)
    client = _client(router)
    from botocore.exceptions import ClientError

    for _ in range(3):
        with pytest.raises(ClientError):
            client.invoke_endpoint(
                EndpointName=ENDPOINT, Body=b"{}", InferenceComponentName="broken"
            )
    client.invoke_endpoint(EndpointName=ENDPOINT, Body=b"{}", InferenceComponentName="echo")
    metrics = router.admin("GET", "metrics")[1]
    broken, echo = metrics["components"]["broken"], metrics["components"]["echo"]
    assert (broken["invocations"], broken["invocation_5xx_errors"], broken["model_errors"]) == (
        3,
        3,
        3,
    )
    assert broken["invocation_4xx_errors"] == 0
    assert (echo["invocations"], echo["invocation_5xx_errors"], echo["model_errors"]) == (1, 0, 0)
    assert sum(echo["latency_ms"]["histogram"].values()) == 1
    assert (
        echo["latency_ms"]["p50"] is not None
        and echo["latency_ms"]["p95"] >= echo["latency_ms"]["p50"]
    )


def test_container_contract_passes_the_model_answer_verbatim(router):
    assert _request(f"{router.base}/ping")[0] == 503  # nothing registered yet
    router.put("bad", [router.bad_request])
    health = {"bad": {"healthy": 1, "copies": 1, "down": {}}}
    assert _request(f"{router.base}/ping") == (200, {"status": "ok", "components": health})
    status, body = _request(f"{router.base}/invocations", "POST", {"decision": {}})
    assert (status, body) == (400, {"error": "fake error 400", "retryable": False})


def test_admin_refuses_malformed_components(router):
    def copy(url: str, sha: str = "a" * 64) -> dict:
        return {"url": url, "spec_sha256": sha}

    cases = [
        ("components/ok-name", {"copies": [copy("http://10.0.0.1:8080")]}, "loopback"),
        ("components/ok-name", {"copies": [copy(router.ok[0])], "extra": 1}, "exactly copies"),
        ("components/ok-name", {"copies": []}, "non-empty"),
        ("components/ok-name", {"copies": [copy(router.ok[0], "ABC")]}, "64 lowercase hex"),
        ("components/ok-name", {"copies": [router.ok[0]]}, "copies[0] must be exactly"),
        ("components/ok-name", {"copies": [copy(router.ok[0]), copy(router.ok[0] + "/")]}, "repeat"),
        ("components/ok-name", {"spec": {"env": {"K": "v"}}, "copies": [copy(router.ok[0])]}, "exactly copies"),
        ("components/bad_name", {"copies": [copy(router.ok[0])]}, "letters, digits"),
        ("components/ok-name", {"copies": [], "scale_to_zero": {"idle_s": 0}}, "idle_s"),
        ("components/ok-name", {"copies": [], "scale_to_zero": {"idle_s": True}}, "idle_s"),
        ("components/ok-name", {"copies": [], "scale_to_zero": {"idle_s": 5, "command": ["sh"]}}, "idle_s"),
    ]
    for path, payload, needle in cases:
        status, body = router.admin("PUT", path, payload)
        assert status == 400 and needle in body["error"], (path, body)
    assert router.admin("GET", "state")[1]["components"] == {}
    assert router.admin("DELETE", "components/absent")[0] == 404


def test_oversized_body_is_refused_before_it_is_read(router):
    import http.client

    router.put("echo", router.ok[:1])
    conn = http.client.HTTPConnection("127.0.0.1", _port(router.base), timeout=10)
    conn.putrequest("POST", "/invocations")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(6 * 1024 * 1024 + 1))
    conn.endheaders()  # the body is never sent: the router must answer from the headers alone
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 413 and "at most" in body["error"]
    assert router.admin("GET", "metrics")[1]["components"]["echo"]["invocations"] == 0
