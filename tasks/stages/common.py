"""Names and server specs shared by the stages that start model servers."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tasks.errors import NotFound
from tasks.hashing import sha256_json
from tasks.images import server_command


def resource_name(ctx, role: str, *content: str) -> str:
    """`<prefix>-<model>-<role>[-<hash of content>]`, derived from content only; the config
    guarantees it fits SageMaker's 63 characters."""
    base = f"{ctx.config.resource_prefix}-{ctx.config.name}-{role}"
    return f"{base}-{sha256_json(list(content))[:10]}" if content else base


def production_endpoint(ctx) -> str:
    return resource_name(ctx, "prod")


def semif_spec(ctx, model_dir: Path, *, copies: int, model_ref: dict):
    """The component spec that runs images/semif/server.py on an extracted model directory."""
    from tasks.hosting.local import ComponentSpec

    image = ctx.config.image
    env = {
        "SEMIF_MODEL_DIR": str(model_dir),
        "SEMIF_THREADS": str(image.threads),
        "SEMIF_N_GPU_LAYERS": str(image.n_gpu_layers),
        "SEMIF_MAX_TOKENS": str(image.max_tokens),
        "SEMIF_MAX_REQUEST_TOKENS": str(image.max_request_tokens),
        "SEMIF_MAX_SHARED_DECISIONS": str(image.max_shared_decisions),
        "SEMIF_MAX_IN_FLIGHT": str(image.max_in_flight),
        "SEMIF_MAX_BODY_BYTES": str(image.max_body_bytes),
        "SEMIF_HOST": "127.0.0.1",
    }
    return ComponentSpec(command=server_command("semif"), env=env, copies=copies, model_ref=model_ref, port_env="SEMIF_PORT")


@contextmanager
def temporary_endpoint(ctx, name: str, component: str, spec) -> Iterator[str]:
    """Serve a spec on a throw-away local endpoint for the block; always removed afterwards."""
    hosting = ctx.backends.hosting
    hosting.ensure_endpoint(name)
    try:
        hosting.put_component(name, component, spec)
        yield hosting.endpoint_url(name)
    finally:
        delete_endpoint_if_present(hosting, name)


def delete_endpoint_if_present(hosting, name: str) -> bool:
    """Remove an endpoint; False when there was none (teardown is idempotent)."""
    return hosting.delete_endpoint(name)


def describe_if_present(hosting, name: str) -> dict | None:
    try:
        return hosting.describe_endpoint(name)
    except NotFound:
        return None
