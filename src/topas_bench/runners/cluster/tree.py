"""The approximate radix tree of sglang-router 0.3.2's `cache_aware` policy.

Mirrors `sgl-model-gateway/src/policies/tree.rs` of the `sglang-router==0.3.2` sdist (read, not
copied): one tree per model, shared by all workers ("tenants"); every node keeps a map
tenant -> last access epoch and a cached `last_tenant`.
- `insert(text, tenant)` puts the tenant on every node of the path (adding the units it did not
  have to its size), splits a node where the text leaves it (the upper half copies the tenant
  map and `last_tenant`), adds the rest as a new leaf owned by the tenant, and stamps the
  deepest node with a fresh epoch;
- `prefix_match(text)` walks while the text matches (a partial match inside a node counts and
  stops there) and returns the matched length and that node's `last_tenant` (if it still owns
  the node, else any owner, which is then cached); one lookup in eight (epoch & 7 == 0) stamps
  the node for LRU;
- `evict(max_size)`: for every tenant above `max_size` units, remove it from its least recently
  used leaves (a parent left without the tenant below joins the candidates) until it fits.
The epoch is a counter bumped by every new leaf, every insert's final stamp and every lookup
(the router's is one process-wide atomic). Where Rust iterates a DashMap (an arbitrary order),
insertion order is used here; ties of the eviction heap break by discovery order.

The tree is generic over its units (`Units`): `TEXT` compares characters, as the real router
does on the request's text; `TOKENS` compares token runs (`workloads.pieces`), as the
simulator's requests carry no text. Which to use is the caller's (docs/cluster.md: the
simulated router matches tokens, the real one characters).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from topas_bench.workloads.pieces import Piece, common, first_token, length, take

S = TypeVar("S")


class Units(Protocol[S]):
    """How the tree reads a sequence: its length, first unit, common prefix, and a split."""

    empty: S

    def length(self, s: S) -> int: ...
    def first(self, s: S) -> Hashable: ...
    def common(self, a: S, b: S) -> int: ...
    def split(self, s: S, n: int) -> tuple[S, S]: ...


class TextUnits:
    """Characters of a string (Unicode scalars, as Rust's `chars()`)."""

    empty = ""

    def length(self, s: str) -> int:
        return len(s)

    def first(self, s: str) -> Hashable:
        return s[0]

    def common(self, a: str, b: str) -> int:
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return n
        lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        return lo

    def split(self, s: str, n: int) -> tuple[str, str]:
        return s[:n], s[n:]


class TokenUnits:
    """Token runs of a prompt (`workloads.pieces`: equal keys are equal tokens)."""

    empty: tuple[Piece, ...] = ()

    def length(self, s: Sequence[Piece]) -> int:
        return length(s)

    def first(self, s: Sequence[Piece]) -> Hashable:
        return first_token(s[0])

    def common(self, a: Sequence[Piece], b: Sequence[Piece]) -> int:
        return common(a, b, _NO_LIMIT)  # it stops at the end of either

    def split(self, s: Sequence[Piece], n: int) -> tuple[Sequence[Piece], Sequence[Piece]]:
        head, tail = take(s, n)
        return tuple(head), tuple(tail)


_NO_LIMIT = 1 << 62
TEXT = TextUnits()
TOKENS = TokenUnits()


class _Node:
    __slots__ = ("children", "last_tenant", "n", "parent", "seq", "tenants")

    def __init__(self, seq: Any, n: int, parent: _Node | None, last: int | None) -> None:
        self.seq = seq
        self.n = n
        self.parent = parent
        self.children: dict[Hashable, _Node] = {}
        self.tenants: dict[int, int] = {}  # tenant -> last access epoch
        self.last_tenant = last


class ApproxTree(Generic[S]):
    """One model's tree; tenants are worker indices."""

    def __init__(self, units: Units[S]) -> None:
        self.units = units
        self.root = _Node(units.empty, 0, None, None)
        self.size: dict[int, int] = {}  # tenant -> units it owns (`tenant_char_count`)
        self._epoch = 0

    def _tick(self) -> int:
        e = self._epoch  # `fetch_add` returns the value before
        self._epoch += 1
        return e

    def insert(self, seq: S, tenant: int) -> None:
        u = self.units
        self.root.tenants.setdefault(tenant, 0)
        self.size.setdefault(tenant, 0)
        rest, prev, n = seq, self.root, u.length(seq)
        while n:
            key = u.first(rest)
            child = prev.children.get(key)
            if child is None:  # the rest becomes a leaf of this tenant
                leaf = _Node(rest, n, prev, tenant)
                self.size[tenant] += n
                leaf.tenants[tenant] = self._tick()
                prev.children[key] = leaf
                return
            shared = u.common(rest, child.seq)
            if shared < child.n:  # split: the upper half inherits owners and last_tenant
                head, tail = u.split(child.seq, shared)
                mid = _Node(head, shared, prev, child.last_tenant)
                mid.tenants = dict(child.tenants)
                mid.children[u.first(tail)] = child
                prev.children[key] = mid
                child.seq, child.n, child.parent = tail, child.n - shared, mid
                child = mid
            if tenant not in child.tenants:
                self.size[tenant] += child.n
                child.tenants[tenant] = 0
            prev, rest, n = child, u.split(rest, shared)[1], n - shared
        prev.tenants[tenant] = self._tick()

    def prefix_match(self, seq: S) -> tuple[int, int | None]:
        """(matched units, tenant of the deepest matched node; None if it has no tenant)."""
        u = self.units
        rest, prev, matched, n = seq, self.root, 0, u.length(seq)
        while matched < n:
            child = prev.children.get(u.first(rest))
            if child is None:
                break
            shared = u.common(rest, child.seq)
            matched += shared
            prev = child
            if shared < child.n:
                break
            rest = u.split(rest, shared)[1]
        tenant = prev.last_tenant
        if tenant is None or tenant not in prev.tenants:
            tenant = next(iter(prev.tenants), None)
            prev.last_tenant = tenant
        epoch = self._tick()
        if epoch & 7 == 0 and tenant is not None:
            prev.tenants[tenant] = epoch
        return matched, tenant

    def evict(self, max_size: int) -> None:
        """`evict_tenant_by_size`: shrink every tenant above `max_size` units, LRU leaves first.
        (With every tenant within the limit the walk would remove nothing, so it is skipped.)"""
        if all(size <= max_size for size in self.size.values()):
            return
        heap: list[tuple[int, int, int, _Node]] = []
        order = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in _leaf_tenants(node):
                heap.append((node.tenants[tenant], order, tenant, node))
                order += 1
        heapq.heapify(heap)
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if self.size.get(tenant, 0) <= max_size:
                continue
            if tenant not in node.tenants or any(
                tenant in c.tenants for c in node.children.values()
            ):
                continue  # no longer this tenant's leaf
            self.size[tenant] = max(self.size[tenant] - node.n, 0)
            del node.tenants[tenant]
            parent = node.parent
            if parent is not None and not node.children and not node.tenants and node.n:
                del parent.children[self.units.first(node.seq)]
            if (
                parent is not None
                and tenant in parent.tenants
                and not any(tenant in c.tenants for c in parent.children.values())
            ):
                heapq.heappush(heap, (parent.tenants[tenant], order, tenant, parent))
                order += 1


def _leaf_tenants(node: _Node) -> list[int]:
    """Tenants of `node` that none of its children has (`Tree::leaf_of`)."""
    below = {t for c in node.children.values() for t in c.tenants}
    return [t for t in node.tenants if t not in below]
