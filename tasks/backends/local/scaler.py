"""The local stand-in for Application Auto Scaling: give one component of a local endpoint a number of copies.

Run by the endpoint's router (`python -m shiplift.tasks.backends.local.scaler --state-dir DIR ENDPOINT COMPONENT
COPIES`) for a component that scales to zero: with 0 when it has been idle for its `idle_s`, with 1 when a request found
no copy (the scale-out alarm's one-copy step on SageMaker). It takes the component's own lock, so it waits for a deploy
or a rollout of this component in progress but never for another component's (a bake of another model on a shared
endpoint does not delay a wake-up); an endpoint or component deleted meanwhile is left alone, and a shared endpoint
without room for the copy refuses it (CapacityError, as SageMaker's InsufficientCapacity)."""

from __future__ import annotations

import argparse
import sys

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import ShipliftError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shiplift.tasks.backends.local.scaler",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", required=True, help="the local backend's state folder")
    parser.add_argument("endpoint")
    parser.add_argument("component")
    parser.add_argument("copies", type=int)
    args = parser.parse_args(argv)
    try:
        changed = ProcessSupervisor(args.state_dir).scale(args.endpoint, args.component, args.copies)
    except ShipliftError as exc:
        sys.stderr.write(f"scaler {args.endpoint}/{args.component}: not scaled to {args.copies}: {exc}\n")
        return 1
    word = "copy" if args.copies == 1 else "copies"
    sys.stderr.write(f"scaler {args.endpoint}/{args.component}: {args.copies} {word}"
                     f"{'' if changed else ' already'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
