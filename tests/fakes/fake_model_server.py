"""A tiny stdlib model server for hosting tests, run as a subprocess.

Environment (all optional except the port):
- FAKE_PORT_ENV names the variable that holds the port (default FAKE_PORT);
- FAKE_DELAY_S: seconds each POST /invocations sleeps before answering;
- FAKE_STATUS: HTTP status of POST /invocations (default 200);
- FAKE_STARTUP_DELAY_S: seconds before the server starts listening;
- FAKE_EXIT_AT_START: exit with code 3 after printing this message instead of serving;
- FAKE_IGNORE_SIGTERM=1: ignore SIGTERM (tests escalation to SIGKILL).
Prints `fake model server pid N starting` first. POST /invocations answers
{"pid", "port", "echo": <request body as text>, "content_type"}, so tests see which copy answered.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002
        sys.stderr.write(format % args + "\n")

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        if self.path == "/ping":
            self._send(200, {"status": "ok"})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/invocations":
            self._send(404, {"error": "not found"})
            return
        time.sleep(float(os.environ.get("FAKE_DELAY_S", "0")))
        status = int(os.environ.get("FAKE_STATUS", "200"))
        if status != 200:
            self._send(status, {"error": f"fake error {status}", "retryable": status == 503})
            return
        self._send(
            200,
            {
                "pid": os.getpid(),
                "port": self.server.server_address[1],
                "echo": body.decode("utf-8", errors="replace"),
                "content_type": self.headers.get("Content-Type"),
            },
        )


def main() -> int:
    port = int(os.environ[os.environ.get("FAKE_PORT_ENV", "FAKE_PORT")])
    print(f"fake model server pid {os.getpid()} starting", flush=True)
    if os.environ.get("FAKE_EXIT_AT_START"):
        print(os.environ["FAKE_EXIT_AT_START"], flush=True)
        return 3
    if os.environ.get("FAKE_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(float(os.environ.get("FAKE_STARTUP_DELAY_S", "0")))
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"fake model server on 127.0.0.1:{port}", flush=True)
    server.serve_forever(poll_interval=0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
