"""The backend conformance suite's fixture: `backend`, one tiny release on the local and on the aws backend.

Each test in this folder runs once per backend with the same assertions, so the two implementations of
the seams (`tasks.backends.interfaces`) cannot drift apart. The aws side runs against the session's AWS double
(the `aws` fixture of tests/conftest.py), its account prepared by tests/aws/aws_release.py.

What a backend cannot show the same way (how a no-op deploy is observed, how many image builds ran)
is behind one method of `Conformance`, so the tests still assert one thing on both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
QUIET = lambda message: None  # noqa: E731
MEMORY_MB = 1024


@dataclass
class Conformance:
    """One backend under test: its `Backends`, the tiny release config, and helpers to make specs."""

    kind: str
    config: Any  # tasks.config.ReleaseConfig
    backends: Any  # tasks.backends.registry.Backends
    folder: Path
    placement_kind: str  # what `LiveComponent.placement.kind` must say for the config's placement
    double: Any = None  # the AWS double (aws only)
    calls: list | None = None  # every Aws.call of this test as (service, operation, params) (aws only)
    _image: Any = None
    _models: dict = field(default_factory=dict)

    # -- models and specs ------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        return self.config.resource_prefix

    def gguf(self, seed: int) -> Path:
        from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf

        path = self.folder / "models" / f"seed{seed}" / f"tiny-seed{seed}.gguf"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_tiny_gguf(path, seed=seed)
        return path

    def artifact(self, seed: int):
        """The tiny GGUF of `seed`, packaged and put in this backend's store (once per seed)."""
        if seed not in self._models:
            from shiplift.tasks.artifacts.packaging import package_gguf

            packaged = package_gguf(self.gguf(seed), self.folder / "packages" / f"seed{seed}",
                                    manifest={"model": self.config.name, "kind": "gguf", "seed": seed})
            self._models[seed] = self.backends.store.put_file(packaged.path, name="model.tar.gz", progress=QUIET)
        return self._models[seed]

    def image(self):
        """The release's serving image, built once per test."""
        if self._image is None:
            self._image = self.backends.images.build(self.config.image, progress=QUIET)
        return self._image

    def spec(self, seed: int, *, copies: int = 1, release_id: str | None = None):
        """A ComponentSpec the way `tasks.pipeline.stages.common.component_spec` builds one."""
        from shiplift.tasks.backends.interfaces import ComponentSpec, ModelRef
        from shiplift.tasks.pipeline.stages.common import compute

        stored, image = self.artifact(seed), self.image()
        return ComponentSpec(image_uri=image.uri, artifact_uri=stored.uri, artifact_sha256=stored.sha256,
                             environment=self.config.image.container_env(), copies=copies,
                             compute=compute(self.config, MEMORY_MB),
                             model_ref=ModelRef(release_id=release_id or f"conformance-seed{seed}",
                                                artifact_sha256=stored.sha256, image_digest=image.digest))

    # -- names and deploys -------------------------------------------------------------------
    def candidate_name(self, spec) -> str:
        from shiplift.tasks.pipeline.stages.common import candidate_name

        return candidate_name(self.config, spec.artifact_sha256, spec.image_uri.rsplit("@", 1)[1])

    def production(self) -> tuple[str, str]:
        from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint

        return production_endpoint(self.config), production_component(self.config)

    def deploy(self, endpoint: str, component: str, spec, *, role: str):
        return self.backends.hosting.deploy(endpoint, component, spec, self.config.placement, role=role, progress=QUIET)

    # -- what differs in how a backend is observed -------------------------------------------
    def builds(self) -> int:
        """Image builds started so far: CodeBuild StartBuild calls (aws); none locally (the image is the source
        tree)."""
        if self.kind == "aws":
            return len([call for call in self.calls if call[1] == "StartBuild"])
        return 0

    def footprint(self, endpoint: str) -> Any:
        """What a deploy that changes nothing leaves exactly as it was: every mutating SageMaker request so far
        (aws), or the pids of the endpoint's router and copies (local)."""
        if self.kind == "aws":
            return [(call.operation, sorted(call.params.items(), key=str)) for call in self.double.calls
                    if call.mutating]
        described = self.backends.hosting.processes.describe_endpoint(endpoint)
        return {"router": described["router"].get("pid"),
                "components": {name: sorted(copy["pid"] for copy in entry["copies"])
                               for name, entry in described["components"].items()}}

    def cleanup(self) -> None:
        """Delete every endpoint this backend may have started (local processes must not outlive the test)."""
        if self.kind == "local":
            for endpoint in self.backends.hosting.processes.list_endpoints():
                self.backends.hosting.delete_endpoint(endpoint["name"], progress=QUIET)
        else:
            self.double.reset()  # stops every model server the double started for this test


@pytest.fixture(params=["local", "aws"])
def backend(request, tiny_release, tmp_path):
    """A tiny release's backends (`make_backends`) on the local backend, or on the aws one against the AWS double."""
    from shiplift.tasks.backends.registry import make_backends
    from shiplift.tasks.config import load_release_config

    kind = request.param
    state_dir = tmp_path / "state"
    double = calls = None
    if kind == "aws":
        double, release = request.getfixturevalue("aws"), request.getfixturevalue("aws_release")
        calls = request.getfixturevalue("aws_calls")
        release.prepare_account(double)
        path = release.write_aws_config(tiny_release, tmp_path / "configs", state_dir, name="conf-aws")
        placement_kind = "instance_pool"
    else:
        path = tiny_release.write_tiny_config(tmp_path / "configs", state_dir, name="conf-local")
        placement_kind = "local-process"
    config = load_release_config(path)
    assert config.backend.kind == kind
    subject = Conformance(kind=kind, config=config, backends=make_backends(config), folder=tmp_path / "work",
                          placement_kind=placement_kind, double=double, calls=calls)
    request.addfinalizer(subject.cleanup)
    return subject
