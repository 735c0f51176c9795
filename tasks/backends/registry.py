"""Backend selection (DESIGN §3): the one place that picks the implementations behind the seams.

`make_backends(config)` returns a `Backends` of protocol-typed parts (`tasks.backends.interfaces`) and
imports only the chosen implementation: the local one (a content-addressed folder, process
images, processes on loopback, router counters) or the aws one (S3, CodeBuild + ECR, SageMaker,
CloudWatch). Stages see the protocols, never an implementation module. Calibration always scores
on this worker (`scratch`: the image's server as a loopback process), on both backends.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shiplift.tasks.backends.interfaces import (
    ArtifactStore,
    Hosting,
    ImageBuilder,
    LedgerStore,
    Metrics,
    ReleaseRegistry,
    ScratchServer,
)

if TYPE_CHECKING:
    from shiplift.tasks.config import ReleaseConfig
    from shiplift.tasks.ledger.checkpoints import CheckpointStore, Signer

LEDGER_URL_ENV = "SHIPLIFT_LEDGER_URL"


@dataclass(frozen=True)
class Backends:
    """The artifact store, image builder, hosting, metrics and ledger a release runs against."""

    kind: str
    state_dir: Path
    store: ArtifactStore
    images: ImageBuilder
    hosting: Hosting
    metrics: Metrics
    ledger: LedgerStore
    # as configured (never with a password); None: SQLite under state_dir or $SHIPLIFT_LEDGER_URL
    ledger_url: str | None
    scratch: ScratchServer  # serve a model folder on this worker (calibration, before the image is pinned)
    preflight: Callable[[], dict]  # before a release opens: credentials, account, region (aws); nothing locally
    # sign the ledger's head outside the database; None: aws without backend.checkpoints
    checkpoint: Callable[[], Any] | None = None
    # a view of the ledger where users look (aws: SageMaker Model Registry); None locally
    registry: ReleaseRegistry | None = None


def default_state_dir() -> Path:
    """$SHIPLIFT_HOME, else .shiplift: the local backend's state and every worker's scratch/cache."""
    return Path(os.environ.get("SHIPLIFT_HOME", ".shiplift")).expanduser().resolve()


def ledger_url_for(state_dir: Path, url: str | None) -> str:
    return url or os.environ.get(LEDGER_URL_ENV) or f"sqlite:///{Path(state_dir).resolve() / 'ledger.db'}"


def open_ledger(*, ledger_url: str | None = None, state_dir: str | Path | None = None, read_only: bool = False):
    """The ledger at `ledger_url` ($SHIPLIFT_LEDGER_URL), else the SQLite file under the state dir;
    `read_only` for queries and verification, which must never change what they read."""
    from shiplift.tasks.errors import BadInput
    from shiplift.tasks.ledger.store import Ledger

    folder = Path(state_dir).expanduser().resolve() if state_dir else default_state_dir()
    url = ledger_url_for(folder, ledger_url)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise BadInput(f"no ledger at {url}", fix=missing_ledger_fix(folder))
    return Ledger(url, read_only=read_only)


def ledgers_nearby(folder: Path) -> list[Path]:
    """State dirs holding a SQLite ledger that a command looking in `folder` may have meant: `make demo`'s, and the
    folders right under the default state dir and the checkout's `.shiplift` (e.g. `.shiplift/airflow`)."""
    from shiplift.tasks.project import DEMO_STATE_DIR, PROJECT_ROOT

    roots = [default_state_dir(), PROJECT_ROOT / ".shiplift"]
    candidates = [DEMO_STATE_DIR, *roots, *(sub for root in roots if root.is_dir() for sub in sorted(root.iterdir()))]
    found = [c.resolve() for c in candidates if (c / "ledger.db").is_file()]
    return [c for c in dict.fromkeys(found) if c != Path(folder).resolve()]


def _shown(path: Path) -> str:
    """A path as a user types it: relative to the working directory when it is under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def missing_ledger_fix(folder: Path) -> str:
    """How to reach a ledger when there is none under `folder`: the exact --state-dir of one found nearby (`make
    demo`'s first), else how to make one."""
    from shiplift.tasks.project import DEMO_STATE_DIR

    nearby = ledgers_nearby(folder)
    if not nearby:
        return "run a release first, or pass --ledger-url / --state-dir naming the ledger"
    named = [f"--state-dir {_shown(path)}" + (" (make demo's)" if path == DEMO_STATE_DIR.resolve() else "")
             for path in nearby]
    return f"pass {' or '.join(named)}, where a ledger is; else run a release first, or pass --ledger-url"


def make_backends(config: ReleaseConfig, *, ledger: Any = None, session: Any = None) -> Backends:
    """Build the backends a config names; `ledger` reuses an open one, `session` is a boto3 session (aws)."""
    from shiplift.tasks.ledger.store import Ledger

    backend = config.backend
    state_dir = Path(backend.state_dir).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    url = ledger_url_for(state_dir, backend.ledger_url)
    ledger = ledger or Ledger(url)
    scratch = _scratch(state_dir)
    if backend.kind == "local":
        from shiplift.tasks.backends.local.artifact_store import LocalArtifactStore
        from shiplift.tasks.backends.local.hosting import LocalMetrics, LoopbackHosting
        from shiplift.tasks.backends.local.process_image import LocalImageBuilder

        store = LocalArtifactStore(state_dir / "artifacts")
        hosting = LoopbackHosting(state_dir, store)
        return Backends(kind="local", state_dir=state_dir, store=store, images=LocalImageBuilder(), hosting=hosting,
                        metrics=LocalMetrics(hosting), ledger=ledger, ledger_url=backend.ledger_url, scratch=scratch,
                        preflight=dict, checkpoint=lambda: sign_checkpoint(ledger, config))
    from shiplift.tasks.backends.aws.backend import aws_backends

    parts = aws_backends(config, state_dir=state_dir, session=session)
    sign = (lambda: sign_checkpoint(ledger, config, session=session)) if backend.checkpoints is not None else None
    return Backends(kind="aws", state_dir=state_dir, ledger=ledger, ledger_url=backend.ledger_url, scratch=scratch,
                    checkpoint=sign, **parts)


def artifact_reader(config: ReleaseConfig, *, session: Any = None):
    """The artifact store a config names, opened to read only (`read_verified`): nothing is created, cached or
    written, for read-only commands such as `gate plan`."""
    backend = config.backend
    state_dir = Path(backend.state_dir).expanduser().resolve()
    if backend.kind == "local":
        from shiplift.tasks.backends.local.artifact_store import LocalArtifactStore

        return LocalArtifactStore(state_dir / "artifacts", create=False)
    from shiplift.tasks.backends.aws.artifact_store import S3ArtifactStore
    from shiplift.tasks.backends.aws.session import Aws

    return S3ArtifactStore(Aws(region=backend.region, profile=backend.profile, access=session), bucket=backend.bucket,
                           prefix=backend.key_prefix, kms_key_id=backend.kms_key_id, cache_dir=state_dir / "s3-cache")


def sign_checkpoint(ledger, config: ReleaseConfig | None = None, *, state_dir: str | Path | None = None,
                    key_path: str | Path | None = None, session: Any = None):
    """Verify the ledger, then sign its head with the checkpoint key of `config`'s backend (the local key file, created
    on first use; aws: its Secrets Manager key) into that backend's store (see `checkpoint_parts`)."""
    from shiplift.tasks.ledger.checkpoints import checkpoint

    signer, store = checkpoint_parts(config, state_dir=state_dir, key_path=key_path, create_key=True, session=session)
    return checkpoint(ledger, store, signer, witness=checkpoint_witness(config))


def checkpoint_witness(config: ReleaseConfig | None):
    """The witness log a local config names (`backend.checkpoint_witness`), else $SHIPLIFT_CHECKPOINT_WITNESS's, else
    None. aws needs none: its checkpoint objects are under Object Lock (COMPLIANCE by default), so they cannot be
    cut back."""
    from shiplift.tasks.ledger.checkpoints import CheckpointLog, default_witness, log_path

    folder = getattr(config.backend, "checkpoint_witness", None) if config is not None else None
    return CheckpointLog(log_path(folder)) if folder else default_witness()


def checkpoint_parts(config: ReleaseConfig | None = None, *, state_dir: str | Path | None = None,
                     key_path: str | Path | None = None, create_key: bool = False, session: Any = None,
                     verify_only: bool = False) -> tuple[Signer, CheckpointStore]:
    """The (signer, store) of a ledger's checkpoints: an aws config's Secrets Manager key (with `verify_only`, its
    configured public key where it names one, and no secret read) and Object Lock bucket (checked; nothing is
    written), else the local key file (`key_path`, else $SHIPLIFT_CHECKPOINT_KEY; created only with `create_key`) and
    the checkpoints file of `state_dir` (else the config's, else $SHIPLIFT_HOME)."""
    from shiplift.tasks.errors import ConfigError

    backend = config.backend if config is not None else None
    if backend is not None and backend.kind == "aws":
        if backend.checkpoints is None or key_path is not None:
            raise ConfigError("an aws config's checkpoints are signed with the key its backend.checkpoints names"
                              + (", not a local key file" if key_path is not None else "; this config names none"),
                              fix="set backend.checkpoints (key_ref, bucket; see the README's Ledger section), "
                                  "and drop --key")
        from shiplift.tasks.backends.aws.checkpoint_store import aws_checkpoint_parts
        from shiplift.tasks.backends.aws.session import Aws

        aws = Aws(region=backend.region, profile=backend.profile, access=session)
        return aws_checkpoint_parts(aws, backend.checkpoints, kms_key_id=backend.kms_key_id, verify_only=verify_only)
    from shiplift.tasks.ledger.checkpoints import CheckpointLog, SigningKey, default_key_path, log_path

    chosen = state_dir or (backend.state_dir if backend is not None else default_state_dir())
    folder = Path(chosen).expanduser().resolve()
    key = SigningKey(key_path or default_key_path(), state_dir=folder, create=create_key)
    return key, CheckpointLog(log_path(folder))


def local_endpoints(state_dir: str | Path):
    """The local backend's endpoint processes under a state dir (what `shiplift endpoints` and `make stop` manage)."""
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor

    return ProcessSupervisor(Path(state_dir).expanduser().resolve())


def _scratch(state_dir: Path):
    from shiplift.tasks.backends.local.hosting import ScratchServer

    return ScratchServer(state_dir / "scratch")
