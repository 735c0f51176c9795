"""Issue 44's figure: how long a scaled-to-zero tenant takes to wake while another tenant on the same local endpoint
bakes a canary, beside the same wake-up with nothing baking.

`python -m bench.wake_while_baking [--bake-s 30]`: a shared endpoint with tenant x (2 copies) and tenant y (scaled to
zero), real router and scaler processes and fake model servers (tests/fakes/fake_model_server.py) on loopback. x runs a
canary whose bakes last `--bake-s` seconds; once x's first bake has started, y is invoked every 50 ms until it answers.
Prints one JSON line per case: the wake-up time and the no-capacity answers meanwhile (before the fix the scaler
waited for x's bakes: 61.4 s and 260 answers with 30 s bakes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from shiplift.tasks.backends.interfaces import RolloutPlan, ScaleToZeroPlan
from shiplift.tasks.backends.local.endpoint_state import ProcessSpec
from shiplift.tasks.backends.local.rollout import roll_out
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor

FAKE = Path(__file__).resolve().parents[1] / "tests" / "fakes" / "fake_model_server.py"
ENDPOINT = "bench-shared"


def _spec(copies: int, version: str) -> ProcessSpec:
    return ProcessSpec(command=[sys.executable, str(FAKE)], env={"FAKE_PORT_ENV": "SEMIF_PORT"}, copies=copies,
                       port_env="SEMIF_PORT", model_ref={"version": version})


def _answered(url: str, component: str) -> bool:
    request = urllib.request.Request(url + "/invocations", data=b'{"q": 1}', method="POST", headers={
        "Content-Type": "application/json", "X-Amzn-SageMaker-Inference-Component": component})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status == 200
    except urllib.error.HTTPError:
        return False


def wake(url: str, component: str, deadline_s: float) -> dict:
    """Invoke every 50 ms until the component answers: seconds taken and no-capacity answers meanwhile."""
    start, refused = time.monotonic(), 0
    while not _answered(url, component):
        refused += 1
        if time.monotonic() - start > deadline_s:
            return {"woke": False, "seconds": round(time.monotonic() - start, 2), "no_capacity_answers": refused}
        time.sleep(0.05)
    return {"woke": True, "seconds": round(time.monotonic() - start, 2), "no_capacity_answers": refused}


def measure(state_dir: Path, bake_s: float | None) -> dict:
    """y's wake-up from zero, while x bakes for `bake_s` (None: with nothing baking)."""
    hosting = ProcessSupervisor(state_dir)
    url = hosting.ensure_endpoint(ENDPOINT).url
    hosting.put_component(ENDPOINT, "x", _spec(2, "v1"))
    hosting.put_component(ENDPOINT, "y", _spec(1, "v1"))
    hosting.set_scaling(ENDPOINT, "y", ScaleToZeroPlan(max_copies=1, idle_s=3600, invocations_per_copy=1))
    hosting.scale(ENDPOINT, "y", 0)
    baking, rollout = threading.Event(), None
    if bake_s is not None:
        def bake(step) -> None:
            baking.set()
            time.sleep(bake_s)  # the canary's wait interval: this is what the other tenant must not wait for

        rollout = threading.Thread(target=roll_out, args=(ProcessSupervisor(state_dir), ENDPOINT, "x", _spec(2, "v2"),
                                                          RolloutPlan(strategy="canary", wait_interval_s=bake_s), bake))
        rollout.start()
        baking.wait(60)
    try:
        return {"case": f"x baking {bake_s:g}s" if bake_s is not None else "nothing baking",
                **wake(url, "y", deadline_s=3 * (bake_s or 10))}
    finally:
        if rollout is not None:
            rollout.join()
        hosting.delete_endpoint(ENDPOINT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bake-s", type=float, default=30.0, help="how long each of x's bakes lasts (issue 44: 30)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        for bake_s in (None, args.bake_s):
            print(json.dumps(measure(Path(state) / "state", bake_s)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
