"""The local endpoint process: the SageMaker runtime API in front of model-server copies.

Run as `python -m shiplift.tasks.backends.local.router --name NAME --port 0 --state-file FILE`. On its
invocation port it serves

- `POST /endpoints/{EndpointName}/invocations` in the shape botocore's `sagemaker-runtime`
  client expects (restjson; errors carry `x-amzn-ErrorType` and a JSON `Message`), honouring
  `X-Amzn-SageMaker-Inference-Component`;
- `POST /endpoints/{EndpointName}/invocations-response-stream` (InvokeEndpointWithResponseStream): the same checks and
  errors, and a 200 whose body is AWS's event stream (`tasks.backends.local.event_stream`), the copy's answer in
  `PayloadPart`s as it comes, so boto3's `invoke_endpoint_with_response_stream` reads a local endpoint too;
- the container contract directly: `GET /ping`, `POST /invocations` (model answers verbatim).

Control lives on a second loopback port that answers only requests carrying the bearer token
the router writes, with its ports, into the state file (mode 0600, so only the state
directory's user can read it): `PUT|DELETE /_shiplift/components/{name}`, `GET
/_shiplift/state`, `GET /_shiplift/metrics`, `POST /_shiplift/shutdown`. A component is registered as its copies'
URLs and the hash of the spec each runs (two specs during a rolling update); no command or
environment reaches the router. A copy left out of a registration drains: it gets no new
request and stays listed until those in flight finish. Metrics are kept per component and per
spec of the copy that answered, so a canary's errors and latency are its own.

Each request goes to the healthy copy with the fewest outstanding requests. A copy whose
`/ping` fails twice in a row, or that refuses or breaks a forwarded request, leaves rotation
until its `/ping` answers 200 again; `/ping` of the router says so. A copy whose `/ping` answers
503 busy (its connections are full: `Retry-After`) answers, so it stays where it is. The data
port never shows copy URLs (copies are named by their position in the component), and the
control port reads no body before the token is checked and refuses the router's own ports as
copies. A component registered with `scale_to_zero` (`{"idle_s": N}`) scales itself, as Application Auto Scaling
does on SageMaker: idle for N seconds, the router runs `python -m shiplift.tasks.backends.local.scaler` (with the
`--state-dir` the router was started with) to stop its copies; a request that finds no copy is answered
SageMaker's no-capacity `ValidationError` (callers retry it; on the container route, `503 {"retryable": true}` as every
refusal there that waiting cures), counted as a NoCapacityInvocationFailure, and starts
the scaler for one copy, as the scale-out alarm's step policy does. The router keeps its components in memory only;
`tasks.backends.local.supervisor` persists them, registers them again after a restart and replaces dead copies. Stdlib
only (plus `images/common/sagemaker_http.py`, the HTTP framing every shiplift server shares), so it starts in a fraction
of a second.

This module is the entry point (`main`); the router's parts live beside it (`tasks.backends.local.`…):
`router_model` (components, copies, names), `routing` (the `Router` core: dispatch, health, metrics views),
`router_scaling` (scale to zero and the serverless emulation), `router_metrics`, `router_http` (the two ports'
handlers) and `router_admin_payload` (the control port's body checks).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from shiplift.tasks.atomic import write_json_atomic
from shiplift.tasks.backends.local.router_http import AdminHandler, Handler, RouterServer
from shiplift.tasks.backends.local.router_model import name_problem
from shiplift.tasks.backends.local.routing import HEALTH_INTERVAL_S, Router

EXIT_PORT_TAKEN = 3  # the --port asked for is not free (the supervisor then lets the router pick one)


def main(argv: list[str] | None = None) -> int:
    """Serve one endpoint until POST /_shiplift/shutdown (control port) or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m shiplift.tasks.backends.local.router")
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--state-file", type=Path, required=True)
    parser.add_argument("--invoke-timeout-s", type=float, default=60.0)
    parser.add_argument("--connect-timeout-s", type=float, default=2.0)
    parser.add_argument("--max-body-bytes", type=int, default=6 * 1024 * 1024)
    parser.add_argument("--max-in-flight", type=int, default=128)
    parser.add_argument("--read-deadline-s", type=float, default=30.0, help="seconds a client has to send a request")
    parser.add_argument("--max-connections", type=int, default=512)
    parser.add_argument("--max-connections-per-client", type=int, default=256)
    parser.add_argument("--health-interval-s", type=float, default=HEALTH_INTERVAL_S)
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="the supervisor's state folder: what the scaler of a scale-to-zero component is run with")
    args = parser.parse_args(argv)
    problem = name_problem(args.name)
    if problem:
        parser.error(problem)
    for flag in (
        "invoke_timeout_s",
        "connect_timeout_s",
        "max_body_bytes",
        "max_in_flight",
        "read_deadline_s",
        "max_connections",
        "max_connections_per_client",
        "health_interval_s",
    ):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be > 0")
    router = Router(
        args.name,
        invoke_timeout_s=args.invoke_timeout_s,
        connect_timeout_s=args.connect_timeout_s,
        max_body_bytes=args.max_body_bytes,
        max_in_flight=args.max_in_flight,
        health_interval_s=args.health_interval_s,
        state_dir=args.state_dir,
    )
    limits = {
        "read_deadline_s": args.read_deadline_s,
        "max_connections": args.max_connections,
        "max_connections_per_client": args.max_connections_per_client,
    }
    try:
        server = RouterServer(("127.0.0.1", args.port), Handler, router, **limits)
    except OSError as exc:
        sys.stderr.write(f"router {args.name}: cannot listen on 127.0.0.1:{args.port} ({exc})\n")
        return EXIT_PORT_TAKEN
    AdminHandler.token = secrets.token_urlsafe(32)
    admin = RouterServer(("127.0.0.1", 0), AdminHandler, router, **limits)
    router.port, router.admin_port = server.server_address[1], admin.server_address[1]

    def stop(*_: Any) -> None:
        router.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    workers = [
        threading.Thread(target=target, name=name, daemon=True)
        for name, target in (
            ("invocations", lambda: server.serve_forever(poll_interval=0.2)),
            ("control", lambda: admin.serve_forever(poll_interval=0.2)),
            ("health", router.watch_health),
        )
    ]
    for worker in workers:
        worker.start()
    write_json_atomic(
        args.state_file,
        {
            "name": args.name,
            "pid": os.getpid(),
            "port": router.port,
            "admin_port": admin.server_address[1],
            "admin_token": AdminHandler.token,
            "started_at": time.time(),
        },
        mode=0o600,
    )
    sys.stderr.write(f"router {args.name} listening on 127.0.0.1:{router.port}\n")
    sys.stderr.flush()
    try:
        while not router.stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for each in (server, admin):
            each.shutdown()
            each.server_close()
    sys.stderr.write(f"router {args.name} stopped\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
