"""A token-exact radix prefix cache, mirroring SGLang 0.5.23's radix tree (page size 1).

SGLang (`mem_cache/unified_cache/unified_tree_core.py`, and its Rust twin that servers load by
default) keeps a radix tree of token ids. Its behaviour that decides who gets evicted, mirrored
here:
- `match_prefix` splits the node where a match ends inside it, and stamps the matched path
  with a fresh time, deepest node newest (`_match_post_processor`);
- `insert` touches the root and every node it walks, splits where the key leaves a node, and
  adds the rest as a new leaf; tokens already in the tree are shared (the caller's duplicate
  KV is freed);
- `inc_lock_ref` / `dec_lock_ref` move a path between evictable and protected;
- `evict(n)` pops evictable leaves in LRU order (a heap on `last_access_time`), a parent whose
  last child went joining the heap, until at least `n` tokens are freed.
Times are a per-cache counter (SGLang's is `get_and_increase_time_counter`): only their order
matters.

Tokens are named, not stored: a workload segment `(key, n)` is the tokens `(key, 0..n-1)`, and
`runners.sglang_cpu.tokens.TokenIds` gives each key one unique lead id followed by a shared
filler id, so comparing `(key, offset)` pairs here is comparing token ids there. An edge is a
list of pieces (`workloads.pieces`); a child is found by its first token: the key for a lead
token (`start == 0`), `FILL` for a filler (which, at a given node, can only continue the key
being filled there).

Eviction order is SGLang's `--radix-eviction-policy` (`evict.py`: lru, lfu, slru, priority), with
the per-node hit counts and priorities those strategies read.

Extensions (no SGLang counterpart in the reference engine):
- kept nodes (an agent prefix a policy wants resident) hold one extra lock;
- an optional host tier (HiCache-like): an evicted GPU node moves to host memory when there is
  room, from where a match can load it back for `tokens * kv_bytes / host_link_bandwidth`.
  Host copies are evicted LRU when host memory is full.

Invariant: every ancestor of a GPU node is on the GPU.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from topas_bench.runners.sim.evict import eviction_key
from topas_bench.workloads.pieces import Piece, common, first_token, length, take


class Node:
    __slots__ = (
        "children", "edge", "hit_count", "last_access", "lock", "on_gpu", "on_host", "parent",
        "priority", "ready_s", "tokens",
    )  # fmt: skip

    def __init__(self, edge: list[Piece], parent: Node | None, t: float) -> None:
        self.edge = edge
        self.tokens = length(edge)
        self.parent = parent
        self.children: dict[str, Node] = {}
        self.lock = 0
        self.last_access = t
        self.on_gpu = True
        self.on_host = False
        self.hit_count = 0  # inserts of distinct requests that walked it (lfu, slru)
        self.priority = 0  # the highest inserting request's priority (priority eviction)
        self.ready_s = 0.0  # when a prefetch from the host tier has brought it in

    def gpu_child_count(self) -> int:
        return sum(1 for c in self.children.values() if c.on_gpu)

    def __lt__(self, other: Node) -> bool:  # heap tie-break (times are unique anyway)
        return self.last_access < other.last_access


@dataclass(frozen=True, slots=True)
class Match:
    """A matched prefix: `gpu_tokens` ending at `node` (the root if none), then the host-tier
    nodes that continue it (`host_tokens` in all)."""

    gpu_tokens: int
    node: Node
    host_tokens: int
    host_nodes: tuple[Node, ...]


class RadixCache:
    """Token-exact radix tree with lock counts, SGLang's eviction orders and an optional host
    tier."""

    def __init__(
        self,
        host_capacity_tokens: int = 0,
        eviction: str = "lru",
        slru_protected_threshold: int = 2,
    ) -> None:
        self.eviction = eviction
        self._key = eviction_key(eviction, slru_protected_threshold)
        self._time = 0.0
        self.root = Node([], None, 0.0)
        self.root.lock = 1  # the root is never evicted
        self.gpu_tokens = 0
        self.evictable_tokens = 0
        self.host_capacity_tokens = host_capacity_tokens
        self.host_tokens = 0
        #: Bumped whenever the tree's shape or residency changes, so callers can memoise
        #: read-only probes.
        self.version = 0

    def _tick(self) -> float:
        self._time += 1.0
        return self._time

    # -- queries (read-only: no split, no time stamp) ----------------------------------------
    @property
    def protected_tokens(self) -> int:
        return self.gpu_tokens - self.evictable_tokens

    def probe(self, key: Sequence[Piece], limit: int | None = None) -> tuple[int, int]:
        """(GPU tokens, then host tokens) of `key`'s cached prefix, without touching anything
        (the reading twin of `match`, as SGLang's `match_full_device_prefix`)."""
        cap = length(key) if limit is None else limit
        node, gpu, host, rest = self.root, 0, 0, list(key)
        while rest and gpu + host < cap:
            child = node.children.get(first_token(rest[0]))
            if child is None or not (child.on_gpu or child.on_host):
                break
            m = common(child.edge, rest, cap - gpu - host)
            if child.on_gpu and not host:
                gpu += m
            elif child.on_host:
                host += m
            else:
                break
            if m < child.tokens:
                break
            rest = take(rest, m)[1]
            node = child
        return gpu, host

    def walk(self, key: Sequence[Piece]) -> list[Node]:
        """The nodes `key` runs through, read-only: on the GPU, then on the host, the node
        where it ends (maybe inside) included (`match_full_device_prefix`'s walk)."""
        node, rest, out = self.root, list(key), []
        while rest:
            child = node.children.get(first_token(rest[0]))
            if child is None or not (child.on_gpu or child.on_host):
                break
            m = common(child.edge, rest, length(rest))
            out.append(child)
            if m < child.tokens:
                break
            rest = take(rest, m)[1]
            node = child
        return out

    def device_path(self, key: Sequence[Piece]) -> list[Node]:
        """`walk`'s leading GPU nodes."""
        out = []
        for n in self.walk(key):
            if not n.on_gpu:
                break
            out.append(n)
        return out

    def nodes(self) -> Iterator[Node]:
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def unlocked_path_tokens(self, node: Node) -> int:
        """Evictable tokens on the path root..node (what locking `node` would protect)."""
        total = 0
        n: Node | None = node
        while n is not None and n is not self.root:
            if n.lock == 0 and n.on_gpu:
                total += n.tokens
            n = n.parent
        return total

    # -- match (SGLang's match_prefix: splits and stamps) -----------------------------------
    def match(self, key: Sequence[Piece], limit: int | None = None) -> Match:
        """Longest cached prefix of `key` (at most `limit` tokens), splitting the node where
        it ends and stamping the matched path (deepest newest), as `match_prefix` does."""
        cap = length(key) if limit is None else limit
        node, gpu, host = self.root, 0, 0
        gpu_node = self.root
        host_nodes: list[Node] = []
        rest = list(key)
        while rest and gpu + host < cap:
            child = node.children.get(first_token(rest[0]))
            if child is None or not (child.on_gpu or child.on_host):
                break
            m = common(child.edge, rest, cap - gpu - host)
            partial = m < child.tokens
            if partial:
                child = self._split(child, m)
            if child.on_gpu and not host_nodes:
                gpu += m
                gpu_node = child
            elif child.on_host:
                host += m
                host_nodes.append(child)
            else:
                break
            rest = take(rest, m)[1]
            node = child
            if partial:
                break
        self._stamp(host_nodes[-1] if host_nodes else gpu_node)
        return Match(gpu, gpu_node, host, tuple(host_nodes))

    def _stamp(self, node: Node) -> None:
        t = self._tick()
        n: Node | None = node
        while n is not None:
            n.last_access = t
            t -= 1e-5
            n = n.parent

    def _split(self, child: Node, at: int) -> Node:
        """`_split_node`: a new parent holding `child`'s first `at` tokens. The new node is
        stamped at creation, then the child (its suffix keeps no older recency)."""
        head, tail = take(child.edge, at)
        parent = child.parent
        assert parent is not None
        new = Node(head, parent, self._tick())
        new.lock = child.lock
        new.on_gpu = child.on_gpu
        new.on_host = child.on_host
        new.priority = child.priority
        new.hit_count = child.hit_count
        parent.children[first_token(head[0])] = new
        child.edge = tail
        child.tokens -= at
        child.parent = new
        new.children[first_token(tail[0])] = child
        child.last_access = self._tick()
        self.version += 1
        return new

    # -- locking ----------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """`inc_lock_ref`: protect the path root..node."""
        n: Node | None = node
        while n is not None and n is not self.root:
            if n.lock == 0 and n.on_gpu:
                self.evictable_tokens -= n.tokens
            n.lock += 1
            n = n.parent

    def unlock(self, node: Node) -> None:
        """`dec_lock_ref`: release the path root..node."""
        n: Node | None = node
        while n is not None and n is not self.root:
            n.lock -= 1
            assert n.lock >= 0, "lock count below zero"
            if n.lock == 0 and n.on_gpu:
                self.evictable_tokens += n.tokens
            n = n.parent

    # -- insertion ---------------------------------------------------------------------------
    def insert(
        self, key: Sequence[Piece], priority: int = 0, inserted_len: int | None = None
    ) -> tuple[Node, int]:
        """`insert`: put `key` in the tree. Returns (its last node, tokens newly placed on the
        GPU). Tokens already on the GPU are shared (the caller frees its duplicate KV);
        host-only nodes are re-materialised from the new KV. Every walked node's priority
        becomes at least `priority`; a node ending past `inserted_len` (what the inserting
        request inserted before) counts a hit, as does the new leaf (`None`: no hits)."""
        node = self.root
        node.last_access = self._tick()
        node.priority = max(node.priority, priority)
        added = 0
        done = 0
        rest = list(key)
        while rest:
            child = node.children.get(first_token(rest[0]))
            if child is None:
                break
            child.last_access = self._tick()
            m = common(child.edge, rest, length(rest))
            if m < child.tokens:
                child = self._split(child, m)
            child.priority = max(child.priority, priority)
            if not child.on_gpu:
                self._to_gpu(child)
                added += child.tokens
            done += m
            if inserted_len is not None and done > inserted_len:
                child.hit_count += 1
            rest = take(rest, m)[1]
            node = child
        if rest:
            leaf = Node(rest, node, self._tick())
            leaf.priority = priority
            if inserted_len is not None and done + leaf.tokens > inserted_len:
                leaf.hit_count = 1
            node.children[first_token(rest[0])] = leaf
            self.version += 1
            self.gpu_tokens += leaf.tokens
            self.evictable_tokens += leaf.tokens
            added += leaf.tokens
            node = leaf
        return node, added

    def load_back(self, nodes: Sequence[Node]) -> int:
        """Bring host-resident `nodes` (a chain below a GPU node) back to the GPU."""
        loaded = 0
        for n in nodes:
            self._to_gpu(n)
            n.last_access = self._tick()
            loaded += n.tokens
        return loaded

    def _to_gpu(self, node: Node) -> None:
        self.version += 1
        node.on_gpu = True
        self.gpu_tokens += node.tokens
        if node.lock == 0:
            self.evictable_tokens += node.tokens

    # -- eviction ----------------------------------------------------------------------------
    def _evictable_leaves(self) -> list[tuple[float, Node]]:
        key = self._key
        heap = [
            (key(n), n)
            for n in self.nodes()
            if n.on_gpu and n.lock == 0 and n.gpu_child_count() == 0
        ]
        heapq.heapify(heap)
        return heap

    def evict(self, tokens: int) -> int:
        """Free at least `tokens` GPU tokens by evicting unlocked leaves in the eviction
        policy's order (a parent whose last GPU child went joins the heap); returns freed."""
        if tokens <= 0:
            return 0
        heap = self._evictable_leaves()
        freed = 0
        while freed < tokens and heap:
            _, n = heapq.heappop(heap)
            freed += n.tokens
            parent = n.parent
            self._evict_node(n)
            if (
                parent is not None
                and parent is not self.root
                and parent.lock == 0
                and parent.on_gpu
                and parent.gpu_child_count() == 0
            ):
                heapq.heappush(heap, (self._key(parent), parent))
        return freed

    def _evict_node(self, n: Node) -> None:
        self.version += 1
        n.on_gpu = False
        self.gpu_tokens -= n.tokens
        self.evictable_tokens -= n.tokens
        if self.host_capacity_tokens and not n.on_host and self._make_host_room(n.tokens):
            n.on_host = True
            self.host_tokens += n.tokens
        if not n.on_host:
            self._delete_subtree(n)

    def offload_path(self, node: Node, keep_tokens: int) -> int:
        """Move the path root..`node` to the host tier from its end up, while a node is on the
        GPU, unlocked, has no GPU child, lies past the path's first `keep_tokens` (a node
        across that boundary is split there) and fits the host tier (`Policy.context_action`'s
        offload); returns the tokens moved. Host copies are made room for as an eviction
        makes it."""
        path = []
        n: Node | None = node
        while n is not None and n is not self.root:
            path.append(n)
            n = n.parent
        start = sum(x.tokens for x in path)
        moved = 0
        for n in path:  # deepest first
            start -= n.tokens
            if start + n.tokens <= keep_tokens or not n.on_gpu or n.lock or n.gpu_child_count():
                break
            if start < keep_tokens:  # the node runs across the boundary: split it there
                self._split(n, keep_tokens - start)
            if n.tokens > self.host_capacity_tokens:
                break
            self._evict_node(n)
            if not n.on_host:
                break
            moved += n.tokens
        return moved

    def _make_host_room(self, tokens: int) -> bool:
        if tokens > self.host_capacity_tokens:
            return False
        need = self.host_tokens + tokens - self.host_capacity_tokens
        if need <= 0:
            return True
        # As SGLang's `evict_host`: a heap of host-only leaves; a parent whose last child went
        # becomes a leaf and joins it (else a host chain could never be freed).
        key = self._key
        victims = [
            (key(n), n) for n in self.nodes() if n.on_host and not n.on_gpu and not n.children
        ]
        heapq.heapify(victims)
        while need > 0 and victims:
            _, v = heapq.heappop(victims)
            need -= v.tokens
            parent = v.parent
            self._delete_subtree(v)
            if parent is not None and parent.on_host and not parent.on_gpu and not parent.children:
                heapq.heappush(victims, (key(parent), parent))
        return need <= 0

    def _delete_subtree(self, n: Node) -> None:
        """Drop a node that is no longer on the GPU, with its (host-only) descendants."""
        assert not n.on_gpu
        if n.parent is not None:
            first = first_token(n.edge[0])
            if n.parent.children.get(first) is n:
                del n.parent.children[first]
        stack = [n]
        while stack:
            m = stack.pop()
            if m.on_host:
                self.host_tokens -= m.tokens
                m.on_host = False
            stack.extend(m.children.values())
            m.children = {}
