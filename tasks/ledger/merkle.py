"""A Merkle tree over the ledger's record hashes, as RFC 6962 / RFC 9162 define it (§2.1), so one release's
records can be proven included in a signed checkpoint without the whole ledger: the proof is O(log n) hashes.

Leaves are `SHA-256(0x00 || record_hash)`, inner nodes `SHA-256(0x01 || left || right)`, and a tree of n
leaves splits at the largest power of two below n.
"""

from __future__ import annotations

import hashlib


def leaf(data: bytes) -> bytes:
    """The leaf hash of one entry (for the ledger: a record hash's 32 bytes)."""
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


class Tree:
    """A Merkle tree over fixed leaves that keeps every subtree hash it computes, so its root and the audit paths
    of any number of its leaves cost O(n) hashes in all (a release's records are proven together)."""

    def __init__(self, leaves: list[bytes]):
        self.leaves = leaves
        self._hashes: dict[tuple[int, int], bytes] = {}

    def subtree(self, start: int, end: int) -> bytes:
        """The hash of leaves[start:end] (RFC 6962 MTH)."""
        if end - start == 1:
            return self.leaves[start]
        found = self._hashes.get((start, end))
        if found is None:
            k = _split(end - start)
            found = self._hashes[(start, end)] = _node(self.subtree(start, start + k), self.subtree(start + k, end))
        return found

    def root(self) -> bytes:
        """The Merkle tree hash of the leaves (an empty tree is the hash of nothing)."""
        return self.subtree(0, len(self.leaves)) if self.leaves else hashlib.sha256(b"").digest()

    def audit_path(self, index: int) -> list[bytes]:
        """The hashes that prove leaf `index` is in the tree (RFC 6962 §2.1.1 PATH)."""
        if not 0 <= index < len(self.leaves):
            raise ValueError(f"leaf {index} is not in a tree of {len(self.leaves)}")
        path: list[bytes] = []
        start, end = 0, len(self.leaves)
        while end - start > 1:
            k = _split(end - start)
            if index < start + k:
                path.append(self.subtree(start + k, end))
                end = start + k
            else:
                path.append(self.subtree(start, start + k))
                start = start + k
        return path[::-1]


def root(leaves: list[bytes]) -> bytes:
    """The Merkle tree hash of the leaves."""
    return Tree(leaves).root()


def included(entry: bytes, index: int, size: int, path: list[bytes], expected_root: bytes) -> bool:
    """Whether `path` proves the leaf hash `entry` at `index` in a tree of `size` leaves with root `expected_root`
    (RFC 9162 §2.1.3.2)."""
    if not 0 <= index < size:
        return False
    fn, sn, value = index, size - 1, entry
    for sibling in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            value = _node(sibling, value)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            value = _node(value, sibling)
        fn >>= 1
        sn >>= 1
    return sn == 0 and value == expected_root
