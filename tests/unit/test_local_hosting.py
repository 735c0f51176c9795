"""ProcessSupervisor: real router and fake model-server processes on loopback, state on disk."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from pydantic import ValidationError

from shiplift.tasks.backends.local.endpoint_state import ProcessSpec
from shiplift.tasks.backends.local.process_table import OWNER_ENV
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import BadInput, CapacityError, NotFound, NotReady
from tests.unit.conftest import _dead, _pids

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "fake_model_server.py"


def _spec(copies: int = 1, version: str = "v1", **env: str) -> ProcessSpec:
    return ProcessSpec(
        command=[sys.executable, str(FAKE)],
        env={"FAKE_PORT_ENV": "SEMIF_PORT", **env},
        copies=copies,
        port_env="SEMIF_PORT",
        model_ref={"artifact_sha256": "a" * 64, "version": version},
    )


def _invoke(url: str, component: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if component:
        headers["X-Amzn-SageMaker-Inference-Component"] = component
    req = urllib.request.Request(
        url + "/invocations", data=b'{"q": 1}', headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _spawn_fake(owner: str | None) -> subprocess.Popen:
    """A fake copy in its own session, as the backend starts one, but never recorded; tagged for `owner` if given.

    Returns once the kernel shows its environment (empty until exec has finished), so a sweep can see the tag.
    """
    env = {**os.environ, "FAKE_PORT": "0"}
    if owner is not None:
        env[OWNER_ENV] = owner
    proc = subprocess.Popen(
        [sys.executable, str(FAKE)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{proc.pid}/environ").read_bytes():
        assert time.monotonic() < deadline, "the fake server did not exec within 10 s"
        time.sleep(0.05)
    return proc


def _owner_tag(tmp_path: Path, endpoint: str) -> str:
    """The SHIPLIFT_ENDPOINT_OWNER value ProcessSupervisor(tmp_path / "state") gives an endpoint's processes."""
    return f"{(tmp_path / 'state').resolve()}::{endpoint}"


def test_spec_is_strict_and_frozen():
    spec = _spec()
    with pytest.raises(ValidationError):
        ProcessSpec(**{**spec.model_dump(), "surprise": 1})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        ProcessSpec(**{**spec.model_dump(), "copies": 0})
    with pytest.raises(ValidationError, match="port_env"):
        ProcessSpec(**{**spec.model_dump(), "env": {"SEMIF_PORT": "8080"}})
    with pytest.raises(ValidationError, match="environment variable name"):
        ProcessSpec(**{**spec.model_dump(), "env": {"BAD-NAME": "x"}})
    with pytest.raises(ValidationError, match="plain JSON"):
        ProcessSpec(**{**spec.model_dump(), "model_ref": {"t": float("nan")}})
    with pytest.raises(ValidationError):
        spec.copies = 2
    assert spec.sha256() == _spec().sha256() != _spec(version="v2").sha256()


@pytest.mark.parametrize("name", ["under_score", "-lead", "x" * 64, ""])
def test_bad_names_are_refused_before_anything_starts(hosting, name):
    with pytest.raises(BadInput, match="name"):
        hosting.ensure_endpoint(name)
    assert hosting.list_endpoints() == []


def test_put_invoke_idempotent_then_replace_all_at_once(hosting):
    created = hosting.ensure_endpoint("ep-a")
    assert created.status == "created"
    assert hosting.ensure_endpoint("ep-a") == created.model_copy(update={"status": "running"})
    first = hosting.put_component("ep-a", "semif", _spec(copies=2), ready_timeout_s=20)
    assert first.changed and len({c.pid for c in first.copies}) == 2

    url = hosting.endpoint_url("ep-a")
    assert url == f"http://127.0.0.1:{created.port}/endpoints/ep-a"
    served = {_invoke(url)[1]["pid"] for _ in range(6)}
    assert served == {c.pid for c in first.copies}

    again = hosting.put_component("ep-a", "semif", _spec(copies=2), ready_timeout_s=20)
    assert not again.changed and again.copies == first.copies

    second = hosting.put_component(
        "ep-a", "semif", _spec(copies=1, version="v2"), ready_timeout_s=20
    )
    assert second.changed and {c.pid for c in second.copies}.isdisjoint(
        {c.pid for c in first.copies}
    )
    assert all(_dead(c.pid) for c in first.copies)
    assert {_invoke(url)[1]["pid"] for _ in range(3)} == {second.copies[0].pid}
    view = hosting.describe_endpoint("ep-a")["components"]["semif"]
    assert view["registered"] and view["spec"]["model_ref"]["version"] == "v2"
    assert [c["ping"] for c in view["copies"]] == [200]


def test_state_survives_a_new_instance_like_a_new_cli_command(hosting, tmp_path):
    started = hosting.ensure_endpoint("ep-b")
    put = hosting.put_component("ep-b", "semif", _spec(), ready_timeout_s=20)
    later = ProcessSupervisor(tmp_path / "state")
    found = later.ensure_endpoint("ep-b")
    assert (found.status, found.pid, found.port) == ("running", started.pid, started.port)
    assert not later.put_component("ep-b", "semif", _spec(), ready_timeout_s=20).changed
    assert [e["name"] for e in later.list_endpoints()] == ["ep-b"]
    view = later.describe_endpoint("ep-b")
    assert (
        view["router"]["alive"]
        and view["components"]["semif"]["copies"][0]["pid"] == put.copies[0].pid
    )
    state = json.loads((tmp_path / "state" / "endpoints" / "ep-b.json").read_text())
    assert state["router"]["port"] == started.port and state["pending"] == state["retiring"] == []


def test_killed_router_is_restarted_and_components_registered_again(hosting, tmp_path):
    before = hosting.ensure_endpoint("ep-c")
    put = hosting.put_component("ep-c", "semif", _spec(), ready_timeout_s=20)
    os.kill(before.pid, signal.SIGKILL)
    assert _dead(before.pid)
    with pytest.raises(NotReady, match="not running"):
        hosting.metrics("ep-c")
    after = ProcessSupervisor(tmp_path / "state").ensure_endpoint("ep-c")
    assert after.status == "restarted" and after.pid != before.pid
    status, body = _invoke(after.url, "semif")
    assert status == 200 and body["pid"] == put.copies[0].pid


def test_delete_endpoint_stops_every_process_and_forgets_it(hosting, tmp_path):
    hosting.ensure_endpoint("ep-d")
    hosting.put_component("ep-d", "one", _spec(copies=2), ready_timeout_s=20)
    hosting.put_component("ep-d", "two", _spec(), ready_timeout_s=20)
    pids = _pids(hosting, "ep-d")
    assert len(pids) == 4
    assert hosting.delete_endpoint("ep-d") is True
    assert all(_dead(pid, within_s=0.5) for pid in pids)
    assert not (tmp_path / "state" / "endpoints" / "ep-d.json").exists()
    assert hosting.list_endpoints() == []
    with pytest.raises(NotFound):
        hosting.describe_endpoint("ep-d")
    assert hosting.delete_endpoint("ep-d") is False


def test_delete_component_stops_its_copies_only(hosting):
    hosting.ensure_endpoint("ep-e")
    keep = hosting.put_component("ep-e", "keep", _spec(), ready_timeout_s=20)
    drop = hosting.put_component("ep-e", "drop", _spec(), ready_timeout_s=20)
    assert hosting.delete_component("ep-e", "drop") is True
    assert _dead(drop.copies[0].pid, within_s=0.5)
    assert list(hosting.describe_endpoint("ep-e")["components"]) == ["keep"]
    assert (
        _invoke(hosting.endpoint_url("ep-e"))[1]["pid"] == keep.copies[0].pid
    )  # one left: no header
    assert hosting.delete_component("ep-e", "drop") is False


def test_copy_that_exits_reports_its_log_tail_and_old_copies_keep_serving(hosting):
    hosting.ensure_endpoint("ep-f")
    old = hosting.put_component("ep-f", "semif", _spec(), ready_timeout_s=20)
    broken = _spec(copies=2, version="v2", FAKE_EXIT_AT_START="boom: model file missing")
    with pytest.raises(CapacityError, match="boom: model file missing") as caught:
        hosting.put_component("ep-f", "semif", broken, ready_timeout_s=20)
    assert "exited with code 3" in str(caught.value)
    view = hosting.describe_endpoint("ep-f")["components"]["semif"]
    assert view["spec"]["model_ref"]["version"] == "v1"
    assert [c["pid"] for c in view["copies"]] == [old.copies[0].pid]
    assert _invoke(hosting.endpoint_url("ep-f"))[1]["pid"] == old.copies[0].pid


def test_copy_that_never_gets_ready_is_stopped_with_its_log_tail(hosting, tmp_path):
    hosting.ensure_endpoint("ep-g")
    slow = _spec(copies=2, FAKE_STARTUP_DELAY_S="60")
    with pytest.raises(NotReady, match="within 0.5s") as caught:
        hosting.put_component("ep-g", "semif", slow, ready_timeout_s=0.5)
    started = re.findall(r"fake model server pid (\d+) starting", str(caught.value))
    assert started, "the error should carry the copy's log tail"
    logs = (tmp_path / "state" / "logs" / "ep-g").glob("semif-*.log")
    pids = [int(m) for log in logs for m in re.findall(r"pid (\d+) starting", log.read_text())]
    assert len(pids) == 2 and all(_dead(pid, within_s=0.5) for pid in pids)
    state = json.loads((tmp_path / "state" / "endpoints" / "ep-g.json").read_text())
    assert state["components"] == {} and state["pending"] == []


def test_command_that_does_not_exist_is_bad_input(hosting):
    spec = _spec().model_copy(update={"command": ["/nonexistent/server"]})
    with pytest.raises(BadInput, match="cannot run"):
        hosting.put_component("ep-h", "semif", spec, ready_timeout_s=5)
    assert hosting.describe_endpoint("ep-h")["components"] == {}


def test_metrics_count_model_5xx(hosting):
    hosting.ensure_endpoint("ep-i")
    hosting.put_component("ep-i", "semif", _spec(FAKE_STATUS="500"), ready_timeout_s=20)
    for _ in range(2):
        status, body = _invoke(hosting.endpoint_url("ep-i"))
        assert status == 424 and body["OriginalStatusCode"] == 500
    counters = hosting.metrics("ep-i")["components"]["semif"]
    assert (
        counters["invocations"],
        counters["invocation_5xx_errors"],
        counters["model_errors"],
    ) == (2, 2, 2)


def test_stop_escalates_to_sigkill_for_a_copy_that_ignores_sigterm(tmp_path):
    hosting = ProcessSupervisor(tmp_path / "state", stop_grace_s=0.3)
    hosting.ensure_endpoint("ep-j")
    put = hosting.put_component(
        "ep-j", "stubborn", _spec(FAKE_IGNORE_SIGTERM="1"), ready_timeout_s=20
    )
    assert hosting.delete_endpoint("ep-j")
    assert _dead(put.copies[0].pid, within_s=0.5)


def test_leftover_pending_copy_from_a_crash_is_stopped_by_the_next_command(hosting, tmp_path):
    hosting.ensure_endpoint("ep-k")
    orphan = _spawn_fake(owner=None)
    path = tmp_path / "state" / "endpoints" / "ep-k.json"
    state = json.loads(path.read_text())
    state["pending"] = [
        {"pid": orphan.pid, "start_ticks": None, "log": "x", "port": 1, "url": "http://127.0.0.1:1"}
    ]
    path.write_text(json.dumps(state))
    assert ProcessSupervisor(tmp_path / "state").ensure_endpoint("ep-k").status == "running"
    assert orphan.wait(timeout=5) is not None
    assert json.loads(path.read_text())["pending"] == []


def test_unrecorded_process_tagged_for_the_endpoint_is_stopped_and_others_are_not(hosting, tmp_path):
    hosting.ensure_endpoint("ep-m")
    orphan = _spawn_fake(_owner_tag(tmp_path, "ep-m"))
    other_endpoint = _spawn_fake(_owner_tag(tmp_path, "ep-other"))
    untagged = _spawn_fake(None)
    try:
        put = hosting.put_component("ep-m", "semif", _spec(), ready_timeout_s=20)
        assert orphan.wait(timeout=5) is not None
        assert other_endpoint.poll() is None and untagged.poll() is None
        assert not _dead(put.copies[0].pid, within_s=0.2), "recorded copies keep running"
    finally:
        for proc in (orphan, other_endpoint, untagged):
            proc.kill()
            proc.wait(timeout=5)


def test_a_copys_own_child_in_a_session_of_its_own_is_not_a_stray(hosting, tmp_path):
    """The dlc-chat image runs llama_cpp.server in its own session, and it inherits the owner tag: the sweep of
    unrecorded tagged processes must leave it to its parent (it killed every chat copy's server before this)."""
    marker = tmp_path / "child.pid"
    launcher = ("import os, subprocess, sys; child = subprocess.Popen([sys.executable, '-c', 'import time; "
                "time.sleep(120)'], start_new_session=True); open(sys.argv[1], 'w').write(str(child.pid)); "
                "os.execv(sys.executable, [sys.executable, sys.argv[2]])")
    spec = _spec().model_copy(update={"command": [sys.executable, "-c", launcher, str(marker), str(FAKE)]})
    hosting.ensure_endpoint("ep-c")
    hosting.put_component("ep-c", "semif", spec, ready_timeout_s=20)
    child = int(marker.read_text())
    try:
        hosting.put_component("ep-c", "other", _spec(), ready_timeout_s=20)  # sweeps unrecorded tagged processes
        assert not _dead(child, within_s=0.5), "the copy's own child was swept as a stray"
    finally:
        os.kill(child, 9)


def test_delete_of_an_endpoint_never_recorded_still_stops_its_tagged_router(tmp_path):
    hosting = ProcessSupervisor(tmp_path / "state", stop_grace_s=3)
    orphan = _spawn_fake(_owner_tag(tmp_path, "ep-n"))
    try:
        assert hosting.delete_endpoint("ep-n") is False
        assert orphan.wait(timeout=5) is not None
    finally:
        orphan.kill()
        orphan.wait(timeout=5)


def _router_ping(hosting: ProcessSupervisor, name: str) -> tuple[int, dict]:
    port = hosting._load(name).router.port  # asked directly: ensure_endpoint would heal what it looks at
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _wait_for(check, within_s: float, what: str):
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} did not happen within {within_s}s"
        time.sleep(0.1)


def test_killed_copy_leaves_rotation_is_reported_and_is_replaced(hosting):
    hosting.ensure_endpoint("ep-dead")
    put = hosting.put_component("ep-dead", "semif", _spec(copies=2), ready_timeout_s=20)
    victim, survivor = put.copies
    os.kill(victim.pid, signal.SIGKILL)
    assert _dead(victim.pid)
    url = hosting.endpoint_url("ep-dead")
    answers = [_invoke(url) for _ in range(6)]  # the refused forward is retried on the survivor at once
    assert [status for status, _ in answers] == [200] * 6
    assert {body["pid"] for _, body in answers} == {survivor.pid}

    status, ping = _wait_for(
        lambda: (reply := _router_ping(hosting, "ep-dead"))[1]["status"] == "degraded" and reply,
        10, "the router reporting the endpoint degraded",
    )
    assert status == 200 and ping["components"]["semif"]["healthy"] == 1
    assert list(ping["components"]["semif"]["down"]) == ["copy 1"], "the data port names copies, never their URLs"
    listed = hosting.list_endpoints()[0]
    assert (listed["status"], listed["components"]) == ("degraded", {"semif": {"in_rotation": 1, "copies": 2}})
    served_before = {c["url"]: c["served"] for c in hosting._admin(hosting._load("ep-dead"), "GET", "state")[1]
                     ["components"]["semif"]["copies"]}
    assert served_before[victim.url] == 0, "a dead copy's counter must not rise"

    hosting.ensure_endpoint("ep-dead")  # what every deploy and invoker does first: heal
    healed = hosting.describe_endpoint("ep-dead")["components"]["semif"]["copies"]
    assert len(healed) == 2 and survivor.pid in {c["pid"] for c in healed}
    assert victim.pid not in {c["pid"] for c in healed}
    assert all(c["in_rotation"] and c["ping"] == 200 for c in healed)
    assert hosting.list_endpoints()[0]["status"] == "ok"
    assert {_invoke(url)[1]["pid"] for _ in range(8)} == {c["pid"] for c in healed}


def test_one_copy_endpoint_with_a_dead_copy_is_unhealthy_until_healed(hosting):
    hosting.ensure_endpoint("ep-one")
    only = hosting.put_component("ep-one", "semif", _spec(copies=1), ready_timeout_s=20).copies[0]
    os.kill(only.pid, signal.SIGKILL)
    assert _dead(only.pid)
    url = hosting.endpoint_url("ep-one")
    status, body = _invoke(url)
    assert status == 503 and "Retry" in body["Message"]
    ping_status, ping = _router_ping(hosting, "ep-one")
    assert (ping_status, ping["status"], ping["components"]["semif"]["healthy"]) == (503, "unhealthy", 0)
    assert hosting.list_endpoints()[0]["status"] == "unhealthy"
    hosting.ensure_endpoint("ep-one")
    status, body = _invoke(url)
    assert status == 200 and body["pid"] != only.pid


def test_hung_copy_leaves_rotation_after_failed_health_checks(hosting):
    hosting.ensure_endpoint("ep-hung")
    put = hosting.put_component("ep-hung", "semif", _spec(copies=2), ready_timeout_s=20)
    stopped = put.copies[0]
    os.kill(stopped.pid, signal.SIGSTOP)  # alive but answering nothing: only the health check can tell
    try:
        _wait_for(lambda: _router_ping(hosting, "ep-hung")[1]["status"] == "degraded", 15,
                  "the hung copy leaving rotation")
        url = hosting.endpoint_url("ep-hung")
        assert {_invoke(url)[1]["pid"] for _ in range(4)} == {put.copies[1].pid}
    finally:
        os.kill(stopped.pid, signal.SIGCONT)


def test_router_control_needs_the_token_and_returns_no_environment(hosting, tmp_path):
    hosting.ensure_endpoint("ep-ctl")
    hosting.put_component("ep-ctl", "semif", _spec(SECRETISH="value-that-must-not-leak"), ready_timeout_s=20)
    state = hosting._load("ep-ctl")
    ready = tmp_path / "state" / "run" / "ep-ctl.router.json"
    assert ready.stat().st_mode & 0o777 == 0o600
    public = f"http://127.0.0.1:{state.router.port}/_shiplift/state"
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(public, timeout=5)
    assert caught.value.code == 404, "the invocation port serves no control route"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
        request = urllib.request.Request(f"http://127.0.0.1:{state.router.admin_port}/_shiplift/state", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=5)
        assert caught.value.code == 401 and "Bearer" in json.loads(caught.value.read())["error"]
    shutdown = urllib.request.Request(f"http://127.0.0.1:{state.router.admin_port}/_shiplift/shutdown", method="POST",
                                      data=b"", headers={"Authorization": "Bearer wrong"})
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(shutdown, timeout=5)
    assert hosting.list_endpoints()[0]["router_alive"], "an unauthorised shutdown stopped the router"
    seen = json.dumps(hosting._admin(state, "GET", "state")[1])
    assert "value-that-must-not-leak" not in seen and "SECRETISH" not in seen and "command" not in seen


def test_cli_lists_endpoint_health_as_a_table_and_a_closed_pipe_is_no_traceback(hosting, tmp_path, capsys):
    from shiplift.tasks.cli.main import main

    hosting.ensure_endpoint("ep-cli")
    put = hosting.put_component("ep-cli", "semif", _spec(copies=2), ready_timeout_s=20)
    os.kill(put.copies[0].pid, signal.SIGKILL)
    assert _dead(put.copies[0].pid)
    state_dir = str(tmp_path / "state")
    _wait_for(lambda: hosting.list_endpoints()[0]["status"] == "degraded", 10, "the endpoint showing degraded")
    assert main(["endpoints", "list", "--state-dir", state_dir]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["endpoint", "status", "components", "(copies", "in", "rotation", "/", "spec)", "url"]
    assert table[2].split()[:4] == ["ep-cli", "degraded", "semif", "1/2"]
    assert main(["endpoints", "heal", "ep-cli", "--state-dir", state_dir]) == 0
    capsys.readouterr()
    assert main(["endpoints", "list", "--json", "--state-dir", state_dir]) == 0
    assert json.loads(capsys.readouterr().out)[0]["components"] == {"semif": {"in_rotation": 2, "copies": 2}}

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        done = subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.main", "endpoints", "list", "--json",
                               "--state-dir",
                               state_dir], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and "Traceback" not in done.stderr, done.stderr
