"""Backend conformance: the same scenarios, with the same assertions, on the local and the aws backend.

The `backend` fixture (conftest.py) runs each test twice: local processes on loopback, and S3 +
CodeBuild/ECR + SageMaker against the AWS double. A behaviour one backend has and the other lacks
fails here, on the backend that lacks it.
"""

from __future__ import annotations

import json
import re

import pytest

from shiplift.tasks.backends.interfaces import ImageRef, LiveComponent, StoredArtifact
from shiplift.tasks.errors import NotFound
from shiplift.tasks.hashing import sha256_file

QUIET = lambda message: None  # noqa: E731
DECISION = {"id": "q", "state": "The sky is blue.", "question": "Is the sky blue?",
            "options": [{"id": "no", "description": "no"}, {"id": "yes", "description": "yes"}]}
PINNED = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


def ask(backend, endpoint: str, component: str) -> tuple[int, dict]:
    """One SemIf decision through the hosting's own invoker, as the eval runners send it."""
    channel = backend.backends.hosting.invoker(endpoint, component, timeout_s=30).open()
    try:
        status, body = channel.post(json.dumps({"decision": DECISION}).encode(), 30)
    finally:
        channel.close()
    return status, json.loads(body)


def assert_real_answer(status: int, answer: dict, gguf_sha256: str) -> None:
    assert status == 200, answer
    result = answer["result"]
    assert result["id"] == "q" and result["option_ids"] == ["no", "yes"], result
    assert len(result["probabilities"]) == 2 and abs(sum(result["probabilities"]) - 1) < 1e-6, result
    assert result["model"]["sha256"] == gguf_sha256, "the answer comes from the model the spec names"


def assert_serves(backend, live: LiveComponent | None, spec, *, endpoint: str, component: str) -> None:
    assert live is not None, f"{endpoint}/{component} is not there"
    assert (live.endpoint, live.component) == (endpoint, component)
    assert live.status == "InService", live
    assert live.differences(spec) == [], live.differences(spec)
    assert live.model_ref == spec.model_ref
    assert live.artifact_sha256 == spec.artifact_sha256 and live.artifact_uri == spec.artifact_uri
    assert live.image_digest == spec.image_uri.rsplit("@", 1)[1]
    assert live.copies == spec.copies
    assert live.placement.kind == backend.placement_kind, live.placement


# 1 ------------------------------------------------------------------------------------------
def test_store_is_content_addressed_and_idempotent(backend, tmp_path):
    store = backend.backends.store
    first = tmp_path / "a" / "evidence.json"
    first.parent.mkdir()
    first.write_bytes(b'{"answer": 42}\n')
    stored = store.put_file(first, name="evidence.json", progress=QUIET)
    assert isinstance(stored, StoredArtifact)
    assert stored.sha256 == sha256_file(first) and stored.size == first.stat().st_size
    assert stored.sha256 in stored.uri and stored.uri.endswith("/evidence.json")

    assert store.put_file(first, name="evidence.json",
                          progress=QUIET) == stored, "the same content again is the stored one"
    copy = tmp_path / "copy-of-evidence.json"  # same bytes from another path
    copy.write_bytes(first.read_bytes())
    assert store.put_file(copy, name="evidence.json", progress=QUIET) == stored

    local = store.get(stored.uri)
    assert local.is_file() and sha256_file(local) == stored.sha256 and local.read_bytes() == first.read_bytes()
    assert store.exists(stored.sha256)
    assert not store.exists("0" * 64)

    other = tmp_path / "b" / "evidence.json"
    other.parent.mkdir()
    other.write_bytes(b'{"answer": 43}\n')
    changed = store.put_file(other, name="evidence.json", progress=QUIET)
    assert changed.uri != stored.uri and changed.sha256 == sha256_file(other) != stored.sha256
    assert sha256_file(store.get(changed.uri)) == changed.sha256
    assert sha256_file(store.get(stored.uri)) == stored.sha256, "the first content was not overwritten"


# 2 ------------------------------------------------------------------------------------------
def test_image_is_pinned_by_digest_and_built_once(backend):
    images = backend.backends.images
    ref = images.build(backend.config.image, progress=QUIET)
    assert isinstance(ref, ImageRef)
    assert PINNED.match(ref.uri) and ref.uri.endswith("@" + ref.digest), ref.uri
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", ref.digest)
    builds = backend.builds()
    again = images.build(backend.config.image, progress=QUIET)
    assert again.digest == ref.digest and again.uri == ref.uri
    assert backend.builds() == builds, "the same image content is found, not built again"


# 3 ------------------------------------------------------------------------------------------
def test_candidate_serves_the_spec_answers_and_is_deleted(backend):
    hosting = backend.backends.hosting
    spec = backend.spec(1)
    name = backend.candidate_name(spec)
    live = backend.deploy(name, name, spec, role="candidate")
    assert isinstance(live, LiveComponent)
    assert_serves(backend, live, spec, endpoint=name, component=name)
    assert live.copies == 1
    assert live.placement.kind == backend.placement_kind
    assert hosting.describe(name, name) == live, "describe says what deploy returned"

    assert_real_answer(*ask(backend, name, name), sha256_file(backend.gguf(1)))

    assert hosting.describe(name, f"{name}-nope") is None, "an unknown component"
    assert hosting.describe(f"{backend.prefix}-no-such-endpoint", name) is None, "an unknown endpoint"

    assert hosting.delete_endpoint(name, progress=QUIET) is True
    assert hosting.describe(name, name) is None
    assert hosting.delete_endpoint(name, progress=QUIET) is False, "deleting an absent endpoint says so"


# 4 ------------------------------------------------------------------------------------------
def test_production_scales_and_updates_in_place_to_a_new_model(backend):
    hosting = backend.backends.hosting
    endpoint, component = backend.production()
    old = backend.spec(1, copies=2, release_id="release-one")
    live = backend.deploy(endpoint, component, old, role="production")
    assert_serves(backend, live, old, endpoint=endpoint, component=component)
    assert hosting.describe(endpoint, component).copies == 2
    before = backend.footprint(endpoint)

    new = backend.spec(2, copies=2, release_id="release-two")
    assert new.artifact_sha256 != old.artifact_sha256
    updated = backend.deploy(endpoint, component, new, role="production")
    assert_serves(backend, updated, new, endpoint=endpoint, component=component)
    described = hosting.describe(endpoint, component)
    assert described.artifact_sha256 == new.artifact_sha256 and described.model_ref == new.model_ref
    assert described.differences(new) == []
    assert described.differences(old) != [], "the old spec no longer serves"
    assert backend.footprint(endpoint) != before, "an update with another spec changed what runs"

    new_gguf = sha256_file(backend.gguf(2))
    assert new_gguf != sha256_file(backend.gguf(1))
    for _ in range(4):  # enough requests for both copies to answer
        assert_real_answer(*ask(backend, endpoint, component), new_gguf)


# 5 ------------------------------------------------------------------------------------------
def test_redeploying_the_same_spec_is_a_no_op(backend):
    hosting = backend.backends.hosting
    candidate_spec = backend.spec(1)
    candidate = backend.candidate_name(candidate_spec)
    endpoint, component = backend.production()
    spec = backend.spec(1, copies=1)
    deployed = {
        "candidate": (candidate, candidate, candidate_spec,
                      backend.deploy(candidate, candidate, candidate_spec, role="candidate")),
        "production": (endpoint, component, spec, backend.deploy(endpoint, component, spec, role="production")),
    }
    before = {role: backend.footprint(name) for role, (name, _, _, _) in deployed.items()}

    for role, (name, part, wanted, first) in deployed.items():
        assert_serves(backend, first, wanted, endpoint=name, component=part)
        again = backend.deploy(name, part, wanted, role=role)
        assert_serves(backend, again, wanted, endpoint=name, component=part)
        assert again == first, role
        assert hosting.describe(name, part) == first, role
    after = {role: backend.footprint(name) for role, (name, _, _, _) in deployed.items()}
    assert after == before, "nothing was created, updated or restarted"


# 6 ------------------------------------------------------------------------------------------
def test_managed_resources_lists_what_was_deployed_and_nothing_after_cleanup(backend):
    hosting = backend.backends.hosting
    prefix = backend.prefix
    assert hosting.managed_resources(prefix) == [], "a fresh account / state folder holds nothing"

    candidate_spec = backend.spec(1)
    candidate = backend.candidate_name(candidate_spec)
    backend.deploy(candidate, candidate, candidate_spec, role="candidate")
    endpoint, component = backend.production()
    backend.deploy(endpoint, component, backend.spec(1), role="production")

    found = hosting.managed_resources(prefix)
    assert all(resource.name.startswith(prefix) for resource in found), found
    assert {r.name for r in found if r.kind == "endpoint"} == {candidate, endpoint}, found
    only_production = hosting.managed_resources(endpoint)
    assert {r.name for r in only_production if r.kind == "endpoint"} == {endpoint}, "the prefix filters"

    for resource in found:
        hosting.delete_resource(resource, progress=QUIET)
    assert hosting.managed_resources(prefix) == []
    assert hosting.describe(candidate, candidate) is None and hosting.describe(endpoint, component) is None
    assert hosting.delete_endpoint(endpoint, progress=QUIET) is False, "nothing is left to delete"


# 7 ------------------------------------------------------------------------------------------
def test_a_models_own_error_comes_back_with_the_containers_status_and_body(backend):
    """The channel contract (tasks/backends/aws/invoke.py, validation/transport.py): a model's own error answers with
    the container's status and body, so the retry policy and the recorded error text are the same on both backends."""
    endpoint, component = backend.production()
    backend.deploy(endpoint, component, backend.spec(1), role="production")
    channel = backend.backends.hosting.invoker(endpoint, component, timeout_s=30).open()
    try:
        status, body = channel.post(json.dumps({"decision": {"question": "no id"}}).encode(), 30)
    finally:
        channel.close()
    assert (status, json.loads(body)) == (400, {"error": "decision.id: is required"}), (status, body)


# 8 ------------------------------------------------------------------------------------------
def test_a_component_that_is_not_there_gets_no_answer(backend):
    """Asking a live endpoint for a component it does not hold is a client error, never another model's answer."""
    candidate_spec = backend.spec(1)
    candidate = backend.candidate_name(candidate_spec)
    backend.deploy(candidate, candidate, candidate_spec, role="candidate")
    endpoint, component = backend.production()
    backend.deploy(endpoint, component, backend.spec(1), role="production")
    for name in (endpoint, candidate):  # an endpoint of components, and a candidate's single-model endpoint
        status, answer = ask(backend, name, f"{backend.prefix}-no-such-component")
        assert 400 <= status < 500 and "result" not in answer, (name, status, answer)


# 9 ------------------------------------------------------------------------------------------
def test_an_absent_endpoint_is_not_found(backend):
    """DESIGN §3: both backends raise the same domain errors. An invoker for an endpoint that does not exist is
    NotFound (local: at once), not a stream of 400 answers a gate would score as a failed model."""
    missing = f"{backend.prefix}-{backend.config.name}-cand-0000000000"
    assert backend.backends.hosting.describe(missing, missing) is None
    with pytest.raises(NotFound):
        backend.backends.hosting.invoker(missing, missing, timeout_s=30)
