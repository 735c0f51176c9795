"""Load from a second process: N clients POST to an invocation URL until M requests are sent, then print counts.

Usage: python tests/fakes/load_client.py URL --clients 16 --requests 2000 [--component NAME] [--deadline-s 120]
Prints one JSON object: {"sent", "by_status": {status: n}, "by_pid": {pid: n}, "other": n, "other_examples": [...],
"seconds"}.
A 503 whose body says to retry counts as retryable; anything else that is not 200 is listed in "other".
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse
from collections import Counter


def post(conn: http.client.HTTPConnection, path: str,
         headers: dict[str, str]) -> tuple[http.client.HTTPConnection, int, bytes]:
    """One request: the connection to go on with (a fresh one after a failure), the status (0: no answer) and body."""
    try:
        conn.request("POST", path, body=b'{"q": 1}', headers=headers)
        response = conn.getresponse()
        return conn, response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        return http.client.HTTPConnection(conn.host, conn.port, timeout=30), 0, repr(exc).encode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--component")
    parser.add_argument("--deadline-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    target = urllib.parse.urlsplit(args.url)
    path = target.path.rstrip("/") + "/invocations"
    headers = {"Content-Type": "application/json"}
    if args.component:
        headers["X-Amzn-SageMaker-Inference-Component"] = args.component
    lock = threading.Lock()
    remaining = [args.requests]
    statuses: Counter = Counter()
    pids: Counter = Counter()
    other: list[str] = []
    other_count = [0]
    deadline = time.monotonic() + args.deadline_s

    def client() -> None:
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        while time.monotonic() < deadline:
            with lock:
                if remaining[0] == 0:
                    break
                remaining[0] -= 1
            conn, status, body = post(conn, path, headers)
            with lock:
                statuses[status] += 1
                if status == 200:
                    pids[json.loads(body)["pid"]] += 1
                elif not (status == 503 and b"Retry" in body):
                    other_count[0] += 1
                    if len(other) < 20:
                        other.append(f"{status}: {body[:200]!r}")
        conn.close()

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({
        "sent": sum(statuses.values()),
        "by_status": {str(k): v for k, v in sorted(statuses.items())},
        "by_pid": {str(k): v for k, v in sorted(pids.items())},
        "other": other_count[0],
        "other_examples": other,
        "seconds": round(time.monotonic() - started, 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
