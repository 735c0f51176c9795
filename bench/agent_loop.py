"""`make bench` section: an agent loop, 8 requests that re-score one ~1,100-token state with a new question each turn,
on the SemIf adapter with its prefix cache and without it (SEMIF_PREFIX_CACHE_BYTES=0), each in its own process,
requests alternated between the two, a fresh state every round so each round starts cold.

Prints tokens evaluated (the adapter's /metrics), wall time, the speed ratio, the token bound (the ratio if time
followed evaluated tokens) and the fraction of it reached, and the largest difference between the two servers' option
probabilities. Alone: `python -m bench.agent_loop [ROUNDS] [--tiny]` (the demo Gemma when its package is installed and
--tiny is not given, else the tiny model).
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

from bench.harness import ROUNDS, SERVER_ENV, decisions, gemma_path, image_server, log, post, report, shared_state
from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.errors import NotFound

TURNS = 8
TOLERANCE = 1e-4  # absolute, on each option probability


def tokens_evaluated(url: str) -> int:
    """The adapter's semif_tokens_evaluated_total."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return int(float(re.search(r"^semif_tokens_evaluated_total (\S+)$", text, re.MULTILINE).group(1)))


def turns(batch: list[dict], round_no: int) -> list[dict]:
    """The round's 8 requests: the batch's decisions, one a turn, on the state marked with the round (so no round
    reuses another's state)."""
    return [{"decision": {**item, "state": f"Case {round_no + 1}. {item['state']}"}} for item in batch[:TURNS]]


def run(gguf: Path, batch: list[dict], settings: dict[str, str] = SERVER_ENV, rounds: int = ROUNDS) -> list[dict]:
    """The agent loop with and without reuse; `batch`: 8 decisions on one state (bench.run's shared state),
    `settings`: the adapters' SEMIF_* limits."""
    spent = {"reuse": [], "none": []}  # per round: (tokens evaluated, seconds)
    worst, prefix_tokens = 0.0, None
    env = {"SEMIF_GGUF_PATH": str(gguf), **settings}
    with image_server("semif", env, "SEMIF_PORT") as reuse_url, \
            image_server("semif", {**env, "SEMIF_PREFIX_CACHE_BYTES": "0"}, "SEMIF_PORT") as none_url:
        urls = {"reuse": reuse_url, "none": none_url}
        for round_no in range(rounds):
            before = {name: tokens_evaluated(url) for name, url in urls.items()}
            seconds = dict.fromkeys(urls, 0.0)
            for turn_no, payload in enumerate(turns(batch, round_no)):
                order = ("reuse", "none") if (round_no + turn_no) % 2 == 0 else ("none", "reuse")
                answers = {}
                for name in order:
                    body, took = post(urls[name], payload)
                    seconds[name] += took
                    answers[name] = body["result"]["probabilities"]
                worst = max(worst, *(abs(a - b) for a, b in zip(answers["reuse"], answers["none"], strict=True)))
            for name, url in urls.items():
                spent[name].append((tokens_evaluated(url) - before[name], seconds[name]))
            log(f"  round {round_no + 1}: reuse {spent['reuse'][-1][0]} tokens {seconds['reuse']:.2f}s, "
                f"none {spent['none'][-1][0]} tokens {seconds['none']:.2f}s")
        prefix_tokens = post(reuse_url, {"decisions": batch[:1]})[0]["timing"]["shared_prefix_tokens"]
    tokens = {name: statistics.median(t for t, _ in rounds) for name, rounds in spent.items()}
    wall = {name: statistics.median(s for _, s in rounds) for name, rounds in spent.items()}
    ratio, bound = wall["none"] / wall["reuse"], tokens["none"] / tokens["reuse"]
    return [
        {"name": f"agent loop, {TURNS} requests on one state: reuse vs none", "value": ratio, "unit": "x faster",
         "target": f">= {0.9 * bound:.2f}", "ok": ratio >= 0.9 * bound,
         "detail": f"{prefix_tokens}-token state; tokens {tokens['reuse']:.0f} vs {tokens['none']:.0f} (bound "
                   f"{bound:.2f}x, {ratio / bound:.2f} of it reached); "
                   f"wall {wall['reuse']:.2f}s vs {wall['none']:.2f}s"},
        {"name": "agent loop, cold vs warm option probabilities", "value": worst, "unit": "abs max difference",
         "target": f"<= {TOLERANCE:g}", "ok": worst <= TOLERANCE,
         "detail": f"{rounds * TURNS} decisions, the cached server's answers vs the uncached one's"},
    ]


def main() -> int:

    settings, state = SERVER_ENV, shared_state()
    tiny = "--tiny" in sys.argv[1:]
    try:
        gguf = None if tiny else gemma_path()
    except NotFound as exc:  # the demo package is optional here: say so and use the tiny model
        log(f"the demo Gemma is not available ({exc}); using the tiny model")
        tiny = True
    if tiny:  # one character a token, a 2,048-token context: the state's first 1,100 characters
        gguf = write_tiny_gguf(Path(tempfile.mkdtemp(prefix="shiplift-bench-")) / "tiny.gguf", seed=0)
        settings, state = {**SERVER_ENV, "SEMIF_MAX_TOKENS": "2048", "SEMIF_MAX_REQUEST_TOKENS": "2048"}, state[:1100]
    log(f"agent loop on {gguf.name}")
    numbers = [int(arg) for arg in sys.argv[1:] if arg.isdigit()]
    rounds = numbers[0] if numbers else ROUNDS  # fewer on a machine too busy for three
    results = run(gguf, decisions(state), settings, rounds)
    return report(results)


if __name__ == "__main__":
    sys.exit(main())
