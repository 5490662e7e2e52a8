"""Prompts as token runs, for token-exact prefix comparison without materialising tokens.

A segment `(key, n)` is the tokens `(key, 0..n-1)`: equal keys mean equal tokens, and a prefix
of a key is a prefix of its tokens. Token identity follows the reference engine's ids
(`runners.sglang_cpu.tokens.TokenIds`): offset 0 is the key's own lead token, every later
offset the one shared filler token. So two runs agree on a token when both are the same key's
lead, or both are fillers; comparing `(key, offset)` runs is comparing SGLang's token ids.

A piece `(key, start, end)` is the tokens `key[start:end]`; a sequence of pieces is a prompt, a
radix-tree edge, or a request's prompt plus the output it has generated so far.
"""

from __future__ import annotations

from collections.abc import Sequence

from topas_bench.workloads.model import Segment, output_key

Piece = tuple[str, int, int]
FILL = "\x00fill"  # the identity of a filler token (any key's offset > 0)


def pieces(segments: Sequence[Segment]) -> list[Piece]:
    return [(s.key, 0, s.tokens) for s in segments if s.tokens > 0]


def fill_pieces(
    prompt: Sequence[Segment], task_id: str, stage_id: str, generated: int
) -> list[Piece]:
    """A request's `fill_ids` (SGLang): its prompt, then the output tokens it has produced."""
    out = pieces(prompt)
    if generated > 0:
        out.append((output_key(task_id, stage_id), 0, generated))
    return out


def length(ps: Sequence[Piece]) -> int:
    return sum(b - a for _, a, b in ps)


def first_token(p: Piece) -> str:
    """The identity of a piece's first token: its key's lead, or `FILL`."""
    return p[0] if p[1] == 0 else FILL


def take(ps: Sequence[Piece], n: int) -> tuple[list[Piece], list[Piece]]:
    """Split a piece sequence after its first `n` tokens."""
    head: list[Piece] = []
    for i, (k, a, b) in enumerate(ps):
        if n <= 0:
            return head, list(ps[i:])
        if b - a <= n:
            head.append((k, a, b))
            n -= b - a
        else:
            head.append((k, a, a + n))
            return head, [(k, a + n, b), *ps[i + 1 :]]
    return head, []


def common(x: Sequence[Piece], y: Sequence[Piece], limit: int) -> int:
    """Tokens `x` and `y` share from their starts, at most `limit`."""
    n = 0
    i = j = 0
    xa = x[0][1] if x else 0
    ya = y[0][1] if y else 0
    while i < len(x) and j < len(y) and n < limit:
        xk, _, xb = x[i]
        yk, _, yb = y[j]
        if (xa == 0 or ya == 0) and not (xa == 0 and ya == 0 and xk == yk):
            return n
        run = min(xb - xa, yb - ya, limit - n)
        n += run
        xa += run
        ya += run
        if xa == xb:
            i += 1
            xa = x[i][1] if i < len(x) else 0
        if ya == yb:
            j += 1
            ya = y[j][1] if j < len(y) else 0
    return n
