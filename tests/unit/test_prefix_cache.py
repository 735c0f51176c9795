"""The SemIf adapter's prefix cache (images/semif/prefix_cache.py) without a model: longest-prefix lookup, LRU
eviction under the byte and entry bounds, redundant entries, and the counters `/metrics` shows."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import load_by_path

CACHE = load_by_path("shiplift_semif_prefix_cache", Path(__file__).resolve().parents[2] / "images" / "semif" /
                     "prefix_cache.py")


def state(n: int) -> bytes:
    return bytes(n)


def test_shared_prefix_agrees_with_os_path_commonprefix_on_random_token_lists():
    rng = random.Random(7)
    for _ in range(300):
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(4) for _ in range(rng.randrange(0, 10))]
        expected = len(os.path.commonprefix([a, b]))
        assert CACHE.shared_prefix(np.array(a, dtype=np.int32), np.array(b, dtype=np.int32)) == expected


def test_a_request_extending_a_cached_prefix_reuses_all_of_it_and_counts_the_tokens():
    cache = CACHE.PrefixCache(1000, 4)
    assert cache.lookup([1, 2, 3]) is None
    cache.count(0)
    cache.store([1, 2, 3, 4], state(10))
    found = cache.lookup([1, 2, 3, 4, 5, 6])
    assert found.shared == 4 and list(found.tokens) == [1, 2, 3, 4] and found.state == state(10)
    cache.count(found.shared)
    assert cache.stats() == {"bytes": 10, "entries": 1, "max_bytes": 1000, "max_entries": 4, "hits": 1,
                              "misses": 1, "tokens_saved": 4, "evictions": 0, "too_large": 0}


def test_the_entry_sharing_the_longest_prefix_wins_and_a_diverging_one_is_cut_to_what_it_shares():
    cache = CACHE.PrefixCache(1000, 4)
    cache.store([1, 2, 9, 9], state(1))
    cache.store([1, 2, 3, 4, 7], state(2))
    found = cache.lookup([1, 2, 3, 4, 5])
    assert found.state == state(2) and found.shared == 4  # the entry holds 5 tokens; the request shares 4
    assert cache.lookup([1, 2, 9, 8]).state == state(1)


def test_an_exact_only_cache_reuses_a_state_only_for_the_same_prefix_and_keeps_the_shorter_ones():
    """A sliding-window model's cache (`exact_only`): a state is no use cut back (it lacks window positions) or grown
    (the new tokens would be evaluated in another KV layout than cold), and a grown one does not replace it."""
    cache = CACHE.PrefixCache(1000, 4, exact_only=True)
    cache.store([1, 2, 3, 4, 7], state(2))
    assert cache.lookup([1, 2, 3, 4, 5]) is None  # shares 4 of the entry's 5
    assert cache.lookup([1, 2, 3, 4]) is None  # the entry runs past the request
    assert cache.lookup([1, 2, 3, 4, 7, 8]) is None  # the request grows the entry
    cache.store([1, 2, 3, 4], state(3))
    found = cache.lookup([1, 2, 3, 4])
    assert found.state == state(3) and found.shared == 4 and list(found.tokens) == [1, 2, 3, 4]
    assert cache.lookup([1, 2, 3, 4, 7]).state == state(2)
    assert cache.stats()["entries"] == 2 and cache.stats()["bytes"] == len(state(2)) + len(state(3))
    assert CACHE.PrefixCache(1000, 4, min_shared=4, exact_only=True).lookup([1, 2, 3, 4]) is None


def test_sharing_only_the_prompts_fixed_opening_is_a_miss():
    cache = CACHE.PrefixCache(1000, 4, min_shared=3)
    cache.store([1, 2, 3, 4, 5], state(1))
    assert cache.lookup([1, 2, 3, 8]) is None  # shares 3: no more than the fixed opening
    assert cache.lookup([1, 2, 3, 4, 8]).shared == 4


def test_the_entry_bound_evicts_the_least_recently_used():
    cache = CACHE.PrefixCache(1000, 2)
    cache.store([1, 1], state(1))
    cache.store([2, 2], state(2))
    assert cache.lookup([1, 1, 5]) is not None  # [1, 1] is now the most recently used
    cache.store([3, 3], state(3))
    assert cache.lookup([2, 2, 5]) is None
    assert cache.holds([1, 1]) and cache.holds([3, 3])
    assert cache.stats()["evictions"] == 1 and cache.stats()["entries"] == 2 and cache.stats()["bytes"] == 4


def test_the_byte_bound_evicts_until_the_states_fit():
    cache = CACHE.PrefixCache(100, 16)
    for i in range(1, 5):
        cache.store([i, i], state(40))
    stats = cache.stats()
    assert stats["bytes"] == 80 and stats["entries"] == 2 and stats["evictions"] == 2
    assert cache.holds([3, 3]) and cache.holds([4, 4]) and not cache.holds([1, 1])


def test_a_state_over_the_byte_bound_is_refused_and_counted_and_changes_nothing():
    cache = CACHE.PrefixCache(100, 16)
    cache.store([1, 2], state(60))
    assert not cache.admits(101)
    assert cache.admits(100)
    assert cache.stats() == {"bytes": 60, "entries": 1, "max_bytes": 100, "max_entries": 16, "hits": 0,
                              "misses": 0, "tokens_saved": 0, "evictions": 0, "too_large": 1}


def test_storing_an_extension_drops_the_entry_it_makes_redundant():
    cache = CACHE.PrefixCache(1000, 16)
    cache.store([1, 2, 3], state(30))
    cache.store([7, 8], state(5))
    cache.store([1, 2, 3, 4, 5], state(50))
    assert not cache.holds([1, 2, 3]) and cache.holds([1, 2, 3, 4, 5]) and cache.holds([7, 8])
    assert cache.stats()["bytes"] == 55 and cache.stats()["evictions"] == 0


@pytest.mark.parametrize("max_bytes, max_entries", [(0, 16), (1 << 20, 0)])
def test_either_bound_zero_turns_the_cache_off(max_bytes, max_entries):
    assert not CACHE.PrefixCache(max_bytes, max_entries).enabled
    assert CACHE.PrefixCache(1, 1).enabled
