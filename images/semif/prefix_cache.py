"""A bounded, least-recently-used store of evaluated KV states keyed by the tokens they hold, so that a request
sharing a prefix with an earlier one restores that state and evaluates only its new tokens (llama-server's
`--cache-ram`).

Standard library and numpy only: the adapter copies it beside server.py, and unit tests drive it without a model.
Every method takes the cache's own lock, so `/metrics` can read the counters while a request scores.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Reuse:
    """What a lookup found: the entry's state, its tokens, and how many of the request's leading tokens it holds."""

    tokens: np.ndarray
    state: bytes
    shared: int


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two token arrays have in common."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """Evaluated states by token prefix, bounded by total state bytes and by entry count (either 0: off).

    `exact_only`: reuse a state only for a request whose prefix is exactly its tokens (a sliding-window model's:
    llama.cpp writes its state without the window's masked cells, so a kept state can be neither cut back to a
    shorter prefix nor grown into a longer one in the KV layout a cold evaluation has; see server.py)."""

    def __init__(self, max_bytes: int, max_entries: int, *, min_shared: int = 1, exact_only: bool = False):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.min_shared = min_shared  # a lookup reuses an entry only when it shares more than this many tokens
        self.exact_only = exact_only
        self._entries: OrderedDict[bytes, tuple[np.ndarray, bytes]] = OrderedDict()  # key: the tokens' bytes
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.tokens_saved = 0
        self.evictions = 0
        self.too_large = 0  # states not kept because one alone exceeds max_bytes

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.max_entries > 0

    def lookup(self, tokens: Sequence[int]) -> Reuse | None:
        """The entry sharing the longest prefix with `tokens` (more than `min_shared` of them; with `exact_only`, the
        entry of exactly `tokens`), made the most recently used; None when there is none."""
        wanted = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            best_key, best_shared = None, self.min_shared
            if self.exact_only:
                if wanted.tobytes() in self._entries and len(wanted) > self.min_shared:
                    best_key, best_shared = wanted.tobytes(), len(wanted)
            else:
                for key, (held, _) in self._entries.items():
                    shared = shared_prefix(held, wanted)
                    if shared > best_shared:
                        best_key, best_shared = key, shared
            if best_key is None:
                return None
            self._entries.move_to_end(best_key)
            held, state = self._entries[best_key]
            return Reuse(tokens=held, state=state, shared=best_shared)

    def count(self, reused: int) -> None:
        """Count one request by the tokens it did not evaluate thanks to the cache: a hit when any, else a miss (a
        found state that llama.cpp could not load counts as the miss it was)."""
        with self._lock:
            if reused:
                self.hits += 1
                self.tokens_saved += reused
            else:
                self.misses += 1

    def admits(self, size: int) -> bool:
        """Whether a state of `size` bytes fits the byte bound on its own (asked before copying it out of llama.cpp);
        a refusal is counted, and the request simply pays its whole prefix next time."""
        with self._lock:
            if size > self.max_bytes:
                self.too_large += 1
                return False
            return True

    def store(self, tokens: Sequence[int], state: bytes) -> None:
        """Keep `state` (the KV state of exactly `tokens`), dropping entries it makes redundant (unless `exact_only`,
        those whose tokens are a prefix of `tokens`: any request they serve, it serves as well, cut back) and then
        the least recently used until both bounds hold (a state over the byte bound on its own goes as well: ask
        `admits` first)."""
        held = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            for key, (other, other_state) in list(self._entries.items()):
                if not self.exact_only and len(other) <= len(held) and shared_prefix(other, held) == len(other):
                    del self._entries[key]
                    self.bytes -= len(other_state)
            self._entries[held.tobytes()] = (held, state)
            self.bytes += len(state)
            while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= len(dropped)
                self.evictions += 1

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether an entry holds exactly `tokens` (then storing them again would only copy the same state)."""
        with self._lock:
            return np.asarray(tokens, dtype=np.int32).tobytes() in self._entries

    def stats(self) -> dict[str, int]:
        """The counters `/metrics` shows."""
        with self._lock:
            return {"bytes": self.bytes, "entries": len(self._entries), "max_bytes": self.max_bytes,
                    "max_entries": self.max_entries, "hits": self.hits, "misses": self.misses,
                    "tokens_saved": self.tokens_saved, "evictions": self.evictions, "too_large": self.too_large}
