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


def component_spec(ctx, model_dir: Path, *, copies: int, model_ref: dict):
    """The component spec that runs the configured image's server on an extracted model folder."""
    from tasks.hosting.local import ComponentSpec

    image = ctx.config.image
    return ComponentSpec(
        command=server_command(image.kind), env=image.server_env(model_dir), copies=copies,
        model_ref=model_ref, port_env=image.port_env,
    )


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
